"""Training that stays finite: a non-finite gradient norm stops the run at that optimizer step,
and no checkpoint holding a non-finite value is written.

The decision is taken on the gradient norm, not on each rank's loss: the norm is computed after
DDP has averaged the gradients, so every rank sees the same value and all stop at the same step
(one rank stopping alone would leave the others waiting in the next all-reduce), and a NaN loss on
any rank makes that average NaN. The read costs one device-to-host copy per optimizer step;
Determined already copies every batch's loss to the host (determined/pytorch/_pytorch_trial.py:716).

Under fp16 the loss scaler owns non-finite gradients (it skips that step and lowers the scale), so
only the checkpoint guard applies there.

A local run stops with TrainingDiverged (one line, exit 2). On a cluster the stop is det.InvalidHP:
the trial reports an early exit, a search moves on to its next trial, and Determined's exit
checkpoint passes the same guard (pytorch/_pytorch_trial.py:502-506 checkpoints before re-raising;
an InvalidHP raised while that checkpoint is written is re-raised without it, :258-262).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from determined import pytorch

from extractive_qa import model_files
from extractive_qa.config.settings import Hyperparameters
from extractive_qa.errors import TrainingDiverged
from extractive_qa.trial.optimizer_recipes import divergence_causes

logger = logging.getLogger("squad")


class FiniteGuard:
    """The run's stop on non-finite values: `gradient_norm` after each all-reduce, `checkpoint`
    before each save. `on_cluster` chooses det.InvalidHP over TrainingDiverged."""

    def __init__(
        self, hp: Hyperparameters, learning_rate: float, on_cluster: bool, loss_scaled: bool
    ) -> None:
        self.hint = divergence_causes(hp, learning_rate)
        self.on_cluster, self.loss_scaled = on_cluster, loss_scaled

    def stop(self, what: str) -> Exception:
        message = f"training stopped: {what}. Likely: {self.hint}."
        if self.on_cluster:  # the trial's log is all a cluster user sees; locally the CLI prints it
            import determined as det

            logger.error(message)
            return det.InvalidHP(message)
        return TrainingDiverged(message)

    def gradient_norm(self, norm: torch.Tensor, loss: torch.Tensor, batch_idx: int) -> None:
        """Raise when the averaged gradients' norm is NaN or infinite (before the step applies
        them); `loss` is this rank's, shown in the message."""
        if self.loss_scaled or bool(torch.isfinite(norm)):
            return
        raise self.stop(
            f"at batch {batch_idx + 1} the gradient norm is {float(norm)} (this rank's loss "
            f"{float(loss):.4g}), so the step that would write non-finite weights was not taken"
        )

    def checkpoint(self, state: dict[str, Any]) -> None:
        """Raise when a model or optimizer tensor of the checkpoint about to be written is NaN or
        infinite; nothing of it has been written yet."""
        bad = model_files.non_finite((f"{kind} {name}", tensor) for kind, name, tensor in _tensors(state))
        if bad is not None:
            raise self.stop(f"{bad} holds NaN or infinite values, so no checkpoint was written")


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


class FiniteCheckpoint(pytorch.PyTorchCallback):
    """FiniteGuard.checkpoint on every save, before Determined writes state_dict.pth
    (on_checkpoint_save_start, pytorch/_pytorch_trial.py:1127-1130)."""

    def __init__(self, guard: FiniteGuard) -> None:
        self.guard = guard

    def on_checkpoint_save_start(self, checkpoint: dict[str, Any]) -> None:
        self.guard.checkpoint(checkpoint)
