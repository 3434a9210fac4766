"""Training throughput, side by side in one run, on real SQuAD windows.

    python3 -m bench.throughput [--model embedded|bert-base] [--batches 24] [--json FILE]
    python3 -m bench.throughput --model bert-base --device cuda --precision bf16 --json gpu.json

Two comparisons, each on identical inputs:

1. Harness overhead. (a) the trial through Determined's local Trainer (train.py's own `run`,
   timed by the trial's RunLog), and (b) a bare PyTorch loop doing what `train_batch` does with
   the same model, optimizer, schedule and the *same batches* (the trial's sampler, epoch 0, its
   seed). Run --repeats times each, interleaved; harness_overhead = trial / bare (sequences/s),
   best run of each (the first pays one-time costs: CUDA context, torch.compile). The last
   losses are printed: equal losses show the two loops saw the same batches.
2. The fast path, switch by switch, over the same windows (a fixed random sample of the training
   set): the standard recipe (every window padded to max_seq_length, random batches, eager
   attention, plain AdamW, fp32), then + length-grouped batches with dynamic padding, + SDPA
   attention, + fused AdamW (CUDA), + TF32 matmuls (CUDA), + bf16/fp16 autocast (--precision; on a
   CPU with bf16 matrix units bf16 by default, as `precision: auto`), + the fast dropout masks (CPU;
   every rung before uses torch's), + torch.compile (--compile [MODE ...]). The last rung before
   compile is the fast path (the trial's default settings);
   dynamic_padding_speedup = fast path / standard recipe. On a bf16 CPU the standard recipe also
   runs with its own bf16 switch: speedup_over_standard_bf16 = fast path / that.

FLOPs per batch: flops.training_flops (6 x non-embedding parameters + 12 x layers x hidden x
width, per token computed, padding included; sources in its docstring and docs/gpu.md). On a GPU
the table shows model FLOPs utilisation against the card's dense bf16 peak, and the fast path's
projected time for SQuAD v1.1 x 2 epochs (88.6k windows x 2).

One idea: the throughput ladder -- the trial against the bare loop, then one lever at a time --
measured on identical batches in one run, so that its rungs compare.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from bench import flops
from extractive_qa import cli, compat
from extractive_qa.config import experiment, run_plan
from extractive_qa.config.model_family import EMBEDDED_MODEL, pretrained_config
from extractive_qa.config.settings import PRECISIONS, Hyperparameters, WindowSpec
from extractive_qa.data import squad_files
from extractive_qa.data.batching import Collator, FeatureBatchSampler, FeatureDataset, training_batches
from extractive_qa.data.features import Features, build_features, load_tokenizer
from extractive_qa.qa import mixed_precision

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bench.common import (
    ROOT,
    SEED,
    SQUAD_V11_WINDOWS,
    Loop,
    Rung,
    machine_text,
    model_dir,
    provenance,
    run_trial,
    sync,
    time_loop,
    trial_config,
    window_sample,
)

# Dense (no sparsity) bf16 tensor-core peaks, TFLOP/s, from NVIDIA's data sheets.
BF16_PEAK_TFLOPS = {
    "H100 SXM": 989.4,
    "H100 NVL": 835.0,
    "H100 PCIe": 756.0,
    "H100": 989.4,
    "H200": 989.4,
    "A100": 312.0,
    "L40S": 362.0,
    "A10": 125.0,
    "V100": 125.0,
}


def peak_tflops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, value in BF16_PEAK_TFLOPS.items():  # the most specific names come first
        if key in name:
            return value
    return None


def flop_counter(model_path: str, weights_only: bool = False) -> Callable[[int, int], float]:
    """FLOPs of a training step on (batch, width): flops.training_flops on a meta-device model
    (weights_only: flops.parameter_flops, the Linear layers' share)."""
    from transformers import AutoModelForQuestionAnswering

    config = pretrained_config(model_path, local_only=True)
    with torch.device("meta"):
        model = AutoModelForQuestionAnswering.from_config(config)
    count = flops.parameter_flops if weights_only else flops.training_flops
    return lambda batch, width: count(model, batch, width)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model",
        choices=["embedded", "bert-base"],
        default="embedded",
        help="embedded: the MiniLM BERT of the CPU default; bert-base: random BERT-base",
    )
    parser.add_argument("--train-file", type=Path, default=ROOT / "squad_data" / "local-train-v1.1.json")
    parser.add_argument("--batches", type=int, default=24, help="timed batches per measurement")
    parser.add_argument("--warmup", type=int, default=2, help="untimed batches before each ladder rung")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-seq-length", type=int, default=384)
    parser.add_argument("--doc-stride", type=int, default=128)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        help="fast path precision (default: bf16 on CUDA; on a CPU what precision: auto picks there)",
    )
    parser.add_argument(
        "--compile",
        nargs="*",
        choices=["default", "reduce-overhead", "max-autotune-no-cudagraphs"],
        help="add a torch.compile rung per mode (no mode given: default)",
    )
    parser.add_argument(
        "--graphs",
        action="store_true",
        help="CUDA: add a rung with forward + backward captured as one CUDA graph per width (buckets)",
    )
    parser.add_argument("--repeats", type=int, default=2, help="interleaved trial / bare-loop runs")
    parser.add_argument(
        "--rounds", type=int, default=1,
        help="ladder: rounds the rungs take turns in, each batch's best kept (more than 1 keeps every "
        "rung's model in memory)",
    )  # fmt: skip
    parser.add_argument("--skip-trial", action="store_true", help="only the fast-path ladder")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    args.device = torch.device(args.device)
    if args.compile == []:
        args.compile = ["default"]
    if args.graphs and args.device.type != "cuda":
        parser.error("--graphs: CUDA graphs need --device cuda")
    if args.graphs and args.precision == "fp16":
        parser.error("--graphs: with bf16 or fp32 (fp16's GradScaler steps are not captured)")
    if args.device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    if args.doc_stride >= args.max_seq_length:
        parser.error(
            f"--doc-stride {args.doc_stride} must be smaller than --max-seq-length {args.max_seq_length} "
            "(it is the overlap between consecutive windows)"
        )
    # bf16 on a GPU; on a CPU what `precision: auto` picks there (bf16 where it has bf16 units).
    cpu_pick = mixed_precision.resolve_precision("auto", "cpu")[0]
    args.precision = args.precision or ("bf16" if args.device.type == "cuda" else cpu_pick)
    args.precision = mixed_precision.resolve_precision(args.precision, args.device.type)[0]
    if args.precision == "fp16" and args.device.type != "cuda":
        parser.error("--precision fp16 needs --device cuda")
    if min(args.batches, args.batch_size, args.repeats, args.rounds) < 1 or args.warmup < 0:
        parser.error("--batches, --batch-size, --repeats, --rounds must be positive; --warmup >= 0")
    if not args.train_file.is_file():
        parser.error(f"--train-file {args.train_file}: no such file")
    return args


