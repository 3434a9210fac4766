"""A trial on a Determined cluster, driven by the master: the same small interface as a local run
(local_run.LocalRun) -- what happens before fit, the extras the trial gets, fit, what happens
after -- so that train.py tells one story for both. Here the master does what a local run does
itself (metrics, checkpoints, retention, preemption); what remains is restoring its latest
checkpoint through the resume guard."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

from determined import pytorch

from extractive_qa import det_internals
from extractive_qa.config import run_plan
from extractive_qa.launch import local_run
from extractive_qa.resume.restore import restore_on_cluster
from extractive_qa.resume.rewrite import ExpectedState
from extractive_qa.trial.callbacks import TrialExtras


@dataclasses.dataclass
class ClusterRun:
    source: Any  # config.experiment.Source, from the master
    plan: run_plan.RunPlan
    expected: Callable[[], ExpectedState]
    distributed: Any = None  # Determined's own process group (det.pytorch.init makes it)
    rank: int = 0

    def finished(self, total: int) -> dict[str, Any] | None:
        """A cluster trial is never told it already finished: the master does not start one."""
        return None

    def restore(self, context: Any, cleanup: contextlib.ExitStack) -> None:
        """The master's latest checkpoint (shared_fs or a bucket), before model and data: rewritten
        per machine by the resume guard, and that copy is what Determined restores."""
        if self.source.checkpoint_path is not None:
            self.source.latest_checkpoint = restore_on_cluster(
                context.distributed, self.source.checkpoint_path, self.expected, cleanup
            )

    def extras(self, trial: Any, context: Any) -> TrialExtras:
        return TrialExtras()  # the master shows progress, keeps checkpoints and preempts

    def before_fit(self, trial: Any, context: Any) -> dict[str, Any] | None:
        return None

    def fit(self, trainer: pytorch.Trainer, trial: Any, context: Any) -> None:
        with det_internals.restore_where_it_lies():  # the private copy, on any checkpoint_storage
            trainer.fit(**self.plan.fit_kwargs(self.source.latest_checkpoint, True))

    def report(self, slots: int) -> None:
        """The master already holds every report."""


def driver_for(options: Any, source: Any, plan: run_plan.RunPlan, expected: Callable[[], ExpectedState],
               cleanup: contextlib.ExitStack) -> Any:  # fmt: skip
    """The run's driver: the master's trial (ClusterRun) or a run without a master (LocalRun,
    prepared: its process group joined and the checkpoint it resumes rewritten)."""
    if source.on_cluster:
        return ClusterRun(source, plan, expected)
    return local_run.prepare(options, source, plan, expected, cleanup)
