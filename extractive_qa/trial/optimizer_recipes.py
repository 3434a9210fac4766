"""What each optimizer needs to train well, and the warnings when a run's settings fall short:
the recipes the learning-rate study chose (docs/scaling.md), which scaling.py applies when it
switches a config's optimizer, the analysis of RAdam's rectifier (a long built-in warm-up at the
default beta2), and a peak learning rate far out of fine-tuning's range. The dry run and the trial
both warn from here."""

from __future__ import annotations

import math
from typing import Any

from extractive_qa.config.settings import Hyperparameters
from extractive_qa.errors import ConfigError
from extractive_qa.trial.optimization import linear_warmup_decay

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


def divergence_causes(hp: Hyperparameters, lr: float) -> str:
    """The settings of this run that most often make fine-tuning diverge, as the config names them;
    the learning rate when none looks unusual. `lr`: the peak rate (RunPlan.learning_rate)."""
    causes = []
    if lr > (1e-2 if hp.optimizer == "lamb" else 1e-3):
        causes.append(f"hyperparameters.learning_rate: a peak rate of {lr:g} (fine-tuning rates are 1e-5 to "
                      "1e-3, LAMB's up to ~1e-2)")  # fmt: skip
    if hp.adam_epsilon < 1e-12:  # towards fp32's smallest numbers, and the optimizer divides by it
        causes.append(f"hyperparameters.adam_epsilon: {hp.adam_epsilon:g} (1e-8 to 1e-6 divide safely)")
    if hp.no_answer_loss_weight > 10:
        causes.append(f"hyperparameters.no_answer_loss_weight: {hp.no_answer_loss_weight:g} (the recipe: 1)")
    if hp.max_grad_norm == 0:
        causes.append("hyperparameters.max_grad_norm: 0, so gradients are not clipped (the default: 1.0)")
    return "; ".join(causes) or f"the learning rate ({lr:g}): lower hyperparameters.learning_rate"


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
