"""Fine-tune a question-answering model on SQuAD with Determined's PyTorch Trainer.

On a cluster (entrypoint `python3 -m determined.launch.torch_distributed python3 train.py`) the
experiment config comes from the master. Locally:

    python3 train.py                                   # the embedded default (local.yaml), CPU
    python3 train.py --config const.yaml --set data.squad_version=2.0 --batches 200
    python3 train.py --resume checkpoints/determined/UUID --batches 400
    torchrun --nproc_per_node=2 train.py --config local.yaml

The last stdout line is one JSON object: exact_match, f1, checkpoint, steps_completed,
last_train_loss (v2.0 adds the v2.0 metrics).
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import compat
import config
import data
import det_internals

if TYPE_CHECKING:
    import model_def

ROOT = Path(__file__).resolve().parent


# How gloo and NCCL report a peer that is gone: a timed-out or broken collective.
PEER_LOST = (
    "Timed out waiting",
    "Connection closed by peer",
    "Connection reset by peer",
    "collective operation timeout",
)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Fine-tune BERT on SQuAD with Determined.")
    parser.add_argument("--config", type=Path, default=ROOT / "local.yaml", help="experiment YAML")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set hyperparameters.learning_rate=1e-4",
    )
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--batches", type=int, help="total training length in batches")
    length.add_argument("--epochs", type=int, help="total training length in epochs")
    parser.add_argument("--resume", type=Path, help="checkpoint directory to continue from")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the run plan a cluster would execute for --config (one JSON object) and exit",
    )
    parser.add_argument(
        "--settings",
        action="store_true",
        help="list every hyperparameters.* and data.* setting with its default and meaning, and exit",
    )
    parser.add_argument(
        "--metrics-out",
        type=Path,
        help="also write the run's metric reports (steps, end time, metrics) here as JSON",
    )
    parser.add_argument(
        "--checkpoint-dir",
        type=Path,
        default=ROOT / "checkpoints",
        help="where local runs keep checkpoints (DIR/determined/UUID)",
    )
    args = parser.parse_args(argv)
    # Local runs work in the project directory, as a cluster trial works in its context
    # directory: relative paths in a config are relative to it, and Determined copies it
    # (filtered by .detignore) into each checkpoint's code/.
    args.config = args.config.resolve()
    args.checkpoint_dir = args.checkpoint_dir.resolve()
    args.resume = args.resume.resolve() if args.resume else None
    args.metrics_out = args.metrics_out.resolve() if args.metrics_out else None
    for name in ("batches", "epochs"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name} must be a positive integer")
    return args


def join_process_group(on_cluster: bool, timeout_s: float | None) -> Any:
    """Who initialises the torch process group, decided in one place.

    On a cluster det.pytorch.init() does it (_trainer.py:282-296: it ignores `distributed=`), so
    joining here would initialise the default group twice. Locally, torchrun sets WORLD_SIZE and
    nothing else joins: we do (gloo on CPU) and hand init() the DistributedContext. Either way
    collectives give up after `timeout_s` (config.collective_timeout_s) instead of torch's 30 min.
    """
    if on_cluster or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    import torch
    import torch.distributed as dist
    from determined import core

    os.environ.setdefault("USE_TORCH_DISTRIBUTED", "1")  # Determined's switch for torch DDP
    timeout = {} if timeout_s is None else {"timeout": datetime.timedelta(seconds=timeout_s)}
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(backend=backend, **timeout)
    # Determined's DistributedContext talks over two fixed TCP ports by default (12360 and
    # 12360 + MAX_SLOTS_PER_AGENT, determined/constants.py:13-18): on a cluster each container
    # has its own network, but two local runs on one machine would cross-talk ("got
    # non-_HelloMessage") or fail to bind. Rank 0 picks two free ports and shares them.
    ports: list[Any] = [free_tcp_ports(2) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(ports, src=0)
    env = os.environ
    return core.DistributedContext(
        rank=dist.get_rank(),
        size=dist.get_world_size(),
        local_rank=int(env["LOCAL_RANK"]),
        local_size=int(env["LOCAL_WORLD_SIZE"]),
        cross_rank=int(env["GROUP_RANK"]),
        cross_size=int(env["GROUP_WORLD_SIZE"]),
        chief_ip=env.get("DET_CHIEF_IP"),
        pub_port=ports[0][0],
        pull_port=ports[0][1],
    )


def free_tcp_ports(n: int) -> list[int]:
    """n distinct ports that nothing listens on now (the OS picks them)."""
    import socket

    probes = [socket.socket() for _ in range(n)]
    try:
        for probe in probes:
            probe.bind(("", 0))
        return [probe.getsockname()[1] for probe in probes]
    finally:
        for probe in probes:
            probe.close()


def seed_everything(seed: int) -> None:
    # On a cluster Determined seeds from the trial seed; locally we do it from experiment_seed.
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def check_checkpoint(checkpoint: Path, what: str) -> int:
    """A complete, undamaged Determined checkpoint, or a ConfigError naming the file; returns its
    steps_completed. Runs before any training, so a truncated copy never ends in torch's raw
    zip-reader traceback after the model and data are loaded."""
    import zipfile

    state, meta = checkpoint / "state_dict.pth", checkpoint / "metadata.json"
    needed = (state, meta, checkpoint / "trial_state.pkl")
    if not any(path.is_file() for path in needed):
        raise config.ConfigError(
            f"{what} {checkpoint}: not a checkpoint written by train.py "
            "(needs state_dict.pth, metadata.json and trial_state.pkl)."
        )
    for path in needed:
        if not path.is_file():
            raise config.ConfigError(
                f"{what} {checkpoint}: incomplete checkpoint, {path.name} is missing "
                "(not written by train.py, or the copy was cut short)."
            )
    try:
        steps = int(json.loads(meta.read_text())["steps_completed"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise config.ConfigError(f"{what} {meta}: damaged checkpoint metadata ({err}).") from None
    try:  # torch.save writes a zip archive; check every member against its CRC
        with zipfile.ZipFile(state) as archive:
            bad = archive.testzip()
    except (OSError, zipfile.BadZipFile, EOFError) as err:
        raise config.ConfigError(
            f"{what} {state}: damaged or truncated checkpoint ({err}); resume from an earlier "
            "checkpoint or copy this one again."
        ) from None
    if bad is not None:
        raise config.ConfigError(f"{what} {state}: damaged checkpoint (member {bad} fails its CRC).")
    return steps


def prepare_resume(checkpoint: Path, storage_root: Path) -> tuple[str, int]:
    """Make a checkpoint directory restorable by Determined's local storage; return (id, steps)."""
    steps = check_checkpoint(checkpoint, "--resume")
    storage_root.mkdir(parents=True, exist_ok=True)
    target = storage_root / checkpoint.name
    if not (target.exists() and target.resolve() == checkpoint.resolve()):
        target = storage_root / f"resume-{checkpoint.name}"
        # Every local rank gets here (torchrun): link under a private name, then rename over the
        # target -- atomic, so concurrent ranks cannot trip over each other's link.
        private = storage_root / f".{target.name}.{os.getpid()}"
        private.symlink_to(checkpoint.resolve(), target_is_directory=True)
        os.replace(private, target)
    return target.name, steps


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
        slots=config.slots_of(exp_conf),
        on_cluster=True,
        latest_checkpoint=latest,
        steps_completed=det_internals.steps_completed(info),
        checkpoint_path=det_internals.shared_fs_checkpoint(exp_conf, latest) if latest else None,
    )


