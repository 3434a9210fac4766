"""Count and time the gradient all-reduces of the real trial over 2 local processes.

    python3 -m tests.support.allreduce_probe --config X.yaml --batches N --out RAW.json [--set K=V ...]

runs as one torchrun rank: train.py's `run` (Determined's local Trainer, gloo) with the trial
instrumented, not changed -- a DDP communication hook wraps the default all-reduce to count
calls and bytes and time each bucket from launch to completion, and train_batch is timed per
batch. `launch()` starts the two ranks; `summarise()` turns their record into per-step and
per-batch figures. The aggregation test asserts on them; bench/aggregation.py reports them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path
from typing import Any

from extractive_qa.io.files import ROOT

WORLD = 2


def record(args: argparse.Namespace) -> None:
    """One torchrun rank: the real trial with a counting comm hook; rank 0 writes the record."""
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    import model_def
    import train

    events: list[tuple[int, float, float, int]] = []  # (batch, launched, done, bytes)
    batches: list[tuple[int, float, bool]] = []  # (batch, seconds, communicated)
    current = {"batch": -1}

    # No annotations here: DDP checks them at runtime, and this module's are postponed strings.
    def counting_allreduce(state, bucket):  # noqa: ANN001, ANN202
        launched = time.perf_counter()
        nbytes = bucket.buffer().numel() * bucket.buffer().element_size()
        batch = current["batch"]

        def done(fut: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
            events.append((batch, launched, time.perf_counter(), nbytes))
            return fut.value()

        return default_hooks.allreduce_hook(None, bucket).then(done)

    class Instrumented(model_def.SquadTrial):
        def __init__(self, context: Any) -> None:
            super().__init__(context)
            assert isinstance(self.model, torch.nn.parallel.DistributedDataParallel), "needs 2 processes"
            self.model.register_comm_hook(None, counting_allreduce)

        def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
            current["batch"] = batch_idx
            t = time.perf_counter()
            out = super().train_batch(batch, epoch_idx, batch_idx)
            sync = (batch_idx + 1) % self.plan.aggregation_frequency == 0
            batches.append((batch_idx, time.perf_counter() - t, sync))
            return out

    run_args = train.parse_args(
        ["--config", args.config, "--checkpoint-dir", args.checkpoint_dir, "--batches", str(args.batches)]
        + [x for item in args.set for x in ("--set", item)]
    )
    result = train.run(train.run_options(run_args), trial_class=Instrumented)
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps({"events": events, "batches": batches, "result": result}))


def launch(config: Path | str, frequency: int, batches: int, sets: list[str], tmp: Path) -> dict[str, Any]:
    """Two ranks at `optimizations.aggregation_frequency=frequency`; their raw record. A failed
    run raises RuntimeError with the ranks' stderr."""
    from extractive_qa import scaling_runs

    out = tmp / f"agg{frequency}.json"
    program = ["-m", "tests.support.allreduce_probe", "--config", str(config)]
    program += ["--batches", str(batches), "--out", str(out)]
    program += ["--checkpoint-dir", str(tmp / f"ckpt{frequency}")]
    for item in [f"optimizations.aggregation_frequency={frequency}", *sets]:
        program += ["--set", item]
    cmd, env = scaling_runs.torchrun(WORLD, program, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"aggregation_frequency {frequency}: rc {proc.returncode}\n{proc.stderr[-4000:]}")
    return json.loads(out.read_text())


def summarise(frequency: int, raw: dict[str, Any], per_rank_batch: int) -> dict[str, Any]:
    """All-reduce calls, bytes and time per optimizer step and per batch; batch times."""
    events, batches = raw["events"], raw["batches"]
    communicating = sorted({b for b, *_ in events})
    per_batch = []  # per communicating batch: (calls, bytes, first launch -> last done)
    for b in communicating:
        mine = [e for e in events if e[0] == b]
        per_batch.append(
            (len(mine), sum(e[3] for e in mine), max(e[2] for e in mine) - min(e[1] for e in mine))
        )
    n_batches = len(batches)
    n_steps = n_batches // frequency
    calls = sum(p[0] for p in per_batch)
    timed = batches[1:]  # the first batch carries one-time warm-up
    sync = [s for _, s, c in timed if c]
    local = [s for _, s, c in timed if not c]
    comm_total = sum(p[2] for p in per_batch[1:]) * len(per_batch) / max(1, len(per_batch) - 1)
    seconds = sum(s for _, s, _ in timed)
    return {
        "aggregation_frequency": frequency,
        "batches": n_batches,
        "optimizer_steps": n_steps,
        "communicating_batches": len(communicating),
        "allreduce_calls": calls,
        "allreduce_calls_per_step": round(calls / max(1, n_steps), 3),
        "allreduce_calls_per_batch": round(calls / max(1, n_batches), 3),
        "allreduce_mb_per_step": round(sum(p[1] for p in per_batch) / max(1, n_steps) / 2**20, 1),
        "comm_seconds_per_step": round(comm_total / max(1, n_steps), 4),
        "comm_seconds_per_batch": round(comm_total / max(1, n_batches), 4),
        "seconds_per_communicating_batch": round(sum(sync) / len(sync), 4) if sync else None,
        "seconds_per_accumulating_batch": round(sum(local) / len(local), 4) if local else None,
        "samples_per_s": round(len(timed) * per_rank_batch * WORLD / seconds, 2) if seconds else None,
        "f1": (raw.get("result") or {}).get("f1"),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--batches", type=int, required=True)
    parser.add_argument("--checkpoint-dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--set", action="append", default=[])
    record(parser.parse_args())
