"""bf16 on the CPU, the fast dropout masks and the standard recipe: what the embedded default
gains in speed, and whether F1 pays for it, on paired seeds.

    python3 -m bench.cpu_precision study [--seeds 42,43,44,45,46]   # fp32 vs bf16, resumable
    python3 -m bench.cpu_precision masks [--seeds ...]              # fast vs torch's dropout masks
    python3 -m bench.cpu_precision recipes [--seeds ...] [--set K=V]  # ours vs the standard recipe
    python3 -m bench.cpu_precision report | masks-report | recipes-report  # a study's table

A study runs `train.py --config local.yaml` once per arm and seed, the arms alternating seed by
seed (so that they see the same machine state), and keeps one row per finished run; a stopped
study resumes where it was. An arm is one level of each factor -- `precision` (fp32, bf16 autocast),
`masks` (the fast dropout masks or torch's, `hyperparameters.dropout_masks`) and `recipe` (the fast
path, the trial's defaults, or the standard recipe of the transformers QA example: every window
padded to max_seq_length, random batches, eager attention) -- and every run pins all three, so a
row says what it measured. The three studies differ in what they vary (`--precisions`, `--masks`,
`--recipes` choose the levels) and in the file they keep (`--json`):

- study (bench/results/cpu-precision.json): fp32 and bf16, one run at a time, so that each run's
  training time is a fair end-to-end figure too.
- masks (cpu-dropout-masks.json): the fast masks and torch's, fp32. Seeds whose arm did not run
  here pair with `--baseline`'s rows of the same arm (by default the precision study's), and the
  report says which.
- recipes (recipes.json): the fast path and the standard recipe in fp32 and in bf16 (that recipe's
  own `--bf16`); `--set` adds train.py overrides to every run (e.g. `hyperparameters.tf32=false`
  on a GPU, so that fp32 is fp32 there too); `--jobs` runs side by side (a run's accuracy does not
  depend on it; its time does).

The report: F1 / EM (mean ± std) per arm, and for every factor with two levels the paired F1
difference (bf16 - fp32, fast - torch masks, fast path - standard) with its 95 % interval and the
training-time ratio per seed, between arms equal in the other factors. For precision and masks it
applies the rule the defaults follow: the new level may become the default only if the interval
lies within +-1.5 F1 of zero or above it. Rows recorded before a factor was varied ran with its
level of that time (torch's masks, the fast path).

Where a step's time goes and its bound: bench.cpu_step; each lever's speed: bench.throughput.

Every result names the CPU (model, cores, bf16 units) or the GPU it was measured on.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import study
from bench.common import machine_text, provenance
from bench.study import ROOT
from extractive_qa import cli

CONFIG = "local.yaml"
SEEDS = "42,43,44,45,46"
RESULTS = ROOT / "bench" / "results"

# What a study varies: each factor's levels, as train.py settings. The first level is compared
# against the second (bf16 - fp32, fast - torch masks, fast path - standard recipe).
FACTORS: dict[str, dict[str, tuple[str, ...]]] = {
    "recipe": {
        "fast": (),
        "standard": ("hyperparameters.batching=padded", "hyperparameters.attn_implementation=eager"),
    },
    "precision": {
        "bf16": ("hyperparameters.precision=bf16",),
        "fp32": ("hyperparameters.precision=fp32",),
    },
    "masks": {
        "fast": ("hyperparameters.dropout_masks=fast",),
        "torch": ("hyperparameters.dropout_masks=torch",),
    },
}
# The level a row recorded before its factor was varied ran with: the default of that time.
EARLIER = {"recipe": "fast", "masks": "torch"}
# What the default-switching rule says of a factor's first level, passing or failing.
RULES = {
    "precision": ("auto may pick bf16", "keep fp32 as the default"),
    "masks": ("the fast masks may be the default", "keep torch's masks as the default"),
}


@dataclass(frozen=True)
class Study:
    json: Path
    levels: dict[str, tuple[str, ...]]  # what it runs unless --recipes / --precisions / --masks say
    baseline: Path | None = None  # rows that pair with seeds not run here


STUDIES = {
    "study": Study(RESULTS / "cpu-precision.json", {"precision": ("fp32", "bf16")}),
    "masks": Study(
        RESULTS / "cpu-dropout-masks.json", {"masks": ("fast", "torch"), "precision": ("fp32",)},
        baseline=RESULTS / "cpu-precision.json",
    ),
    "recipes": Study(
        RESULTS / "recipes.json", {"recipe": ("fast", "standard"), "precision": ("fp32", "bf16")}
    ),
}  # fmt: skip
OPTION = {"recipe": "--recipes", "precision": "--precisions", "masks": "--masks"}  # the levels' flag
REPORTS = {"report": "study", "masks-report": "masks", "recipes-report": "recipes"}


def runs(
    seeds: list[int], levels: dict[str, tuple[str, ...]], extra: tuple[str, ...] = ()
) -> list[study.Run]:
    """Every arm (one level per factor) per seed, seed by seed; each run pins every factor."""
    out = []
    for seed, *chosen in itertools.product(seeds, *levels.values()):
        cell = dict(zip(levels, chosen, strict=True))
        overrides = tuple(o for factor, level in cell.items() for o in FACTORS[factor][level])
        out.append(study.Run(cell, seed, (*overrides, *extra)))
    return out


def normalized(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with every factor named (those recorded before a factor was varied get EARLIER's)."""
    return [{**EARLIER, **row} for row in rows]


