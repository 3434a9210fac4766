"""Which run a command continues, and what it says about the others: a resume refused for
changed settings prints the command that is accepted, and a run typed again beside a finished
one of the same settings says where that one is."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.support.project import run_train, trained_config


def test_a_refused_resume_prints_the_command_that_is_accepted(trained, tmp_path: Path) -> None:
    """--resume DIR of a checkpoint written with other settings (the README's RAdam line, then
    the plain resume) is refused naming each field -- and prints the command with those settings,
    which then resumes."""
    import shlex

    checkpoint, _ = trained
    mine = tmp_path / "ck"
    shutil.copytree(checkpoint, mine)
    record = json.loads((mine / "experiment.json").read_text())
    saved = record["identity"]["hyperparameters.learning_rate"]
    record["identity"]["hyperparameters.learning_rate"] = saved * 2
    (mine / "experiment.json").write_text(json.dumps(record))
    typed = ["--config", str(trained_config(checkpoint)), "--resume", str(mine), "--batches", "8",
             "--checkpoint-dir", str(tmp_path / "c")]  # fmt: skip
    code, _, err = run_train(typed)
    assert code == 2 and "Resume with its settings: python3 train.py " in err, err
    printed = err.split("Resume with its settings: ", 1)[1].strip()
    words = shlex.split(printed)
    assert words[:2] == ["python3", "train.py"]
    assert f"hyperparameters.learning_rate={saved * 2}" in words
    code, result, err = run_train(words[2:])
    assert code == 0 and result["steps_completed"] == 8, err[-3000:]


def test_a_refused_resume_prints_a_command_that_reproduces_the_whole_run(trained, tmp_path: Path) -> None:
    """The command a refusal prints sets every setting the checkpoint's run had otherwise -- its
    validation file too, which identifies nothing, so that pasted it validates on the same
    questions: the resumed run records the settings the checkpoint did."""
    import shlex

    checkpoint, _ = trained
    mine = tmp_path / "ck"
    shutil.copytree(checkpoint, mine)
    recorded = json.loads((mine / "experiment.json").read_text())["settings"]
    other_dev = tmp_path / "other-dev.json"
    other_dev.write_text(Path(recorded["data.validation_file"]).read_text())
    typed = ["--config", str(trained_config(checkpoint)), "--resume", str(mine), "--batches", "8",
             "--set", "hyperparameters.learning_rate=0.5", "--set", f"data.validation_file={other_dev}",
             "--checkpoint-dir", str(tmp_path / "c")]  # fmt: skip
    code, _, err = run_train(typed)
    assert code == 2 and "Resume with its settings: python3 train.py " in err, err
    words = shlex.split(err.split("Resume with its settings: ", 1)[1].strip())
    assert f"data.validation_file={recorded['data.validation_file']}" in words, words
    code, result, err = run_train(words[2:])
    assert code == 0 and result["steps_completed"] == 8, err[-3000:]
    resumed = json.loads((Path(result["checkpoint"]) / "experiment.json").read_text())["settings"]
    assert resumed == recorded


def test_the_same_command_typed_again_continues_its_run(trained, tmp_path: Path, caplog) -> None:
    """A command typed again beside its own checkpoint continues it (as --resume auto) and keeps
    only the newest of the run's checkpoints; --restart trains from the beginning and says which
    checkpoints of these settings stay beside it and how large."""
    checkpoint, _ = trained
    config = str(trained_config(checkpoint))
    ck = tmp_path / "c"
    # Retention by recency alone: whichever of the two validates better, only the newest stays.
    latest_only = ["--set", "checkpoint_storage.save_trial_best=0"]
    code, first, err = run_train(
        ["--config", config, "--batches", "2", "--checkpoint-dir", str(ck), *latest_only]
    )
    assert code == 0 and first["steps_completed"] == 2, err[-3000:]
    with caplog.at_level("INFO", logger="squad"):
        code, again, err = run_train(
            ["--config", config, "--batches", "4", "--checkpoint-dir", str(ck), *latest_only]
        )
    assert code == 0 and again["steps_completed"] == 4, err[-3000:]
    assert f"continuing this run's checkpoint {first['checkpoint']} at batch 2" in caplog.text
    kept = sorted(p.name for p in (ck / "determined").iterdir() if not p.name.startswith("."))
    assert kept == [Path(again["checkpoint"]).name]  # the run's earlier checkpoint is not kept unseen
    caplog.clear()
    with caplog.at_level("WARNING", logger="squad"):
        code, restarted, err = run_train(
            ["--config", config, "--batches", "1", "--checkpoint-dir", str(ck), "--restart", *latest_only]
        )
    assert code == 0 and restarted["steps_completed"] == 1, err[-3000:]
    said = caplog.text
    assert "--restart: training from the beginning; 1 earlier checkpoint(s)" in said and " MB (" in said
    assert again["checkpoint"] in said


def test_placeholders_and_settings_without_their_section_are_explained(trained, tmp_path: Path) -> None:
    """The README's UUID pasted as it is, to --resume as to predict.py: the same explanation; a
    setting typed without its section: the key to type."""
    checkpoint, _ = trained
    pasted = ["--config", str(trained_config(checkpoint)), "--resume", "checkpoints/determined/UUID",
              "--checkpoint-dir", str(tmp_path / "c")]  # fmt: skip
    code, _, err = run_train(pasted)
    assert code == 2 and "UUID stands for a checkpoint's directory name" in err, err[-2000:]
    assert "python3 train.py --checkpoints" in err
    code, _, err = run_train(["--set", "learning_rate=1e-4", "--dry-run"])
    assert code == 2 and "--set hyperparameters.learning_rate=1e-4" in err, err[-2000:]
