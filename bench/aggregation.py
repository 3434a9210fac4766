"""Gradient all-reduce per optimizer step at aggregation_frequency 1, 2, 4 (2 local processes).

    python3 bench/aggregation.py [--frequencies 1,2,4] [--batches 16] [--json FILE]

For each frequency this launches `torchrun --nproc_per_node=2` on the real trial (train.py's
`run`, Determined's local Trainer, gloo) with `optimizations.aggregation_frequency` set in the
config, exactly as a user would. The trial is instrumented, not changed: a DDP communication
hook wraps the default all-reduce to count calls and bytes and time each bucket from launch to
completion, and train_batch is timed per batch. Reported per frequency: all-reduce calls and
bytes per optimizer step and per batch, communication time per optimizer step (first bucket
launched -> last bucket done; it overlaps the rest of backward), the mean time of batches that
communicate vs batches that only accumulate, and samples/s. docs/scaling.md turns these into a
model of per-GPU efficiency.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def worker(args: argparse.Namespace) -> int:
    """One torchrun rank: the real trial with a counting comm hook."""
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
    result = train.run(run_args, trial_class=Instrumented)
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps({"events": events, "batches": batches, "result": result}))
    return 0


def summarise(frequency: int, raw: dict[str, Any], world: int, batch_size: int) -> dict[str, Any]:
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
        "samples_per_s": round(len(timed) * batch_size * world / seconds, 2) if seconds else None,
        "f1": (raw.get("result") or {}).get("f1"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", default=str(ROOT / "local.yaml"))
    parser.add_argument("--frequencies", default="1,2,4")
    parser.add_argument(
        "--batches", type=int, default=16, help="batches per run (a multiple of each frequency)"
    )
    parser.add_argument("--set", action="append", default=[], help="extra config overrides (KEY=VALUE)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint-dir", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    try:
        frequencies = [int(f) for f in args.frequencies.split(",")]
    except ValueError:
        parser.error(f"--frequencies {args.frequencies!r}: expected integers like 1,2,4")
    if min(frequencies) < 1 or args.batches < 2 or any(args.batches % f for f in frequencies):
        parser.error("--batches must be >= 2 and a multiple of every frequency (>= 1)")

    from common import tiny_validation_file

    import config
    import scaling_runs

    conf = config.load_yaml(args.config)
    world, batch_size = 2, int(conf["hyperparameters"]["global_batch_size"]) // 2
    rows = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        val = tiny_validation_file(tmp)
        for f in frequencies:
            out = tmp / f"agg{f}.json"
            sets = [f"optimizations.aggregation_frequency={f}", f"data.validation_file={val}", *args.set]
            program = [__file__, "--worker", "--config", args.config, "--batches", str(args.batches)]
            program += ["--checkpoint-dir", str(tmp / f"ckpt{f}"), "--out", str(out)]
            program += [x for s in sets for x in ("--set", s)]
            cmd, env = scaling_runs.torchrun(2, program, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
            print(f"aggregation_frequency {f}: torchrun x2, {args.batches} batches ...", flush=True)
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
            if proc.returncode != 0:
                print(proc.stderr[-4000:], file=sys.stderr)
                print(
                    f"error: the run with aggregation_frequency {f} failed (rc {proc.returncode}).",
                    file=sys.stderr,
                )
                return 1
            row = summarise(f, json.loads(out.read_text()), world, batch_size)
            rows.append(row)
            print(
                f"  {row['allreduce_calls_per_step']} all-reduce calls / optimizer step "
                f"({row['allreduce_calls_per_batch']} per batch), {row['allreduce_mb_per_step']} MB / step, "
                f"comm {row['comm_seconds_per_step'] * 1000:.0f} ms / step = "
                f"{row['comm_seconds_per_batch'] * 1000:.0f} ms / batch; batch time communicating "
                f"{row['seconds_per_communicating_batch']} s, "
                f"accumulating {row['seconds_per_accumulating_batch']} s;"
                f" {row['samples_per_s']} samples/s",
                flush=True,
            )
    result = {
        "world_size": world,
        "per_rank_batch": batch_size,
        "config": args.config,
        "date": time.strftime("%Y-%m-%d"),
        "rows": rows,
    }
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