def arm_name(arm: dict[str, str], factors: list[str]) -> str:
    return ", ".join(f"{f} {arm[f]}" for f in factors)


def borrow(
    rows: list[dict[str, Any]], baseline: dict[str, Any] | None
) -> tuple[list[dict[str, Any]], list[str]]:
    """The baseline's rows for arms run here at seeds not run here (marked, so that no training
    time is taken from them), and a note per arm saying so."""
    if baseline is None:
        return [], []
    arms = {json.dumps({f: r[f] for f in FACTORS}, sort_keys=True) for r in rows}
    have = {(json.dumps({f: r[f] for f in FACTORS}, sort_keys=True), r["seed"]) for r in rows}
    where = (baseline.get("cpu") or {}).get("cpu") or baseline.get("device") or "?"
    taken: dict[str, list[int]] = {}
    borrowed = []
    for row in normalized(baseline["rows"]):
        key = json.dumps({f: row[f] for f in FACTORS}, sort_keys=True)
        if key in arms and (key, row["seed"]) not in have:
            borrowed.append({**row, "borrowed": True})
            taken.setdefault(key, []).append(row["seed"])
    notes = [
        f"{arm_name(json.loads(key), list(FACTORS))}, seeds {', '.join(map(str, sorted(seeds)))}: "
        f"the baseline study's rows ({where})"
        for key, seeds in taken.items()
    ]
    return borrowed, notes


def report(result: dict[str, Any], baseline: dict[str, Any] | None = None) -> str:
    rows = normalized(result["rows"])
    borrowed, notes = borrow(rows, baseline)
    rows += borrowed
    measured = [r for r in rows if not r.get("borrowed")]
    present = {f: [lv for lv in FACTORS[f] if any(r[f] == lv for r in rows)] for f in FACTORS}
    varied = [f for f in FACTORS if len(present[f]) > 1]
    shown = varied or ["precision"]
    cpu = result.get("cpu")
    machine = str(result.get("machine") or result.get("device") or "")
    if isinstance(cpu, dict):
        machine = f"{machine_text(cpu=cpu)}, torch {cpu.get('torch', '?')}"
    overrides = " ".join(result.get("overrides", [])) or "none"
    fixed = ", ".join(f"{f} {present[f][0]}" for f in FACTORS if len(present[f]) == 1)
    lines = [f"{CONFIG}, paired seeds; {machine or '?'}; fixed: {fixed or '-'}; overrides: {overrides}", ""]
    lines.append("| " + " | ".join(shown) + " | n | F1 | EM | training s (runs here) |")
    lines.append("|" + "---|" * (len(shown) + 4))
    for chosen in itertools.product(*(present[f] for f in FACTORS)):
        arm = dict(zip(FACTORS, chosen, strict=True))
        s = study.summary(rows, arm, None)
        if s is None:
            continue
        seconds = list(study.by_seed(measured, arm, "train_seconds").values())
        mean_s = f"{sum(seconds) / len(seconds):.1f}" if seconds else "-"
        lines.append(f"| {' | '.join(arm[f] for f in shown)} | {study.fmt_summary(s)} | {mean_s} |")
    lines.append("")
    for factor in varied:
        first, second = present[factor][:2]
        others = [f for f in FACTORS if f != factor]
        for chosen in itertools.product(*(present[f] for f in others)):
            rest = dict(zip(others, chosen, strict=True))
            a, b = {**rest, factor: first}, {**rest, factor: second}
            diff = study.paired(study.by_seed(rows, a), study.by_seed(rows, b))
            if diff is None:
                continue
            within = arm_name(rest, [f for f in others if f in varied])
            line = f"- {factor} {first} - {second}{f' ({within})' if within else ''}: "
            line += f"paired F1 {study.fmt_diff(diff)}, n = {diff['n']}"
            if factor in RULES:
                passes = study.passes_rule(diff)
                verdict = f"PASS: {RULES[factor][0]}" if passes else f"FAIL: {RULES[factor][1]}"
                line += f"; rule ({study.RULE}): {verdict}"
            lines.append(line)
            t_a = study.by_seed(measured, a, "train_seconds")
            t_b = study.by_seed(measured, b, "train_seconds")
            shared = sorted(set(t_a) & set(t_b))
            if shared:
                ratios = [t_a[s] / t_b[s] for s in shared]
                mean, std = study.mean_std(ratios)
                per_seed = ", ".join(f"{s}: {r:.3f}" for s, r in zip(shared, ratios, strict=True))
                lines.append(
                    f"  training time {first} / {second}, runs measured here, per seed: {per_seed}; "
                    f"mean {mean:.3f} ± {std:.3f}"
                )
    return "\n".join(lines + [f"- {n}" for n in notes])


