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
import contextlib
import json
import logging
import os
import random
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import config
import data

ROOT = Path(__file__).resolve().parent


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


def local_distributed() -> Any:
    """torchrun sets WORLD_SIZE: join the process group (gloo on CPU) for local multi-process."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    import torch
    import torch.distributed as dist
    from determined import core

    os.environ.setdefault("USE_TORCH_DISTRIBUTED", "1")  # Determined's switch for torch DDP
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend=backend)
    return core.DistributedContext.from_torch_distributed()


def seed_everything(seed: int) -> None:
    # On a cluster Determined seeds from the trial seed; locally we do it from experiment_seed.
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def prepare_resume(checkpoint: Path, storage_root: Path) -> tuple[str, int]:
    """Make a checkpoint directory restorable by Determined's local storage; return (id, steps)."""
    meta_path = checkpoint / "metadata.json"
    if not (checkpoint / "state_dict.pth").is_file() or not meta_path.is_file():
        raise config.ConfigError(
            f"--resume {checkpoint}: not a checkpoint written by train.py "
            "(needs state_dict.pth and metadata.json)."
        )
    steps = int(json.loads(meta_path.read_text()).get("steps_completed", 0))
    storage_root.mkdir(parents=True, exist_ok=True)
    target = storage_root / checkpoint.name
    if not (target.exists() and target.resolve() == checkpoint.resolve()):
        target = storage_root / f"resume-{checkpoint.name}"
        if target.is_symlink() or target.exists():
            target.unlink()
        target.symlink_to(checkpoint.resolve(), target_is_directory=True)
    return target.name, steps


@contextlib.contextmanager
def resume_at(steps_completed: int) -> Iterator[None]:
    """Local mode: make the trial controller continue at `steps_completed`.

    In local training mode Trainer.fit() always starts the controller at batch 0, so a resumed
    run would replay the data from the beginning. On a cluster the master passes the right count;
    here we pass the checkpoint's. (Determined 0.38.1 is the final release, so this private
    hook cannot move.)
    """
    from determined import pytorch

    original = pytorch._PyTorchTrialController
    if steps_completed == 0:
        yield
        return

    class Resuming(original):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["steps_completed"] = steps_completed
            super().__init__(*args, **kwargs)

    pytorch._PyTorchTrialController = Resuming
    try:
        yield
    finally:
        pytorch._PyTorchTrialController = original


def allow_determined_checkpoints() -> None:
    # Determined's controller torch.load()s its own checkpoints with torch's default
    # weights_only=True; the RNG state inside holds NumPy objects, which we allow explicitly
    # instead of turning weights_only off.
    import numpy as np
    import torch

    multiarray = np._core.multiarray if hasattr(np, "_core") else np.core.multiarray
    torch.serialization.add_safe_globals(
        [multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    )


def run(args: argparse.Namespace, trial_class: type | None = None) -> dict[str, Any] | None:
    """Train as configured; rank 0 returns the final metrics. `trial_class` lets benchmarks
    instrument the trial (a SquadTrial subclass); users never need it."""
    import determined as det
    from determined import pytorch

    import model_def

    distributed = local_distributed()
    info = det.get_cluster_info()
    on_cluster = info is not None and info.task_type == "TRIAL"
    if on_cluster:
        exp_conf = info.trial._config
        hparams = dict(info.trial.hparams)
        latest, steps = info.latest_checkpoint, None
        slots = int(exp_conf["resources"]["slots_per_trial"])
    else:
        exp_conf = config.apply_overrides(config.load_yaml(args.config), args.overrides)
        hparams = config.local_hparams(exp_conf)
        if args.batches or args.epochs:
            if (exp_conf.get("searcher") or {}).get("max_time") is not None:
                exp_conf["searcher"]["max_time"] = args.batches or args.epochs
                exp_conf["searcher"]["time_metric"] = "batches" if args.batches else "epochs"
            else:
                hparams["train_length"] = (
                    {"batches": args.batches} if args.batches else {"epochs": args.epochs}
                )
        slots = distributed.size if distributed else 1
        latest, steps = None, 0
    # Check everything before any long work; a bad config ends here with a clear message.
    plan = config.run_plan(exp_conf, hparams, slots)
    if not on_cluster:
        os.chdir(ROOT)
        seed_everything(plan.seed)
        # Local checkpoints go to DIR/determined/UUID (Determined's local storage follows XDG).
        os.environ["XDG_DATA_HOME"] = str(args.checkpoint_dir.resolve())
        if args.resume:
            latest, steps = prepare_resume(args.resume, args.checkpoint_dir.resolve() / "determined")
    allow_determined_checkpoints()

    with pytorch.init(**plan.init_kwargs(exp_conf), distributed=distributed) as context:
        trial = (trial_class or model_def.SquadTrial)(context)
        trainer = pytorch.Trainer(trial, context)
        with resume_at(steps or 0):
            trainer.fit(**plan.fit_kwargs(latest))
        if context.distributed.rank != 0:
            return None
        log = trial.run_log
        if args.metrics_out:
            write_metrics(args.metrics_out, exp_conf, plan, context.distributed.size, log.series)
        return {
            **{k: float(v) for k, v in log.validation.items() if k not in ("batches", "epochs")},
            "checkpoint": log.checkpoint,
            "steps_completed": log.steps_completed,
            "last_train_loss": log.last_train_loss,
            "train_seconds": round(log.train_seconds, 2),
            "samples_per_s": round(
                log.batches_timed * plan.hparams["global_batch_size"] / max(log.train_seconds, 1e-9), 2
            ),
        }


def write_metrics(
    path: Path, exp_conf: dict[str, Any], plan: config.RunPlan, slots: int, series: dict
) -> None:
    record = {
        "name": exp_conf.get("name"),
        "state": "COMPLETED",
        "slots": slots,
        "global_batch_size": plan.hparams["global_batch_size"],
        "aggregation_frequency": plan.aggregation_frequency,
        "optimizer": plan.hparams["optimizer"],
        **series,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(record, indent=1))
    tmp.replace(path)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        result = run(args)
    except (config.ConfigError, data.DataError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if result is not None:
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
