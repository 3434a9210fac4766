"""Peak memory and step time of one training step with gradient checkpointing off and on, side by
side in one run, for BERT-base and BERT-large shapes (random init) at 384 tokens; from the
per-sample activation memory, the largest per-GPU batch that fits 12 / 16 / 24 / 40 / 80 GB.

    python3 -m bench.memory [--models base,large] [--batches 1,2] [--json FILE]

Each (model, batch, checkpointing) runs in a fresh process: AdamW, fp32, one warm-up step, then
one timed step. On a CPU the peak is the process's resident high-water mark; on a GPU,
torch.cuda.max_memory_allocated. The batch estimate is linear in the measured per-sample cost
(peak at the larger batch minus peak at the smaller, per sample) over the fixed cost (weights,
gradients, optimizer state), and is marked as an estimate.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from extractive_qa import cli
from extractive_qa.io.files import ROOT

SHAPES = {
    "base": {
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "intermediate_size": 3072,
    },
    "large": {
        "hidden_size": 1024,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "intermediate_size": 4096,
    },
}
CARDS_GB = (12, 16, 24, 40, 80)
SEQ = 384


def one_step(model_name: str, batch: int, checkpointing: bool, device: str) -> dict[str, float]:
    """In this process: build, warm up, time one step; the peak memory in GiB."""
    import torch
    from transformers import BertConfig, BertForQuestionAnswering

    from extractive_qa import compat

    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, max_position_embeddings=512, **SHAPES[model_name])
    model = BertForQuestionAnswering(config).to(device).train()
    if checkpointing:
        compat.enable_activation_checkpointing(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    inputs = {
        "input_ids": torch.randint(1000, 30000, (batch, SEQ), device=device),
        "attention_mask": torch.ones(batch, SEQ, dtype=torch.long, device=device),
        "start_positions": torch.randint(0, SEQ, (batch,), device=device),
        "end_positions": torch.randint(0, SEQ, (batch,), device=device),
    }
    seconds = 0.0
    for step in range(2):
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        model(**inputs).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started if step == 1 else 0.0
    if device == "cuda":
        peak = torch.cuda.max_memory_allocated() / 2**30
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
    return {"peak_gib": round(peak, 3), "step_s": round(seconds, 2)}


@cli.boundary
def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default="base,large")
    parser.add_argument("--batches", default="1,2", help="two or more per-device batch sizes")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "memory-cpu.json")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: model,batch,checkpointing
    args = parser.parse_args()
    if args.one:
        name, batch, on = args.one.split(",")
        print(json.dumps(one_step(name, int(batch), on == "1", args.device)))
        return 0
    models = args.models.split(",")
    batches = sorted(int(b) for b in args.batches.split(","))
    if len(batches) < 2 or any(m not in SHAPES for m in models):
        parser.error(f"--batches needs two sizes or more; --models from {', '.join(SHAPES)}")
    rows = []
    for name in models:
        for batch in batches:
            for on in (0, 1):  # off and on side by side for every shape and batch
                command = [
                    sys.executable,
                    "-m",
                    "bench.memory",
                    "--device",
                    args.device,
                    "--one",
                    f"{name},{batch},{on}",
                ]
                done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
                row = {
                    "model": name,
                    "batch": batch,
                    "checkpointing": bool(on),
                    **json.loads(done.stdout.splitlines()[-1]),
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
    summary = []
    for name in models:
        for on in (False, True):
            mine = {r["batch"]: r for r in rows if r["model"] == name and r["checkpointing"] == on}
            small, large = batches[0], batches[-1]
            per_sample = (mine[large]["peak_gib"] - mine[small]["peak_gib"]) / (large - small)
            fixed = mine[small]["peak_gib"] - small * per_sample
            fits = {
                f"{gb} GB": int((gb * 1e9 / 2**30 - fixed) // per_sample) if per_sample > 0 else None
                for gb in CARDS_GB
            }
            summary.append(
                {
                    "model": name,
                    "checkpointing": on,
                    "per_sample_gib": round(per_sample, 3),
                    "fixed_gib": round(fixed, 2),
                    "largest_batch_estimate": fits,
                }
            )
    for name in models:
        off = {r["batch"]: r for r in rows if r["model"] == name and not r["checkpointing"]}
        on = {r["batch"]: r for r in rows if r["model"] == name and r["checkpointing"]}
        for batch in batches:
            print(
                f"{name} batch {batch}: peak on/off {on[batch]['peak_gib'] / off[batch]['peak_gib']:.2f}x, "
                f"step time on/off {on[batch]['step_s'] / off[batch]['step_s']:.2f}x"
            )
    from bench.common import provenance  # here: the measuring subprocesses import only torch

    result = {
        **provenance("bench.memory", sys.argv[1:]),
        "device": args.device,
        "seq_len": SEQ,
        "rows": rows,
        "summary": summary,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1))
    for s in summary:
        print(json.dumps(s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
