"""Optimizers (AdamW, RAdam, LAMB) and the linear warm-up / decay schedule as the trial builds
them, and the state a resumed checkpoint must fit (the same model and optimizer, built on the meta
device). What each optimizer's settings should be is optimizer_recipes'.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from extractive_qa import compat
from extractive_qa.config.model_family import pretrained_config
from extractive_qa.config.settings import Hyperparameters
from extractive_qa.errors import ConfigError
from extractive_qa.resume import rewrite as checkpoint_rewrite
from extractive_qa.resume.rewrite import ExpectedState

if TYPE_CHECKING:
    from extractive_qa.config.run_plan import RunPlan

# --------------------------------------------------------------------------------------------
# Optimizers and schedule.
# --------------------------------------------------------------------------------------------


def build_optimizer(model: torch.nn.Module, hp: Hyperparameters, lr: float, device: torch.device) -> Any:
    """hp's optimizer at peak learning rate `lr` (RunPlan.learning_rate: the scaling rule applied)."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        # No weight decay for biases and LayerNorm weights (the BERT recipe).
        (
            no_decay if name.endswith("bias") or "LayerNorm" in name or "norm" in name.lower() else decay
        ).append(param)
    groups = [
        {"params": decay, "weight_decay": hp.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    eps, betas = hp.adam_epsilon, (hp.adam_beta1, hp.adam_beta2)
    if hp.optimizer == "adamw":
        # The fused kernel: one pass per parameter instead of a dozen (on the CPU torch's foreach
        # AdamW loops over the tensors op by op); the same update, rounded the same way.
        fused = compat.fused_adamw(device.type)
        return torch.optim.AdamW(
            groups, lr=lr, betas=betas, eps=eps, fused=fused, foreach=None if fused else True
        )
    if hp.optimizer == "radam":
        return torch.optim.RAdam(
            groups, lr=lr, betas=betas, eps=eps, decoupled_weight_decay=True, foreach=True
        )
    import torch_optimizer

    return torch_optimizer.Lamb(groups, lr=lr, betas=betas, eps=eps)


def expected_state(plan: RunPlan) -> ExpectedState:
    """The model and optimizer `plan` trains, built on the meta device from the model's config (a
    second or two; no weights read or allocated): the names and shapes a resumed checkpoint must
    have (launch.checkpoint_rewrite checks it against them)."""
    from transformers import AutoModelForQuestionAnswering

    name = plan.data.pretrained_model
    try:
        config = pretrained_config(name, local_only=False)
    except (OSError, ValueError) as err:
        raise ConfigError(
            f"data.pretrained_model {name!r}: cannot load ({str(err).splitlines()[0]})"
        ) from None
    with torch.device("meta"):
        model = AutoModelForQuestionAnswering.from_config(config)
    return checkpoint_rewrite.expected_state(
        model, build_optimizer(model, plan.hparams, plan.learning_rate, torch.device("meta"))
    )


def linear_warmup_decay(total_steps: int, warmup_steps: int) -> Any:
    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))

    return factor


def wrapped_optimization(context: Any, plan: RunPlan, model: torch.nn.Module, total: int, warmup: int) -> Any:
    """The optimizer and its schedule wrapped for Determined: gradients averaged over
    aggregation_frequency batches as the plan says, the schedule stepped once per optimizer step.
    Returns (optimizer, wrapped schedule, the schedule itself: RecipeOptions reads its factors)."""
    from determined import pytorch

    optimizer = context.wrap_optimizer(
        build_optimizer(model, plan.hparams, plan.learning_rate, context.device),
        average_aggregated_gradients=plan.average_aggregated_gradients,
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, linear_warmup_decay(total, warmup))
    wrapped = context.wrap_lr_scheduler(
        schedule, step_mode=pytorch.LRScheduler.StepMode.STEP_EVERY_OPTIMIZER_STEP
    )
    return optimizer, wrapped, schedule


def take_recipe_options(checkpoint: dict[str, Any], optimizer: Any, schedule: Any) -> None:
    """A checkpoint about to be loaded (Determined's dict, before its optimizer and schedule load
    it), changed so that a resume takes from it only tensors and step counts.

    torch's Optimizer.load_state_dict takes every option of each saved parameter group (`maximize`,
    `amsgrad`, `capturable`, `fused`, betas, weight decay...), and LambdaLR its base rates: a
    checkpoint could switch the optimizer's behaviour, and a GPU run's `fused` fails on a CPU. Here
    each group takes this run's options (its optimizer as the recipe built it, on this device),
    the schedule this run's peak rates, and the rate of the first resumed step is the schedule's
    own at the saved step: peak x factor(last_epoch), as LambdaLR computes it."""
    saved_schedule = checkpoint["lr_schedulers_state_dict"][0]
    step = saved_schedule["last_epoch"]
    peaks = list(schedule.base_lrs)
    rates = [peak * factor(step) for peak, factor in zip(peaks, schedule.lr_lambdas, strict=True)]
    saved_schedule.update(base_lrs=peaks, _last_lr=list(rates))
    saved = checkpoint["optimizers_state_dict"][0]
    saved["param_groups"] = [
        {**{k: v for k, v in group.items() if k != "params"}, "lr": rate, "params": kept["params"]}
        for group, kept, rate in zip(optimizer.param_groups, saved["param_groups"], rates, strict=True)
    ]


def gradient_clipping(optimizer: Any, scaler: Any, max_norm: float, check_norm: Callable[[Any], None]) -> Any:
    """Determined's clip_grads for step_optimizer, run after the gradients are averaged over ranks:
    fp16's gradients unscaled first, their global norm handed to `check_norm` (finite_guard), then
    clipped to max_grad_norm (0: not clipped; an infinite bound only measures)."""

    def clip(params: Any) -> None:
        if scaler:
            scaler.unscale_(optimizer)
        check_norm(torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else math.inf))

    return clip
