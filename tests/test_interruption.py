"""Ctrl-C and SIGTERM in a local run: the run stops at a batch boundary, keeps a checkpoint, says
how to resume, and the resumed run ends where an uninterrupted one does; `--resume auto` starts
fresh the first time and continues after a kill, alone and under torchrun."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.cli_result import last_json
from tests.support.project import ROOT, run_train, tiny_config, write_yaml

BATCHES = 300  # long enough that a signal sent after the first batch lands mid-run


def _config(tiny_bert: Path, tmp_path: Path) -> Path:
    conf = tiny_config(tiny_bert, tmp_path)
    conf["hyperparameters"].update(learning_rate=3e-3, warmup_ratio=0.1)
    conf["scheduling_unit"] = 50
    return write_yaml(conf, tmp_path / "exp.yaml")


def _start(cmd: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True,  # a signal for this run only, not for pytest
    )  # fmt: skip


def _signal_after_first_batch(proc: subprocess.Popen, signum: int, group: bool = False) -> str:
    """Wait for the first progress line (training has begun), send `signum`; return stderr."""
    seen, deadline = [], time.monotonic() + 300
    assert proc.stderr is not None
    for line in proc.stderr:
        seen.append(line)
        if "batch" in line and "estimate from batches" in line:
            os.killpg(proc.pid, signum) if group else proc.send_signal(signum)
            break
        assert time.monotonic() < deadline, "".join(seen)[-3000:]
    rest = proc.communicate(timeout=300)[1]
    return "".join(seen) + rest


def test_ctrl_c_keeps_a_checkpoint_and_its_resume_equals_the_uninterrupted_run(
    tiny_bert: Path, tmp_path: Path
) -> None:
    config = _config(tiny_bert, tmp_path)
    ckpt = tmp_path / "interrupted"
    cmd = [sys.executable, "train.py", "--config", str(config), "--checkpoint-dir", str(ckpt),
           "--batches", str(BATCHES)]  # fmt: skip
    proc = _start(cmd)
    err = _signal_after_first_batch(proc, signal.SIGINT)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert "SIGINT: stopping after this batch and writing a checkpoint" in err
    line = next(line for line in err.splitlines() if line.startswith("stopped after "))
    stopped = int(line.split()[2])
    assert 0 < stopped < BATCHES
    kept = Path(line.split("checkpoint kept: ")[1].split(". Resume with:")[0])
    kept = kept if kept.is_absolute() else ROOT / kept
    assert json.loads((kept / "metadata.json").read_text())["steps_completed"] == stopped
    # The printed command, run as printed (from the directory the first one ran in).
    resume = shlex.split(line.split("Resume with: ")[1])
    assert resume[:2] == ["python3", "train.py"] and resume[-2] == "--resume"
    out = subprocess.run([sys.executable, *resume[1:]], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    resumed = last_json(out.stdout)
    code, full, err = run_train(["--config", str(config), "--checkpoint-dir", str(tmp_path / "full"),
                                 "--batches", str(BATCHES)])  # fmt: skip
    assert code == 0, err
    assert resumed["steps_completed"] == full["steps_completed"] == BATCHES
    for key in ("exact_match", "f1", "last_train_loss"):
        assert resumed[key] == pytest.approx(full[key], abs=1e-6), key


def test_resume_auto_starts_fresh_then_continues_after_sigterm_under_torchrun(
    tiny_bert: Path, tmp_path: Path
) -> None:
    """The README's torchrun line, twice: the first launch has no checkpoint and starts fresh;
    SIGTERM to torchrun (as a scheduler stops a job) keeps a checkpoint; the same command then
    continues from it and finishes."""
    from extractive_qa import scaling_runs

    config = _config(tiny_bert, tmp_path)
    program = [str(ROOT / "train.py"), "--config", str(config), "--checkpoint-dir", str(tmp_path / "c"),
               "--batches", str(BATCHES), "--resume", "auto"]  # fmt: skip
    cmd, env = scaling_runs.torchrun(2, program)
    first = _start(cmd, env)
    err = _signal_after_first_batch(first, signal.SIGTERM, group=True)
    assert "--resume auto: no checkpoint of this run" in err, err[-3000:]
    assert "Traceback" not in err.split("SIGTERM: stopping")[0]
    storage = tmp_path / "c" / "determined"
    kept = [json.loads(m.read_text())["steps_completed"] for m in storage.glob("*/metadata.json")]
    assert len(kept) == 1 and 0 < kept[0] < BATCHES, err[-3000:]
    second = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "--resume auto: continuing from" in second.stderr
    assert last_json(second.stdout)["steps_completed"] == BATCHES


def test_resume_latest_takes_only_this_runs_checkpoints(
    tiny_bert: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A shared checkpoint directory: another experiment's newer checkpoint is not this run's to
    continue; an explicit --resume of it names each changed setting (exit 2). Extending the run
    says that the schedule is planned again."""
    config = _config(tiny_bert, tmp_path)
    other = tmp_path / "other.yaml"
    other.write_text(config.read_text().replace("learning_rate: 0.003", "learning_rate: 0.001"))
    shared = ["--checkpoint-dir", str(tmp_path / "shared")]
    assert run_train(["--config", str(config), *shared, "--batches", "2"])[0] == 0
    assert run_train(["--config", str(other), *shared, "--batches", "2"])[0] == 0
    storage = tmp_path / "shared" / "determined"
    again = ["--config", str(config), *shared, "--batches", "4"]
    code, result, err = run_train([*again, "--resume", "latest"])
    assert code == 0, err
    assert "planned for 2 batches, this one for 4 batches" in caplog.text
    mine = json.loads((Path(result["checkpoint"]) / "experiment.json").read_text())["identity"]
    assert mine["hyperparameters.learning_rate"] == 0.003
    others = [m.parent for m in storage.glob("*/experiment.json")
              if json.loads(m.read_text())["identity"]["hyperparameters.learning_rate"] == 0.001]  # fmt: skip
    code, _, err = run_train([*again, "--resume", str(others[0])])
    assert code == 2 and "hyperparameters.learning_rate: 0.001 -> 0.003" in err and "--allow-changed" in err
    code, _, err = run_train([*again, "--resume", str(others[0]), "--allow-changed"])
    assert code == 0, err