def chosen_levels(args: argparse.Namespace, preset: Study, on_gpu: bool) -> dict[str, tuple[str, ...]]:
    """Each factor's levels to run: the command line's, else the study's, else the default's
    (the fast path; the fast masks on a CPU, torch's on a GPU, where CUDA keeps torch's dropout)."""
    default_masks = ("torch",) if on_gpu else ("fast",)
    levels = {"recipe": ("fast",), "precision": ("fp32", "bf16"), "masks": default_masks}
    levels.update(preset.levels)
    for factor, option in OPTION.items():
        given = getattr(args, option.lstrip("-"))
        if given is not None:
            picked = tuple(v for v in given.split(",") if v)
            if not picked or set(picked) - set(FACTORS[factor]):
                allowed = ",".join(FACTORS[factor])
                raise SystemExit(f"{option} {given!r}: a comma-separated subset of {allowed}")
            levels[factor] = picked
    if on_gpu and "fast" in levels["masks"]:
        raise SystemExit(
            "--masks fast: the fast dropout masks are the CPU's; CUDA draws torch's (--masks torch)"
        )
    return levels


@cli.boundary
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=[*STUDIES, *REPORTS])
    parser.add_argument("--seeds", default=SEEDS, help="a study: comma-separated experiment seeds")
    parser.add_argument("--precisions", help="a study: which of fp32,bf16 to run")
    parser.add_argument("--masks", help="a study: which of fast,torch dropout masks to run")
    parser.add_argument("--recipes", help="a study: which of fast,standard recipes to run")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="a study: a train.py --set for every run (e.g. hyperparameters.tf32=false on a GPU)",
    )  # fmt: skip
    parser.add_argument("--jobs", type=int, default=1, help="a study: runs side by side")
    parser.add_argument(
        "--baseline", type=Path,
        help="a report: the study whose rows pair with seeds not run here (masks: cpu-precision.json)",
    )  # fmt: skip
    parser.add_argument("--json", type=Path, help="the study's file (default: its own in bench/results)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        parser.error(f"--seeds {args.seeds!r}: comma-separated integers, e.g. 42,43,44")
    if args.baseline is not None and not args.baseline.is_file():
        parser.error(f"--baseline {args.baseline}: no such file (a study's JSON in bench/results)")
    name = REPORTS.get(args.what, args.what)
    preset = STUDIES[name]
    path = args.json or preset.json
    running = args.what in STUDIES
    # A study's runs all share its overrides; its report reads the file whatever they were.
    result = study.load(path, {"config": CONFIG, **({"overrides": args.overrides} if running else {})})
    if running:
        import torch

        on_gpu = torch.cuda.is_available()
        levels = chosen_levels(args, preset, on_gpu)
        result["device"] = study.device_name()
        recorded = provenance("bench.cpu_precision", sys.argv[1:], torch.device("cuda" if on_gpu else "cpu"))
        result["machine"], result["cpu"] = recorded["machine"], recorded["cpu"]
        command = [f"python3 -m bench.cpu_precision {name} --seeds {args.seeds}"]
        command += [f"{OPTION[f]} {','.join(v)}" for f, v in levels.items()]
        command += [f"--set {o}" for o in args.overrides]
        command += [f"--json {args.json}"] if args.json else []
        result["command"], result["date"] = " ".join(command), time.strftime("%Y-%m-%d")
        result["commit"], result["versions"] = recorded["commit"], recorded["versions"]
        result["overrides"] = args.overrides
        result["rows"] = normalized(result["rows"])
        study.run_all(runs(seeds, levels, tuple(args.overrides)), path, result, CONFIG, jobs=args.jobs)
        study.save(path, result)
    if not result["rows"]:
        raise SystemExit(f"{path}: no runs recorded yet; `python3 -m bench.cpu_precision {name}` runs them")
    baseline_path = args.baseline or preset.baseline
    baseline = None
    if baseline_path is not None and baseline_path.resolve() != path.resolve() and baseline_path.is_file():
        baseline = json.loads(baseline_path.read_text())
    print(report(result, baseline))
    return 0


if __name__ == "__main__":
    sys.exit(main())
