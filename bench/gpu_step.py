"""A training step on a GPU: where its time goes, kernel by kind, and how long the GPU waits.

    python3 -m bench.gpu_step [--model bert-base] [--rungs 64:bf16,12:fp32:graphs] [--json FILE]

For each rung (windows per step : precision [: graphs]), bench.common.Loop -- the trial's step without
Determined: forward under autocast, backward, clip, fused AdamW, schedule -- runs on the real
windows of the local training file (length-grouped batches, dynamic padding, SDPA, TF32, as the
trial's defaults; with `graphs`, width buckets of 64 and forward + backward captured as a CUDA
graph per input shape), one untimed step per input shape first, then `--batches` steps under
torch.profiler with CUDA activity. Reported per step:

- wall ms, and GPU busy ms (the union of the kernels' intervals): the rest is the GPU waiting
  for the host -- kernel launches, Python, the autograd engine -- the "launch-bound" share;
- kernel time by kind (`kernel_kind`: matrix products, attention, norms, dropout, casts,
  optimizer and clipping, embedding gradient, copies, other element-wise);
- the matrix products' own rate: 6 x non-embedding parameters x tokens computed over their
  kernel time (how close cuBLAS runs to the card's peak, apart from everything else);
- kernel launches per step, and host synchronizations per step (cudaStreamSynchronize /
  DeviceSynchronize / EventSynchronize, and `.item()`): each stalls the host until the GPU
  drains;
- the data loader's share: ms to collate one batch on the host (outside the step, as a
  DataLoader does it), against the step's wall time.

On a CPU there are no kernels: bench.cpu_precision profile is the CPU's breakdown.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from bench.common import SEED, Loop, Rung, provenance, sync, window_sample
from bench.results_files import num
from extractive_qa import cli
from extractive_qa.data.batching import Collator, FeatureBatchSampler

# Kernel kinds, by substrings of the (lower-cased) kernel name, first match wins. Attention
# comes first: SDPA's kernels (flash, memory-efficient "fmha_cutlass", cuDNN) carry matmul-ish
# names too. Matrix products: cuBLAS / cuBLASLt ("gemm", "nvjet", "xmma") and CUTLASS.
KINDS: list[tuple[str, tuple[str, ...]]] = [
    ("copies (host <-> device, memset)", ("memcpy", "memset")),
    ("attention (SDPA kernels, softmax, masks)", ("fmha", "flash", "attention", "softmax", "cudnn")),
    ("optimizer and clipping (fused AdamW, grad norm)", ("adam", "multi_tensor_apply", "lpnorm")),
    ("matrix products (cuBLAS, CUTLASS)", ("gemm", "nvjet", "xmma", "cutlass", "cublas", "gemv")),
    ("norms (LayerNorm forward and backward)", ("layer_norm", "layernorm")),
    ("dropout", ("dropout", "bernoulli")),
    ("casts (fp32 <-> bf16)", ("direct_copy", "copy_kernel")),
    ("embedding gradient", ("embedding", "indexing_backward", "index_put", "scatter")),
]
TOP = 25  # the kernels that take the most time, by name, kept in the results
OTHER = "other element-wise (GELU, bias, residual adds, loss, reductions)"
SYNCS = (
    "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "aten::_local_scalar_dense",
)  # fmt: skip
LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx")


def split_events(events: Iterable[Any]) -> tuple[list[str], list[Any]]:
    """(host event names, the GPU's kernels and copies) of a profile. The GPU timeline also carries
    the step's labelled ranges (record_function: "forward", "optimizer", the optimizer's own
    step): spans over many kernels, not kernels, and they share the host ops' names."""
    from torch.autograd import DeviceType

    host = [e.name for e in events if e.device_type == DeviceType.CPU]
    ranges = set(host)
    return host, [e for e in events if e.device_type == DeviceType.CUDA and e.name not in ranges]


def kernel_kind(name: str) -> str:
    low = name.lower()
    for kind, needles in KINDS:
        if any(n in low for n in needles):
            return kind
    return OTHER


