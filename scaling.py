"""Scaling study: a series of runs that differ only in slots, aggregation and optimizer, and its report.

    python3 scaling.py launch --master URL --config distributed.yaml --slots 1,2,4,8,16 \\
        --aggregation 1,2,4 --optimizer adamw,radam [--study ID] [--set KEY=VALUE] [--dry-run]
    python3 scaling.py report --master URL --study ID [--out DIR]
    python3 scaling.py local --config local.yaml --slots 1,2 --batches N --out DIR

Each run keeps the base config's per-slot batch (global batch = per-slot batch x slots, as in
the published scaling table) and changes nothing else but `resources.slots_per_trial`,
`optimizations.aggregation_frequency`, `hyperparameters.optimizer`, its name and its labels
(`study=ID`, `slots=N`, `agg=N`, `optimizer=X`, so the WebUI can filter and compare them).

The report is computed from measured metric reports only: samples/s from the steps and end
times of consecutive training reports (intervals that contain a validation are left out), train
time = the run's samples / that rate, speedup = samples/s over the 1-slot run with the same
aggregation and optimizer, per-slot efficiency = speedup / slots, EM and F1 from the last
validation. Failed or unfinished runs stay in the report with their state.

Layers: this module (planning, the pure report, the CLI) imports extractive_qa.scaling_runs (the
planned run, its report's inputs, and the runners: SDK, torchrun), which never imports it.
"""

from __future__ import annotations

import argparse
import copy
import io
import itertools
import json
import os
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from extractive_qa import cli  # first: a Ctrl-C while the libraries load is one line
from extractive_qa.config import experiment, run_plan
from extractive_qa.config.settings import OPTIMIZERS, Hyperparameters
from extractive_qa.errors import ConfigError, DataError, ScalingError
from extractive_qa.files import (
    ROOT,
    check_new_directory,
    check_output_dir,
    check_outputs,
    write_bytes_atomic,
    write_text_atomic,
)
from extractive_qa.scaling_runs import STUDY_LABEL, RunInputs, Variant
from extractive_qa.trial.optimization import apply_recipe

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
# From metric reports to a table.
# --------------------------------------------------------------------------------------------


@dataclass
class RunRecord:
    name: str
    state: str
    slots: int
    per_slot_batch: int
    aggregation: int
    optimizer: str
    steps: int | None = None
    samples: int | None = None
    samples_per_s: float | None = None
    train_seconds: float | None = None
    elapsed_seconds: float | None = None
    exact_match: float | None = None
    f1: float | None = None
    reported_samples_per_s: float | None = None  # the trial's own window rates (perf_*), pooled
    padding_frac: float | None = None
    data_wait_frac: float | None = None
    peak_mem_gib: float | None = None
    speedup: float | None = None
    efficiency: float | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def usable(self) -> bool:
        return self.state == "COMPLETED" and self.samples_per_s is not None


def record(run: RunInputs) -> RunRecord:
    rec = RunRecord(
        run.name,
        run.state,
        run.slots,
        run.global_batch_size // max(1, run.slots),
        run.aggregation,
        run.optimizer,
    )
    if run.error:
        rec.notes.append(run.error)
    training = sorted(run.training)
    validation_times = [t for _, t, _ in run.validation]
    samples = seconds = 0.0
    for (s0, t0), (s1, t1) in itertools.pairwise(training):
        if s1 <= s0 or t1 <= t0 or any(t0 < v <= t1 for v in validation_times):
            continue  # a validation (or a restart) inside: not pure training time
        samples += (s1 - s0) * run.global_batch_size
        seconds += t1 - t0
    if training:
        rec.steps = training[-1][0]
        rec.samples = rec.steps * run.global_batch_size
        rec.elapsed_seconds = round(max(t for _, t in training) - min(t for _, t in training), 2)
    if seconds > 0:
        rec.samples_per_s = round(samples / seconds, 3)
        rec.train_seconds = round(rec.samples / rec.samples_per_s, 2)
    elif run.state == "COMPLETED":
        rec.notes.append("fewer than two training reports without a validation between: no rate")
    pool_reported(run, rec)
    if run.validation:
        last = max(run.validation, key=lambda v: (v[0], v[1]))[2]
        em = last.get("exact_match", last.get("exact"))
        rec.exact_match = None if em is None else round(float(em), 2)
        rec.f1 = None if last.get("f1") is None else round(float(last["f1"]), 2)
    elif run.state == "COMPLETED":
        rec.notes.append("no validation reported")
    return rec


