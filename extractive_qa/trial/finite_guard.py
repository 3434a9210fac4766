"""Training that stays finite: a non-finite gradient norm, or a weight or optimizer state that
became NaN or infinite, stops the run, and no checkpoint holding such a value is written.

The decisions are taken where every rank takes the same one: the gradient norm after DDP has
averaged the gradients (a NaN loss on any rank makes that average NaN), and the weights and
optimizer state -- equal on every rank -- at the end of each training workload, which Determined
runs on every rank before any validation or checkpoint (pytorch/_pytorch_trial.py:571-599). One
rank stopping alone would leave the others waiting in the next collective. The norm costs one
device-to-host read per optimizer step (Determined already reads every batch's loss to the host,
:716); the state check one pass over the weights per workload.

Under fp16 the loss scaler owns non-finite gradients (it skips that step and lowers the scale);
the state check still applies.

What a stop ends in is the run's driver's to say (`TrialExtras.end_diverged`): a local run
stops with TrainingDiverged (one line, exit 2); on a cluster the trial ends as an invalid
hyperparameter without an exit checkpoint (launch.cluster_run), so a search moves on to its next
trial. The chief's save refuses non-finite values as a last line.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from determined import pytorch

from extractive_qa.config.settings import Hyperparameters
from extractive_qa.errors import TrainingDiverged
from extractive_qa.io import model_files
from extractive_qa.trial.optimizer_recipes import divergence_causes

# What a stop that every rank takes at once ends in, given its message: TrainingDiverged for a
# local run (the CLI prints it), an invalid hyperparameter for a cluster trial.
EndDiverged = Callable[[str], Exception]


class FiniteGuard:
    """The run's stop on non-finite values: `gradient_norm` after each all-reduce, `state` at
    each workload's end and before each save; `end_diverged` is what a stop every rank takes
    ends in (the driver's)."""

    def __init__(
        self, hp: Hyperparameters, learning_rate: float, end_diverged: EndDiverged, loss_scaled: bool
    ) -> None:
        self.hint = divergence_causes(hp, learning_rate)
        self.end_diverged, self.loss_scaled = end_diverged, loss_scaled

    def stop(self, what: str, every_rank: bool = True) -> Exception:
        """The exception that stops the run; `every_rank`: every rank raises it at this point
        (only then can a cluster trial end as an invalid hyperparameter)."""
        message = f"training stopped: {what}. Likely: {self.hint}."
        return self.end_diverged(message) if every_rank else TrainingDiverged(message)

    def gradient_norm(self, norm: torch.Tensor, loss: torch.Tensor, batch_idx: int) -> None:
        """Raise when the averaged gradients' norm is NaN or infinite (before the step applies
        them); `loss` is this rank's, shown in the message."""
        if self.loss_scaled or bool(torch.isfinite(norm)):
            return
        raise self.stop(
            f"at batch {batch_idx + 1} the gradient norm is {float(norm)} (this rank's loss "
            f"{float(loss):.4g}), so the step that would write non-finite weights was not taken"
        )

    def state(self, state: dict[str, Any], where: str, every_rank: bool = True) -> None:
        """Raise when a tensor of Determined's checkpoint dictionary (or the same keys built from
        the live model and optimizer) is NaN or infinite; `where` says what is then not done."""
        bad = model_files.non_finite((f"{kind} {name}", tensor) for kind, name, tensor in _tensors(state))
        if bad is not None:
            raise self.stop(f"{bad} holds NaN or infinite values, so {where}", every_rank)


def _tensors(state: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """(kind, name, tensor) of the models' weights and the optimizers' per-parameter state in
    Determined's checkpoint dictionary (pytorch/_pytorch_trial.py:1109-1118)."""
    found = []
    for model in state.get("models_state_dict", []):
        found += [("model weight", name, tensor) for name, tensor in model.items()]
    for optimizer in state.get("optimizers_state_dict", []):
        for index, moments in optimizer.get("state", {}).items():
            found += [("optimizer state", f"{key} of parameter {index}", v) for key, v in moments.items()]
    return found


class FiniteState(pytorch.PyTorchCallback):
    """FiniteGuard.state on every rank at each training workload's end, before any validation or
    checkpoint can follow; and on the chief's save before state_dict.pth is written
    (on_checkpoint_save_start, pytorch/_pytorch_trial.py:1127-1130), where a local stop is exit 2
    and a cluster's -- unreachable after the first -- a failed trial rather than a waiting one."""

    def __init__(self, guard: FiniteGuard, model: torch.nn.Module, optimizer: Any) -> None:
        self.guard, self.model, self.optimizer = guard, model, optimizer

    def on_training_workload_end(self, avg_metrics: dict[str, Any], batch_metrics: Any) -> None:
        live = {
            "models_state_dict": [self.model.state_dict()],
            "optimizers_state_dict": [self.optimizer.state_dict()],
        }
        self.guard.state(live, "training stopped here, and no checkpoint of it is written")

    def on_checkpoint_save_start(self, checkpoint: dict[str, Any]) -> None:
        self.guard.state(checkpoint, "no checkpoint was written", every_rank=False)  # the chief's alone
