"""Ctrl-C and SIGTERM in a local run: finish the batch, keep a checkpoint, say how to resume.

Python's default turns Ctrl-C into a KeyboardInterrupt wherever the process happens to be --
inside a collective, half-way through a checkpoint -- and SIGTERM kills it outright; either way
the work since the last checkpoint is gone. While a local run trains, both signals only set a
flag. Before each batch every rank asks whether any rank got one (one small all-reduce when
there are several ranks, so all of them stop at the same batch); if so, the trial raises
det_internals.stop_training() and Determined writes its exit checkpoint.

A second Ctrl-C in a single-process run stops at once without a checkpoint. Under torchrun the
second signal is not the user's: a terminal's Ctrl-C reaches every process, and torchrun
forwards the one it gets to its workers, then kills them 30 s later
(torch/distributed/elastic/agent/server/api.py `_shutdown`), so repeats are ignored there.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from extractive_qa import det_internals

EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}  # 128 + the signal, as a shell reports it


class StoppedNow(Exception):
    """A second Ctrl-C: the run stops where it is, without an exit checkpoint."""


class Interruption:
    """The signal flag of one rank and the per-batch check that turns it into a stop."""

    def __init__(self, distributed: Any, device: Any, before_stop: Callable[[], None] = lambda: None) -> None:
        self.distributed = distributed
        self.device = device
        self.before_stop = before_stop  # e.g. gather every rank's random state for the checkpoint
        self.signum: int | None = None
        self.stopped_at: int | None = None  # the batch index the run stopped before
        self.under_launcher = "TORCHELASTIC_RUN_ID" in os.environ
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> Interruption:
        """While training: the signals set the flag (Python's handlers are put back after)."""
        for signum in EXIT_CODES:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is None:
            self.signum = signum
            if self.distributed.rank == 0:
                again = "" if self.under_launcher else " (Ctrl-C again: stop now, without one)"
                name = signal.Signals(signum).name
                line = f"\n{name}: stopping after this batch and writing a checkpoint{again}"
                print(line, file=sys.stderr, flush=True)
            return
        if signum == signal.SIGINT and not self.under_launcher:
            raise StoppedNow()

    def requested(self) -> bool:
        """Whether any rank got a signal; every rank must call it at the same batch."""
        mine = self.signum is not None
        if self.distributed.size <= 1:
            return mine
        flag = torch.tensor([1 if mine else 0], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        anyone = bool(flag.item())
        if anyone and self.signum is None:
            self.signum = signal.SIGTERM  # another rank was signalled; this one stops with it
        return anyone

    def before_batch(self, batch_idx: int) -> None:
        """The trial calls this before a batch does any work."""
        if self.requested():
            self.stopped_at = batch_idx
            self.before_stop()
            raise det_internals.stop_training()

    def exit_code(self) -> int:
        return EXIT_CODES.get(signal.Signals(self.signum), 1) if self.signum else 0


# --------------------------------------------------------------------------------------------
# What the user is told: what was kept and the command that continues it.
# --------------------------------------------------------------------------------------------


class Interrupted(Exception):
    """A local run stopped by Ctrl-C or SIGTERM: at a batch boundary (with its exit checkpoint)
    or at once (a second Ctrl-C, `stopped_at` None)."""

    def __init__(self, code: int, stopped_at: int | None, checkpoint: str | None, rank: int) -> None:
        self.code, self.stopped_at, self.checkpoint, self.rank = code, stopped_at, checkpoint, rank


def shown_path(path: str, start_dir: Path) -> str:
    """A path as the user would type it from where they started the command."""
    return os.path.relpath(path, start_dir) if Path(path).is_relative_to(start_dir) else path


def resume_command(checkpoint: str, start_dir: Path) -> str:
    """The command that continues an interrupted run: this one, with --resume CHECKPOINT (under
    torchrun: the same torchrun line with --resume auto)."""
    kept, skip = [], False
    for arg in sys.argv[1:]:
        if skip:
            skip = False
        elif arg == "--resume":
            skip = True
        elif not arg.startswith("--resume="):
            kept.append(arg)
    if "TORCHELASTIC_RUN_ID" in os.environ:
        return "the same torchrun command, with --resume auto"
    script = os.path.relpath(sys.argv[0], start_dir)
    return shlex.join(["python3", script, *kept, "--resume", shown_path(checkpoint, start_dir)])


def interrupted_line(stop: Interrupted, start_dir: Path) -> str:
    where = shown_path(stop.checkpoint, start_dir) if stop.checkpoint else None
    if stop.stopped_at is None:
        kept = f"the last checkpoint is {where}" if where else "no checkpoint was written"
        return f"stopped at once (second Ctrl-C), without an exit checkpoint; {kept}."
    if not stop.checkpoint:
        return f"stopped before batch {stop.stopped_at + 1}: no batch was trained, nothing to keep."
    return (
        f"stopped after {stop.stopped_at} batches; checkpoint kept: {where}. "
        f"Resume with: {resume_command(stop.checkpoint, start_dir)}"
    )
