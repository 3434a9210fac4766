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
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from extractive_qa import cli, det_internals  # cli first: a Ctrl-C while the rest loads
from extractive_qa.config import run_plan
from extractive_qa.config.experiment import RunOptions, run_source, settings_table
from extractive_qa.dry_run import dry_run
from extractive_qa.io.files import ROOT
from extractive_qa.launch import driver, interruption
from extractive_qa.launch.process import local_world_size
from extractive_qa.resume import restore as resume
from extractive_qa.storage import buckets

START_DIR = Path.cwd()  # where the user typed the command (a local run then works in ROOT)


# How gloo and NCCL report a peer that is gone: a timed-out or broken collective.
PEER_LOST = (
    "Timed out waiting",
    "Connection closed by peer",
    "Connection reset by peer",
    "collective operation timeout",
)


RECIPES = """\
recipes (from the project directory, with the venv active: . .venv/bin/activate; the README
shows each):
  python3 train.py                                  the embedded default (local.yaml) on the CPU
  python3 train.py --config local_v2.yaml           the same on the bundled SQuAD v2.0 text
  python3 train.py --config distributed.yaml --dry-run
                                                    the plan (steps, warm-up, lr) without training
  python3 train.py --settings --config distributed.yaml
                                                    every setting: default, the config's value
  python3 train.py --resume auto                    continue this run's newest checkpoint, or start
                                                    (what the same command typed again does)
  python3 train.py --restart                        train again from the beginning
  python3 train.py --checkpoints                    which run wrote each checkpoint, its EM/F1, size
  torchrun --nproc_per_node=2 train.py --config local.yaml --resume auto \\
      --checkpoint-dir checkpoints/two-processes    2 processes; rerun the same line after a stop

Ctrl-C (or SIGTERM) stops after the current batch, writes a checkpoint and prints the command
that resumes it; a second Ctrl-C stops at once; the same command typed again continues the run
(--restart trains it again). Paths inside a config, and in --set values, are relative to the
project directory; --config and the other paths on the command line to where you are.
"""


def build_parser() -> argparse.ArgumentParser:
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
        help="override a config value, e.g. --set hyperparameters.learning_rate=1e-4 (a path in it is the "
        "config's: relative to the project directory)",
    )
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--batches", type=int, help="total training length in batches")
    length.add_argument("--epochs", type=int, help="total training length in epochs")
    add_start_arguments(parser)
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
        "--checkpoints", action="store_true", help="list --checkpoint-dir's checkpoints; exit"
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
    return parser


def add_start_arguments(parser: argparse.ArgumentParser) -> None:
    """Where a run starts: a checkpoint to continue (the same command typed again continues its
    run), or the beginning."""
    start = parser.add_mutually_exclusive_group()
    start.add_argument(
        "--resume",
        metavar="DIR|URL|auto|latest",
        help="continue from a checkpoint directory or s3:// / gs:// / azure:// URL; `auto` (what a "
        "command without --resume or --restart does): from this run's newest complete checkpoint in "
        "--checkpoint-dir -- the same settings --, or from the start when there is none; `latest`: "
        "the same, but an error when there is none",
    )
    start.add_argument(
        "--restart",
        action="store_true",
        help="train from the beginning even where --checkpoint-dir holds a checkpoint of this run "
        "(it is kept; the run says where and how large)",
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.command_line = list(sys.argv[1:] if argv is None else argv)  # what a refusal may repeat, mended
    # Local runs work in the project directory, as a cluster trial works in its context
    # directory: relative paths in a config are relative to it, and Determined copies it
    # (filtered by .detignore) into each checkpoint's code/.
    args.config = args.config.resolve()
    args.checkpoint_dir = args.checkpoint_dir.resolve()
    if args.resume and args.resume not in ("latest", "auto") and not buckets.is_url(args.resume):
        args.resume = Path(args.resume).resolve()  # an s3:// or gs:// URL stays as typed
    args.metrics_out = args.metrics_out.resolve() if args.metrics_out else None
    for name in ("batches", "epochs"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name} must be a positive integer")
    return args


def run_options(args: argparse.Namespace) -> RunOptions:
    """The parsed command line as the run's typed options (the Namespace stays in the CLI)."""
    return RunOptions(
        config=args.config, overrides=tuple(args.overrides), batches=args.batches, epochs=args.epochs,
        checkpoint_dir=args.checkpoint_dir, resume=args.resume, restart=args.restart,
        allow_changed=args.allow_changed,
        metrics_out=args.metrics_out, command_line=tuple(args.command_line),
    )  # fmt: skip


def run(options: RunOptions, trial_class: type | None = None) -> dict[str, Any] | None:
    """Train as configured; rank 0 returns the final metrics. `trial_class` lets benchmarks
    instrument the trial (a SquadTrial subclass); users never need it."""
    with contextlib.ExitStack() as cleanup:  # what the run leaves behind: a resume's private copy
        return train_run(options, trial_class, cleanup)


def train_run(
    args: RunOptions, trial_class: type | None, cleanup: contextlib.ExitStack
) -> dict[str, Any] | None:
    det_internals.check_version()
    import model_def

    # On a cluster the master hands the config over; locally it is the command line's.
    source = run_source(det_internals.cluster_trial(), args, local_world_size())
    plan = run_plan.run_plan(source.exp_conf, source.hparams, source.slots)  # a bad config ends here
    return driver.driver_for(args, source, plan, cleanup).run(trial_class or model_def.SquadTrial)


@cli.boundary
def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.settings:  # a refusal or a closed pipe (`| head`): cli.boundary
        print("\n".join(settings_table(args.config, args.overrides)))
        return 0
    if args.checkpoints:
        from extractive_qa.launch.checkpoint_list import checkpoint_table

        print("\n".join(checkpoint_table(args.checkpoint_dir, Path.cwd())))  # before any chdir
        return 0
    import determined

    # Determined's own format: the WebUI parses the level from it for its log-level filter.
    logging.basicConfig(level=logging.INFO, format=determined.LOG_FORMAT)
    det_internals.quiet_shared_fs_selector_warning()
    if not args.dry_run and det_internals.cluster_trial() is None:
        from extractive_qa.launch import progress

        progress.quiet_determined_log()  # the progress display says it; a cluster keeps it all
        cli.hide_library_progress_bars()
    try:
        result = dry_run(run_options(args)) if args.dry_run else run(run_options(args))
    except interruption.Interrupted as stop:
        if stop.rank == 0:
            print(interruption.interrupted_line(stop, START_DIR), file=sys.stderr, flush=True)
        return stop.code
    except resume.Terminated:  # SIGTERM while a resume wrote its checked copy (removed on the way)
        print("terminated while checking the checkpoint to resume; nothing was trained, the checked "
              "copy is removed. Run the same command again to resume.", file=sys.stderr)  # fmt: skip
        return 143
    except KeyboardInterrupt:  # before training started: nothing was trained
        print("interrupted before training started; nothing to keep.", file=sys.stderr)
        return 130
    except RuntimeError as err:
        if not any(sign in str(err) for sign in PEER_LOST):
            raise
        print(
            f"error: a peer process stopped answering during a collective ({str(err).splitlines()[0]}). "
            f"A machine left the network or crashed; this rank gives up after "
            f"{run_plan.TIMEOUT_VARIABLE} (torch's default: 30 min for gloo, 10 for NCCL) so the run ends "
            "and max_restarts resumes it from the latest checkpoint.",
            file=sys.stderr,
        )
        return 3
    if result is not None:
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
