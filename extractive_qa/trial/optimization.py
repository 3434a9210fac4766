"""Optimizers (AdamW, RAdam, LAMB), the linear warm-up / decay schedule, and the analysis of
RAdam's rectifier that warns when it would act as a long warm-up.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from extractive_qa.config.model_family import loadable_pretrained
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
        fused = device.type == "cuda"
        return torch.optim.AdamW(
            groups, lr=lr, betas=betas, eps=eps, fused=fused, foreach=None if fused else True
        )
    if hp.optimizer == "radam":
        return torch.optim.RAdam(
            groups, lr=lr, betas=betas, eps=eps, decoupled_weight_decay=True, foreach=True
        )
    import torch_optimizer

    return torch_optimizer.Lamb(groups, lr=lr, betas=betas, eps=eps)


# Fine-tuning rates for BERT-sized encoders are 1e-5 to 1e-3 (LAMB's up to ~1e-2); past this a run
# diverges within its first steps. A warning, not an error: a user may be probing on purpose.
LR_WARN_ABOVE = 0.05


def learning_rate_warning(lr: float) -> str | None:
    """What to tell a user whose peak learning rate (RunPlan.learning_rate) is far out of range."""
    if lr <= LR_WARN_ABOVE:
        return None
    return (
        f"hyperparameters.learning_rate: the peak learning rate resolves to {lr:g}, while fine-tuning "
        "rates are 1e-5 to 1e-3 (LAMB's up to ~1e-2); a run at this rate diverges. Lower it unless "
        "that is what you are testing."
    )


def expected_state(plan: RunPlan) -> ExpectedState:
    """The model and optimizer `plan` trains, built on the meta device from the model's config (a
    second or two; no weights read or allocated): the names and shapes a resumed checkpoint must
    have (launch.checkpoint_rewrite checks it against them)."""
    from transformers import AutoConfig, AutoModelForQuestionAnswering

    name = plan.data.pretrained_model
    try:
        config = AutoConfig.from_pretrained(loadable_pretrained(name))
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


def radam_rectifier(step: int, beta2: float) -> float:
    """RAdam's factor on its adaptive step at optimizer step `step` (from 1), as torch.optim.RAdam
    computes it. While rho_t <= 5 (the first 5 steps) torch takes an un-normalized momentum step
    instead, gradient-sized and so negligible next to an Adam step: counted as 0."""
    rho_inf = 2 / (1 - beta2) - 1
    decay = beta2**step
    rho_t = rho_inf - 2 * step * decay / (1 - decay)
    if rho_t <= 5:
        return 0.0
    return math.sqrt((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t))


def radam_half_lr_step(beta2: float) -> int | None:
    """The first optimizer step at which RAdam's rectifier lets at least half the lr through; None
    when it never does (beta2 below ~0.71: rho_inf <= 5, torch never takes the adaptive step)."""
    if 2 / (1 - beta2) - 1 <= 5:
        return None
    step = 1
    while radam_rectifier(step, beta2) < 0.5:  # rises to 1 within ~10 / (1 - beta2) steps
        step += 1
    return step


def radam_step_share(total_steps: int, warmup_steps: int, beta2: float) -> float:
    """How far RAdam moves the weights over a run relative to AdamW at the same lr and schedule:
    the schedule-weighted mean of its rectifier (a built-in warm-up, thousands of steps long at
    the default beta2 0.999)."""
    schedule = linear_warmup_decay(total_steps, warmup_steps)
    weights = [schedule(step) for step in range(total_steps)]
    rectified = sum(w * radam_rectifier(step + 1, beta2) for step, w in enumerate(weights))
    return rectified / max(sum(weights), 1e-12)


# Each optimizer's settings that the learning-rate study chose (docs/scaling.md), the one place
# they live: scaling.py's series apply them when they switch a config's optimizer, and the shipped
# YAMLs use them (tests compare). RAdam: beta2 0.95 and no linear warm-up on top of its rectifier;
# LAMB: its own learning rate, 20x AdamW's (4e-3 at 40x diverged).
OPTIMIZER_RECIPES: dict[str, dict[str, float]] = {
    "adamw": {},
    "radam": {"adam_beta2": 0.95, "warmup_ratio": 0.0},
    "lamb": {"learning_rate_factor": 20.0},
}


def apply_recipe(hyperparameters: dict[str, Any], optimizer: str) -> None:
    """Switch a config's `hyperparameters:` section (an AdamW recipe) to `optimizer`'s recipe."""
    hyperparameters["optimizer"] = optimizer
    for key, value in OPTIMIZER_RECIPES[optimizer].items():
        if key == "learning_rate_factor":
            rate = hyperparameters.get("learning_rate")
            if isinstance(rate, dict):  # {type: const, val: X}
                rate = rate.get("val")
            if not isinstance(rate, (int, float)) or isinstance(rate, bool):
                raise ConfigError(
                    f"hyperparameters.learning_rate: {optimizer} takes {value:g}x a constant learning "
                    f"rate; got {hyperparameters.get('learning_rate')!r}."
                )
            hyperparameters["learning_rate"] = rate * value
        else:
            hyperparameters[key] = value


# Below this share RAdam trained behind AdamW in the learning-rate study (docs/scaling.md).
RADAM_MIN_SHARE = 0.75
# The rectifier passes half the lr after 16 steps instead of 556 (a warm-up of its own, about 10 %
# of a few hundred steps): the form multi_machine.yaml ships, with no linear warm-up on top.
RADAM_SHORT_BETA2 = 0.95


def radam_warning(hp: Hyperparameters, total_steps: int, warmup_steps: int) -> str | None:
    """What to tell a user whose RAdam run is too short for its rectifier (None when it is not).
    bench/lr_scaling.py measures these forms against AdamW (docs/scaling.md)."""
    if hp.optimizer != "radam":
        return None
    share = radam_step_share(total_steps, warmup_steps, hp.adam_beta2)
    if share >= RADAM_MIN_SHARE:
        return None
    half = radam_half_lr_step(hp.adam_beta2)
    msg = (
        f"hyperparameters.optimizer radam with adam_beta2 {hp.adam_beta2:g} over this run's "
        f"{total_steps} optimizer steps: its rectifier keeps the step under half the learning rate "
        + (f"for the first {half - 1} steps" if half else "on every step (rho_inf <= 5)")
        + ", so the run moves the weights "
        f"{share:.2f}x as far as AdamW at the same learning rate and schedule"
        + (f", on top of warmup_ratio {hp.warmup_ratio:g}'s own warm-up" if warmup_steps else "")
        + ". "
    )
    short = radam_step_share(total_steps, warmup_steps, RADAM_SHORT_BETA2)
    if half is None:  # no length helps: the adaptive step never comes
        return msg + f"Set adam_beta2: {RADAM_SHORT_BETA2:g} ({short:.2f}x) or use optimizer: adamw."
    if hp.adam_beta2 > RADAM_SHORT_BETA2 and short >= RADAM_MIN_SHARE:
        return msg + (
            f"Set adam_beta2: {RADAM_SHORT_BETA2:g} ({short:.2f}x), train longer, or use optimizer: adamw."
        )
    return msg + "Train longer or use optimizer: adamw."
