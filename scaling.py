"""Scaling study: a series of runs that differ only in slots, aggregation and optimizer, and its report.

    python3 scaling.py launch --master URL --config distributed.yaml --slots 1,2,4,8,16 \\
        --aggregation 1,2,4 --optimizer adamw,radam [--study ID] [--set KEY=VALUE] [--dry-run]
    python3 scaling.py report --master URL --study ID [--out DIR]
    python3 scaling.py local --config local.yaml --slots 1,2 --batches N --out DIR

Each run keeps the base config's per-slot batch (global batch = per-slot batch x slots, as in
the published scaling table) and changes nothing else but `resources.slots_per_trial`,
`optimizations.aggregation_frequency`, `hyperparameters.optimizer`, its name and its labels
(`study=ID`, `slots=N`, `agg=N`, `optimizer=X`, so the WebUI can filter and compare them).

The report is computed from measured metric reports only (extractive_qa.scaling_report). This
script plans the series and is the command line; the package holds the runners
(extractive_qa.scaling_runs: SDK, torchrun) and the report, and never imports it.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from extractive_qa import cli  # first: a Ctrl-C while the libraries load is one line
from extractive_qa.config import experiment, run_plan
from extractive_qa.config.settings import OPTIMIZERS, Hyperparameters
from extractive_qa.errors import ScalingError
from extractive_qa.io.files import ROOT
from extractive_qa.scaling_report import (  # noqa: F401 -- the report's API, as scaling.X
    REPORT_FILES,
    RunRecord,
    build_report,
    check_report_outputs,
    pool_reported,
    record,
    write_report,
)
from extractive_qa.scaling_runs import STUDY_LABEL, Variant
from extractive_qa.trial.optimizer_recipes import apply_recipe

# --------------------------------------------------------------------------------------------
# The series of configs.
# --------------------------------------------------------------------------------------------


def int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ScalingError(f"{flag} {text!r}: expected positive integers like 1,2,4") from None
    if not values or min(values) < 1:
        raise ScalingError(f"{flag} {text!r}: expected positive integers like 1,2,4")
    return sorted(set(values))


def variants(
    base: dict[str, Any],
    slots: Iterable[int],
    aggregation: Iterable[int],
    optimizers: Iterable[str],
    study: str,
) -> list[Variant]:
    searcher = (base.get("searcher") or {}).get("name", "single")
    if searcher != "single":
        raise ScalingError(
            f"searcher.name is {searcher!r}: a scaling study compares single runs; use a config with "
            "searcher.name: single (const.yaml, distributed.yaml, multi_machine.yaml, local.yaml)."
        )
    hparams = experiment.local_hparams(base)
    base_slots = experiment.slots_of(base)
    global_batch = hparams.get("global_batch_size", Hyperparameters().global_batch_size)
    if not isinstance(global_batch, int) or global_batch % base_slots:
        raise ScalingError(
            f"hyperparameters.global_batch_size ({global_batch!r}) must be a constant integer divisible "
            f"by resources.slots_per_trial ({base_slots}) to give a per-slot batch."
        )
    per_slot = global_batch // base_slots
    for opt in optimizers:
        if opt not in OPTIMIZERS:
            raise ScalingError(f"--optimizer {opt!r}: choose from {', '.join(OPTIMIZERS)}.")
    base_name = base.get("name", "squad")
    out = []
    for s in slots:
        for a in aggregation:
            for opt in optimizers:
                conf = copy.deepcopy(base)
                name = f"{base_name} [{study}] slots={s} agg={a} {opt}"
                conf["name"] = name
                labels = set(conf.get("labels") or [])
                labels |= {STUDY_LABEL, f"study={study}", f"slots={s}", f"agg={a}", f"optimizer={opt}"}
                conf["labels"] = sorted(labels)
                conf.setdefault("resources", {})["slots_per_trial"] = s
                conf.setdefault("optimizations", {})["aggregation_frequency"] = a
                apply_recipe(conf["hyperparameters"], opt)
                conf["hyperparameters"]["global_batch_size"] = per_slot * s
                # each one must be valid
                plan = run_plan.run_plan(conf, experiment.local_hparams(conf), s)
                out.append(Variant(name, s, a, opt, per_slot, conf, plan.learning_rate))
    return out


def plan_series(series: Sequence[Variant]) -> list[dict[str, Any]]:
    """What `train.py --dry-run` counts and warns for each run of a series."""
    from extractive_qa.dry_run import count_plan, count_training_windows

    rows, windows = [], None
    for v in series:
        plan = run_plan.run_plan(v.config, experiment.local_hparams(v.config), v.slots)
        windows = windows or count_training_windows(plan.data, ROOT)  # the same data in every run
        counts = count_plan(plan, v.config, v.slots, windows)
        keys = ("training_windows", "optimizer_steps", "warmup_steps", "warnings")
        rows.append({k: counts.get(k) for k in keys})
    return rows


# --------------------------------------------------------------------------------------------
# CLI.
# --------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def series_args(p: argparse.ArgumentParser, slots: str) -> None:
        p.add_argument("--config", type=Path, required=True, help="base experiment YAML")
        p.add_argument("--slots", default=slots, help="comma list, e.g. 1,2,4,8,16")
        p.add_argument("--aggregation", default="1", help="comma list of aggregation frequencies")
        p.add_argument("--optimizer", default="adamw", help="comma list: adamw,radam,lamb")
        p.add_argument(
            "--set",
            dest="overrides",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="change the base config for every run (e.g. hyperparameters.learning_rate=5e-5)",
        )
        p.add_argument("--study", default=time.strftime("%Y%m%d-%H%M%S"), help="study id (label)")

    p = sub.add_parser("launch", help="create one experiment per combination on a cluster")
    series_args(p, "1,2,4,8,16")
    p.add_argument("--master", default=os.environ.get("DET_MASTER"))
    p.add_argument("--dry-run", action="store_true", help="print the configs, create nothing")
    p = sub.add_parser("report", help="pull a study's metrics and write report.md/json/png")
    p.add_argument("--master", default=os.environ.get("DET_MASTER"))
    p.add_argument("--study", required=True)
    p.add_argument("--out", type=Path, default=Path("."))
    p = sub.add_parser("local", help="run the series here with torchrun and write the report")
    series_args(p, "1,2")
    p.add_argument("--batches", type=int, required=True, help="training length of each run")
    p.add_argument("--out", type=Path, required=True)
    return parser.parse_args(argv)


@cli.boundary
def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command in ("launch", "report") and not args.master and not getattr(args, "dry_run", False):
        raise ScalingError("--master URL (or DET_MASTER) is required for launch and report.")
    if args.command in ("report", "local"):  # where the report goes, before any work
        check_report_outputs(args.command, args.out, getattr(args, "config", None))
    from extractive_qa import scaling_runs

    if args.command == "report":
        report = build_report(scaling_runs.from_cluster(args.master, args.study), args.study)
        paths = write_report(report, args.out)
        print(json.dumps({"study": args.study, "written": [str(p) for p in paths]}))
        return 0
    if not args.config.is_file():
        raise ScalingError(f"--config {args.config}: no such file.")
    base = experiment.load_experiment(args.config, args.overrides)
    slots = int_list(args.slots, "--slots")
    aggregation = int_list(args.aggregation, "--aggregation")
    optimizers = [o.strip() for o in args.optimizer.split(",") if o.strip()]
    series = variants(base, slots, aggregation, optimizers, args.study)
    if args.command == "launch":
        if args.dry_run:  # each run's plan, with the dry run's counts and warnings
            for v, counts in zip(series, plan_series(series), strict=True):
                row = {"name": v.name, "learning_rate": v.learning_rate, **counts, "config": v.config}
                print(json.dumps(row))
            return 0
        ids = scaling_runs.launch(scaling_runs.connect(args.master), series)
        print(json.dumps({"study": args.study, "experiments": ids}))
        return 0
    if args.batches < 1:
        raise ScalingError("--batches must be a positive integer.")
    runs = scaling_runs.run_local(series, args.batches, args.out)
    paths = write_report(build_report(runs, args.study), args.out)
    print(json.dumps({"study": args.study, "written": [str(p) for p in paths]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
