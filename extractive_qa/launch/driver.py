"""The one interface train.py drives a run through: a trial the master drives (cluster_run) or a
run without a master (local_run).

train.py tells one story for both -- is it already finished, restore, build the trial, give it
its extras, check before fit, fit, report -- and each driver does its own part of each step.
Where a driver has nothing to do in a step it inherits the step as `RunDriver` defines it here:
the defaults below are the one place that says "nothing here". A driver owns where its run
resumes (`ResumePoint`); nothing is written into the config's `Source` to be read back.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import TYPE_CHECKING, Any, Protocol

from extractive_qa.trial.callbacks import TrialExtras

if TYPE_CHECKING:
    import torch
    from determined import core, pytorch

    from extractive_qa.data.squad_files import SquadSet
    from extractive_qa.trial.callbacks import RankRandomState, RunLog


@dataclasses.dataclass(frozen=True)
class ResumePoint:
    """Where fit starts: the storage id Determined restores (a resume's private, rewritten copy)
    and the batches that copy trained. The default is a fresh start."""

    storage_id: str | None = None
    steps_completed: int = 0


class BuiltTrial(Protocol):
    """What a driver reads of the trial once it is built (model_def.SquadTrial has it)."""

    run_log: RunLog
    rank_random_state: RankRandomState
    train_set: SquadSet
    model: torch.nn.Module

    def batches_per_epoch(self) -> int: ...


class RunDriver(Protocol):
    """A run's driver; both drivers subclass this to inherit the steps they have nothing to do in."""

    distributed: core.DistributedContext | None  # given to det.pytorch.init (None: it makes its own)
    resume_point: ResumePoint

    @property
    def rank(self) -> int:
        return self.distributed.rank if self.distributed is not None else 0

    def finished(self, total: int) -> dict[str, Any] | None:
        """The result of a run with nothing left to train of `total` batches; None: train."""
        return None

    def restore(self, context: pytorch.PyTorchTrialContext, cleanup: contextlib.ExitStack) -> None:
        """Inside Determined's context, before model and data: what the run resumes from."""

    def extras(self, trial: BuiltTrial, context: pytorch.PyTorchTrialContext) -> TrialExtras:
        """What the built trial gets besides its own callbacks."""
        return TrialExtras()

    def before_fit(self, trial: BuiltTrial, context: pytorch.PyTorchTrialContext) -> dict[str, Any] | None:
        """Checks once the trial is built; a result: the run had already finished."""
        return None

    def fit(self, trainer: pytorch.Trainer, trial: BuiltTrial, context: pytorch.PyTorchTrialContext) -> None:
        """Trainer.fit from `resume_point`."""
        raise NotImplementedError

    def report(self, slots: int) -> None:
        """After fit, on rank 0: what the run writes besides its checkpoints."""