def pool_reported(run: RunInputs, rec: RunRecord) -> None:
    """The trial's own perf_* over its training windows, each weighted by its batches: the rate is
    all those samples over all those windows' seconds (the global batch cancels out)."""
    windows, previous = [], 0
    for steps, metrics in sorted(run.reported, key=lambda r: r[0]):
        batches, previous = steps - previous, steps
        if batches > 0 and metrics.get("perf_samples_per_s"):
            windows.append((batches, metrics))
    if not windows:
        return
    batches = sum(b for b, _ in windows)
    rec.reported_samples_per_s = round(batches / sum(b / m["perf_samples_per_s"] for b, m in windows), 3)
    for key in ("padding_frac", "data_wait_frac"):
        values = [(b, m[f"perf_{key}"]) for b, m in windows if f"perf_{key}" in m]
        if values:
            setattr(rec, key, round(sum(b * v for b, v in values) / sum(b for b, _ in values), 4))
    peaks = [m["perf_peak_mem_gib"] for _, m in windows if "perf_peak_mem_gib" in m]
    rec.peak_mem_gib = round(max(peaks), 2) if peaks else None


def build_report(runs: Sequence[RunInputs], study: str) -> dict[str, Any]:
    records = [record(r) for r in runs]
    if not any(r.usable for r in records):
        states = ", ".join(f"{r.name}: {r.state}" for r in records) or "none found"
        raise ScalingError(f"study {study}: no finished runs with training reports ({states}).")
    for rec in records:
        if not rec.usable:
            continue
        base = [
            b
            for b in records
            if b.usable and b.slots == 1 and (b.aggregation, b.optimizer) == (rec.aggregation, rec.optimizer)
        ]
        if base:
            rec.speedup = round(rec.samples_per_s / base[0].samples_per_s, 3)
            rec.efficiency = round(rec.speedup / rec.slots, 3)
        else:
            rec.notes.append("no finished 1-slot run with this aggregation/optimizer: no speedup")
    records.sort(key=lambda r: (r.aggregation, r.optimizer, r.slots, r.name))
    return {
        "study": study,
        "created": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "definitions": {
            "samples_per_s": "samples between consecutive training reports / their end-time difference, "
            "summed over intervals without a validation",
            "train_seconds": "the run's samples / samples_per_s",
            "elapsed_seconds": "first to last training report",
            "speedup": "samples_per_s / that of the 1-slot run with the same aggregation and optimizer",
            "efficiency": "speedup / slots",
            "reported_samples_per_s": "the trial's own perf_samples_per_s (training windows only, "
            "on the wall clock, all ranks) pooled over its reports: their samples / their seconds",
            "padding_frac, data_wait_frac": "the trial's perf_padding_frac / perf_data_wait_frac, "
            "weighted by each report's batches",
        },
        "runs": [asdict(r) for r in records],
    }


def _fmt(value: Any, spec: str = "") -> str:
    return "-" if value is None else format(value, spec)


REPORT_FILES = ("report.json", "report.md", "report.png")
LOCAL_FILES = (*REPORT_FILES, "configs", "runs", "checkpoints")  # what `local` writes into --out


