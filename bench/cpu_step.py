"""The embedded default's training step on the CPU: where its time goes, and how far it is from
the bound its matrix products set.

    python3 -m bench.cpu_step [--batches 8] [--rounds 3] [--precisions auto,fp32] [--json FILE]

One command, three measurements on the trial's real batches -- local.yaml's training windows,
batched by the trial's sampler (epoch 0, seed 42) -- through bench.common.Loop, the trial's step
without Determined (forward under autocast, backward, clipping, AdamW, schedule):

- the step: each batch timed unprofiled, the best of `--rounds` rounds per batch;
- the bound: every matrix product the step ran (aten mm / addmm / bmm / baddbmm, captured with
  their shapes, strides and dtype while the step ran), timed alone on random data of the same
  layout, best of the rounds; `step / bound` says how much of the step is outside the CPU's
  matrix units (1.0: nothing is);
- the profile: torch.profiler's self time per operator, grouped into matmuls, attention,
  dropout masks, casts, norms and element-wise work, the optimizer and host work (profiled, so
  somewhat slower than the step: the shares are the point).

The step and the bound are timed round by round in the same process, so that a slower machine
state moves both. `auto` is what `precision: auto` picks on this CPU.

    python3 -m bench.cpu_step --allocator [--runs 2] [--json FILE]

The allocator setting the trial makes on the CPU (trial/cpu_allocator.py: freed memory kept for
the next step) against glibc's default, each in fresh processes taking turns (a process-wide
setting cannot be switched back and forth inside one): ms per step and minor page faults per
step of the same batches, best of each process's rounds.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from bench import study
from bench.batching import local_setup
from bench.common import Loop, Rung, provenance
from extractive_qa import cli
from extractive_qa.config import run_plan
from extractive_qa.config.model_family import resolve_pretrained
from extractive_qa.data.batching import training_batches
from extractive_qa.qa import mixed_precision
from extractive_qa.trial import dropout_masks

WARMUP = 2  # untimed batches first: one-time allocations, oneDNN's first kernels

# Self time of each operator, grouped. bmm only occurs in attention in these encoders (QK^T, PV);
# Linear layers are mm / addmm. Dropout masks: torch's bernoulli_, or everything inside
# dropout_masks' labelled range (numpy's draws are its self time, the masked product included).
DROPOUT = "dropout masks (drawing and applying them)"
GROUPS = {
    "matmuls (Linear layers)": {"aten::mm", "aten::addmm", "aten::linear", "aten::matmul"},
    "attention (QK^T, softmax, PV, masking)": {
        "aten::bmm", "aten::_softmax", "aten::_softmax_backward_data", "aten::all",
        "aten::isneginf", "aten::where", "aten::masked_fill", "aten::masked_fill_",
        "aten::_safe_softmax", "aten::baddbmm", "aten::_scaled_dot_product_flash_attention_for_cpu",
    },
    DROPOUT: {"aten::bernoulli_", "aten::bernoulli", "aten::native_dropout", dropout_masks.RANGE},
    "casts (fp32 <-> bf16)": {"aten::copy_", "aten::_to_copy", "aten::to"},
    "embedding gradient": {"aten::embedding_dense_backward", "aten::embedding_backward", "aten::index_add_"},
}  # fmt: skip
OPTIMIZER = "optimizer, clipping, schedule"
ELEMENTWISE = "norms, activations, element-wise"
HOST = "host work (Python, dispatch, the autograd engine's bookkeeping)"
GEMMS = {"mm", "addmm", "bmm", "baddbmm"}  # the aten overloads whose products are the bound


def trial_batches(n: int) -> tuple[run_plan.RunPlan, list[dict[str, torch.Tensor]], float]:
    """local.yaml's plan, the first n batches its sampler gives in epoch 0 (seed 42), and the
    milliseconds collating one took (the data loader's work per batch)."""
    plan, features, _ = local_setup()
    hp = plan.hparams
    sampler, collate = training_batches(
        features, hp.global_batch_size, batching=hp.batching, multiple=hp.pad_to_multiple_of, seed=42, ranks=1
    )
    indices = list(itertools.islice(sampler.batches(0), n))
    started = time.perf_counter()
    batches = [collate(b.tolist()) for b in indices]
    return plan, batches, (time.perf_counter() - started) * 1e3 / len(batches)


def loop(plan: run_plan.RunPlan, precision: str, **change: Any) -> Loop:
    """The trial's step at `precision`, with `change` (attn, optimizer, masks) applied."""
    rung = Rung(
        "", plan.hparams.batching, plan.hparams.pad_to_multiple_of,
        change.get("attn", plan.attention), change.get("optimizer", "trial"), precision,
        masks=change.get("masks", plan.hparams.dropout_masks),
    )  # fmt: skip
    return Loop(resolve_pretrained(plan.data.pretrained_model), rung, plan.hparams, 200, torch.device("cpu"))


# --------------------------------------------------------------------------------------------
# The bound: the step's own matrix products, alone.
# --------------------------------------------------------------------------------------------

Operand = tuple[tuple[int, ...], tuple[int, ...], str]  # shape, strides, dtype
Product = tuple[str, tuple[Any, ...]]  # the aten overload's name, its arguments (tensors as Operand)


def captured_products(step: Loop, batches: list[dict[str, torch.Tensor]]) -> collections.Counter[Product]:
    """Every matrix product the step runs over `batches` (forward, backward), with its operands'
    shapes, strides and dtype, counted: what the profile's matmul rows are, shape by shape."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: collections.Counter[Product] = collections.Counter()

    class Capture(TorchDispatchMode):
        def __torch_dispatch__(
            self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
        ) -> Any:
            if func.overloadpacket.__name__ in GEMMS:
                operands = tuple(
                    (tuple(a.shape), tuple(a.stride()), str(a.dtype).removeprefix("torch."))
                    if isinstance(a, torch.Tensor)
                    else a
                    for a in args
                )
                seen[(func.overloadpacket.__name__, operands)] += 1
            return func(*args, **(kwargs or {}))

    with Capture():
        for batch in batches:
            step.step(batch)
    return seen


def _operand(spec: Any) -> Any:
    if not (isinstance(spec, tuple) and len(spec) == 3 and isinstance(spec[0], tuple)):
        return spec
    shape, strides, dtype = spec
    extent = sum((size - 1) * stride for size, stride in zip(shape, strides, strict=True)) + 1
    return torch.randn(extent, dtype=getattr(torch, dtype)).as_strided(shape, strides)


def product_seconds(products: collections.Counter[Product], repeats: int = 3) -> dict[Product, float]:
    """Seconds of one call of each product on random operands of its layout (best of repeats)."""
    seconds = {}
    for key in products:
        name, specs = key
        op = getattr(torch.ops.aten, name).default
        args = [_operand(s) for s in specs]
        op(*args)  # oneDNN's first call of a shape
        best = float("inf")
        for _ in range(repeats):
            started = time.perf_counter()
            op(*args)
            best = min(best, time.perf_counter() - started)
        seconds[key] = best
    return seconds


def product_flops(key: Product) -> float:
    name, specs = key
    shapes = [s[0] for s in specs if isinstance(s, tuple) and len(s) == 3 and isinstance(s[0], tuple)]
    a, b = shapes[-2], shapes[-1]  # addmm/baddbmm: the bias first
    batch = a[0] if len(a) == 3 else 1
    return 2.0 * batch * a[-2] * a[-1] * b[-1]


# --------------------------------------------------------------------------------------------
# The profile: self time grouped.
# --------------------------------------------------------------------------------------------


def _ancestors(event: Any) -> Iterator[Any]:
    while event.cpu_parent is not None:
        event = event.cpu_parent
        yield event


def _group(event: Any) -> str:
    ancestors = {a.name for a in _ancestors(event)}
    if "optimizer" in ancestors:
        return OPTIMIZER
    if dropout_masks.RANGE in ancestors:
        return DROPOUT
    if event.name.startswith("autograd::"):  # the autograd engine's own bookkeeping
        return HOST
    for group, names in GROUPS.items():
        if event.name in names:
            return group
    return ELEMENTWISE


def profile_groups(step: Loop, batches: list[dict[str, torch.Tensor]]) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    started = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for batch in batches:
            step.step(batch)
    wall_ms = (time.perf_counter() - started) * 1e3
    shares: dict[str, float] = {}
    for event in prof.events():
        if event.name in ("forward", "backward", "optimizer") or event.name.startswith("ProfilerStep"):
            continue  # ranges: their operators are counted, not their own time
        group = _group(event)
        shares[group] = shares.get(group, 0.0) + event.self_cpu_time_total / 1e3
    shares[HOST] = max(0.0, wall_ms - sum(shares.values()))
    ordered = sorted(shares.items(), key=lambda kv: -kv[1])
    return {
        "profiled_ms_per_step": round(wall_ms / len(batches), 1),
        "ms_per_step_by_group": {k: round(v / len(batches), 1) for k, v in ordered},
    }


# --------------------------------------------------------------------------------------------
# One precision: the step, the bound, the profile.
# --------------------------------------------------------------------------------------------


def measure(
    plan: run_plan.RunPlan, batches: list[dict[str, torch.Tensor]], precision: str, rounds: int
) -> dict:
    step = loop(plan, precision)
    warmup, timed = batches[:WARMUP], batches[WARMUP:]
    for batch in warmup:
        step.step(batch)
    products = captured_products(step, timed)
    step_best = [float("inf")] * len(timed)
    bound_best: dict[Product, float] = {}
    for _ in range(rounds):
        for i, batch in enumerate(timed):
            started = time.perf_counter()
            step.step(batch)
            step_best[i] = min(step_best[i], time.perf_counter() - started)
        for key, seconds in product_seconds(products).items():
            bound_best[key] = min(bound_best.get(key, float("inf")), seconds)
    steps = len(timed)
    step_ms = sum(step_best) * 1e3 / steps
    bound_ms = sum(bound_best[k] * n for k, n in products.items()) * 1e3 / steps
    heaviest = sorted(products, key=lambda k: -bound_best[k] * products[k])[:8]
    result = {
        "precision": precision,
        "ms_per_step": round(step_ms, 1),
        "gemm_bound_ms_per_step": round(bound_ms, 1),
        "step_over_bound": round(step_ms / bound_ms, 3),
        "gemm_gflop_per_step": round(sum(product_flops(k) * n for k, n in products.items()) / steps / 1e9, 1),
        "gemm_calls_per_step": round(sum(products.values()) / steps, 1),
        "heaviest_products": [
            {
                "op": key[0],
                "operands": [list(s[0]) for s in key[1] if isinstance(s, tuple) and len(s) == 3],
                "ms_per_step": round(bound_best[key] * products[key] * 1e3 / steps, 2),
                "gflops": round(product_flops(key) / bound_best[key] / 1e9, 1),
            }
            for key in heaviest
        ],
        **profile_groups(step, timed),
    }
    print(
        f"  {precision}: step {step_ms:.1f} ms, its matrix products alone {bound_ms:.1f} ms "
        f"({result['gemm_gflop_per_step']} GFLOP): step / bound = {step_ms / bound_ms:.2f}",
        flush=True,
    )
    return result


def table(result: dict[str, Any]) -> str:
    measured = result["precisions"]
    groups = list(dict.fromkeys(g for m in measured for g in m["ms_per_step_by_group"]))
    head = " | ".join(f"{m['precision']} ms/step (share)" for m in measured)
    lines = [f"| where | {head} |", "|---|" + "---|" * len(measured)]
    for group in groups:
        cells = []
        for m in measured:
            ms = m["ms_per_step_by_group"].get(group, 0.0)
            cells.append(f"{ms:.0f} ({ms / m['profiled_ms_per_step']:.0%})")
        lines.append(f"| {group} | {' | '.join(cells)} |")
    for label, key, form in (
        ("**step, profiled**", "profiled_ms_per_step", "{:.0f}"),
        ("step, unprofiled", "ms_per_step", "{:.0f}"),
        ("its matrix products alone", "gemm_bound_ms_per_step", "{:.0f}"),
        ("**step / bound**", "step_over_bound", "{:.2f}"),
    ):
        lines.append(f"| {label} | " + " | ".join(form.format(m[key]) for m in measured) + " |")
    return "\n".join(lines)


def allocator_child(setting: str, batches_n: int, rounds: int) -> dict[str, float]:
    """One process's step with glibc's default or the trial's setting: best ms per batch, faults."""
    import resource

    from extractive_qa.trial import cpu_allocator

    keep = cpu_allocator.keep_freed_memory
    cpu_allocator.keep_freed_memory = lambda: setting == "keep" and keep()  # Loop applies it on the CPU
    torch.manual_seed(0)
    plan, batches, _ = trial_batches(batches_n + WARMUP)
    step = loop(plan, mixed_precision.resolve_precision("auto", "cpu")[0])
    for batch in batches[:WARMUP]:
        step.step(batch)
    best, faults = [float("inf")] * batches_n, 0
    for _ in range(rounds):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for i, batch in enumerate(batches[WARMUP:]):
            started = time.perf_counter()
            step.step(batch)
            best[i] = min(best[i], time.perf_counter() - started)
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before  # the last round's
    return {"ms_per_step": sum(best) * 1e3 / batches_n, "minor_faults_per_step": faults / batches_n}


def allocator(args: argparse.Namespace) -> dict[str, Any]:
    import json
    import subprocess

    from extractive_qa.io.files import ROOT

    runs: dict[str, list[dict[str, float]]] = {"default": [], "keep": []}
    for _ in range(args.runs):
        for setting in runs:
            child = [sys.executable, "-m", "bench.cpu_step", "--allocator-child", setting,
                     "--batches", str(args.batches), "--rounds", str(args.rounds)]  # fmt: skip
            done = subprocess.run(child, cwd=ROOT, capture_output=True, text=True, check=True)
            runs[setting].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"  {setting}: {runs[setting][-1]}", flush=True)
    best = {k: min(v, key=lambda r: r["ms_per_step"]) for k, v in runs.items()}
    ratio = best["keep"]["ms_per_step"] / best["default"]["ms_per_step"]
    table_text = "\n".join([
        "| malloc | ms per step | minor page faults per step |",
        "|---|---|---|",
        *(f"| {k} | {r['ms_per_step']:.0f} | {r['minor_faults_per_step']:,.0f} |" for k, r in best.items()),
        f"| **kept / default** | {ratio:.3f} | |",
    ])  # fmt: skip
    return {"runs": runs, "best": best, "keep_over_default": round(ratio, 3), "table": table_text}