def verify_on_chief(distributed: Any, checkpoint: Path, what: str) -> None:
    """The chief alone reads and CRC-checks the checkpoint (bert-base: ~1.3 GB from shared storage,
    once instead of once per rank); every rank gets its verdict and a damaged checkpoint stops
    them all with the same message (exit 2)."""
    verdict: dict[str, Any] | None = None
    if distributed.rank == 0:
        logging.getLogger("squad").info(
            "verifying %s %s for all %d ranks", what, checkpoint, distributed.size
        )
        try:
            verdict = {"steps": check_checkpoint(checkpoint, what)}
        except config.ConfigError as err:
            verdict = {"error": str(err)}
    verdict = distributed.broadcast(verdict)
    if "error" in verdict:
        raise config.ConfigError(verdict["error"])


def from_command_line(args: argparse.Namespace, slots: int) -> Source:
    """The YAML as a master would hand it, with --set / --batches / --epochs applied."""
    exp_conf = config.apply_overrides(config.load_yaml(args.config), args.overrides)
    exp_conf = config.with_master_defaults(exp_conf)
    hparams = config.local_hparams(exp_conf)
    if args.batches or args.epochs:
        if (exp_conf.get("searcher") or {}).get("max_time") is not None:
            exp_conf["searcher"]["max_time"] = args.batches or args.epochs
            exp_conf["searcher"]["time_metric"] = "batches" if args.batches else "epochs"
        else:
            hparams["train_length"] = {"batches": args.batches} if args.batches else {"epochs": args.epochs}
    return Source(exp_conf=exp_conf, hparams=hparams, slots=slots, on_cluster=False)


