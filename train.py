"""Fine-tune a question-answering model on SQuAD with Determined's PyTorch Trainer.

On a cluster (entrypoint `python3 -m determined.launch.torch_distributed python3 train.py`) the
experiment config comes from the master; locally it is --config (default local.yaml), and the
common recipes are in `train.py --help` (RECIPES below).

The last stdout line is one JSON object: exact_match, f1, checkpoint, steps_completed,
last_train_loss (v2.0 adds the v2.0 metrics).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from extractive_qa import cli, compat, det_internals  # cli first: a Ctrl-C while the rest loads
from extractive_qa.config import run_plan
from extractive_qa.config.experiment import from_cluster, from_command_line, settings_table
from extractive_qa.dry_run import dry_run
from extractive_qa.errors import ConfigError, DataError
from extractive_qa.files import check_output_file, check_outputs, write_text_atomic
from extractive_qa.trial import callbacks, interruption
from extractive_qa.trial.checkpoint_rewrite import expected_for_plan
from extractive_qa.trial.checkpoint_storage import (
    check_free_space,
    check_local_storage,
    check_outside_upload,
    checkpoint_write_failed,
    prepare_local_storage,
    write_failure_error,
)
from extractive_qa.trial.checkpoints import (
    check_same_data,
    check_same_run,
    finished_resume,
    note_length_change,
    prepare_resume,
    resume_from,
    verify_on_chief,
)
from extractive_qa.trial.launch import join_process_group, local_world_size, seed_everything

if TYPE_CHECKING:
    import model_def

ROOT = Path(__file__).resolve().parent
DATA_FILES = ("train_file", "validation_file")  # data.* paths a run reads (URLs never match a file)
START_DIR = Path.cwd()  # where the user typed the command (a local run then works in ROOT)


# How gloo and NCCL report a peer that is gone: a timed-out or broken collective.
PEER_LOST = (
    "Timed out waiting",
    "Connection closed by peer",
    "Connection reset by peer",
    "collective operation timeout",
)


RECIPES = """\
recipes (from the project directory, with the venv active: . .venv/bin/activate):
  python3 train.py                                  the embedded default (local.yaml) on the CPU
  python3 train.py --config local_v2.yaml           the same on the bundled SQuAD v2.0 text
  python3 train.py --config const.yaml --set data.squad_version=2.0 \\
      --set data.train_file=https://rajpurkar.github.io/SQuAD-explorer/dataset/train-v2.0.json \\
      --set data.validation_file=https://rajpurkar.github.io/SQuAD-explorer/dataset/dev-v2.0.json
                                                    SQuAD v2.0 with the official files
  python3 train.py --config distributed.yaml --dry-run
                                                    the plan (steps, warm-up, lr) without training
  python3 train.py --settings --config const.yaml   every setting: default, the config's value
  python3 train.py --resume auto                    continue this run's newest checkpoint, or start
  torchrun --nproc_per_node=2 train.py --resume auto
                                                    2 processes; rerun the same line after a stop