@dataclass
class Setup:
    """The model, the trial's config and the real training windows every measurement uses."""

    args: argparse.Namespace
    tmp: Path
    model_path: str
    conf_path: Path
    hp: Hyperparameters
    features: Features

    @classmethod
    def build(cls, args: argparse.Namespace, tmp: Path) -> Setup:
        tokenizer = load_tokenizer(EMBEDDED_MODEL)  # the bert-base-uncased vocab
        model_path = model_dir(args.model, tmp, tokenizer)
        conf_path = trial_config(args, model_path, tmp)
        conf = experiment.load_yaml(conf_path)
        plan = run_plan.run_plan(conf, experiment.local_hparams(conf), 1)
        squad = squad_files.load_squad(args.train_file, training=True)
        spec = WindowSpec(args.max_seq_length, args.doc_stride, plan.data.max_query_length)
        features = build_features(squad.examples, tokenizer, spec, labels=True, offsets=False)
        return cls(args, tmp, model_path, conf_path, plan.hparams, features)


@dataclass
class Table:
    """Rows of sequences/s, tokens/s, padding and (on a GPU) model FLOPs utilisation."""

    flops: Callable[[int, int], float]
    peak: float | None
    rows: list[dict[str, Any]] = field(default_factory=list)

    def record(
        self, name: str, seconds: float, batches: list[dict[str, torch.Tensor]], extra: dict | None = None
    ) -> dict[str, Any]:
        seqs = sum(len(b["input_ids"]) for b in batches)
        real = sum(int(b["attention_mask"].sum()) for b in batches)
        computed = sum(b["input_ids"].numel() for b in batches)
        work = sum(self.flops(*b["input_ids"].shape) for b in batches)
        row = {
            "name": name,
            "seconds": round(seconds, 3),
            "sequences_per_s": round(seqs / seconds, 2),
            "tokens_per_s": round(real / seconds, 1),
            "padded_tokens_per_s": round(computed / seconds, 1),
            "padding_share": round(1 - real / computed, 3),
            "tflops": round(work / seconds / 1e12, 3),
        }
        if self.peak:
            row["mfu"] = round(work / seconds / 1e12 / self.peak, 3)
        row.update(extra or {})
        self.rows.append(row)
        mfu = f"  MFU {row['mfu']:.1%}" if "mfu" in row else ""
        print(
            f"  {name:44s} {row['sequences_per_s']:9.2f} seq/s {row['tokens_per_s']:11.0f} tok/s  "
            f"pad {row['padding_share']:.0%}{mfu}",
            flush=True,
        )
        return row


