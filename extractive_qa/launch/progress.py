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
from collections.abc import Callable
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
    """A first estimate of what is left after a few batches, then one update per training report
    (every scheduling_unit batches).

    The run's first batch carries one-time set-up (kernel selection, allocator growth, the first
    window width): on some CPUs it takes many times a steady batch, and an estimate drawn from it
    said more than an hour for a six-minute run. The first estimate is therefore drawn from the
    batches after it (up to ESTIMATE_BATCHES of them, or ESTIMATE_SECONDS of training), and the
    line says so and what the first batch took.
    """

    ESTIMATE_BATCHES = 3
    ESTIMATE_SECONDS = 20.0

    def __init__(
        self,
        context: Any,
        total_batches: int | None,
        batches_per_epoch: int,
        global_batch_size: int,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.context = context
        self.total = total_batches
        self.per_epoch = max(1, batches_per_epoch)
        self.global_batch_size = global_batch_size
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self.clock = clock
        self._rate: float | None = None  # samples/s of the last window (perf_metrics)
        self._drawn = False
        self._done = 0  # batches trained so far (context.current_train_batch() fails before any)
        self._starts: list[tuple[int, float]] = []  # (batch index, its start) until the estimate
        self._estimated = False

    def on_trial_startup(self, first_batch_idx: int, checkpoint_uuid: str | None) -> None:
        self._done = first_batch_idx  # a resumed run starts above zero

    def before_batch(self, batch_idx: int) -> None:
        """Called by the trial before each batch: a first estimate after a few batches, rather
        than after a whole reporting period (minutes on a CPU)."""
        if self._estimated or self._rate is not None:
            return
        self._starts.append((batch_idx, self.clock()))
        if len(self._starts) < 3:  # the first batch and at least one after it
            return
        (first, t0), (second, t1), (last, now) = self._starts[0], self._starts[1], self._starts[-1]
        if last - second < self.ESTIMATE_BATCHES and now - t1 < self.ESTIMATE_SECONDS:
            return
        self._estimated = True
        rate = self.global_batch_size * (last - second) / (now - t1) if now > t1 else None
        note = (
            f"  (estimate from batches {second + 1}-{last}; batch {first + 1} took "
            f"{t1 - t0:.1f} s with set-up; each report replaces it)"
        )
        self._emit(self._line(last, {}, rate) + note, final=False)

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
