"""What a run's driver is, and what both drivers share: a trial the master drives (cluster_run)
or a run without a master (local_run); launch.driver picks one.

A driver has one method, `run`: it opens Determined's context, builds the trial there, hands it
everything that differs by where it runs (trial.callbacks.TrialExtras), fits it and returns the
final metrics. Each driver tells its own story in it, top to bottom -- a cluster trial restores
the master's latest checkpoint and fits; a local run also checks where it writes, shows
progress, keeps its checkpoints and stops at a batch boundary on Ctrl-C -- so no driver carries
a step it has nothing to do in. What both share is here: Determined's context (`trial_context`)
and the result line (`final_result`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from extractive_qa import compat, det_internals

if TYPE_CHECKING:
    import torch
    from determined import core, pytorch

    from extractive_qa.config.experiment import Source
    from extractive_qa.config.run_plan import RunPlan
    from extractive_qa.data.squad_files import SquadSet
    from extractive_qa.trial.callbacks import RankRandomState, RunLog, TrialExtras
    from extractive_qa.trial.perf_metrics import TrainingThroughput


class BuiltTrial(Protocol):
    """What a driver reads of the trial once it is built (model_def.SquadTrial has it)."""

    run_log: RunLog
    rank_random_state: RankRandomState
    train_set: SquadSet
    model: torch.nn.Module
    perf: TrainingThroughput

    def batches_per_epoch(self) -> int: ...

    def add_extras(self, extras: TrialExtras) -> None: ...


# The trial's class (or a benchmark's subclass of it): built inside Determined's context.
TrialBuilder = Callable[["pytorch.PyTorchTrialContext"], BuiltTrial]


class RunDriver(Protocol):
    """A run's driver. `run` builds the trial with `build` inside Determined's context, fits it
    and returns the final metrics on rank 0 (None on the other ranks)."""

    def run(self, build: TrialBuilder) -> dict[str, Any] | None: ...


@contextlib.contextmanager
def trial_context(
    plan: RunPlan, source: Source, distributed: core.DistributedContext | None
) -> Iterator[pytorch.PyTorchTrialContext]:
    """det.pytorch.init as both drivers open it: the collective timeout the plan sets, the GPUs
    this process may see on a cluster, and `distributed` (None: Determined makes its own)."""
    from determined import pytorch

    compat.allow_determined_checkpoints()
    with (
        det_internals.collective_timeout(plan.collective_timeout_s),
        det_internals.local_gpus_torch_sees(source.on_cluster),
        pytorch.init(**plan.init_kwargs(source.exp_conf), distributed=distributed) as context,
    ):
        yield context


def final_result(trial: BuiltTrial) -> dict[str, Any]:
    """The last stdout line: final validation metrics, checkpoint, steps, loss, throughput."""
    from extractive_qa.trial import perf_metrics

    log = trial.run_log
    return {
        **{k: float(v) for k, v in log.validation.items() if k not in ("batches", "epochs")},
        "checkpoint": log.checkpoint,
        "steps_completed": log.steps_completed,
        "last_train_loss": log.last_train_loss,
        "stopped_by_searcher": log.stopped_by_searcher,
        **perf_metrics.run_rates(trial.perf),
    }
