"""Exact resume (mid-epoch, aggregation 2, bf16, two processes, from before the stage layout) and
what a resume refuses."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from extractive_qa.launch import local_run
from extractive_qa.trial import callbacks
from tests.support.cli_result import last_json
from tests.support.project import ROOT, run_train, tiny_config, write_yaml

# A local run keeps only its latest and best checkpoints (save_trial_latest / save_trial_best);
# these tests resume from the middle of a finished run.
KEEP_ALL = {"type": "shared_fs", "host_path": "/tmp", "save_trial_latest": 100}


def _checkpoints(root: Path) -> dict[int, Path]:
    out = {}
    for meta in (root / "determined").glob("*/metadata.json"):
        out[json.loads(meta.read_text())["steps_completed"]] = meta.parent
    return out


@pytest.mark.cluster_stack
def test_resume_mid_epoch_with_aggregation_equals_uninterrupted(tiny_bert: Path, tmp_path: Path) -> None:
    conf = tiny_config(tiny_bert, tmp_path)
    conf["optimizations"] = {"aggregation_frequency": 2}
    conf["min_checkpoint_period"] = {"batches": 6}
    conf["checkpoint_storage"] = KEEP_ALL
    conf["hyperparameters"]["warmup_ratio"] = 0.2
    conf["hyperparameters"]["learning_rate"] = 3e-3
    path = write_yaml(conf, tmp_path / "exp.yaml")
    full_dir = tmp_path / "full"
    code, full, err = run_train(["--config", str(path), "--checkpoint-dir", str(full_dir), "--batches", "12"])
    assert code == 0, err
    mid = _checkpoints(full_dir)[6]  # taken mid-epoch (an epoch here is ~100 batches)
    code, resumed, err = run_train(
        [
            "--config",
            str(path),
            "--checkpoint-dir",
            str(tmp_path / "resumed"),
            "--resume",
            str(mid),
            "--batches",
            "12",
        ]
    )
    assert code == 0, err
    assert resumed["steps_completed"] == full["steps_completed"] == 12
    for key in ("exact_match", "f1", "last_train_loss"):
        assert resumed[key] == pytest.approx(full[key], abs=1e-6), key


@pytest.mark.cluster_stack
def test_bf16_resume_equals_uninterrupted(tiny_bert: Path, tmp_path: Path) -> None:
    """bf16 autocast over fp32 weights and AdamW state: a run resumed mid-epoch ends where the
    uninterrupted run does."""
    conf = tiny_config(tiny_bert, tmp_path)
    conf["min_checkpoint_period"] = {"batches": 4}
    conf["checkpoint_storage"] = KEEP_ALL
    conf["hyperparameters"].update(precision="bf16", warmup_ratio=0.2, learning_rate=3e-3)
    path = write_yaml(conf, tmp_path / "exp.yaml")
    full_dir = tmp_path / "full"
    code, full, err = run_train(["--config", str(path), "--checkpoint-dir", str(full_dir), "--batches", "8"])
    assert code == 0, err
    mid = _checkpoints(full_dir)[4]
    resume = ["--checkpoint-dir", str(tmp_path / "resumed"), "--resume", str(mid), "--batches", "8"]
    code, resumed, err = run_train(["--config", str(path), *resume])
    assert code == 0, err
    assert resumed["steps_completed"] == full["steps_completed"] == 8
    for key in ("exact_match", "f1", "last_train_loss"):
        assert resumed[key] == pytest.approx(full[key], abs=1e-6), key


def _torchrun_train(conf_path: Path, checkpoint_dir: Path, *extra: str) -> dict:
    from extractive_qa import scaling_runs

    program = [str(ROOT / "train.py"), "--config", str(conf_path), "--checkpoint-dir", str(checkpoint_dir)]
    cmd, env = scaling_runs.torchrun(2, [*program, *extra])
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    return last_json(out.stdout)


@pytest.mark.cluster_stack
def test_two_process_resume_equals_uninterrupted(tiny_bert: Path, tmp_path: Path) -> None:
    """Each rank resumes its own random stream. Determined restores the chief's on every rank;
    the ranks' dropout draws differ once their padded batch widths do (with this seed, from batch
    10: 112 vs 104 tokens), so a restart from batch 12 continued rank 1 on rank 0's stream."""
    conf = tiny_config(tiny_bert, tmp_path)
    conf["min_checkpoint_period"] = {"batches": 12}
    conf["checkpoint_storage"] = KEEP_ALL
    conf["hyperparameters"]["learning_rate"] = 3e-3
    path = write_yaml(conf, tmp_path / "exp.yaml")
    full = _torchrun_train(path, tmp_path / "full", "--batches", "20")
    mid = _checkpoints(tmp_path / "full")[12]
    resumed = _torchrun_train(path, tmp_path / "resumed", "--resume", str(mid), "--batches", "20")
    assert resumed["steps_completed"] == full["steps_completed"] == 20
    for key in ("exact_match", "f1", "last_train_loss"):
        assert resumed[key] == pytest.approx(full[key], abs=1e-6), key