def test_sigterm_exits_143_and_a_second_ctrl_c_stops_at_once(tiny_bert: Path, tmp_path: Path) -> None:
    """SIGTERM (a scheduler's stop): the batch finishes, a checkpoint is kept, exit 143. Ctrl-C
    twice: the second stops at once, without an exit checkpoint, exit 130."""
    config = _config(tiny_bert, tmp_path)
    term = [sys.executable, "train.py", "--config", str(config), "--checkpoint-dir", str(tmp_path / "t"),
            "--batches", str(BATCHES)]  # fmt: skip
    proc = _start(term)
    err = _signal_after_first_batch(proc, signal.SIGTERM)
    assert proc.returncode == 143, err[-3000:]
    assert "stopped after " in err and "checkpoint kept:" in err and "Traceback" not in err
    twice = [*term[:-4], "--checkpoint-dir", str(tmp_path / "i"), "--batches", str(BATCHES)]
    proc = _start(twice)
    seen = []
    assert proc.stderr is not None
    for line in proc.stderr:  # the first Ctrl-C once training runs, the second when it is heard
        seen.append(line)
        if "estimate from batches" in line:
            proc.send_signal(signal.SIGINT)
        if "SIGINT: stopping after this batch" in line:
            proc.send_signal(signal.SIGINT)
            break
    err = "".join(seen) + proc.communicate(timeout=300)[1]
    assert proc.returncode == 130, err[-3000:]
    assert "stopped at once (second Ctrl-C), without an exit checkpoint" in err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err


def test_retention_keeps_the_newest_checkpoint_and_latest_refuses_without_one(
    tiny_bert: Path, tmp_path: Path
) -> None:
    """A local run keeps what checkpoint_storage says (save_trial_latest 1, save_trial_best 0:
    the newest only) and deletes its older ones; `--resume latest` with none of this run there
    is an error (exit 2), `auto` starts fresh."""
    conf = tiny_config(tiny_bert, tmp_path)
    conf["min_checkpoint_period"] = {"batches": 2}
    conf["checkpoint_storage"] = {"type": "shared_fs", "host_path": "/tmp", "save_trial_latest": 1,
                                  "save_trial_best": 0}  # fmt: skip
    config = write_yaml(conf, tmp_path / "exp.yaml")
    store = ["--config", str(config), "--checkpoint-dir", str(tmp_path / "c")]
    code, _, err = run_train([*store, "--resume", "latest", "--batches", "6"])
    assert code == 2 and "--resume latest: no complete checkpoint of this run" in err, err[-2000:]
    code, result, err = run_train([*store, "--resume", "auto", "--batches", "6"])
    assert code == 0, err[-2000:]
    kept = [
        json.loads(m.read_text())["steps_completed"]
        for m in (tmp_path / "c" / "determined").glob("*/metadata.json")
    ]
    assert kept == [6] and result["steps_completed"] == 6  # the checkpoints at 2 and 4 were removed
