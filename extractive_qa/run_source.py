"""Where a run's config comes from: the master (a cluster trial) or the command line.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from extractive_qa import config_loading, det_internals, master_mirror


@dataclass
class Source:
    """Where this run's config comes from: the master (a cluster trial) or the command line."""

    exp_conf: dict[str, Any]
    hparams: dict[str, Any]
    slots: int
    on_cluster: bool
    latest_checkpoint: str | None = None  # a storage id (cluster) or local checkpoint name
    steps_completed: int = 0
    checkpoint_path: Path | None = None  # a cluster's latest checkpoint on shared_fs, to verify


def from_cluster(info: Any) -> Source:
    exp_conf = det_internals.experiment_config(info)
    latest = info.latest_checkpoint
    return Source(
        exp_conf=exp_conf,
        hparams=dict(info.trial.hparams),
        slots=master_mirror.slots_of(exp_conf),
        on_cluster=True,
        latest_checkpoint=latest,
        steps_completed=det_internals.steps_completed(info),
        checkpoint_path=det_internals.shared_fs_checkpoint(exp_conf, latest) if latest else None,
    )


def from_command_line(args: argparse.Namespace, slots: int) -> Source:
    """The YAML as a master would hand it, with --set / --batches / --epochs applied."""
    exp_conf = config_loading.load_experiment(args.config, args.overrides)
    exp_conf = master_mirror.with_master_defaults(exp_conf)
    hparams = config_loading.local_hparams(exp_conf)
    if args.batches or args.epochs:
        if (exp_conf.get("searcher") or {}).get("max_time") is not None:
            exp_conf["searcher"]["max_time"] = args.batches or args.epochs
            exp_conf["searcher"]["time_metric"] = "batches" if args.batches else "epochs"
        else:
            hparams["train_length"] = {"batches": args.batches} if args.batches else {"epochs": args.epochs}
    return Source(exp_conf=exp_conf, hparams=hparams, slots=slots, on_cluster=False)