def busy_us(intervals: Iterable[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals: time the GPU was running something."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def summarize(
    kernels: list[tuple[str, float, float]], host_events: list[str], steps: int, wall_ms: float
) -> dict[str, Any]:
    """Per-step figures from the profiled kernels (name, start us, end us) and host event names."""
    by_kind: dict[str, float] = {}
    by_name: dict[str, list[float]] = {}
    for name, start, end in kernels:
        kind = kernel_kind(name)
        by_kind[kind] = by_kind.get(kind, 0.0) + (end - start) / 1e3
        by_name.setdefault(name, []).append((end - start) / 1e3)
    top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:TOP]
    busy_ms = busy_us((s, e) for _, s, e in kernels) / 1e3
    ordered = sorted(by_kind.items(), key=lambda kv: -kv[1])
    return {
        "steps": steps,
        "wall_ms_per_step": round(wall_ms / steps, 2),
        "gpu_busy_ms_per_step": round(busy_ms / steps, 2),
        "gpu_idle_share": round(max(0.0, 1 - busy_ms / wall_ms), 3),
        "kernel_ms_per_step_by_kind": {k: round(v / steps, 3) for k, v in ordered},
        "kernels_per_step": round(len(kernels) / steps, 1),
        "launches_per_step": round(sum(n in LAUNCHES for n in host_events) / steps, 1),
        "host_syncs_per_step": round(sum(n in SYNCS for n in host_events) / steps, 2),
        "top_kernels": [
            {
                "name": name[:200],
                "kind": kernel_kind(name),
                "ms_per_step": round(sum(ms) / steps, 3),
                "calls_per_step": round(len(ms) / steps, 1),
            }
            for name, ms in top
        ],
    }


def rung_batches(
    setup: Any, batch_size: int, n_batches: int, graphs: bool = False
) -> tuple[list[dict], float]:
    """`n_batches` length-grouped batches (the trial's batching; width buckets of 64 for CUDA
    graphs, one graph per shape) of the real windows, cycling through the file when it holds
    fewer; and ms to collate one on the host."""
    hp, features = setup.hp, setup.features
    batching, multiple = ("buckets", 64) if graphs else (hp.batching, hp.pad_to_multiple_of)
    sample = window_sample(len(features), n_batches * batch_size)
    sampler = FeatureBatchSampler(
        features.lengths[sample], batch_size, shuffle=True, batching=batching, seed=SEED,
        bucket_width=multiple,
    )  # fmt: skip
    collate = Collator(features, True, multiple, labels=True)
    started = time.perf_counter()
    batches = [collate(sample[ix].tolist()) for ix in sampler.batches(0)]
    return batches, (time.perf_counter() - started) * 1e3 / len(batches)


def profile_rung(
    setup: Any, batch_size: int, precision: str, n_batches: int, graphs: bool = False
) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    from bench.throughput import flop_counter

    hp, device = setup.hp, setup.args.device
    batches, collate_ms = rung_batches(setup, batch_size, n_batches, graphs)
    batching, multiple = ("buckets", 64) if graphs else (hp.batching, hp.pad_to_multiple_of)
    rung = Rung("", batching, multiple, "sdpa", "trial", precision, "", hp.tf32, graphs=graphs)
    loop = Loop(setup.model_path, rung, hp, len(batches) * 2, device)
    for b in {tuple(b["input_ids"].shape): b for b in batches}.values():  # once per shape, untimed
        loop.step(b)
    sync(device)
    started = time.perf_counter()
    for b in batches:
        loop.step(b)
    sync(device)
    unprofiled_ms = (time.perf_counter() - started) * 1e3
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        started = time.perf_counter()
        for b in batches:
            loop.step(b)
        sync(device)
        wall_ms = (time.perf_counter() - started) * 1e3
    events = prof.events()
    host, device_events = split_events(events)
    kernels = [(e.name, e.time_range.start, e.time_range.end) for e in device_events]
    out = summarize(kernels, host, len(batches), wall_ms)
    streams: dict[str, float] = {}
    for e in device_events:  # which streams the kernels ran on (the step's own is one)
        key = str(getattr(e, "device_resource_id", "?"))
        streams[key] = streams.get(key, 0.0) + (e.time_range.end - e.time_range.start) / 1e3
    out["kernel_ms_per_step_by_stream"] = {k: round(v / len(batches), 2) for k, v in streams.items()}
    # The matrix products' own rate: their FLOPs (6 N per token computed) over their kernel time.
    count = flop_counter(setup.model_path, weights_only=True)
    tokens = sum(b["input_ids"].numel() for b in batches)
    linear_flops = sum(count(*b["input_ids"].shape) for b in batches)
    mm_ms = out["kernel_ms_per_step_by_kind"].get(KINDS[3][0], 0.0) * len(batches)
    out.update(
        batch_size=batch_size,
        precision=precision,
        tf32=hp.tf32,
        cuda_graphs=graphs,
        unprofiled_ms_per_step=round(unprofiled_ms / len(batches), 2),
        sequences_per_s_unprofiled=round(batch_size * len(batches) / unprofiled_ms * 1e3, 1),
        mean_width=round(tokens / sum(len(b["input_ids"]) for b in batches), 1),
        collate_ms_per_batch=round(collate_ms, 2),
        matmul_tflops=round(linear_flops / (mm_ms / 1e3) / 1e12, 1) if mm_ms else None,
    )
    del loop
    torch.cuda.empty_cache()
    return out