def harness_overhead(setup: Setup, table: Table) -> dict[str, Any]:
    """1. The trial through Determined's local Trainer vs the bare loop, on the same batches."""
    args, hp, features = setup.args, setup.hp, setup.features
    sampler, collate = training_batches(
        features, args.batch_size, batching=hp.batching, multiple=hp.pad_to_multiple_of, seed=SEED
    )
    trial_batches = [collate(ix.tolist()) for ix in sampler.batches(0)[: args.batches]]
    fast = Rung(
        "fast", hp.batching, hp.pad_to_multiple_of, hp.attn_implementation, "trial", args.precision,
        (args.compile or [""])[0], hp.tf32, hp.dropout_masks,
    )  # fmt: skip
    print(
        f"harness: {args.batches} batches of {args.batch_size}, trial (Determined local Trainer) "
        "vs bare loop, same batches",
        flush=True,
    )
    trial_s, bare_s, losses = [], [], {}
    for r in range(args.repeats):
        loop = Loop(setup.model_path, fast, hp, args.batches, args.device)
        sampler.epoch = 0  # each repeat replays the trial's first epoch
        # Batches come through a torch DataLoader as in the trial: collation is inside the
        # timed loop for both, and the loader's seed draw keeps dropout's RNG in step.
        loader = torch.utils.data.DataLoader(
            FeatureDataset(len(features)), batch_sampler=sampler, collate_fn=collate
        )
        seconds, losses["bare"] = time_loop(loop, itertools.islice(loader, args.batches), 0)
        bare_s.append(seconds)
        del loop
        out = run_trial(setup.conf_path, setup.tmp, r)
        trial_s.append(out["train_seconds"])
        losses["trial"] = out["last_train_loss"]
        print(f"  run {r + 1}: bare {seconds:.2f} s, trial {out['train_seconds']:.2f} s", flush=True)
    # Best of N: the first run pays one-time costs that belong to neither loop (CUDA context
    # and library handles, torch.compile's graphs -- 167 s of a 169 s first run on an H100).
    bare = table.record(
        "bare loop (trial's batches and settings)",
        min(bare_s),
        trial_batches,
        {"runs_seconds": [round(s, 3) for s in bare_s], "last_loss": losses["bare"]},
    )
    trial = table.record(
        "trial via Determined local Trainer",
        min(trial_s),
        trial_batches,
        {"runs_seconds": [round(s, 3) for s in trial_s], "last_loss": losses["trial"]},
    )
    overhead = round(trial["sequences_per_s"] / bare["sequences_per_s"], 3)
    print(
        f"  harness_overhead (trial / bare) = {overhead:.3f}; last loss bare "
        f"{losses['bare']:.6f}, trial {losses['trial']:.6f}",
        flush=True,
    )
    return {
        "harness_overhead": overhead,
        "same_batches_last_loss": {k: round(v, 6) for k, v in losses.items()},
    }