def test_resume_rejects_a_foreign_directory(tiny_bert: Path, tmp_path: Path) -> None:
    path = write_yaml(tiny_config(tiny_bert, tmp_path), tmp_path / "exp.yaml")
    code, _, err = run_train(["--config", str(path), "--resume", str(tmp_path)])
    assert code == 2 and "not a checkpoint written by train.py" in err


@pytest.mark.cluster_stack
@pytest.mark.parametrize("damage", ["truncated_state", "missing_metadata"])
def test_damaged_checkpoint_is_refused_before_training(damage: str, trained, tmp_path: Path) -> None:
    import shutil

    checkpoint, _ = trained
    conf_path = checkpoint.parents[2] / "exp.yaml"  # the fixture's tmp/ckpt/determined/UUID
    ckpt = tmp_path / "copy"
    shutil.copytree(checkpoint, ckpt)
    if damage == "truncated_state":
        state = ckpt / "state_dict.pth"
        state.write_bytes(state.read_bytes()[: state.stat().st_size - 1000])
        expected = "state_dict.pth: damaged or truncated checkpoint"
    else:
        (ckpt / "metadata.json").unlink()
        expected = "incomplete checkpoint, metadata.json is missing"
    code, out, err = run_train(["--config", str(conf_path), "--resume", str(ckpt)])
    assert code == 2 and out is None and expected in err and "Traceback" not in err


def test_run_log_counts_steps_before_the_first_batch() -> None:
    """A checkpoint or validation before any batch of this run (step-zero validation, or a resumed
    run whose final validation is pending) reports where the run starts, not a batch index."""
    from determined import errors

    class Context:
        def current_train_batch(self) -> int:
            raise errors.InternalException("Training hasn't started.")

    class Trial:
        context = Context()

    Trial.context._current_batch_idx = None  # what Determined's context holds before a batch
    log = callbacks.RunLog(Trial())  # type: ignore[arg-type]
    series = local_run.MetricSeries(log)
    log.on_trial_startup(12, "some-uuid")
    log.on_validation_end({"f1": 1.0})
    series.on_validation_end({"f1": 1.0})
    log.on_checkpoint_save_start({})
    assert log.steps_completed == 12 and series.series["validation"][0]["steps_completed"] == 12


PRE_MOVE = ROOT / "tests" / "fixtures" / "pre-move-checkpoint"


