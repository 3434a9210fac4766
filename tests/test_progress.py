"""What a local run shows while it trains: one progress line per report, redrawn in place on a
terminal, instead of Determined's log."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.cli_result import last_json
from tests.support.project import ROOT, tiny_config, write_yaml


def test_local_run_shows_progress_not_determineds_log(tiny_bert: Path, tmp_path: Path) -> None:
    path = write_yaml(tiny_config(tiny_bert, tmp_path), tmp_path / "exp.yaml")
    out = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "--config", str(path), "--batches", "4"]
        + ["--checkpoint-dir", str(tmp_path / "ckpt")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "f1" in last_json(out.stdout)  # the result stays the last stdout line
    lines = out.stderr.splitlines()
    assert any(line.startswith("[") and "batch 4/4" in line and "samples/s" in line for line in lines), (
        out.stderr
    )
    assert any(line.startswith("validation after batch 4: exact_match") for line in lines), out.stderr
    assert "report_progress" not in out.stderr and "upload_tensorboard_files" not in out.stderr
    assert "Writing model shards" not in out.stderr  # transformers' own bars stay out of the way


def test_progress_redraws_in_place_on_a_terminal() -> None:
    import io

    from extractive_qa.launch import progress

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    class Context:
        batch: int | None = None

        def current_train_batch(self) -> int:
            if self.batch is None:
                raise RuntimeError("Training hasn't started.")  # as Determined's context does
            return self.batch

    screen, context = Terminal(), Context()
    bar = progress.Progress(
        context, total_batches=40, batches_per_epoch=20, global_batch_size=16, stream=screen
    )
    bar.on_trial_startup(10, None)
    bar.on_training_start()
    context.batch = 9
    bar.on_training_workload_end({"loss": 2.5, "lr": 1e-4}, None)
    context.batch = 19
    bar.on_training_workload_end({"loss": 2.0, "lr": 9e-5, "perf_samples_per_s": 32.0}, None)
    bar.on_validation_end({"exact_match": 40.0, "f1": 50.0})
    bar.on_trial_shutdown()
    text = screen.getvalue()
    assert text.startswith("\r\033[K[") and "batch 20/40  epoch 1/2  loss 2.0000  lr 9.00e-05" in text
    # the window's rate as the trial reports it (perf_metrics): 20 batches x 16 left at 32/s
    assert "lr 9.00e-05  32.0 samples/s  left 0m10s" in text
    assert text.endswith("validation after batch 20: exact_match 40.00  f1 50.00\n")
    assert progress.duration(3725) == "1h02m" and progress.duration(65) == "1m05s"


def test_the_first_estimate_leaves_the_first_batchs_set_up_out() -> None:
    """A first batch 60 times a steady one (one-time set-up, as an AVX2-only CPU showed) must not
    become the estimate: 204 batches at 1 s each are 3-4 minutes, not hours."""
    import io

    from extractive_qa.launch import progress

    now = [0.0]
    screen = io.StringIO()
    bar = progress.Progress(
        None,
        total_batches=204,
        batches_per_epoch=68,
        global_batch_size=16,
        stream=screen,
        clock=lambda: now[0],
    )
    bar.on_trial_startup(0, None)
    for batch, took in enumerate([60.0, 1.0, 1.0, 1.0, 1.0]):
        bar.before_batch(batch)
        now[0] += took
    lines = screen.getvalue().splitlines()
    assert lines == [
        "[........................] batch 4/204  epoch 1/3  16.0 samples/s  left 3m20s"
        "  (estimate from batches 2-4; batch 1 took 60.0 s with set-up; each report replaces it)"
    ], lines