STANDARD_BF16 = "standard recipe + bf16 autocast (its --bf16)"


def fast_path_rungs(args: argparse.Namespace, hp: Hyperparameters) -> list[Rung]:
    """The standard recipe, then one switch at a time up to the trial's defaults (+ compile)."""
    B, m = hp.batching, hp.pad_to_multiple_of  # the trial's default batching
    T = "torch"  # torch's dropout masks: the standard recipe's, and every rung before the fast ones
    rungs = [  # fmt: skip
        Rung(
            "standard recipe (pad to max, eager, AdamW, fp32)", "padded", 1, "eager", "plain", "fp32", masks=T
        ),
    ]
    if args.precision == "bf16" and args.device.type == "cpu":
        # The standard recipe with its own bf16 switch (the transformers example's --bf16 on a CPU).
        rungs.append(Rung(STANDARD_BF16, "padded", 1, "eager", "plain", "bf16", masks=T))
    rungs += [
        Rung(f"+ dynamic padding, {B} batches (/{m})", B, m, "eager", "plain", "fp32", masks=T),
        Rung("+ SDPA attention", B, m, "sdpa", "plain", "fp32", masks=T),
    ]
    cuda = args.device.type == "cuda"
    tf32 = cuda and hp.tf32
    if cuda:
        rungs.append(Rung("+ fused AdamW", B, m, "sdpa", "trial", "fp32"))
    if tf32:
        rungs.append(Rung("+ TF32 matmuls", B, m, "sdpa", "trial", "fp32", "", True))
    # On a GPU the fused AdamW rung came before; on a CPU it follows the masks (the order of
    # what each step spends most on).
    opt = "trial" if cuda else "plain"
    if args.precision != "fp32":
        rungs.append(Rung(f"+ {args.precision} autocast", B, m, "sdpa", opt, args.precision, "", tf32, T))
    if not cuda and hp.dropout_masks == "fast":
        rungs.append(Rung("+ fast dropout masks", B, m, "sdpa", "plain", args.precision, "", tf32))
    if not cuda and compat.fused_adamw("cpu"):
        rungs.append(Rung("+ fused AdamW (CPU kernel)", B, m, "sdpa", "trial", args.precision, "", tf32))
    if not cuda and args.precision == "bf16":
        # Not the trial's: bf16 weights, fp32 master weights in the optimizer, no autocast.
        rungs.append(
            Rung(
                "+ bf16 weights, fp32 master weights (no autocast)", B, m, "sdpa", "trial", "bf16",
                "", tf32, master_weights=True,
            )
        )  # fmt: skip
    if args.compile or args.graphs:
        # torch.compile and CUDA graphs make a graph per padded width: width buckets of 64 tokens
        # keep those few.
        fast = rungs[-1]
        rungs.append(
            Rung("+ width buckets (/64), eager", "buckets", 64, "sdpa", "trial", fast.precision, "", tf32)
        )
    if args.graphs:
        rungs.append(
            Rung(
                "+ CUDA graphs (forward + backward), buckets /64", "buckets", 64, "sdpa", "trial",
                rungs[-1].precision, "", tf32, graphs=True,
            )
        )  # fmt: skip
    if args.compile:
        for mode in args.compile:
            rungs.append(
                Rung(
                    f"+ torch.compile ({mode}), buckets /64",
                    "buckets",
                    64,
                    "sdpa",
                    "trial",
                    rungs[-1].precision,
                    mode,
                    tf32,
                )
            )
    return rungs


@dataclass
class Measured:
    """A rung being measured: its loop (kept between rounds), its batches, each batch's best time."""

    rung: Rung
    loop: Loop | None
    batches: list[dict[str, torch.Tensor]]
    best: list[float]
    extra: dict[str, Any]


