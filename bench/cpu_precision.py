"""bf16 on the CPU: what the embedded default gains in speed and whether F1 pays for it.

    python3 -m bench.cpu_precision study [--seeds 42,43,44,45,46]   # paired seeds, resumable
    python3 -m bench.cpu_precision report                           # the table from --json
    python3 -m bench.cpu_precision profile [--batches 8]            # where a training step goes
    python3 -m bench.cpu_precision levers [--batches 16 --rounds 2] # each lever, side by side

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

Every result names the CPU (model, cores, bf16 units) it was measured on.
"""

from __future__ import annotations

import argparse
import itertools
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
BOUND = 1.5  # the default switches only if the paired F1 interval's lower end is at least -BOUND


def runs(seeds: list[int]) -> list[study.Run]:
    """fp32 and bf16 alternating seed by seed, so that both see the same machine state."""
    return [
        study.Run({"precision": p}, seed, (f"hyperparameters.precision={p}",))
        for seed, p in itertools.product(seeds, PRECISIONS)
    ]


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
    parser.add_argument("what", choices=["study", "report", "profile", "levers"])
    parser.add_argument("--seeds", default=SEEDS, help="study: comma-separated experiment seeds")
    parser.add_argument("--batches", type=int, default=8, help="profile / levers: timed batches")
    parser.add_argument("--rounds", type=int, default=2, help="levers: interleaved rounds (best of)")
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "cpu-precision.json")
    args = parser.parse_args(argv)
    result = study.load(args.json, {"config": CONFIG})
    if args.what != "report":  # a measurement: it names the CPU it ran on
        result["machine"] = cpu_description()
    if args.what == "study":
        result["command"] = "python3 -m bench.cpu_precision study --seeds " + args.seeds
        result["date"] = time.strftime("%Y-%m-%d")
        seeds = [int(s) for s in args.seeds.split(",")]
        study.run_all(runs(seeds), args.json, result, CONFIG, jobs=1)
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


if __name__ == "__main__":
    sys.exit(main())