def check_report_outputs(args: argparse.Namespace) -> None:
    """--out as every writer's outputs are checked (files.check_outputs: no link, no checkpoint,
    nothing the project uploads); `local` also takes a new directory or one holding only what an
    earlier `local` wrote, since it writes configs/, runs/ and checkpoints/ there."""
    out = args.out.resolve()
    check_output_dir(out, "--out")
    if args.command == "local":
        inputs = {"--config": args.config}
        check_outputs({"--out": out, **{f"--out ({n})": out / n for n in LOCAL_FILES}}, inputs)
        check_new_directory(out, "--out", LOCAL_FILES)
    else:
        check_outputs({f"--out ({n})": out / n for n in REPORT_FILES}, {}, new_files_in_upload=True)


def write_report(report: dict[str, Any], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / name for name in REPORT_FILES]
    write_text_atomic(paths[0], json.dumps(report, indent=1))
    lines = [
        f"# Scaling study {report['study']}",
        "",
        f"Written {report['created']} by `scaling.py` from the runs' metric reports.",
        "",
        "| run | state | slots | per-slot batch | aggregation | optimizer | train time | samples/s | "
        "speedup | efficiency | reported samples/s | padding | data wait | EM | F1 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["runs"]:
        t = r["train_seconds"]
        train = None if t is None else f"{t:.1f} s" if t < 120 else f"{t / 60:.1f} min"
        lines.append(
            f"| {r['name']} | {r['state']} | {r['slots']} | {r['per_slot_batch']} | {r['aggregation']} | "
            f"{r['optimizer']} | {_fmt(train)} | {_fmt(r['samples_per_s'], '.2f')} | "
            f"{_fmt(r['speedup'], '.2f')} | {_fmt(r['efficiency'], '.2f')} | "
            f"{_fmt(r['reported_samples_per_s'], '.2f')} | {_fmt(r['padding_frac'], '.1%')} | "
            f"{_fmt(r['data_wait_frac'], '.1%')} | {_fmt(r['exact_match'], '.1f')} | {_fmt(r['f1'], '.1f')} |"
        )
    notes = [(r["name"], n) for r in report["runs"] for n in r["notes"]]
    if notes:
        lines += ["", "Notes:", ""] + [f"- {name}: {note}" for name, note in notes]
    lines += ["", "Definitions:", ""] + [f"- {k}: {v}" for k, v in report["definitions"].items()]
    lines += ["", "![speedup vs slots](report.png)"]
    write_text_atomic(paths[1], "\n".join(lines) + "\n")
    plot(report, paths[2])
    return paths


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.5))
    series: dict[tuple[int, str], list[tuple[int, float]]] = {}
    for r in report["runs"]:
        if r["speedup"] is not None:
            series.setdefault((r["aggregation"], r["optimizer"]), []).append((r["slots"], r["speedup"]))
    top = max([r["slots"] for r in report["runs"]] + [1])
    ax.plot([1, top], [1, top], "k--", lw=1, label="linear (ideal)")
    for (agg, opt), points in sorted(series.items()):
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], "o-", label=f"agg {agg}, {opt}")
    ax.set_xticks(sorted({r["slots"] for r in report["runs"]} | {1}))
    ax.set_xlabel("slots")
    ax.set_ylabel("speedup over 1 slot (samples/s)")
    ax.set_title(f"Scaling study {report['study']}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    image = io.BytesIO()
    fig.savefig(image, format="png", dpi=120)
    write_bytes_atomic(path, image.getvalue())  # replaced whole, never written through a link
    plt.close(fig)


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


def main(argv: Sequence[str] | None = None) -> int:
    if cli.refuse_undecodable(argv):
        return 2
    args = parse_args(argv)
    try:
        if args.command in ("launch", "report") and not args.master and not getattr(args, "dry_run", False):
            raise ScalingError("--master URL (or DET_MASTER) is required for launch and report.")
        if args.command in ("report", "local"):  # where the report goes, before any work
            check_report_outputs(args)
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
    except (ScalingError, ConfigError, DataError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