def warm_rung(setup: Setup, rung: Rung, batches: list[dict[str, torch.Tensor]]) -> Measured:
    """A rung's loop after an untimed step per input shape and the warm-up batches."""
    args, hp, device = setup.args, setup.hp, setup.args.device
    loop = Loop(setup.model_path, rung, hp, len(batches), device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    # One untimed step per input shape first: what a run pays once per shape (cuBLAS/SDPA plans;
    # torch.compile's graph, CUDA graph capture), so the timed steps are steady state. A
    # bucket's last batch can be smaller than the rest: a shape of its own.
    shapes = {tuple(b["input_ids"].shape): b for b in reversed(batches)}
    started = time.perf_counter()
    for b in shapes.values():
        loop.step(b)
    sync(device)
    warm_s = time.perf_counter() - started
    for b in batches[: args.warmup]:
        loop.step(b)
    timed = batches[args.warmup :]
    extra = {"widths": len({shape[1] for shape in shapes}), "first_step_per_width_s": round(warm_s, 2)}
    return Measured(rung, loop, timed, [float("inf")] * len(timed), extra)


def time_round(measured: Measured) -> None:
    """Each batch once more; the best time per batch is kept."""
    loop = measured.loop
    assert loop is not None
    for i, batch in enumerate(measured.batches):
        sync(loop.device)
        started = time.perf_counter()
        loss = loop.step(batch)
        sync(loop.device)
        measured.best[i] = min(measured.best[i], time.perf_counter() - started)
    measured.extra["last_loss"] = round(float(loss), 4)


def finish(table: Table, measured: Measured) -> dict[str, Any]:
    loop = measured.loop
    if loop is not None and loop.device.type == "cuda":
        measured.extra["peak_memory_gb"] = round(torch.cuda.max_memory_allocated(loop.device) / 2**30, 2)
    measured.loop = None  # its memory, before the next rung's
    return table.record(measured.rung.name, sum(measured.best), measured.batches, measured.extra)


def ladder(setup: Setup, table: Table) -> dict[str, Any]:
    """2. The same windows (a fixed random sample) through each rung; speedup and projection.
    With --rounds R > 1 every rung's loop is kept and the rungs take turns, round by round (each
    batch's best time of the R counts), so that a slower spell of the machine is shared by all."""
    args, hp, features = setup.args, setup.hp, setup.features
    n = (args.batches + args.warmup) * args.batch_size
    sample = window_sample(len(features), n)
    rungs = fast_path_rungs(args, hp)
    print(
        f"fast path ladder: the same {n} windows ({args.warmup} warm-up + {args.batches} timed batches "
        f"of {args.batch_size}), mean {features.lengths[sample].mean():.0f} tokens, "
        f"max {args.max_seq_length}, {args.rounds} round(s)",
        flush=True,
    )
    measuring: list[Measured | dict[str, Any]] = []
    for rung in rungs:
        # A fixed sample of the windows: sample[ix] maps the sampler's positions to features.
        sampler = FeatureBatchSampler(
            features.lengths[sample], args.batch_size, shuffle=True, batching=rung.batching, seed=SEED,
            bucket_width=rung.multiple,
        )  # fmt: skip
        collate = Collator(features, rung.batching != "padded", rung.multiple, labels=True)
        batches = [collate(sample[ix].tolist()) for ix in sampler.batches(0)]
        try:
            measuring.append(warm_rung(setup, rung, batches))
            if args.rounds == 1:  # one at a time: only one rung's model in memory
                time_round(measuring[-1])
                measuring[-1] = finish(table, measuring[-1])
        except (RuntimeError, torch.OutOfMemoryError) as err:
            if not (rung.graphs or rung.compile):
                raise
            # An optional lever that fails on this stack is a row that says why, not a lost run.
            table.rows.append({"name": rung.name, "error": f"{type(err).__name__}: {err}"[:400]})
            print(f"  {rung.name:44s} failed: {table.rows[-1]['error']}", flush=True)
            measuring[-1:] = [table.rows[-1]]
    for _ in range(args.rounds if args.rounds > 1 else 0):
        for m in measuring:
            if isinstance(m, Measured):
                time_round(m)
    bound = fast_path_bound(setup, measuring, rungs) if args.device.type == "cpu" else {}
    rows = [finish(table, m) if isinstance(m, Measured) else m for m in measuring]
    # The fast path is the trial's default settings: every rung but the optional ones after it.
    standard = rows[0]
    trials = [
        row
        for row, rung in zip(rows, rungs, strict=True)
        if not (rung.compile or rung.master_weights)
        and (rung.batching, rung.multiple) == (hp.batching, hp.pad_to_multiple_of)
    ]
    fastest = trials[-1]
    result = {
        **bound,
        "dynamic_padding_speedup": round(fastest["sequences_per_s"] / standard["sequences_per_s"], 3),
        "projection_squad_v11_2_epochs_min": round(
            2 * SQUAD_V11_WINDOWS / fastest["sequences_per_s"] / 60, 1
        ),
        "projection_standard_recipe_min": round(2 * SQUAD_V11_WINDOWS / standard["sequences_per_s"] / 60, 1),
    }
    print(f"dynamic_padding_speedup (fast path / standard recipe) = {result['dynamic_padding_speedup']:.2f}")
    standard_bf16 = next((row for row in rows if row["name"] == STANDARD_BF16), None)
    if standard_bf16 is not None:
        result["speedup_over_standard_bf16"] = round(
            fastest["sequences_per_s"] / standard_bf16["sequences_per_s"], 3
        )
        print(f"fast path / standard recipe with bf16 = {result['speedup_over_standard_bf16']:.2f}")
    print(
        "projected SQuAD v1.1 x 2 epochs on this device: fast path "
        f"{result['projection_squad_v11_2_epochs_min']} min, "
        f"standard recipe {result['projection_standard_recipe_min']} min"
    )
    return result


def fast_path_bound(setup: Setup, measuring: list[Any], rungs: list[Rung]) -> dict[str, Any]:
    """The fast path's step against its own matrix products timed alone (bench.cpu_step): how
    much of the trial's step is outside the CPU's matrix units."""
    from bench import cpu_step

    hp = setup.hp
    fast = [
        m
        for m in measuring
        if isinstance(m, Measured)
        and not (m.rung.compile or m.rung.master_weights)
        and (m.rung.batching, m.rung.multiple) == (hp.batching, hp.pad_to_multiple_of)
    ][-1]
    assert fast.loop is not None
    products = cpu_step.captured_products(fast.loop, fast.batches)
    bound_s = sum(seconds * products[key] for key, seconds in cpu_step.product_seconds(products).items())
    step_s = sum(fast.best)
    print(
        f"fast path ({fast.rung.name}): {step_s * 1e3 / len(fast.batches):.1f} ms per step, its matrix "
        f"products alone {bound_s * 1e3 / len(fast.batches):.1f} ms: step / bound = {step_s / bound_s:.2f}",
        flush=True,
    )
    return {
        "fast_path_gemm_bound_s": round(bound_s, 3),
        "fast_path_step_over_bound": round(step_s / bound_s, 3),
    }


@cli.boundary
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = args.device
    machine = machine_text(device)
    print(f"device: {machine}; torch {torch.__version__}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        setup = Setup.build(args, Path(tmp))
        table = Table(flop_counter(setup.model_path), peak_tflops(device))
        result: dict[str, Any] = {
            **provenance("bench.throughput", sys.argv[1:] if argv is None else argv, device),
            "device": machine,
            "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d"),
            "model": args.model,
            "batch_size": args.batch_size,
            "max_seq_length": args.max_seq_length,
            "windows_in_train_file": len(setup.features),
            "mean_window_tokens": round(float(setup.features.lengths.mean()), 1),
            "bf16_peak_tflops": table.peak,
        }
        if not args.skip_trial:
            result.update(harness_overhead(setup, table))
        result.update(ladder(setup, table))
    result["rows"] = table.rows
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
