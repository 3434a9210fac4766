"""The embedded default's training step on the CPU: where its time goes, and what each lever buys.

Run through bench.cpu_precision (`profile`, `levers`), which stores the result beside the accuracy
study. Both use the trial's real batches -- local.yaml's training windows, batched by the trial's
sampler (epoch 0, seed 42) -- and bench.common.Loop, the trial's step without Determined.
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections.abc import Iterator
from typing import Any

import torch

from bench.batching import local_setup
from bench.common import Loop, Rung
from extractive_qa.config import run_plan
from extractive_qa.config.model_family import resolve_pretrained
from extractive_qa.data.batching import training_batches
from extractive_qa.trial import dropout_masks

WARMUP = 2  # untimed batches first: one-time allocations, oneDNN's first kernels

# Self time of each operator, grouped. Dropout masks: torch's bernoulli_, or everything inside
# dropout_masks' labelled range (numpy's draws are its self time, the masked product included).
DROPOUT = "dropout masks (drawing and applying the fast ones; torch's bernoulli_)"
# Self time of each operator, grouped. bmm only occurs in attention in these encoders (QK^T, PV);
# Linear layers are mm / addmm. all / isneginf / where are SDPA's math path (the one it takes in
# training with attention dropout) guarding fully masked rows.
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
ELEMENTWISE = "norms, activations, element-wise (dropout's multiply included)"
HOST = "host work (Python, dispatch, the autograd engine's bookkeeping)"


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


def profile_one(plan: run_plan.RunPlan, batches: list[dict[str, torch.Tensor]], precision: str) -> dict:
    from torch.profiler import ProfilerActivity, profile

    step = loop(plan, precision)
    for batch in batches[:WARMUP]:
        step.step(batch)
    started = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for batch in batches[WARMUP:]:
            step.step(batch)
    wall_ms = (time.perf_counter() - started) * 1e3
    shares: dict[str, float] = {}
    for event in prof.events():
        if event.name in ("forward", "backward", "optimizer") or event.name.startswith("ProfilerStep"):
            continue  # ranges: their operators are counted, not their own time
        group = _group(event)
        shares[group] = shares.get(group, 0.0) + event.self_cpu_time_total / 1e3
    shares[HOST] = max(0.0, wall_ms - sum(shares.values()))
    steps = len(batches) - WARMUP
    ordered = sorted(shares.items(), key=lambda kv: -kv[1])
    return {
        "ms_per_step": round(wall_ms / steps, 1),
        "ms_per_step_by_group": {k: round(v / steps, 1) for k, v in ordered},
    }


def profile(args: argparse.Namespace) -> dict[str, Any]:
    """Where a training step's time goes, fp32 and bf16, on the same batches (profiled, so each
    step is somewhat slower than unprofiled: the shares are the point)."""
    torch.manual_seed(0)
    plan, batches, collate_ms = trial_batches(args.batches + WARMUP)
    result: dict[str, Any] = {"command": f"python3 -m bench.cpu_precision profile --batches {args.batches}"}
    for precision in ("fp32", "bf16"):
        result[precision] = profile_one(plan, batches, precision)
    groups = list(result["fp32"]["ms_per_step_by_group"])
    lines = ["| where | fp32 ms/step (share) | bf16 ms/step (share) |", "|---|---|---|"]
    for group in groups:
        cells = []
        for precision in ("fp32", "bf16"):
            ms = result[precision]["ms_per_step_by_group"].get(group, 0.0)
            cells.append(f"{ms:.0f} ({ms / result[precision]['ms_per_step']:.0%})")
        lines.append(f"| {group} | {cells[0]} | {cells[1]} |")
    lines.append(f"| **step** | {result['fp32']['ms_per_step']:.0f} | {result['bf16']['ms_per_step']:.0f} |")
    lines.append(f"| data: collating a batch (the loader's work, outside the step) | {collate_ms:.1f} | - |")
    result["collate_ms_per_batch"] = round(collate_ms, 2)
    result["table"] = "\n".join(lines)
    return result


LEVERS = {  # the first is the baseline: fp32 as it was before bf16 and the fast masks
    "fp32, torch's dropout masks (before: SDPA, foreach AdamW)": ("fp32", {"masks": "torch"}),
    "fp32 + fast dropout masks": ("fp32", {}),
    "bf16 autocast, torch's dropout masks": ("bf16", {"masks": "torch"}),
    "bf16 + fast dropout masks (the trial's step where auto picks bf16)": ("bf16", {}),
    "bf16 + fast masks + fused AdamW (CPU kernel)": ("bf16", {"optimizer": "fused"}),
    "bf16 + fast masks + eager attention in training": ("bf16", {"attn": "eager"}),
}


def _fused(step: Loop) -> None:
    """Swap the trial's foreach AdamW for torch's fused CPU kernel (same update, one kernel)."""
    hp = step.optimizer.defaults
    groups = [{"params": g["params"], "weight_decay": g["weight_decay"]} for g in step.optimizer.param_groups]
    step.optimizer = torch.optim.AdamW(groups, lr=hp["lr"], betas=hp["betas"], eps=hp["eps"], fused=True)
    step.schedule = torch.optim.lr_scheduler.LambdaLR(step.optimizer, step.schedule.lr_lambdas[0])


MATMULS = {  # (m, k, n): a big square-ish product, and MiniLM's (384 hidden, 1536 FFN) at 3,200 tokens
    "4096x1024 @ 1024x1024": (4096, 1024, 1024),
    "3200x384 @ 384x1536 (FFN in)": (3200, 384, 1536),
    "3200x1536 @ 1536x384 (FFN out)": (3200, 1536, 384),
    "3200x384 @ 384x384 (attention projections)": (3200, 384, 384),
}


def matmuls(repeats: int = 10) -> dict[str, dict[str, float]]:
    """GFLOP/s of plain matrix products in fp32 and bf16: what the CPU's bf16 units give alone."""
    out = {}
    for name, (m, k, n) in MATMULS.items():
        rates = {}
        for dtype in (torch.float32, torch.bfloat16):
            a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
            a @ b
            started = time.perf_counter()
            for _ in range(repeats):
                a @ b
            seconds = time.perf_counter() - started
            rates[str(dtype).removeprefix("torch.")] = 2 * m * k * n * repeats / seconds / 1e9
        out[name] = {
            "fp32_gflops": round(rates["float32"]),
            "bf16_gflops": round(rates["bfloat16"]),
            "bf16_vs_fp32": round(rates["bfloat16"] / rates["float32"], 2),
        }
    return out