@cli.boundary
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batches", type=int, default=8, help="timed batches (after 2 warm-up ones)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the step and the bound (best of)")
    parser.add_argument("--precisions", default="auto", help="comma-separated: auto, fp32, bf16")
    parser.add_argument("--json", type=Path, help="write the result here (bench/results/cpu-step-*.json)")
    parser.add_argument("--allocator", action="store_true", help="glibc's default malloc against the trial's")
    parser.add_argument("--runs", type=int, default=2, help="--allocator: processes of each setting")
    parser.add_argument("--allocator-child", choices=["default", "keep"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.allocator_child:
        import json

        print(json.dumps(allocator_child(args.allocator_child, args.batches, args.rounds)))
        return 0
    if args.batches < 1 or args.rounds < 1:
        parser.error("--batches and --rounds must be positive")
    picked = [p for p in args.precisions.split(",") if p]
    if not picked or set(picked) - {"auto", "fp32", "bf16"}:
        parser.error(f"--precisions {args.precisions!r}: a comma-separated subset of auto, fp32, bf16")
    precisions = list(dict.fromkeys(mixed_precision.resolve_precision(p, "cpu")[0] for p in picked))
    torch.manual_seed(0)
    plan, batches, collate_ms = trial_batches(args.batches + WARMUP)
    result: dict[str, Any] = provenance("bench.cpu_step", sys.argv[1:] if argv is None else argv)
    print(f"{result['machine']}: {args.batches} batches of local.yaml, {args.rounds} rounds", flush=True)
    if args.allocator:
        result.update(
            config="local.yaml", batches=args.batches, rounds=args.rounds, allocator=allocator(args)
        )
        print(result["allocator"]["table"])
        if args.json:
            study.save(args.json, result)
        return 0
    result.update(
        config="local.yaml",
        batches=args.batches,
        rounds=args.rounds,
        collate_ms_per_batch=round(collate_ms, 2),
        precisions=[measure(plan, batches, p, args.rounds) for p in precisions],
    )
    result["table"] = table(result)
    print(result["table"])
    if args.json:
        study.save(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