@pytest.mark.cluster_stack
def test_a_checkpoint_from_before_the_stage_layout_resumes_exactly(tmp_path: Path) -> None:
    """tests/fixtures/pre-move-checkpoint: a tiny BERT (400-token WordPiece vocabulary trained on
    the excerpts) trained 8 batches by the code as it was before the library moved into its stage
    subpackages, with the checkpoint it wrote at batch 4 and the uninterrupted run's results.
    Resumed from batch 4 today, it loads and trains on: no saved file names a module path, so
    moving modules never orphans a checkpoint. On the software that wrote it (its metadata's
    torch) the run ends with the uninterrupted run's results; another torch's kernels and random
    draws give other numbers from the same restored state, so there it only has to finish."""
    fixture = tmp_path / "pre-move"
    shutil.copytree(PRE_MOVE, fixture)
    conf = tiny_config(fixture / "model", tmp_path, validation_file=str(fixture / "dev.json"))
    conf["data"].update(max_seq_length=64, doc_stride=16, max_query_length=16)
    conf["name"] = "pre-move"
    # dropout_masks: torch -- the masks the code that wrote the fixture drew (before the fast ones)
    conf["hyperparameters"].update(learning_rate=3e-3, warmup_ratio=0.2, dropout_masks="torch")
    conf["hyperparameters"]["train_length"] = {"type": "const", "val": {"batches": 8}}
    conf["min_checkpoint_period"] = {"batches": 4}
    conf["checkpoint_storage"] = KEEP_ALL
    path = write_yaml(conf, tmp_path / "exp.yaml")
    resume = ["--resume", str(fixture / "checkpoint"), "--checkpoint-dir", str(tmp_path / "ckpt")]
    code, result, err = run_train(["--config", str(path), *resume])
    assert code == 0, err
    expected = json.loads((fixture / "expected.json").read_text())
    assert result["steps_completed"] == expected["steps_completed"] == 8
    written_by = json.loads((fixture / "checkpoint" / "metadata.json").read_text())["framework"]
    if written_by != f"torch-{torch.__version__}":
        assert 0 <= result["f1"] <= 100 and result["last_train_loss"] > 0
        return
    for key in ("exact_match", "f1", "last_train_loss"):
        assert result[key] == pytest.approx(expected[key], abs=1e-6), key


# --------------------------------------------------------------------------------------------
# A resume of other data, and one with nothing left to train.
# --------------------------------------------------------------------------------------------


@pytest.mark.cluster_stack
def test_changed_training_data_at_the_same_path_is_refused(trained, tmp_path: Path, caplog) -> None:
    """The same data.train_file path with other questions in it is another run: refused as
    changed settings are (both digests named), continued with --allow-changed."""
    import yaml

    from tests.support.project import trained_config

    checkpoint, _ = trained
    conf = yaml.safe_load(trained_config(checkpoint).read_text())
    original = Path(conf["data"]["train_file"])
    edited = json.loads(original.read_text())
    edited["data"][0]["paragraphs"] = edited["data"][0]["paragraphs"][:-1]  # one paragraph fewer
    train = tmp_path / original.name
    train.write_text(json.dumps(edited))
    conf["data"]["train_file"] = str(train)
    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump(conf))
    args = ["--config", str(config), "--batches", "8", "--checkpoint-dir", str(tmp_path / "c")]
    # the same path, other content: the checkpoint's own record says so
    record_dir = tmp_path / "same-path"
    shutil.copytree(checkpoint, record_dir)
    record = json.loads((record_dir / "experiment.json").read_text())
    record["identity"]["data.train_file"] = str(train)
    (record_dir / "experiment.json").write_text(json.dumps(record))
    code, _, err = run_train([*args, "--resume", str(record_dir)])
    _refused(code, err, "the training data differ", "--allow-changed")
    with caplog.at_level("WARNING", logger="squad"):
        code, result, err = run_train([*args, "--resume", str(record_dir), "--allow-changed"])
    assert code == 0 and result["steps_completed"] == 8, err[-3000:]
    assert "with changed data (--allow-changed)" in caplog.text
    # the file's first 100 questions only: a subset is other data too, named by its setting
    subset = ["--set", "data.max_train_examples=100", "--resume", str(checkpoint)]
    code, _, err = run_train(["--config", str(trained_config(checkpoint)), *args[2:], *subset])
    _refused(code, err, "data.max_train_examples: None -> 100")


def _refused(code: int, err: str, *needles: str) -> None:
    assert code == 2 and "Traceback" not in err, err[-3000:]
    for needle in needles:
        assert needle in err, (needle, err[-3000:])