def dry_run(args: argparse.Namespace) -> dict[str, Any]:
    """The plan a cluster would run for --config: slots from the YAML, no model, no data."""
    slots = config.slots_of(config.apply_overrides(config.load_yaml(args.config), args.overrides))
    source = from_command_line(args, slots)
    plan = config.run_plan(source.exp_conf, source.hparams, source.slots)
    return describe(plan, source.exp_conf, source.slots)


def describe(plan: config.RunPlan, conf: dict[str, Any], slots: int) -> dict[str, Any]:
    """The run a cluster would execute, as train.py --dry-run prints it."""
    gbs = plan.hparams.global_batch_size
    agg = plan.aggregation_frequency

    def period(length: config.Length | None) -> dict[str, int] | None:
        return None if length is None else {length.unit: length.value}

    batches = plan.length.value if plan.length.unit == "batches" else None
    searcher = conf.get("searcher") or {}
    out: dict[str, Any] = {
        "name": conf.get("name"),
        "slots": slots,
        "global_batch_size": gbs,
        "per_slot_batch_size": gbs // slots,
        "aggregation_frequency": agg,
        "samples_per_optimizer_step": gbs * agg,
        "training_length": period(plan.length),
        "batches": batches,
        "epochs": plan.length.value if plan.length.unit == "epochs" else None,
        "optimizer_steps": None if batches is None else max(1, batches // agg),
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
        out["asha_brackets"] = config.asha_brackets(searcher)
    if batches is None:
        out["note"] = (
            "an epoch is ceil(training windows / global_batch_size) batches; the number of windows "
            "is known once the training set is tokenized, so batches and optimizer steps are "
            "reported by the run itself"
        )
    return out


def run(args: argparse.Namespace, trial_class: type | None = None) -> dict[str, Any] | None:
    """Train as configured; rank 0 returns the final metrics. `trial_class` lets benchmarks
    instrument the trial (a SquadTrial subclass); users never need it."""
    det_internals.check_version()
    from determined import pytorch

    import model_def

    info = det_internals.cluster_trial()
    if info is not None:
        source = from_cluster(info)
    else:  # torchrun's WORLD_SIZE is the slot count of a local run
        source = from_command_line(args, int(os.environ.get("WORLD_SIZE", "1")))
    # Check everything before any long work; a bad config ends here with a clear message.
    plan = config.run_plan(source.exp_conf, source.hparams, source.slots)
    distributed = join_process_group(source.on_cluster, plan.collective_timeout_s)
    if not source.on_cluster:
        os.chdir(ROOT)
        seed_everything(plan.seed)
        # Local checkpoints go to DIR/determined/UUID (Determined's local storage follows XDG).
        os.environ["XDG_DATA_HOME"] = str(args.checkpoint_dir.resolve())
        if args.resume:
            source.latest_checkpoint, source.steps_completed = prepare_resume(
                args.resume, args.checkpoint_dir.resolve() / "determined"
            )
    compat.allow_determined_checkpoints()

    with (
        det_internals.collective_timeout(plan.collective_timeout_s),
        pytorch.init(**plan.init_kwargs(source.exp_conf), distributed=distributed) as context,
    ):
        if source.checkpoint_path is not None:  # before the model and data are loaded
            verify_on_chief(context.distributed, source.checkpoint_path, "DET_LATEST_CHECKPOINT")
        trial = (trial_class or model_def.SquadTrial)(context)
        series = None
        if args.metrics_out and context.distributed.rank == 0:
            series = trial.extra_callbacks["metric_series"] = model_def.MetricSeries(trial.run_log)
        if not source.on_cluster and context.distributed.rank == 0:
            trial.extra_callbacks["progress"] = local_progress(context, plan, trial.batches_per_epoch())
        trainer = pytorch.Trainer(trial, context)
        # A cluster's controller starts at the master's steps_completed; locally we pass ours.
        with det_internals.resume_at(0 if source.on_cluster else source.steps_completed):
            trainer.fit(**plan.fit_kwargs(source.latest_checkpoint, source.on_cluster))
        if context.distributed.rank != 0:
            return None
        if args.metrics_out:
            write_metrics(args.metrics_out, source.exp_conf, plan, context.distributed.size, series.series)
        return final_result(trial)


def final_result(trial: model_def.SquadTrial) -> dict[str, Any]:
    """The last stdout line: final validation metrics, checkpoint, steps, loss, throughput."""
    import perf_metrics

    log = trial.run_log
    return {
        **{k: float(v) for k, v in log.validation.items() if k not in ("batches", "epochs")},
        "checkpoint": log.checkpoint,
        "steps_completed": log.steps_completed,
        "last_train_loss": log.last_train_loss,
        "stopped_by_searcher": log.stopped_by_searcher,
        **perf_metrics.run_rates(trial.perf),
    }


def local_progress(context: Any, plan: config.RunPlan, batches_per_epoch: int) -> Any:
    """The progress display of a local run (rank 0): total batches from the plan."""
    import progress

    unit = batches_per_epoch if plan.length.unit == "epochs" else 1
    total = plan.length.value * unit
    return progress.Progress(context, total, batches_per_epoch, plan.hparams.global_batch_size)


def write_metrics(
    path: Path, exp_conf: dict[str, Any], plan: config.RunPlan, slots: int, series: dict
) -> None:
    record = {
        "name": exp_conf.get("name"),
        "state": "COMPLETED",
        "slots": slots,
        "global_batch_size": plan.hparams.global_batch_size,
        "aggregation_frequency": plan.aggregation_frequency,
        "optimizer": plan.hparams.optimizer,
        **series,
    }
    data.write_text_atomic(path, json.dumps(record, indent=1))


def print_settings() -> None:
    rows = [(name, json.dumps(default) if default != "(required)" else default, help_text)
            for name, default, help_text in config.settings_help()]  # fmt: skip
    width = max(len(name) for name, _, _ in rows)
    dwidth = max(len(default) for _, default, _ in rows)
    for name, default, help_text in rows:
        print(f"{name:<{width}}  {default:<{dwidth}}  {help_text}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.settings:
        print_settings()
        return 0
    import determined

    # Determined's own format: the WebUI parses the level from it for its log-level filter.
    logging.basicConfig(level=logging.INFO, format=determined.LOG_FORMAT)
    if not args.dry_run and det_internals.cluster_trial() is None:
        import progress

        progress.quiet_determined_log()  # the progress display says it; a cluster keeps it all
        progress.hide_library_progress_bars()
    try:
        result = dry_run(args) if args.dry_run else run(args)
    except (config.ConfigError, data.DataError, det_internals.VersionError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except RuntimeError as err:
        if not any(sign in str(err) for sign in PEER_LOST):
            raise
        print(
            f"error: a peer process stopped answering during a collective ({str(err).splitlines()[0]}). "
            f"A machine left the network or crashed; this rank gives up after "
            f"{config.TIMEOUT_VARIABLE} (torch's default: 30 min) so the run ends and max_restarts "
            "resumes it from the latest checkpoint.",
            file=sys.stderr,
        )
        return 3
    if result is not None:
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