def levers(args: argparse.Namespace) -> dict[str, Any]:
    """Each lever on the same batches, the levers interleaved round by round, best of the rounds;
    first the plain matrix products, fp32 against bf16."""
    products = matmuls()
    plan, batches, _ = trial_batches(args.batches + WARMUP)
    best: dict[str, float] = {}
    for _ in range(args.rounds):
        for name, (precision, change) in LEVERS.items():
            fused = change.get("optimizer") == "fused"
            step = loop(plan, precision, **{k: v for k, v in change.items() if k != "optimizer"})
            if fused:
                _fused(step)
            for batch in batches[:WARMUP]:
                step.step(batch)
            started = time.perf_counter()
            for batch in batches[WARMUP:]:
                step.step(batch)
            ms = (time.perf_counter() - started) * 1e3 / args.batches
            best[name] = min(best.get(name, ms), ms)
            print(f"  {name}: {ms:.0f} ms/step", flush=True)
    base = best[next(iter(LEVERS))]
    rows = {name: {"ms_per_step": round(ms, 1), "vs_fp32": round(ms / base, 3)} for name, ms in best.items()}
    lines = ["| matrix product | fp32 GFLOP/s | bf16 GFLOP/s | bf16 / fp32 |", "|---|---|---|---|"]
    lines += [
        f"| {name} | {r['fp32_gflops']} | {r['bf16_gflops']} | {r['bf16_vs_fp32']:.2f}x |"
        for name, r in products.items()
    ]
    lines += ["", "| lever | ms/step (best of rounds) | vs fp32 |", "|---|---|---|"]
    lines += [f"| {name} | {r['ms_per_step']:.0f} | {r['vs_fp32']:.3f} |" for name, r in rows.items()]
    command = f"python3 -m bench.cpu_precision levers --batches {args.batches} --rounds {args.rounds}"
    return {
        "command": command,
        "threads": torch.get_num_threads(),
        "matmuls": products,
        "rows": rows,
        "table": "\n".join(lines),
    }
