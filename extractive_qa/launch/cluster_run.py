"""A trial on a Determined cluster, driven by the master. The master does what a local run does
itself (metrics, checkpoints, retention, preemption, progress in the WebUI); what remains is
restoring its latest checkpoint through the resume guard, and fitting from that copy."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

from determined import pytorch

from extractive_qa import det_internals
from extractive_qa.config import run_plan
from extractive_qa.config.experiment import RunOptions, Source
from extractive_qa.launch import local_run
from extractive_qa.launch.driver import ResumePoint, RunDriver, TrialBuilder, final_result, trial_context
from extractive_qa.resume.restore import restore_on_cluster
from extractive_qa.resume.rewrite import ExpectedState


@dataclasses.dataclass
class ClusterRun(RunDriver):
    source: Source  # from the master
    plan: run_plan.RunPlan
    expected: ExpectedState | None  # what the master's latest checkpoint must fit (None: there is none)
    cleanup: contextlib.ExitStack  # what the run leaves behind: the restored checkpoint's private copy
    resume_point: ResumePoint = ResumePoint()

    def run(self, build: TrialBuilder) -> dict[str, Any] | None:
        """Restore, build, fit; the master does the rest (det.pytorch.init makes the process
        group itself: no distributed context is handed in)."""
        with trial_context(self.plan, self.source, None) as context:
            self.restore(context)  # a checkpoint to continue, before model and data
            trial = build(context)
            trainer = pytorch.Trainer(trial, context)
            with det_internals.restore_where_it_lies():  # the private copy, on any checkpoint_storage
                trainer.fit(**self.plan.fit_kwargs(self.resume_point.storage_id, True))
            return final_result(trial) if context.distributed.rank == 0 else None

    def restore(self, context: pytorch.PyTorchTrialContext) -> None:
        """The master's latest checkpoint (shared_fs or a bucket), before model and data: rewritten
        per machine by the resume guard, and that copy is what Determined restores (Determined
        reads the steps from the copy's metadata.json)."""
        if self.source.checkpoint_path is not None and self.expected is not None:
            at = self.source.checkpoint_path
            self.resume_point = ResumePoint(
                restore_on_cluster(context.distributed, at, self.expected, self.cleanup)
            )


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
        return ClusterRun(source, plan, expected, cleanup)
    return local_run.prepare(options, source, plan, expected, cleanup)


def resumes(options: RunOptions, source: Source) -> bool:
    """Whether the run may resume a checkpoint (then train.py builds what it must fit)."""
    return source.checkpoint_path is not None if source.on_cluster else bool(options.resume)
