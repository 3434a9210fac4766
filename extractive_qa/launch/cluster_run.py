"""A trial on a Determined cluster, driven by the master. The master does what a local run does
itself (metrics, checkpoints, retention, preemption, progress in the WebUI); what remains is
restoring its latest checkpoint through the resume guard, and fitting from that copy. The steps
it has nothing to do in are RunDriver's defaults (launch.driver)."""

from __future__ import annotations

import contextlib
import dataclasses

from determined import core, pytorch

from extractive_qa import det_internals
from extractive_qa.config import run_plan
from extractive_qa.config.experiment import RunOptions, Source
from extractive_qa.launch import local_run
from extractive_qa.launch.driver import BuiltTrial, ResumePoint, RunDriver
from extractive_qa.resume.restore import restore_on_cluster
from extractive_qa.resume.rewrite import ExpectedState


@dataclasses.dataclass
class ClusterRun(RunDriver):
    source: Source  # from the master
    plan: run_plan.RunPlan
    expected: ExpectedState | None  # what the master's latest checkpoint must fit (None: there is none)
    distributed: core.DistributedContext | None = None  # det.pytorch.init makes Determined's own
    resume_point: ResumePoint = ResumePoint()

    def restore(self, context: pytorch.PyTorchTrialContext, cleanup: contextlib.ExitStack) -> None:
        """The master's latest checkpoint (shared_fs or a bucket), before model and data: rewritten
        per machine by the resume guard, and that copy is what Determined restores (Determined
        reads the steps from the copy's metadata.json)."""
        if self.source.checkpoint_path is not None and self.expected is not None:
            at = self.source.checkpoint_path
            self.resume_point = ResumePoint(
                restore_on_cluster(context.distributed, at, self.expected, cleanup)
            )

    def fit(self, trainer: pytorch.Trainer, trial: BuiltTrial, context: pytorch.PyTorchTrialContext) -> None:
        with det_internals.restore_where_it_lies():  # the private copy, on any checkpoint_storage
            trainer.fit(**self.plan.fit_kwargs(self.resume_point.storage_id, True))


def driver_for(
    options: RunOptions,
    source: Source,
    plan: run_plan.RunPlan,
    expected: ExpectedState | None,
    cleanup: contextlib.ExitStack,
) -> RunDriver:
    """The run's driver: the master's trial (ClusterRun) or a run without a master (LocalRun,
    prepared: its process group joined and the checkpoint it resumes rewritten). `expected` is
    what a checkpoint to resume must fit; None where the run resumes none."""
    if source.on_cluster:
        return ClusterRun(source, plan, expected)
    return local_run.prepare(options, source, plan, expected, cleanup)


def resumes(options: RunOptions, source: Source) -> bool:
    """Whether the run may resume a checkpoint (then train.py builds what it must fit)."""
    return source.checkpoint_path is not None if source.on_cluster else bool(options.resume)
