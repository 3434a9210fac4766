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


def test_the_same_run_typed_again_says_where_the_earlier_one_is(trained, tmp_path: Path, caplog) -> None:
    """The first command typed twice trained again from scratch without a word; now it names the
    earlier checkpoint and how to see its result without training."""
    checkpoint, _ = trained
    earlier = tmp_path / "c" / "determined" / "earlier"
    shutil.copytree(checkpoint, earlier)
    config = str(trained_config(checkpoint))
    with caplog.at_level("WARNING", logger="squad"):
        code, result, err = run_train(
            ["--config", config, "--batches", "1", "--checkpoint-dir", str(tmp_path / "c")]
        )
    assert code == 0 and result["steps_completed"] == 1, err[-3000:]
    assert (
        f"a run with these settings already wrote {earlier}" in caplog.text and "--resume auto" in caplog.text
    )
    caplog.clear()
    with caplog.at_level("WARNING", logger="squad"):
        code, _, err = run_train(
            ["--config", config, "--batches", "1", "--checkpoint-dir", str(tmp_path / "d")]
        )
    assert code == 0 and "already wrote" not in caplog.text