Ctrl-C (or SIGTERM) stops after the current batch, writes a checkpoint and prints the command
that resumes it; a second Ctrl-C stops at once. Paths inside a config are relative to the
project directory; --config and the other paths on the command line to where you are.
"""


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Fine-tune an encoder for extractive question answering on SQuAD, with "
        "Determined's Trainer (locally, under torchrun, or on a cluster).",
        epilog=RECIPES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
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
    parser.add_argument(
        "--resume",
        metavar="DIR|auto|latest",
        help="continue from a checkpoint directory; `auto`: from this run's newest complete "
        "checkpoint in --checkpoint-dir, or from the start when there is none (the one to give "
        "torchrun and schedulers, which restart the same command); `latest`: the same, but an "
        "error when there is none",
    )
    parser.add_argument(
        "--allow-changed",
        action="store_true",
        help="--resume even where the checkpoint's model, data, windows, optimizer, batch, "
        "learning rate or seed differ from the config's (otherwise an error naming each)",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the run plan a cluster would execute for --config (one JSON object) and exit",
    )
    parser.add_argument(
        "--settings",
        action="store_true",
        help="list every hyperparameters.* and data.* setting: its default, the value --config "
        "gives it (after --set) and its meaning; then exit",
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
    if args.resume and args.resume not in ("latest", "auto"):
        args.resume = Path(args.resume).resolve()
    args.metrics_out = args.metrics_out.resolve() if args.metrics_out else None
    for name in ("batches", "epochs"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name} must be a positive integer")
    return args


def run(args: argparse.Namespace, trial_class: type | None = None) -> dict[str, Any] | None:
    """Train as configured; rank 0 returns the final metrics. `trial_class` lets benchmarks
    instrument the trial (a SquadTrial subclass); users never need it."""
    with contextlib.ExitStack() as cleanup:  # what the run leaves behind: a resume's private copy
        return train_run(args, trial_class, cleanup)


def train_run(
    args: argparse.Namespace, trial_class: type | None, cleanup: contextlib.ExitStack
) -> dict[str, Any] | None:
    det_internals.check_version()
    from determined import pytorch

    import model_def

    info = det_internals.cluster_trial()
    if info is not None:
        source = from_cluster(info)
    else:  # torchrun's WORLD_SIZE is the slot count of a local run
        source = from_command_line(args, local_world_size())
    # Check everything before any long work; a bad config ends here with a clear message.
    plan = run_plan.run_plan(source.exp_conf, source.hparams, source.slots)
    if not source.on_cluster:  # where this run writes, checked before it trains
        check_local_storage(args.checkpoint_dir, ROOT)
        if plan.data.cache_dir:
            check_outside_upload(ROOT / plan.data.cache_dir, ROOT, "data.cache_dir")
        if args.metrics_out:
            check_output_file(args.metrics_out, "--metrics-out")
            data = source.exp_conf.get("data") or {}
            inputs = {f"data.{k}": ROOT / data[k] for k in DATA_FILES if data.get(k)}
            inputs["--config"] = args.config
            inputs["--checkpoint-dir"] = args.checkpoint_dir  # the checkpoints a resume reads
            if isinstance(args.resume, Path):
                inputs["--resume"] = args.resume
            check_outputs({"--metrics-out": args.metrics_out}, inputs)
    distributed = join_process_group(source.on_cluster, plan.collective_timeout_s)
    if not source.on_cluster:
        os.chdir(ROOT)
        seed_everything(plan.seed)
        # Local checkpoints go to DIR/determined/UUID (Determined's local storage follows XDG).
        os.environ["XDG_DATA_HOME"] = str(args.checkpoint_dir.resolve())
        if args.resume:
            identity = run_plan.run_identity(plan, source.exp_conf.get("name"))
            resume = resume_from(args.resume, args.checkpoint_dir, identity)
            if resume is not None:  # Determined restores a private copy, rewritten from the decoded one
                storage = args.checkpoint_dir / "determined"
                same_run = None  # `auto` and `latest` pick only this run's checkpoints
                if args.resume not in ("auto", "latest"):
                    same_run = functools.partial(
                        check_same_run, identity=identity, allow_changed=args.allow_changed, shown=resume
                    )
                expected = expected_for_plan(plan)
                private, steps = prepare_resume(resume, storage, expected, "--resume", same_run)
                source.steps_completed = steps
                cleanup.callback(private.remove)
                source.latest_checkpoint = private.path.name
                source.resumed, source.resumed_copy = resume, private.path
                note_length_change(private.path, {plan.length.unit: plan.length.value})
                if plan.length.unit == "batches":  # epochs: once the trial knows their length
                    done = finished_resume(args.resume, source, plan.length.value)
                    if done is not None:
                        return done if distributed is None or distributed.rank == 0 else None
    compat.allow_determined_checkpoints()

    with (
        det_internals.collective_timeout(plan.collective_timeout_s),
        det_internals.local_gpus_torch_sees(source.on_cluster),
        pytorch.init(**plan.init_kwargs(source.exp_conf), distributed=distributed) as context,
    ):
        if source.checkpoint_path is not None:  # before the model and data are loaded
            expected = functools.partial(expected_for_plan, plan)
            name, private = verify_on_chief(
                context.distributed, source.checkpoint_path, "DET_LATEST_CHECKPOINT", expected
            )
            source.latest_checkpoint = name  # every rank restores the chief's rewritten copy
            if private is not None:
                cleanup.callback(private.remove)
        trial = (trial_class or model_def.SquadTrial)(context)
        if source.resumed is not None:  # the data read and the length known: before any training
            check_same_data(source.resumed_copy, trial.train_set.sha256, args.allow_changed, source.resumed)
            total = run_plan.total_batches(plan.length, trial.batches_per_epoch())
            done = finished_resume(args.resume, source, total)
            if done is not None:
                return done if context.distributed.rank == 0 else None
        series = None
        if args.metrics_out and context.distributed.rank == 0:
            series = trial.extra_callbacks["metric_series"] = callbacks.MetricSeries(trial.run_log)
        stop = None
        if not source.on_cluster:
            # Ctrl-C / SIGTERM: finish the batch, checkpoint, say how to resume (interruption.py).
            gather = trial.rank_random_state.gather  # the exit checkpoint holds every rank's state
            stop = interruption.Interruption(context.distributed, context.device, gather)
            trial.before_batch.append(stop.before_batch)
        if not source.on_cluster and context.distributed.rank == 0:
            shown = local_progress(context, plan, trial.batches_per_epoch())
            trial.extra_callbacks["progress"] = shown
            trial.before_batch.append(shown.before_batch)
            trial.extra_callbacks["retention"] = local_retention(source.exp_conf, trial.run_log)
            prepare_local_storage(args.checkpoint_dir)  # the trial is built: the config was good
            check_free_space(args.checkpoint_dir, sum(p.numel() for p in trial.model.parameters()))
        trainer = pytorch.Trainer(trial, context)
        # A cluster's controller starts at the master's steps_completed; locally we pass ours.
        with (
            det_internals.resume_at(0 if source.on_cluster else source.steps_completed),
            stop or contextlib.nullcontext(),
        ):
            storage = args.checkpoint_dir / "determined"  # what was there: a failed write's debris is new
            before = {p.name for p in storage.iterdir()} if storage.is_dir() else set()
            try:
                trainer.fit(**plan.fit_kwargs(source.latest_checkpoint, source.on_cluster))
            except interruption.StoppedNow:  # a second Ctrl-C
                checkpoint, rank = trial.run_log.checkpoint, context.distributed.rank
                raise interruption.Interrupted(130, None, checkpoint, rank) from None
            except (OSError, RuntimeError) as err:
                if source.on_cluster or not checkpoint_write_failed(err):
                    raise
                done, scores = trial.run_log.steps_completed, trial.run_log.validation
                raise write_failure_error(err, args.checkpoint_dir, before, done, scores) from None
        if stop is not None and stop.stopped_at is not None:
            rank = context.distributed.rank
            raise interruption.Interrupted(stop.exit_code(), stop.stopped_at, trial.run_log.checkpoint, rank)
        if context.distributed.rank != 0:
            return None
        if args.metrics_out:
            write_metrics(args.metrics_out, source.exp_conf, plan, context.distributed.size, series.series)
        return final_result(trial)


def final_result(trial: model_def.SquadTrial) -> dict[str, Any]:
    """The last stdout line: final validation metrics, checkpoint, steps, loss, throughput."""
    from extractive_qa.trial import perf_metrics

    log = trial.run_log
    return {
        **{k: float(v) for k, v in log.validation.items() if k not in ("batches", "epochs")},
        "checkpoint": log.checkpoint,
        "steps_completed": log.steps_completed,
        "last_train_loss": log.last_train_loss,
        "stopped_by_searcher": log.stopped_by_searcher,
        **perf_metrics.run_rates(trial.perf),
    }


def local_progress(context: Any, plan: run_plan.RunPlan, batches_per_epoch: int) -> Any:
    """The progress display of a local run (rank 0): total batches from the plan."""
    from extractive_qa.trial import progress

    unit = batches_per_epoch if plan.length.unit == "epochs" else 1
    total = plan.length.value * unit
    return progress.Progress(context, total, batches_per_epoch, plan.hparams.global_batch_size)


def local_retention(exp_conf: dict[str, Any], run_log: Any) -> Any:
    """checkpoint_storage's save_trial_latest / save_trial_best, applied to a local run's own
    checkpoints (a master does it on a cluster)."""
    storage = exp_conf.get("checkpoint_storage") or {}
    searcher = exp_conf.get("searcher") or {}
    return callbacks.LocalRetention(
        run_log,
        latest=int(storage.get("save_trial_latest", 1)),
        best=int(storage.get("save_trial_best", 1)),
        metric=searcher.get("metric", "f1"),
        smaller_is_better=bool(searcher.get("smaller_is_better", False)),
    )


def write_metrics(
    path: Path, exp_conf: dict[str, Any], plan: run_plan.RunPlan, slots: int, series: dict
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
    write_text_atomic(path, json.dumps(record, indent=1))


def main(argv: Sequence[str] | None = None) -> int:
    if cli.refuse_undecodable(argv):
        return 2
    args = parse_args(argv)
    if args.settings:
        try:
            print("\n".join(settings_table(args.config, args.overrides)))
        except ConfigError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        except BrokenPipeError:  # `| head`: the reader has what it wanted
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    import determined

    # Determined's own format: the WebUI parses the level from it for its log-level filter.
    logging.basicConfig(level=logging.INFO, format=determined.LOG_FORMAT)
    if not args.dry_run and det_internals.cluster_trial() is None:
        from extractive_qa.trial import progress

        progress.quiet_determined_log()  # the progress display says it; a cluster keeps it all
        progress.hide_library_progress_bars()
    try:
        result = dry_run(args) if args.dry_run else run(args)
    except (ConfigError, DataError, det_internals.VersionError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except interruption.Interrupted as stop:
        if stop.rank == 0:
            print(interruption.interrupted_line(stop, START_DIR), file=sys.stderr, flush=True)
        return stop.code
    except KeyboardInterrupt:  # before training started: nothing was trained
        print("interrupted before training started; nothing to keep.", file=sys.stderr)
        return 130
    except RuntimeError as err:
        if not any(sign in str(err) for sign in PEER_LOST):
            raise
        print(
            f"error: a peer process stopped answering during a collective ({str(err).splitlines()[0]}). "
            f"A machine left the network or crashed; this rank gives up after "
            f"{run_plan.TIMEOUT_VARIABLE} (torch's default: 30 min) so the run ends and max_restarts "
            "resumes it from the latest checkpoint.",
            file=sys.stderr,
        )
        return 3
    if result is not None:
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
