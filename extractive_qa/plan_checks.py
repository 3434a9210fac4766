"""The plan's numbers before launch -- batches, optimizer steps, warm-up, validation and checkpoint
points, ASHA rungs in steps and samples -- and the warnings the measurements behind this project
support: too few optimizer steps for the scale, RAdam's rectifier acting as a long warm-up, too
few steps between validations, windows that mostly repeat each other."""

from __future__ import annotations

from typing import Any

from extractive_qa.master_mirror import asha_brackets
from extractive_qa.optimization import radam_warning
from extractive_qa.run_plan import Length, RunPlan
from extractive_qa.window_counts import WindowCount

# docs/scaling.md, "The learning rate follows the batch": with the square-root rule F1 held at 2x
# (~400 optimizer steps) and fell at 4x / 8x (201 / 100 steps); 8x trained for 4x's steps was
# level with 4x. Below this, a run above its reference batch is predicted to lose F1.
STEP_FLOOR = 400
STEPS_DOC = "docs/scaling.md, section 'The learning rate follows the batch'"
MIN_STEPS_PER_VALIDATION = 5
MAX_REPEATED_WINDOW_SHARE = 0.5
LISTED_POINTS = 12


def batches_per_epoch(windows: int, per_slot_batch: int, ranks: int) -> int:
    """Batches one rank trains per epoch, as Determined counts them (the trial uses this too)."""
    per_slot = -(-windows // per_slot_batch)
    return per_slot // ranks + int(per_slot % ranks > 0)


def total_batches(length: Length, per_epoch: int | None) -> int | None:
    if length.unit == "batches":
        return length.value
    return None if per_epoch is None else length.value * per_epoch


def optimizer_steps(batches: int, aggregation_frequency: int) -> int:
    return max(1, batches // aggregation_frequency)


def _points(period: Length | None, per_epoch: int | None, total: int, start: bool) -> dict[str, Any] | None:
    """Batch indices at which a period fires, with the end of training (Determined's last one)."""
    every = total_batches(period, per_epoch) if period is not None else None
    marks = list(range(every, total + 1, every)) if every else []
    marks = sorted({*([0] if start else []), *marks, total})
    shown = marks if len(marks) <= LISTED_POINTS else [*marks[: LISTED_POINTS - 1], marks[-1]]
    return {"count": len(marks), "at_batches": shown, "every_batches": every}


def count_plan(plan: RunPlan, conf: dict[str, Any], slots: int, windows: WindowCount) -> dict[str, Any]:
    """The dry run's counts and warnings for `plan`."""
    hp, agg = plan.hparams, plan.aggregation_frequency
    gbs = hp.global_batch_size
    per_epoch = None if windows.windows is None else batches_per_epoch(windows.windows, gbs // slots, slots)
    out: dict[str, Any] = {
        "training_windows": windows.windows,
        "training_windows_from": windows.how + (f" ({windows.note})" if windows.note else ""),
        "batches_per_epoch": per_epoch,
    }
    total = total_batches(plan.length, per_epoch)
    warnings: list[str] = []
    if total is not None:
        steps = optimizer_steps(total, agg)
        warmup = int(hp.warmup_ratio * steps)
        out.update(batches=total, optimizer_steps=steps, warmup_steps=warmup)
        out["validations"] = _points(plan.validation_period, per_epoch, total, plan.step_zero_validation)
        if plan.checkpoint_policy != "none" or plan.checkpoint_period is not None:
            out["checkpoints"] = _points(plan.checkpoint_period, per_epoch, total, False)
        warnings += _warnings(plan, steps, warmup, out["validations"], windows)
    searcher = conf.get("searcher") or {}
    if searcher.get("name") == "adaptive_asha" and searcher.get("max_time") is not None:
        unit = searcher.get("time_metric", "batches")
        rungs = []
        for bracket in asha_brackets(searcher):
            row = []
            for rung in bracket:
                batches = rung if unit == "batches" else (None if per_epoch is None else rung * per_epoch)
                row.append({
                    unit: rung,
                    "optimizer_steps": None if batches is None else optimizer_steps(batches, agg),
                    "samples": None if batches is None else batches * gbs,
                })  # fmt: skip
            rungs.append(row)
        out["asha_rungs"] = rungs
    out["warnings"] = warnings
    return out


def _warnings(
    plan: RunPlan, steps: int, warmup: int, validations: dict[str, Any] | None, windows: WindowCount
) -> list[str]:
    hp, agg = plan.hparams, plan.aggregation_frequency
    samples = hp.global_batch_size * agg
    found = []
    reference = hp.reference_batch_size
    if steps < STEP_FLOOR and reference is not None and samples > reference:
        found.append(
            f"{steps} optimizer steps at {samples} samples per step (reference_batch_size "
            f"{hp.reference_batch_size}): when the learning-rate study scaled the batch up, F1 held "
            f"with about {STEP_FLOOR}+ steps and fell with fewer ({STEPS_DOC}). Train more epochs "
            f"(x{-(-STEP_FLOOR // steps)} gives {steps * -(-STEP_FLOOR // steps)} steps) or lower "
            "global_batch_size / aggregation_frequency."
        )
    if (advice := radam_warning(hp, steps, warmup)) is not None:
        found.append(advice)
    every = (validations or {}).get("every_batches")
    if every and every // agg < MIN_STEPS_PER_VALIDATION:
        found.append(
            f"min_validation_period is {every} batches = {every // agg} optimizer step(s) at "
            f"aggregation_frequency {agg}: a validation every few steps costs more than it tells; "
            f"raise min_validation_period to at least {MIN_STEPS_PER_VALIDATION * agg} batches."
        )
    if windows.windows and windows.questions and windows.how != "estimate":
        repeated = 1 - windows.questions / windows.windows
        if repeated > MAX_REPEATED_WINDOW_SHARE:
            found.append(
                f"{repeated:.0%} of the training windows repeat part of the window before them "
                f"(data.max_seq_length {plan.data.max_seq_length}, doc_stride {plan.data.doc_stride}): "
                "each epoch sees much of its text several times. Raise max_seq_length or lower doc_stride."
            )
    return found
