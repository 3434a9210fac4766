"""A scaling study's report: each run's rate, time, speedup and per-slot efficiency, computed from
its measured metric reports only, written as report.json, report.md and report.png -- and where a
report may be written (the writers' rules: files.check_outputs).

samples/s comes from the steps and end times of consecutive training reports (intervals that
contain a validation are left out), train time = the run's samples / that rate, speedup =
samples/s over the 1-slot run with the same aggregation and optimizer, per-slot efficiency =
speedup / slots, EM and F1 from the last validation. Failed or unfinished runs stay in the
report with their state. scaling.py is its command line.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from extractive_qa.errors import ScalingError
from extractive_qa.io.files import (
    check_new_directory,
    check_output_dir,
    check_outputs,
    drawn_from,
    write_bytes_atomic,
    write_text_atomic,
)
from extractive_qa.scaling_runs import LOCAL_MARKER, RunInputs

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


def check_report_outputs(command: str, out: Path, config: Path | None) -> None:
    """--out as every writer's outputs are checked (files.check_outputs: no link, no checkpoint,
    nothing the project uploads); `local` also takes a new directory or one holding only what an
    earlier `local` wrote, since it writes configs/, runs/ and checkpoints/ there."""
    out = out.resolve()
    check_output_dir(out, "--out")
    if command == "local":
        check_outputs({"--out": out, **{f"--out ({n})": out / n for n in LOCAL_FILES}}, {"--config": config})
        check_new_directory(out, "--out", LOCAL_FILES, marker=LOCAL_MARKER)
    else:
        check_outputs({f"--out ({n})": out / n for n in REPORT_FILES}, {})


Draw = Callable[[dict[str, Any], Path, dict[str, str]], None]


def write_report(report: dict[str, Any], out: Path, draw: Draw | None = None) -> list[Path]:
    """report.json, report.md from it, and report.png drawn by `draw` (the speedup against slots
    unless a study draws its own), which names the report.json it shows."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / name for name in REPORT_FILES]
    data = json.dumps(report, indent=1)
    write_text_atomic(paths[0], data)
    write_text_atomic(paths[1], markdown(report))
    (draw or plot)(report, paths[2], drawn_from(paths[0].name, data.encode()))
    return paths


def markdown(report: dict[str, Any]) -> str:
    """report.md: the table of report.json, so the two cannot say different things (a report kept
    in the docs is checked against its JSON by `python3 -m bench.docs --check`)."""
    lines = [
        f"# Scaling study {report['study']}",
        "",
        f"Written {report['created']} by `scaling.py` from the runs' metric reports.",
    ]
    if report.get("machine"):  # a study that ran here knows its machine (bench.multi_machine)
        lines += ["", f"Measured on {report['machine']}, {report['date']}: `{report['command']}`."]
    lines += [
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
    lines += ["", "![the runs above, drawn](report.png)"]
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def png_axes(path: Path, source: dict[str, str], size: tuple[float, float], dpi: int = 120) -> Iterator[Any]:
    """Axes to draw on; once the block ends, the figure is written to `path` as a PNG whose
    metadata names what it shows (files.drawn_from), replaced whole and never through a link. A
    block that raises writes nothing. matplotlib is needed only here, by the commands that draw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=size)
    try:
        yield ax
        fig.tight_layout()
        image = io.BytesIO()
        fig.savefig(image, format="png", dpi=dpi, metadata=source)
        write_bytes_atomic(path, image.getvalue())
    finally:
        plt.close(fig)


def plot(report: dict[str, Any], path: Path, source: dict[str, str]) -> None:
    with png_axes(path, source, (6, 4.5)) as ax:
        _draw_speedups(report, ax)


def _draw_speedups(report: dict[str, Any], ax: Any) -> None:
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
