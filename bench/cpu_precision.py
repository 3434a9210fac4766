"""bf16 on the CPU: what the embedded default gains in speed and whether F1 pays for it.

    python3 -m bench.cpu_precision study [--seeds 42,43,44,45,46]   # paired seeds, resumable
    python3 -m bench.cpu_precision report                           # the table from --json
    python3 -m bench.cpu_precision profile [--batches 8]            # where a training step goes
    python3 -m bench.cpu_precision levers [--batches 16 --rounds 2] # each lever, side by side
    python3 -m bench.cpu_precision recipes [--seeds ...] [--set K=V]  # F1: ours vs the standard recipe
    python3 -m bench.cpu_precision recipes-report                  # its table from --json
    python3 -m bench.cpu_precision masks [--seeds ...] [--masks fast,torch]  # dropout masks: F1, time
    python3 -m bench.cpu_precision masks-report                    # its table from --json

- study: `train.py --config local.yaml --set hyperparameters.precision=fp32|bf16` per seed, the
  two precisions alternating seed by seed on a quiet machine, one run at a time (so each run's
  training time is a fair end-to-end speed figure too). F1 / EM mean +- std per precision, the
  paired F1 difference bf16 - fp32 with its 95 % interval, and the training-time ratio per seed.
  `precision: auto` switches to bf16 by default only if that interval lies within +-1.5 F1 of zero
  or above it (the rule is printed with its verdict).
- profile: torch.profiler over the trial's training step (bench/common.Loop: forward under
  autocast, backward, clip, AdamW, schedule) on the embedded default's real batches, fp32 and
  bf16; self time grouped into matmuls, attention, dropout masks, casts, norms / activations /
  element-wise, embedding gradient, optimizer, other host work.
- levers: the same step with one change at a time, interleaved rounds, best of the rounds:
  ms per step and the ratio to fp32.

- recipes: the fast path (the trial's defaults) against the standard recipe of the transformers
  QA example -- every window padded to max_seq_length, random batches, eager attention
  (`hyperparameters.batching=padded`, `attn_implementation=eager`) -- with the same model, data,
  hyperparameters, seed and number of steps, in fp32 and in bf16 autocast (that recipe's own
  `--bf16`), evaluated by the same evaluation. F1 / EM per arm, the paired F1 difference
  fast - standard per precision and bf16 - fp32 per recipe, and the training-time ratio
  standard / fast per seed. `--set` adds train.py overrides to every run (e.g.
  `hyperparameters.tf32=false` on a GPU, so that fp32 is fp32 there too); `--jobs` runs side by
  side (the accuracy of a run does not depend on it; its time does).

- masks: the embedded default with `hyperparameters.dropout_masks` fast (the default) and torch,
  paired seeds, one run at a time: F1 / EM per arm, the paired F1 difference fast - torch, and the
  training-time ratio fast / torch per seed. Arms not run here pair with `--baseline`'s rows of the
  same precision (the precision study's, which ran with torch's masks), as the report says.

Every result names the CPU (model, cores, bf16 units) or the GPU it was measured on.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path
from typing import Any

from bench import study
from bench.common import cpu_description
from bench.study import ROOT

CONFIG = "local.yaml"
SEEDS = "42,43,44,45,46"
PRECISIONS = ("fp32", "bf16")
DEFAULT_JSON = ROOT / "bench" / "results" / "cpu-precision.json"
BOUND = 1.5  # the default switches only if the paired F1 interval's lower end is at least -BOUND


# The transformers QA example's recipe, as the trial's settings (the rest -- model, data,
# hyperparameters, optimizer maths, schedule, evaluation -- is shared).
RECIPES = {
    "fast": (),
    "standard": ("hyperparameters.batching=padded", "hyperparameters.attn_implementation=eager"),
}


def runs(seeds: list[int], precisions: tuple[str, ...] = PRECISIONS) -> list[study.Run]:
    """fp32 and bf16 alternating seed by seed, so that both see the same machine state."""
    return [
        study.Run({"precision": p}, seed, (f"hyperparameters.precision={p}",))
        for seed, p in itertools.product(seeds, precisions)
    ]


def recipe_runs(seeds: list[int], precisions: tuple[str, ...], extra: tuple[str, ...]) -> list[study.Run]:
    """Every (recipe, precision) per seed, seed by seed."""
    return [
        study.Run(
            {"recipe": r, "precision": p}, seed, (*RECIPES[r], f"hyperparameters.precision={p}", *extra)
        )
        for seed, p, r in itertools.product(seeds, precisions, RECIPES)
    ]


def recipes_report(result: dict[str, Any]) -> str:
    rows = result["rows"]
    where = result.get("device") or ""
    lines = [
        f"{CONFIG}, the fast path vs the standard recipe, paired seeds; {where}; "
        f"overrides: {' '.join(result.get('overrides', [])) or 'none'}",
        "",
        "| recipe | precision | n | F1 | EM | training s (mean) | paired F1 diff [95 % CI] |",
        "|---|---|---|---|---|---|---|",
    ]
    for r, p in itertools.product(RECIPES, PRECISIONS):
        cell = {"recipe": r, "precision": p}
        base = {"recipe": "standard", "precision": p} if r == "fast" else None
        s = study.summary(rows, cell, base)
        if s is None:
            continue
        seconds = list(study.by_seed(rows, cell, "train_seconds").values())
        against = "fast - standard " + study.fmt_diff(s["diff"]) if s["diff"] else "-"
        lines.append(
            f"| {r} | {p} | {s['n']} | {s['f1_mean']:.2f} ± {s['f1_std']:.2f} | {s['em_mean']:.2f} ± "
            f"{s['em_std']:.2f} | {sum(seconds) / len(seconds):.1f} | {against} |"
        )
    lines.append("")
    for r in RECIPES:
        diff = study.paired(
            study.by_seed(rows, {"recipe": r, "precision": "bf16"}),
            study.by_seed(rows, {"recipe": r, "precision": "fp32"}),
        )
        if diff is not None:
            lines.append(f"{r}: paired F1 bf16 - fp32 {study.fmt_diff(diff)} (n = {diff['n']})")
    for p in PRECISIONS:
        fast = study.by_seed(rows, {"recipe": "fast", "precision": p}, "train_seconds")
        standard = study.by_seed(rows, {"recipe": "standard", "precision": p}, "train_seconds")
        shared = sorted(set(fast) & set(standard))
        if shared:
            ratios = [standard[s] / fast[s] for s in shared]
            mean, std = study.mean_std(ratios)
            lines.append(f"{p}: training time standard / fast {mean:.2f} ± {std:.2f} (n = {len(shared)})")
    return "\n".join(lines)


def report(result: dict[str, Any]) -> str:
    rows, m = result["rows"], result.get("machine", {})
    machine = f"{m.get('cpu', '?')} {m.get('family', '')}".strip()
    machine += f", {m.get('cores', '?')} cores, bf16 units: {', '.join(m.get('bf16_units', ['?']))}"
    lines = [
        f"{CONFIG}, paired seeds, one run at a time; {machine}, torch {m.get('torch', '?')}",
        "",
        "| precision | n | F1 | EM | training s (mean) | paired F1 diff to fp32 [95 % CI] |",
        "|---|---|---|---|---|---|",
    ]
    base = {"precision": "fp32"}
    for p in PRECISIONS:
        s = study.summary(rows, {"precision": p}, None if p == "fp32" else base)
        if s is None:
            continue
        seconds = study.by_seed(rows, {"precision": p}, "train_seconds")
        mean_s = sum(seconds.values()) / len(seconds)
        lines.append(
            f"| {p} | {s['n']} | {s['f1_mean']:.2f} ± {s['f1_std']:.2f} | {s['em_mean']:.2f} ± "
            f"{s['em_std']:.2f} | {mean_s:.1f} | {study.fmt_diff(s['diff'])} |"
        )
    fp32_s = study.by_seed(rows, base, "train_seconds")
    bf16_s = study.by_seed(rows, {"precision": "bf16"}, "train_seconds")
    shared = sorted(set(fp32_s) & set(bf16_s))
    if shared:
        ratios = [bf16_s[s] / fp32_s[s] for s in shared]
        mean, std = study.mean_std(ratios)
        per_seed = ", ".join(f"{s}: {r:.3f}" for s, r in zip(shared, ratios, strict=True))
        lines += ["", f"training time bf16 / fp32, per seed: {per_seed}; mean {mean:.3f} ± {std:.3f}"]
    diff = study.paired(study.by_seed(rows, {"precision": "bf16"}), study.by_seed(rows, base))
    if diff is not None:
        passes = diff["lo"] >= -BOUND  # inside [-BOUND, +BOUND], or reaching above it
        verdict = "PASS: auto may pick bf16" if passes else "FAIL: keep fp32 as the default"
        lines.append(
            f"F1 rule (the 95 % interval within +-{BOUND} of zero, or above it): {verdict} "
            f"({study.fmt_diff(diff)}, n = {diff['n']})"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "what",
        choices=[
            "study",
            "report",
            "profile",
            "levers",
            "recipes",
            "recipes-report",
            "masks",
            "masks-report",
        ],
    )
    parser.add_argument("--seeds", default=SEEDS, help="study, recipes: comma-separated experiment seeds")
    parser.add_argument(
        "--precisions", default=",".join(PRECISIONS), help="study, recipes: which of fp32,bf16 to run"
    )
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="recipes: a train.py --set for every run (e.g. hyperparameters.tf32=false on a GPU)",
    )  # fmt: skip
    parser.add_argument("--jobs", type=int, default=1, help="recipes: runs side by side")
    parser.add_argument("--masks", default=",".join(MASKS), help="masks: which of fast,torch to run")
    parser.add_argument(
        "--baseline", type=Path, default=DEFAULT_JSON,
        help="masks-report: the study whose rows (torch's masks) pair with fast runs not paired here",
    )  # fmt: skip
    parser.add_argument("--batches", type=int, default=8, help="profile / levers: timed batches")
    parser.add_argument("--rounds", type=int, default=2, help="levers: interleaved rounds (best of)")
    parser.add_argument(
        "--json", type=Path, default=DEFAULT_JSON, help="the study file (recipes: recipes.json)"
    )
    args = parser.parse_args(argv)
    precisions = tuple(p for p in args.precisions.split(",") if p)
    if not precisions or set(precisions) - set(PRECISIONS):
        parser.error(f"--precisions {args.precisions!r}: a comma-separated subset of {','.join(PRECISIONS)}")
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    if args.what.startswith("recipes"):
        return recipes_main(args, precisions)
    if args.what.startswith("masks"):
        return masks_main(args, precisions)
    result = study.load(args.json, {"config": CONFIG})
    if args.what != "report":  # a measurement: it names the CPU it ran on
        result["machine"] = cpu_description()
    if args.what == "study":
        result["command"] = "python3 -m bench.cpu_precision study --seeds " + args.seeds
        result["date"] = time.strftime("%Y-%m-%d")
        seeds = [int(s) for s in args.seeds.split(",")]
        study.run_all(runs(seeds, precisions), args.json, result, CONFIG, jobs=1)
    elif args.what in ("profile", "levers"):
        from bench import cpu_step

        measured = getattr(cpu_step, args.what)(args)
        result[args.what] = {**measured, "machine": cpu_description(), "date": time.strftime("%Y-%m-%d")}
        print(measured["table"])
    if args.what != "report":
        study.save(args.json, result)
    if args.what in ("study", "report"):
        print(report(result))
    return 0


MASKS = ("fast", "torch")


def mask_runs(seeds: list[int], precisions: tuple[str, ...], masks: tuple[str, ...]) -> list[study.Run]:
    return [
        study.Run(
            {"precision": p, "masks": m},
            seed,
            (f"hyperparameters.precision={p}", f"hyperparameters.dropout_masks={m}"),
        )
        for seed, p, m in itertools.product(seeds, precisions, masks)
    ]


def masks_report(result: dict[str, Any], baseline: dict[str, Any] | None) -> str:
    """fast vs torch masks per precision; torch rows missing here come from the baseline study."""
    rows = list(result["rows"])
    cpu = result.get("machine") or {}
    where = f"{cpu.get('cpu', '?')} {cpu.get('family', '')}, {cpu.get('torch_threads', '?')} threads"
    lines = [f"{CONFIG}, dropout masks fast vs torch, paired seeds; {where}", ""]
    lines += [
        "| precision | masks | n | F1 | EM | training s (runs here) | paired F1 fast - torch [95 % CI] |"
    ]
    lines += ["|---|---|---|---|---|---|---|"]
    notes = []
    for p in PRECISIONS:
        torch_cell = {"precision": p, "masks": "torch"}
        have = set(study.by_seed(rows, torch_cell))
        if baseline is not None:
            borrowed = [
                {**r, "masks": "torch"} for r in baseline["rows"]
                if r.get("precision") == p and "masks" not in r and r["seed"] not in have
            ]  # fmt: skip
            if borrowed and study.by_seed(rows, {"precision": p, "masks": "fast"}):
                rows += borrowed
                where = baseline.get("machine", {}).get("cpu", "?")
                notes.append(
                    f"{p}, torch masks, seeds {', '.join(str(r['seed']) for r in borrowed)}: the baseline "
                    f"study's rows ({where})"
                )
        for m in MASKS:
            cell = {"precision": p, "masks": m}
            s = study.summary(rows, cell, torch_cell if m == "fast" else None)
            if s is None:
                continue
            seconds = list(study.by_seed(result["rows"], cell, "train_seconds").values())  # measured here
            mean_s = f"{sum(seconds) / len(seconds):.1f}" if seconds else "-"
            lines.append(
                f"| {p} | {m} | {s['n']} | {s['f1_mean']:.2f} ± {s['f1_std']:.2f} | {s['em_mean']:.2f} ± "
                f"{s['em_std']:.2f} | {mean_s} | {study.fmt_diff(s['diff'])} |"
            )
        fast = study.by_seed(result["rows"], {"precision": p, "masks": "fast"}, "train_seconds")
        slow = study.by_seed(result["rows"], torch_cell, "train_seconds")
        shared = sorted(set(fast) & set(slow))
        if shared:
            ratios = ", ".join(f"{s}: {fast[s] / slow[s]:.3f}" for s in shared)
            lines.append(f"\n{p}: training time fast / torch masks, runs measured here, per seed: {ratios}")
    return "\n".join(lines + [""] + [f"- {n}" for n in notes])


def masks_main(args: argparse.Namespace, precisions: tuple[str, ...]) -> int:
    json_path = (
        args.json if args.json != DEFAULT_JSON else ROOT / "bench" / "results" / "cpu-dropout-masks.json"
    )
    result = study.load(json_path, {"config": CONFIG})
    if args.what == "masks":
        masks = tuple(m for m in args.masks.split(",") if m)
        if not masks or set(masks) - set(MASKS):
            raise SystemExit(f"--masks {args.masks!r}: a comma-separated subset of {','.join(MASKS)}")
        result["machine"], result["device"] = cpu_description(), study.device_name()
        result["date"] = time.strftime("%Y-%m-%d")
        seeds = [int(s) for s in args.seeds.split(",")]
        study.run_all(mask_runs(seeds, precisions, masks), json_path, result, CONFIG, jobs=1)
    baseline = json.loads(args.baseline.read_text()) if args.baseline and args.baseline.is_file() else None
    print(masks_report(result, baseline))
    return 0


def recipes_main(args: argparse.Namespace, precisions: tuple[str, ...]) -> int:
    json_path = args.json if args.json != DEFAULT_JSON else ROOT / "bench" / "results" / "recipes.json"
    result = study.load(json_path, {"config": CONFIG, "overrides": args.overrides})
    if args.what == "recipes":
        import torch

        result["device"] = study.device_name()
        if not torch.cuda.is_available():
            result["machine"] = cpu_description()
        result["command"] = " ".join(
            [
                "python3 -m bench.cpu_precision recipes --seeds",
                args.seeds,
                "--precisions",
                ",".join(precisions),
            ]
            + [f"--set {o}" for o in args.overrides]
        )
        result["date"] = time.strftime("%Y-%m-%d")
        seeds = [int(s) for s in args.seeds.split(",")]
        study.run_all(
            recipe_runs(seeds, precisions, tuple(args.overrides)), json_path, result, CONFIG, args.jobs
        )
    print(recipes_report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