def table(rows: list[dict[str, Any]]) -> str:
    kinds = list(dict.fromkeys(k for r in rows for k in r["kernel_ms_per_step_by_kind"]))
    graphs = [", CUDA graphs" if r["cuda_graphs"] else "" for r in rows]
    head = [f"{r['batch_size']} x {r['precision']}{g}" for r, g in zip(rows, graphs, strict=True)]
    lines = ["| per step | " + " | ".join(head) + " |", "|---" * (len(rows) + 1) + "|"]

    def line(label: str, cells: list[str]) -> None:
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    line("wall ms (profiled)", [f"{r['wall_ms_per_step']:.1f}" for r in rows])
    line("GPU busy ms", [f"{r['gpu_busy_ms_per_step']:.1f}" for r in rows])
    line("GPU idle (waiting for the host)", [f"{r['gpu_idle_share']:.0%}" for r in rows])
    for kind in kinds:
        line(
            f"  {kind}",
            [
                f"{num(r['kernel_ms_per_step_by_kind'].get(kind, 0))}"
                f" ({r['kernel_ms_per_step_by_kind'].get(kind, 0) / r['gpu_busy_ms_per_step']:.0%})"
                for r in rows
            ],
        )
    line("matrix products' own rate, TFLOP/s", [str(r["matmul_tflops"]) for r in rows])
    line("kernels / launches", [f"{r['kernels_per_step']:.0f} / {r['launches_per_step']:.0f}" for r in rows])
    line("host syncs", [f"{r['host_syncs_per_step']:.2f}" for r in rows])
    line("collate one batch (host), ms", [f"{r['collate_ms_per_batch']:.1f}" for r in rows])
    line(
        "unprofiled ms / seq/s",
        [f"{r['unprofiled_ms_per_step']:.1f} / {r['sequences_per_s_unprofiled']:.0f}" for r in rows],
    )
    return "\n".join(lines)


def parse_rungs(text: str) -> list[tuple[int, str, bool]]:
    """BATCH:PRECISION[:graphs], comma-separated."""
    rungs = []
    for part in text.split(","):
        size, _, rest = part.partition(":")
        precision, _, graphs = rest.partition(":")
        if (
            not size.isdigit()
            or int(size) < 1
            or precision not in ("fp32", "bf16", "fp16")
            or graphs not in ("", "graphs")
            or (graphs and precision == "fp16")
        ):
            raise SystemExit(
                f"--rungs {text!r}: comma-separated BATCH:PRECISION[:graphs], e.g. 64:bf16,12:fp32:graphs"
            )
        rungs.append((int(size), precision, graphs == "graphs"))
    return rungs


@cli.boundary
def main(argv: list[str] | None = None) -> int:
    from bench import throughput

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", choices=["embedded", "bert-base"], default="bert-base")
    parser.add_argument(
        "--rungs",
        default="64:bf16,64:bf16:graphs,12:fp32,12:bf16:graphs",
        help="BATCH:PRECISION[:graphs], comma-separated (graphs: CUDA graphs over width buckets of 64)",
    )
    parser.add_argument("--batches", type=int, default=12, help="profiled steps per rung")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    rungs = parse_rungs(args.rungs)
    if args.batches < 1:
        parser.error("--batches must be at least 1")
    if not torch.cuda.is_available():
        parser.error("no CUDA device here: `python3 -m bench.cpu_precision profile` is the CPU's breakdown")
    targs = throughput.parse_args(["--model", args.model, "--device", "cuda", "--skip-trial"])
    with tempfile.TemporaryDirectory() as tmp:
        setup = throughput.Setup.build(targs, Path(tmp))
        rows = []
        for size, precision, graphs in rungs:
            rows.append(profile_rung(setup, size, precision, args.batches, graphs))
            print(json.dumps(rows[-1]), flush=True)
    result = {**provenance("bench.gpu_step", sys.argv[1:] if argv is None else argv, torch.device("cuda"))}
    result.update(model=args.model, rows=rows, table=table(rows))
    result["driver"] = result["versions"]["driver"]
    print(result["table"])
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
