"""train.py --checkpoints: one line per checkpoint of --checkpoint-dir, naming the run that wrote
it from the checkpoint's own records, with what a damaged or planted record cannot change."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from tests.support.project import run_main


def _copy(checkpoint: Path, storage: Path, name: str) -> Path:
    target = storage / "determined" / name
    shutil.copytree(checkpoint, target)
    return target


def test_each_checkpoint_is_named_by_its_run(trained: tuple[Path, dict], tmp_path: Path) -> None:
    checkpoint, result = trained
    first = _copy(checkpoint, tmp_path, "first")
    second = _copy(checkpoint, tmp_path, "second")
    record = json.loads((second / "experiment.json").read_text())
    record["identity"].update({"name": "squad-v2\x1b[2Jrun", "data.squad_version": "2.0"})
    (second / "experiment.json").write_text(json.dumps(record))
    damaged = _copy(checkpoint, tmp_path, "damaged")
    (damaged / "metadata.json").write_text("{not json")
    (damaged / "experiment.json").unlink()
    outside = tmp_path / "big.bin"
    outside.write_bytes(b"\0" * 5_000_000)
    os.symlink(outside, first / "linked.bin")  # a link is not the checkpoint's bytes
    for n, folder in enumerate((first, second, damaged)):
        os.utime(folder, (1_700_000_000 + n, 1_700_000_000 + n))  # listed oldest first

    code, out, err = run_main(["train.py", "--checkpoints", "--checkpoint-dir", str(tmp_path)], cwd=tmp_path)
    assert code == 0, err
    header, *lines = out.strip().splitlines()
    assert header.split()[:3] == ["written", "checkpoint", "run"]
    assert [line.split()[2] for line in lines] == [
        "determined/first",
        "determined/second",
        "determined/damaged",
    ]  # relative to where the command was typed, so it can be pasted into --checkpoint
    steps = str(result["steps_completed"])
    em_f1 = f"{result['exact_match']:.2f} / {result['f1']:.2f}"
    assert f" {steps} of 6 " in lines[0] and em_f1 in lines[0]
    assert "squad-v2?[2Jrun" in lines[1] and "\x1b" not in out  # recorded text cannot drive the terminal
    assert " 2.0 " in lines[1] and " 1.1 " in lines[0]
    assert lines[2].split()[3:] == ["?"] * 6 + ["-", "-", "-"] + lines[2].split()[-2:], lines[2]
    size = sum(f.stat().st_size for f in checkpoint.rglob("*") if f.is_file())
    assert lines[0].endswith(f"{size / 1e6:,.0f} MB")  # the 5 MB behind the link not counted


def test_no_checkpoints_is_one_line(tmp_path: Path) -> None:
    code, out, _ = run_main(["train.py", "--checkpoints", "--checkpoint-dir", str(tmp_path / "none")])
    assert code == 0
    assert out.strip() == (
        f"no checkpoints in {tmp_path / 'none' / 'determined'} (a run writes them there; "
        "--checkpoint-dir names another directory)"
    )


def test_runs_of_one_name_are_told_apart_by_optimizer_and_changed_settings(
    trained: tuple[Path, dict], tmp_path: Path
) -> None:
    """The RAdam run of the README and the default one share a name: the listing shows each one's
    optimizer and the settings in which it differs from the other (it showed only "2 of 50")."""
    checkpoint, _ = trained
    default = _copy(checkpoint, tmp_path, "default")
    radam = _copy(checkpoint, tmp_path, "radam")
    record = json.loads((radam / "experiment.json").read_text())
    record["identity"].update({"hyperparameters.optimizer": "radam", "hyperparameters.adam_beta2": 0.95})
    (radam / "experiment.json").write_text(json.dumps(record))
    for n, folder in enumerate((default, radam)):
        os.utime(folder, (1_700_000_000 + n, 1_700_000_000 + n))
    code, out, err = run_main(["train.py", "--checkpoints", "--checkpoint-dir", str(tmp_path)], cwd=tmp_path)
    assert code == 0, err
    _, first, second = out.strip().splitlines()
    assert " adamw " in first and " radam " in second
    assert "adam_beta2=0.95" in second and "adam_beta2=0.999" in first


def test_each_score_names_the_questions_it_was_scored_on(trained: tuple[Path, dict], tmp_path: Path) -> None:
    """Scores of two validation files look alike: the listing names each checkpoint's file (and
    the first N questions where a run validated on a subset)."""
    checkpoint, _ = trained
    mine = _copy(checkpoint, tmp_path, "subset")
    record = json.loads((mine / "experiment.json").read_text())
    record["settings"].update({"data.validation_file": "my-dev.json", "data.max_eval_examples": 40})
    (mine / "experiment.json").write_text(json.dumps(record))
    code, out, err = run_main(["train.py", "--checkpoints", "--checkpoint-dir", str(tmp_path)], cwd=tmp_path)
    assert code == 0, err
    header, row = out.strip().splitlines()
    assert "validated on" in header and "my-dev.json (first 40)" in row
