"""What a person running `python3 train.py` sees: progress and scores, not Determined's raw log.

On a terminal one line is redrawn in place (bar, batch N of total, epoch, loss, learning rate,
samples/s, time left); elsewhere (CI, a pipe) the same facts print as plain lines. Validation
scores print as their own line. Everything goes to stderr: stdout's last line stays the run's
JSON result. Cluster runs never get this callback; their WebUI log stays Determined's.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from typing import Any, TextIO

from determined import pytorch


def quiet_determined_log() -> None:
    """Local runs: Determined's local-mode INFO lines (report_progress, status, tensorboard
    uploads) repeat what the progress line shows; warnings and errors still print."""
    logging.getLogger("determined").setLevel(logging.WARNING)


def duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


class Progress(pytorch.PyTorchCallback):
    """A progress update after the first batch (its time as the first estimate of what is left),
    then one per training report (every scheduling_unit batches)."""

    def __init__(
        self,
        context: Any,
        total_batches: int | None,
        batches_per_epoch: int,
        global_batch_size: int,
        stream: TextIO | None = None,
    ) -> None:
        self.context = context
        self.total = total_batches
        self.per_epoch = max(1, batches_per_epoch)
        self.global_batch_size = global_batch_size
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self._rate: float | None = None  # samples/s of the last window (perf_metrics)
        self._drawn = False
        self._done = 0  # batches trained so far (context.current_train_batch() fails before any)
        self._first: tuple[int, float] | None = None  # (the run's first batch index, its start)

    def on_trial_startup(self, first_batch_idx: int, checkpoint_uuid: str | None) -> None:
        self._done = first_batch_idx  # a resumed run starts above zero

    def before_batch(self, batch_idx: int) -> None:
        """Called by the trial before each batch: after the run's first batch, say so at once
        rather than after a whole reporting period (minutes on a CPU)."""
        if self._first is None:
            self._first = (batch_idx, time.monotonic())
        elif batch_idx == self._first[0] + 1:  # the first batch is done
            seconds = time.monotonic() - self._first[1]
            # Slower than the rest (warm-up); the first report's rate replaces it.
            rate = self.global_batch_size / seconds if seconds > 0 else None
            self._emit(self._line(batch_idx, {}, rate) + "  (estimate from the first batch)", final=False)

    def on_training_workload_end(self, avg_metrics: dict[str, Any], batch_metrics: Any) -> None:
        self._done = self.context.current_train_batch() + 1
        # The window's wall-clock rate, as the WebUI charts it (training time only).
        self._rate = avg_metrics.get("perf_samples_per_s") or self._rate
        self._emit(self._line(self._done, avg_metrics, self._rate), final=False)

    def _line(self, done: int, metrics: dict[str, Any], rate: float | None) -> str:
        parts = []
        if self.total:
            epochs = math.ceil(self.total / self.per_epoch)
            epoch = min(math.ceil(done / self.per_epoch), epochs)  # the epoch batch `done` was in
            filled = round(24 * min(done, self.total) / self.total)
            parts.append(f"[{'#' * filled}{'.' * (24 - filled)}] batch {done}/{self.total}")
            parts.append(f"epoch {epoch}/{epochs}")
        else:
            parts.append(f"batch {done}")
        if "loss" in metrics:
            parts.append(f"loss {float(metrics['loss']):.4f}")
        if "lr" in metrics:
            parts.append(f"lr {float(metrics['lr']):.2e}")
        if rate:
            parts.append(f"{rate:.1f} samples/s")
            if self.total:
                parts.append(f"left {duration((self.total - done) * self.global_batch_size / rate)}")
        return "  ".join(parts)

    def on_validation_end(self, metrics: dict[str, Any]) -> None:
        shown = {k: metrics[k] for k in ("exact_match", "f1") if k in metrics}
        scores = "  ".join(f"{k} {float(v):.2f}" for k, v in shown.items())
        self._emit(f"validation after batch {self._done}: {scores}", final=True)

    def on_trial_shutdown(self) -> None:
        if self.live and self._drawn:
            self.stream.write("\n")
            self.stream.flush()

    def _emit(self, line: str, final: bool) -> None:
        if self.live:
            # Redraw in place; a final line (scores) stays and the next redraw starts below it.
            self.stream.write("\r\033[K" + line + ("\n" if final else ""))
            self._drawn = not final
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
