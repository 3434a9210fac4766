"""`train.py --dry-run`: the run a cluster would execute, from the YAML alone: no model is loaded;
the training windows are counted (or read from the feature cache, or estimated) so the plan can
give batches and optimizer steps, and the warnings come before launch.
"""

from __future__ import annotations

import argparse
from typing import Any

from extractive_qa import config_loading, master_mirror, run_plan
from extractive_qa.plan_checks import count_plan
from extractive_qa.run_source import from_command_line
from extractive_qa.scaling_types import ROOT
from extractive_qa.window_counts import count_training_windows


def dry_run(args: argparse.Namespace) -> dict[str, Any]:
    """The plan a cluster would run for --config: slots from the YAML, no model, no data."""
    conf = config_loading.load_experiment(args.config, args.overrides)
    slots = master_mirror.slots_of(conf)
    source = from_command_line(args, slots)
    plan = run_plan.run_plan(source.exp_conf, source.hparams, source.slots)
    out = describe(plan, source.exp_conf, source.slots)
    windows = count_training_windows(plan.data, ROOT)
    return {**out, **count_plan(plan, source.exp_conf, source.slots, windows)}


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
        "precision": plan.hparams.precision,
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
                "max_seq_length",
                "doc_stride",
            )
        },
    }
    if searcher.get("name") == "adaptive_asha" and searcher.get("max_time") is not None:
        out["asha_brackets"] = master_mirror.asha_brackets(searcher)
    return out

