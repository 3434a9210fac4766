"""The plan before launch: a config resolved as the master and the trial would resolve it, the
training windows counted (feature cache, the file itself, or the official file's measured count
as an estimate), batches, optimizer steps, warm-up, validation and checkpoint points and ASHA
rungs in steps and samples, and the warnings the measurements behind this project support: too
few optimizer steps for the scale, RAdam's rectifier acting as a long warm-up, too few steps
between validations, windows that mostly repeat each other, bf16 / fp16 at small per-GPU
batches, torch.compile over dynamic widths."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from extractive_qa import det_internals
from extractive_qa.config import experiment, run_plan
from extractive_qa.config.experiment import asha_brackets, from_command_line
from extractive_qa.config.run_plan import Length, RunPlan, batches_per_epoch, optimizer_steps, total_batches
from extractive_qa.config.settings import DataSettings, WindowSpec
from extractive_qa.data.squad_formats import DATASETS_PREFIX
from extractive_qa.errors import ConfigError, DataError
from extractive_qa.io import reading
from extractive_qa.io.files import ROOT
from extractive_qa.qa.mixed_precision import local_device, resolve_precision
from extractive_qa.trial.optimizer_recipes import learning_rate_warning, radam_warning


def dry_run(args: experiment.RunOptions) -> dict[str, Any]:
    """The plan a cluster would run for --config: slots from the YAML, no model, no data."""
    conf = experiment.load_experiment(args.config, list(args.overrides))
    slots = experiment.slots_of(conf)
    source = from_command_line(args, slots)
    plan = run_plan.run_plan(source.exp_conf, source.hparams, source.slots)
    out = describe(plan, source.exp_conf, source.slots)
    windows = count_training_windows(plan.data, ROOT)
    counted = count_plan(plan, source.exp_conf, source.slots, windows)
    counted["warnings"] = [*counted["warnings"], *not_uploaded(plan.data, ROOT)]
    return {**out, **counted}


def not_uploaded(data: DataSettings, root: Path) -> list[str]:
    """Data files a cluster trial would not find: relative ones outside the project or left out
    of the upload by .detignore (the trial's working directory is the upload), absolute ones not
    on this machine (a warning: they may be on the cluster's). A relative path to nothing is an
    error: it is nowhere."""
    warnings = []
    for field in ("train_file", "validation_file"):
        given = str(getattr(data, field))
        if given.startswith(("http://", "https://", DATASETS_PREFIX)):
            continue
        if Path(given).is_absolute():
            if not Path(given).exists():
                warnings.append(
                    f"data.{field} {given} is not on this machine: a cluster trial finds it only if "
                    "its machines have it at that path (shared storage, a bind mount)."
                )
            continue
        path = (root / given).resolve()
        if not path.is_file():  # relative paths start in the project directory, here and on a cluster
            raise ConfigError(f"data.{field} {reading.not_a_file(given, base=root)}")
        inside = path.is_relative_to(root.resolve())
        if not inside or not det_internals.uploaded(root.resolve(), path):
            why = "is left out of the upload by .detignore" if inside else "is outside the project directory"
            warnings.append(
                f"data.{field} {given} {why}: a cluster trial would not find it (this machine's "
                "runs do). Keep it under the project and out of .detignore, or give a URL."
            )
    return warnings


def describe(plan: run_plan.RunPlan, conf: dict[str, Any], slots: int) -> dict[str, Any]:
    """The run a cluster would execute, as train.py --dry-run prints it."""
    gbs = plan.hparams.global_batch_size
    agg = plan.aggregation_frequency

    def period(length: run_plan.Length | None) -> dict[str, int] | None:
        return None if length is None else {length.unit: length.value}

    searcher = conf.get("searcher") or {}
    out: dict[str, Any] = {
        "name": conf.get("name"),
        "slots": slots,
        "global_batch_size": gbs,
        "per_slot_batch_size": gbs // slots,
        "aggregation_frequency": agg,
        "samples_per_optimizer_step": gbs * agg,
        "training_length": period(plan.length),
        "epochs": plan.length.value if plan.length.unit == "epochs" else None,
        "validation_period": period(plan.validation_period),
        "checkpoint_period": period(plan.checkpoint_period),
        "checkpoint_policy": plan.checkpoint_policy,
        "step_zero_validation": plan.step_zero_validation,
        "reporting_period_batches": plan.reporting_period,
        "optimizer": plan.hparams.optimizer,
        "adam_betas": [plan.hparams.adam_beta1, plan.hparams.adam_beta2],  # AdamW / RAdam / LAMB
        "learning_rate": plan.learning_rate,  # what the optimizer runs at (the rule applied)
        "reference_learning_rate": plan.hparams.learning_rate,
        "reference_batch_size": plan.hparams.reference_batch_size,
        "lr_scaling": plan.hparams.lr_scaling,
        "precision": "{} ({})".format(*resolve_precision(plan.hparams.precision, local_device())),
        "attention": f"{plan.attention} ({plan.attention_note})",
        "gradient_checkpointing": plan.hparams.gradient_checkpointing,
        "batching": f"{plan.hparams.batching} (pad_to_multiple_of {plan.hparams.pad_to_multiple_of})",
        "gradient_compression": plan.gradient_compression,
        "profiling": plan.profiling,
        "searcher": searcher.get("name"),
        "data": {
            k: getattr(plan.data, k)
            for k in (
                "pretrained_model",
                "train_file",
                "validation_file",
                "squad_version",
                "max_train_examples",
                "max_eval_examples",
                "max_seq_length",
                "doc_stride",
            )
        },
    }
    if searcher.get("name") == "adaptive_asha" and searcher.get("max_time") is not None:
        out["asha_brackets"] = experiment.asha_brackets(searcher)
    return out


# --------------------------------------------------------------------------------------------
# Training windows, counted without training.
# --------------------------------------------------------------------------------------------


# Measured windows of the official training files (BERT's uncased WordPiece, max_seq_length 384,
# doc_stride 128, max_query_length 64: docs/scaling.md), for a dry run that cannot see the file.
OFFICIAL_WINDOWS = {("train-v1.1.json", 384, 128, 64): 88_600}
OFFICIAL_QUESTIONS = {"train-v1.1.json": 87_599, "train-v2.0.json": 130_319}


@dataclass(frozen=True)
class WindowCount:
    windows: int | None
    how: str  # "feature cache", "counted", "estimate" or "unknown"
    note: str = ""
    questions: int | None = None  # the training questions they come from (when read here)
    misplaced: str = ""  # SquadSet.misplaced_note of the training file read here


def training_file_here(source: str, name: str, root: Path) -> Path:
    """Where the training file is (or will be) on this machine: a download's cache place, or the
    path relative to the project."""
    from extractive_qa.data.squad_files import OFFICIAL_SHA256, cache_name, default_download_dir

    if source.startswith(("http://", "https://")):
        return default_download_dir() / cache_name(source, name, OFFICIAL_SHA256.get(name))
    return Path(source) if Path(source).is_absolute() else root / source


def count_training_windows(data: DataSettings, root: Path) -> WindowCount:
    """The training windows the run will train on, and how that number was obtained."""
    from extractive_qa.data.feature_cache import CacheDamage, features_fingerprint, read_entry
    from extractive_qa.data.features import build_features, load_tokenizer
    from extractive_qa.data.squad_files import check_version, default_download_dir, first_examples, load_squad

    spec = WindowSpec(data.max_seq_length, data.doc_stride, data.max_query_length)
    source = str(data.train_file)
    name = source.rstrip("/").rsplit("/", 1)[-1]
    local = training_file_here(source, name, root)
    estimate = OFFICIAL_WINDOWS.get((name, spec.max_seq_length, spec.doc_stride, spec.max_query_length))

    def fallback(why: str) -> WindowCount:
        if estimate is not None:
            note = f"{why}; the count measured on the official file"
            return WindowCount(estimate, "estimate", note, OFFICIAL_QUESTIONS.get(name))
        return WindowCount(None, "unknown", f"{why}; the run reports its windows when it starts")

    if source.startswith(DATASETS_PREFIX):
        return fallback(f"{source} is read through datasets when the run starts")
    if local.exists() and not local.is_file():  # a directory, a FIFO, a device: named, not waited on
        raise DataError(f"data.train_file: {reading.not_a_file(local)}")
    if not local.is_file():  # not here yet (a download)
        return fallback(f"{source} is not on this machine yet")
    try:
        tokenizer = load_tokenizer(data.pretrained_model, local_only=True)
        squad = first_examples(load_squad(local, training=True), data.max_train_examples)
    except (DataError, OSError, ValueError) as err:
        return fallback(f"cannot window it here ({str(err).splitlines()[0][:120]})")
    check_version(squad, data.squad_version, "data.train_file")  # refused before launch, as the run would
    cache_dir = Path(data.cache_dir or default_download_dir() / "features")
    if not cache_dir.is_absolute():
        cache_dir = root / cache_dir
    fingerprint = features_fingerprint(squad, data.pretrained_model, tokenizer, spec, "train")
    cached = cache_dir / f"train-{fingerprint}"
    if cached.is_dir():
        try:
            return WindowCount(
                len(read_entry(cached)),
                "feature cache",
                str(cached),
                len(squad.examples),
                squad.misplaced_note(),
            )
        except CacheDamage:
            pass  # the run rebuilds it; count the windows here as it will
    started = time.perf_counter()
    windows = len(build_features(squad.examples, tokenizer, spec, labels=True, offsets=False))
    seconds = time.perf_counter() - started
    note = f"windowed {len(squad.examples)} questions in {seconds:.1f} s"
    return WindowCount(windows, "counted", note, len(squad.examples), squad.misplaced_note())


# --------------------------------------------------------------------------------------------
# Batches, optimizer steps, validation and checkpoint points, and the warnings.
# --------------------------------------------------------------------------------------------


# docs/scaling.md, "The learning rate follows the batch": with the square-root rule F1 held at 2x
# (~400 optimizer steps) and fell at 4x / 8x (201 / 100 steps); 8x trained for 4x's steps was
# level with 4x. Below this, a run above its reference batch is predicted to lose F1.
STEP_FLOOR = 400
STEPS_DOC = "docs/scaling.md, section 'The learning rate follows the batch'"
# docs/gpu.md, "Where a GPU step goes": below this many windows per GPU an eager step is too
# small to keep the GPU busy, and bf16 autocast's casts made it slower than fp32 with TF32 (12,
# 16 and 32 per GPU on an H100); from 64 per GPU up bf16 was the faster.
BF16_PAYS_FROM_PER_GPU = 64
GPU_DOC = "docs/gpu.md"
MIN_STEPS_PER_VALIDATION = 5
MAX_REPEATED_WINDOW_SHARE = 0.5
LISTED_POINTS = 12


def _points(period: Length | None, per_epoch: int | None, total: int, start: bool) -> dict[str, Any] | None:
    """Batch indices at which a period fires, with the end of training (Determined's last one):
    counted, and the first ones listed, without making the list (a run may be 10**12 batches)."""
    every = total_batches(period, per_epoch) if period is not None else None
    multiples = total // every if every else 0  # every, 2 x every, ... up to total
    listed = (every * i for i in range(1, min(multiples, LISTED_POINTS) + 1)) if every else ()
    head = sorted({*([0] if start else []), *listed} - {total})
    count = int(start) + multiples + (0 if multiples and total % every == 0 else 1)
    shown = [*head, total] if count <= LISTED_POINTS else [*head[: LISTED_POINTS - 1], total]
    return {"count": count, "at_batches": shown, "every_batches": every}


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
    warnings += speed_warnings(plan, slots)
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


def speed_warnings(plan: RunPlan, slots: int, device: str | None = None) -> list[str]:
    """Settings measured slow for what they are used with: torch.compile over dynamic widths, and
    bf16 / fp16 autocast at small per-GPU batches (on this machine's GPU, or any multi-GPU run)."""
    hp, found = plan.hparams, []
    if hp.torch_compile and hp.batching != "buckets":
        widths = -(-plan.data.max_seq_length // hp.pad_to_multiple_of)
        found.append(
            f"torch_compile with batching {hp.batching}: the step is compiled again for every padded "
            f"width, up to {widths} at max_seq_length {plan.data.max_seq_length} / pad_to_multiple_of "
            f"{hp.pad_to_multiple_of}, about a minute each for BERT-base on a GPU ({GPU_DOC}). Set "
            "batching: buckets with pad_to_multiple_of 64 (a few widths), or leave torch_compile off."
        )
    per_gpu = hp.global_batch_size // slots
    on_gpus = (device or local_device()) == "cuda" or slots > 1
    if hp.precision in ("bf16", "fp16") and per_gpu < BF16_PAYS_FROM_PER_GPU and on_gpus:
        found.append(
            f"precision {hp.precision} at {per_gpu} windows per GPU: at fewer than "
            f"{BF16_PAYS_FROM_PER_GPU} per GPU the step is too small to keep a GPU busy and autocast's "
            f"casts made it slower than precision fp32 with TF32 matmuls (tf32: true) on an H100 "
            f"({GPU_DOC}). Use fp32 (+TF32) here, or {BF16_PAYS_FROM_PER_GPU}+ windows per GPU."
        )
    return found


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
    if (advice := learning_rate_warning(plan.learning_rate)) is not None:
        found.append(advice)
    if windows.misplaced:
        found.append(f"data.train_file: {windows.misplaced}")
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