@pytest.mark.cluster_stack
def test_a_length_that_trains_nothing(trained, tmp_path: Path, caplog) -> None:
    """--resume DIR with --batches not beyond the checkpoint's: refused, saying how to continue.
    --resume auto on a finished run: exit 0 with the scores its checkpoint recorded."""
    from tests.support.project import trained_config

    checkpoint, trained_result = trained
    config = str(trained_config(checkpoint))
    code, _, err = run_train(["--config", config, "--resume", str(checkpoint), "--batches", "6",
                              "--checkpoint-dir", str(tmp_path / "c")])  # fmt: skip
    _refused(code, err, "has trained 6 batches", "nothing is left to train", "--batches")
    with caplog.at_level("INFO", logger="squad"):
        code, result, err = run_train(["--config", config, "--resume", "auto", "--batches", "6",
                                       "--checkpoint-dir", str(checkpoint.parents[1])])  # fmt: skip
    assert code == 0, err[-3000:]
    assert result["already_finished"] is True and result["steps_completed"] == 6
    assert result["f1"] == pytest.approx(trained_result["f1"]) and result["checkpoint"] == str(checkpoint)
    assert "already finished" in caplog.text


@pytest.mark.skipif(os.geteuid() != 0, reason="handing a checkpoint to another user needs root")
def test_resume_latest_continues_only_your_own_checkpoints(trained, tmp_path: Path, caplog) -> None:
    """In a storage root others can write, another user's checkpoint of the same settings with
    more steps is listed and skipped: --resume latest continues yours."""
    from tests.support.project import trained_config

    checkpoint, _ = trained
    config = str(trained_config(checkpoint))
    storage = tmp_path / "shared" / "determined"
    mine = shutil.copytree(checkpoint, storage / checkpoint.name)
    code, longer, err = run_train(["--config", config, "--resume", str(mine), "--batches", "8",
                                   "--checkpoint-dir", str(tmp_path / "theirs")])  # fmt: skip
    assert code == 0, err[-3000:]
    theirs = shutil.copytree(longer["checkpoint"], storage / "their-checkpoint")
    for path in [theirs, *theirs.rglob("*")]:
        os.lchown(path, 12345, 12345)
    with caplog.at_level("INFO", logger="squad"):
        code, result, err = run_train(["--config", config, "--resume", "latest", "--batches", "10",
                                       "--checkpoint-dir", str(tmp_path / "shared")])  # fmt: skip
    assert code == 0 and result["steps_completed"] == 10, err[-3000:]
    assert f"continuing from {mine}" in caplog.text
    assert "skipped 1 checkpoint(s)" in caplog.text and "their-checkpoint" in caplog.text


def test_a_resume_from_a_directory_says_where_it_goes_on_and_reads_each_record_once(
    trained, tmp_path: Path, caplog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--resume DIR logged no "continuing from ... at batch N" (only --resume auto did), and every
    resume printed Determined's "Ignoring partial checkpoint download from shared_fs", although
    nothing is partial (det_internals.quiet_shared_fs_selector_warning). Each file of the
    checkpoint, or of the checked copy the resume makes of it, is opened once: the rewrite hands
    what it parsed to the identity checks (experiment.json was parsed three to four times)."""
    import logging

    from extractive_qa.io import reading
    from extractive_qa.storage.private_copy import private_root

    checkpoint, _ = trained
    caplog.set_level(logging.INFO)
    from tests.support.project import trained_config

    opened: list[Path] = []
    real = reading.open_regular

    def counted(path: Path | str, *args: object, **kwargs: object) -> object:
        opened.append(Path(os.path.realpath(path)))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(reading, "open_regular", counted)
    args = ["--config", str(trained_config(checkpoint)), "--resume", str(checkpoint), "--batches", "7",
            "--checkpoint-dir", str(tmp_path / "c")]  # fmt: skip
    code, _, err = run_train(args)
    assert code == 0, err[-2000:]
    assert f"--resume {checkpoint}: continuing from {checkpoint} at batch 6" in caplog.text
    assert "Ignoring partial checkpoint download" not in caplog.text + err
    roots = [Path(os.path.realpath(checkpoint)), Path(os.path.realpath(private_root()))]
    read = [path for path in opened if any(path.is_relative_to(root) for root in roots)]
    assert any(path.name == "experiment.json" for path in read), opened
    again = sorted({str(path) for path in read if read.count(path) > 1})
    assert not again, f"opened more than once: {again}"
