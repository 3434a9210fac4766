"""How training windows are batched: F1 on paired seeds, speed, padding and batch repetition.

    python3 -m bench.batching stats                       # no training: padding, repetition
    python3 -m bench.batching speed [--batches 30]        # samples/s of each arm, side by side
    python3 -m bench.batching train [--seeds 42,43,44,45,46] [--jobs 4]   # the paired-seed runs
    python3 -m bench.batching report                      # the table from what is in --json

Arms (hyperparameters.batching / pad_to_multiple_of, everything else the embedded default's
local.yaml): padded (random batches at max_seq_length: the standard recipe), random/8 (random
batches, dynamic padding), sorted/8 (sorted inside chunks of 50 batches: the default, before and
after this study), buckets/64 and buckets/32 (random batches inside width buckets).

- stats: per arm, over epochs 0 and 1 of the sampler with the study's seeds: padding share,
  the share of window pairs batched together in epoch 0 that are batched together again in
  epoch 1 ("repeat"), and the chance that two windows of a batch come from the same paragraph.
  Also at full SQuAD size (88,600 windows drawn from the 384-token length distribution of the
  bundled training text, batch 12 as const.yaml), where no training is needed to see it.
- speed: the trial's training step (bench/common.Loop) over the first --batches batches of each
  arm's epoch 0, the arms interleaved for --rounds rounds in one process, best of the rounds:
  samples/s and ratio to padded.
- train: `train.py --config local.yaml --set hyperparameters.batching=...` per arm and seed
  (bench/study.py: resumable, one JSON row per run). F1 / EM mean +- std and the paired F1
  difference to random/8 with a 95 % interval.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np

from extractive_qa import cli
from extractive_qa.config import experiment, run_plan
from extractive_qa.config.model_family import resolve_pretrained
from extractive_qa.config.settings import WindowSpec
from extractive_qa.data import squad_files
from extractive_qa.data.batching import Collator, FeatureBatchSampler
from extractive_qa.data.features import Features, build_features, load_tokenizer

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bench import study
from bench.common import SQUAD_V11_WINDOWS, machine_text
from bench.study import ROOT

ARMS = {  # name -> (batching, pad_to_multiple_of)
    "padded": ("padded", 8),
    "random/8": ("random", 8),
    "sorted/8": ("sorted", 8),
    "buckets/64": ("buckets", 64),
    "buckets/32": ("buckets", 32),
}
BASELINE = "random/8"  # what the F1 of the others is compared with: unbiased random batches
# A batching becomes the default only if its paired F1 is within DEFAULT_F1 of random batches
# (the mean difference) and it trains at least DEFAULT_SPEEDUP times as fast as padding to
# max_seq_length, the standard recipe it has to beat.
DEFAULT_F1, DEFAULT_SPEEDUP = 1.0, 2.5
SEEDS = "42,43,44,45,46"


def cell(arm: str) -> dict[str, Any]:
    batching, multiple = ARMS[arm]
    return {"batching": batching, "pad_to_multiple_of": multiple}


def sampler(lengths: np.ndarray, batch: int, arm: str, seed: int) -> FeatureBatchSampler:
    batching, multiple = ARMS[arm]
    return FeatureBatchSampler(
        lengths, batch, shuffle=True, batching=batching, seed=seed, bucket_width=multiple
    )


def padding_share(lengths: np.ndarray, batches: list[np.ndarray], arm: str, max_len: int) -> float:
    batching, multiple = ARMS[arm]
    real = padded = 0
    for b in batches:
        width = max_len
        if batching != "padded":
            width = min(max_len, -(-int(lengths[b].max()) // multiple) * multiple)
        real += int(lengths[b].sum())
        padded += width * len(b)
    return 1 - real / padded


def pairs(batches: list[np.ndarray]) -> set[tuple[int, int]]:
    return {(int(a), int(b)) for batch in batches for a, b in combinations(np.sort(batch), 2)}


def repeat_share(s: FeatureBatchSampler) -> float:
    """Of the window pairs sharing a batch in epoch 0, the share that share one in epoch 1."""
    first, second = pairs(s.batches(0)), pairs(s.batches(1))
    return len(first & second) / max(1, len(first))


def same_paragraph(batches: list[np.ndarray], paragraph: np.ndarray) -> float:
    together = same = 0
    for b in batches:
        ids = paragraph[b]
        together += len(b) * (len(b) - 1) // 2
        _, counts = np.unique(ids, return_counts=True)
        same += int((counts * (counts - 1) // 2).sum())
    return same / max(1, together)


def local_setup() -> tuple[run_plan.RunPlan, Features, np.ndarray]:
    conf = experiment.load_yaml(ROOT / "local.yaml")
    plan = run_plan.run_plan(conf, experiment.local_hparams(conf), 1)
    tokenizer = load_tokenizer(plan.data.pretrained_model)
    squad = squad_files.load_squad(ROOT / plan.data.train_file, training=True)
    spec = WindowSpec(plan.data.max_seq_length, plan.data.doc_stride, plan.data.max_query_length)
    features = build_features(squad.examples, tokenizer, spec, labels=True, offsets=False)
    contexts = {c: i for i, c in enumerate(dict.fromkeys(e.context for e in squad.examples))}
    paragraph = np.array([contexts[squad.examples[i].context] for i in features.example_index])
    return plan, features, paragraph


def stats(args: argparse.Namespace, result: dict[str, Any]) -> None:
    plan, features, paragraph = local_setup()
    batch, max_len = plan.hparams.global_batch_size, plan.data.max_seq_length
    # Full-size: SQuAD v1.1 at 384/128 has ~88.6k windows; lengths drawn from the bundled text's.
    tokenizer = load_tokenizer(plan.data.pretrained_model)
    squad = squad_files.load_squad(ROOT / plan.data.train_file, training=True)
    long = build_features(squad.examples, tokenizer, WindowSpec(384, 128, 64), labels=True, offsets=False)
    full = np.random.default_rng(0).choice(long.lengths, SQUAD_V11_WINDOWS)
    rows = {}
    for arm in ARMS:
        per_seed = []
        for seed in args.seeds:
            s = sampler(features.lengths, batch, arm, seed)
            epoch = s.batches(0)
            per_seed.append(
                (
                    padding_share(features.lengths, epoch, arm, max_len),
                    repeat_share(s),
                    same_paragraph(epoch, paragraph),
                )
            )
        big = sampler(full, 12, arm, args.seeds[0])
        rows[arm] = {
            "padding_share": round(float(np.mean([p[0] for p in per_seed])), 4),
            "repeat_share": round(float(np.mean([p[1] for p in per_seed])), 4),
            "same_paragraph": round(float(np.mean([p[2] for p in per_seed])), 4),
            "full_size_padding_share": round(padding_share(full, big.batches(0), arm, 384), 4),
            "full_size_repeat_share": round(repeat_share(big), 5),
        }
        print(arm, rows[arm], flush=True)
    result["stats"] = {
        "command": args.command,
        "windows": len(features),
        "global_batch_size": batch,
        "max_seq_length": max_len,
        "full_size_windows": SQUAD_V11_WINDOWS,
        "full_size_batch": 12,
        "arms": rows,
    }


def speed(args: argparse.Namespace, result: dict[str, Any]) -> None:
    import torch

    from bench.common import Loop, Rung, time_loop

    plan, features, _ = local_setup()
    device = torch.device(args.device)
    model_path = resolve_pretrained(plan.data.pretrained_model)
    batches_by_arm = {}
    for arm, (batching, multiple) in ARMS.items():
        s = sampler(features.lengths, plan.hparams.global_batch_size, arm, args.seeds[0])
        collate = Collator(features, batching != "padded", multiple, labels=True)
        batches_by_arm[arm] = [collate(ix.tolist()) for ix in s.batches(0)[: args.warmup + args.batches]]
    seconds: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for _ in range(args.rounds):  # interleaved, best of the rounds: drift hits every arm alike
        for arm, (batching, multiple) in ARMS.items():
            batches = batches_by_arm[arm]
            # the arithmetic the study's runs train in (study.FP32, study.TORCH_MASKS)
            attention = plan.hparams.attn_implementation
            rung = Rung(arm, batching, multiple, attention, "trial", "fp32", masks="torch")
            loop = Loop(model_path, rung, plan.hparams, len(batches), device)
            seconds[arm].append(time_loop(loop, batches, args.warmup)[0])
            print(arm, f"{seconds[arm][-1]:.1f} s", flush=True)
    rows = {}
    for arm, batches in batches_by_arm.items():
        samples = sum(len(b["input_ids"]) for b in batches[args.warmup :])
        tokens = sum(b["input_ids"].numel() for b in batches[args.warmup :])
        rows[arm] = {
            "samples_per_s": round(samples / min(seconds[arm]), 2),
            "runs_seconds": [round(x, 2) for x in seconds[arm]],
            "padded_tokens_per_sample": round(tokens / samples, 1),
        }
    for row in rows.values():
        row["vs_padded"] = round(row["samples_per_s"] / rows["padded"]["samples_per_s"], 3)
    result.setdefault("speed", {})[machine_text(device)] = {
        "command": args.command,
        "date": time.strftime("%Y-%m-%d"),
        "precision": "fp32, torch's dropout masks",
        "threads": torch.get_num_threads(),
        "batches": args.batches,
        "rounds": args.rounds,
        "arms": rows,
    }


def train(args: argparse.Namespace, result: dict[str, Any]) -> dict[str, Any]:
    result["train_device"] = study.device_name()
    runs = [
        study.Run(
            cell(arm),
            seed,
            (
                study.FP32,
                study.TORCH_MASKS,
                f"hyperparameters.batching={ARMS[arm][0]}",
                f"hyperparameters.pad_to_multiple_of={ARMS[arm][1]}",
            ),
        )
        for seed in args.seeds
        for arm in args.arms
    ]
    return study.run_all(runs, args.json, result, args.config, args.jobs)


def report(result: dict[str, Any]) -> str:
    rows, stats_ = result["rows"], (result.get("stats") or {}).get("arms", {})
    speeds = result.get("speed") or {}
    head = ["batching", "runs", "F1 mean ± std", "EM mean ± std", f"F1 - {BASELINE}, paired [95 % CI]"]
    head += ["padding", "full-size padding", "repeat e0→e1", "same paragraph", "full-size repeat"]
    head += [f"samples/s, {m}" for m in speeds]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for arm in ARMS:
        s = study.summary(rows, cell(arm), cell(BASELINE) if arm != BASELINE else None)
        st = stats_.get(arm, {})

        def pct(key: str, digits: int = 1, st: dict = st) -> str:
            return f"{100 * st[key]:.{digits}f} %" if key in st else "-"

        speed_cells = []
        for m in speeds.values():
            a = m["arms"].get(arm)
            speed_cells.append(f"{a['samples_per_s']:.1f} ({a['vs_padded']:.2f}x)" if a else "-")
        lines.append(
            f"| {arm} | {study.fmt_summary(s)} | {study.fmt_diff(s and s['diff'])} | "
            f"{pct('padding_share')} | {pct('full_size_padding_share')} | {pct('repeat_share')} | "
            f"{pct('same_paragraph', 2)} | "
            f"{pct('full_size_repeat_share', 2)} |" + "".join(f" {c} |" for c in speed_cells)
        )
    for machine, measured in speeds.items():
        lines += ["", *default_rule(rows, measured["arms"], machine)]
    return "\n".join(lines)


def default_rule(rows: list[dict[str, Any]], speed: dict[str, dict[str, Any]], machine: str) -> list[str]:
    """Each arm against the rule for a new default, with the speed measured on `machine`."""
    out = [
        f"The rule for a new default (paired F1 mean within {DEFAULT_F1:g} of {BASELINE}, and at least "
        f"{DEFAULT_SPEEDUP:g}x padded's samples/s on {machine}):"
    ]
    for arm in ARMS:
        s = study.summary(rows, cell(arm), cell(BASELINE))
        if arm not in speed or (arm != BASELINE and not (s and s["diff"])):
            continue
        diff = 0.0 if arm == BASELINE else s["diff"]["mean"]
        close, fast = abs(diff) <= DEFAULT_F1, speed[arm]["vs_padded"] >= DEFAULT_SPEEDUP
        f1_text = f"F1 {diff:+.2f} ({'within' if close else 'outside'})"
        if arm == BASELINE:
            f1_text = "the baseline"
        out.append(
            f"- {'PASS' if close and fast else 'FAIL'} {arm}: {f1_text}, "
            f"{speed[arm]['vs_padded']:.2f}x padded ({'fast enough' if fast else 'too slow'})"
        )
    fastest = max(speed, key=lambda arm: speed[arm]["samples_per_s"])
    out.append(f"- fastest arm: {fastest}")
    return out


@cli.boundary
def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("what", choices=["stats", "speed", "train", "report"])
    parser.add_argument("--seeds", default=SEEDS, help="comma-separated experiment seeds (paired)")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    parser.add_argument("--jobs", type=int, default=1, help="train: runs side by side")
    parser.add_argument("--batches", type=int, default=30, help="speed: timed batches per arm")
    parser.add_argument("--warmup", type=int, default=2, help="speed: untimed batches first")
    parser.add_argument("--rounds", type=int, default=2, help="speed: interleaved rounds (best of)")
    parser.add_argument("--device", default="cpu", help="speed: cpu or cuda")
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "batching.json")
    parser.add_argument("--config", default="local.yaml", help="train: the base experiment")
    args = parser.parse_args()
    try:
        args.seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        parser.error(f"--seeds: expected comma-separated integers, got {args.seeds!r}")
    args.arms = args.arms.split(",")
    if unknown := [a for a in args.arms if a not in ARMS]:
        parser.error(f"--arms: unknown {unknown}; choose from {', '.join(ARMS)}")
    if min(args.jobs, args.batches, args.rounds) < 1 or args.warmup < 0:
        parser.error("--jobs, --batches and --rounds must be >= 1, --warmup >= 0")
    result = study.load(args.json, {"config": args.config, "baseline": BASELINE})
    # The file's command is the one that trained its rows; stats and speed name their own.
    args.command = " ".join(["python3", "-m", "bench.batching", *sys.argv[1:]])
    if args.what == "stats":
        stats(args, result)
    elif args.what == "speed":
        speed(args, result)
    elif args.what == "train":
        result["command"] = args.command
        result = train(args, result)
    study.save(args.json, result)
    print(report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
