"""A trial on a Determined cluster, driven by the master. The master does what a local run does
itself (metrics, checkpoints, retention, preemption, progress in the WebUI); what remains is
restoring its latest checkpoint through the resume guard, handing the trial what a cluster
differs in (the master's trial seed, the searcher's stop, a divergence ending as an invalid
hyperparameter), and fitting from that copy."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
from typing import Any

from determined import pytorch

from extractive_qa import det_internals
from extractive_qa.config import run_plan
from extractive_qa.config.experiment import Source
from extractive_qa.launch.trial_run import BuiltTrial, RunDriver, TrialBuilder, final_result, trial_context
from extractive_qa.resume.restore import restore_on_cluster
from extractive_qa.trial import optimization
from extractive_qa.trial.callbacks import SearcherStop, TrialExtras

logger = logging.getLogger("squad")


@dataclasses.dataclass(frozen=True)
class ClusterRun(RunDriver):
    source: Source  # from the master
    plan: run_plan.RunPlan
    cleanup: contextlib.ExitStack  # what the run leaves behind: the restored checkpoint's private copy

    def run(self, build: TrialBuilder) -> dict[str, Any] | None:
        """Restore, build, hand the trial its extras, fit; the master does the rest
        (det.pytorch.init makes the process group itself: no distributed context is handed in)."""
        with trial_context(self.plan, self.source, None) as context:
            storage_id = self.restore(context)  # a checkpoint to continue, before model and data
            trial = build(context)
            trial.add_extras(cluster_extras(trial, context))
            trainer = pytorch.Trainer(trial, context)
            with det_internals.restore_where_it_lies():  # the private copy, on any checkpoint_storage
                trainer.fit(**self.plan.fit_kwargs(storage_id, True))
            return final_result(trial) if context.distributed.rank == 0 else None

    def restore(self, context: pytorch.PyTorchTrialContext) -> str | None:
        """The storage id fit restores: the master's latest checkpoint (shared_fs or a bucket),
        rewritten per machine by the resume guard (Determined reads the steps from the copy's
        metadata.json); None when the trial starts fresh."""
        if self.source.checkpoint_path is None:
            return None
        expected = optimization.expected_state(self.plan)  # what it must fit (the model on the meta device)
        return restore_on_cluster(context.distributed, self.source.checkpoint_path, expected, self.cleanup)


def cluster_extras(trial: BuiltTrial, context: pytorch.PyTorchTrialContext) -> TrialExtras:
    """What a cluster trial differs in: the master's trial seed orders its data, the searcher may
    stop it, and a divergence ends it as an invalid hyperparameter (a search moves on)."""
    info = det_internals.cluster_trial()
    return TrialExtras(
        seed=context.get_trial_seed(),
        end_diverged=functools.partial(invalid_hyperparameter, context),
        callbacks={"searcher_stop": SearcherStop(context, info, trial.run_log)},
    )


def invalid_hyperparameter(context: pytorch.PyTorchTrialContext, message: str) -> Exception:
    """What every rank raises to end the trial as an invalid hyperparameter, the reason logged
    first: the trial's log is all a cluster user sees."""
    logger.error(message)
    return det_internals.end_as_invalid_hp(context)
