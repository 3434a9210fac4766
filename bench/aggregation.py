"""Gradient all-reduce per optimizer step at aggregation_frequency 1, 2, 4 (2 local processes).

    python3 -m bench.aggregation [--frequencies 1,2,4] [--batches 16] [--json FILE]

For each frequency this launches `torchrun --nproc_per_node=2` on the real trial (train.py's
`run`, Determined's local Trainer, gloo) with `optimizations.aggregation_frequency` set in the
config, exactly as a user would. The trial is instrumented, not changed: a DDP communication
hook wraps the default all-reduce to count calls and bytes and time each bucket from launch to
completion, and train_batch is timed per batch (tests/support/allreduce_probe.py, which the aggregation
test asserts on too). Reported per frequency: all-reduce calls and
bytes per optimizer step and per batch, communication time per optimizer step (first bucket
launched -> last bucket done; it overlaps the rest of backward), the mean time of batches that
communicate vs batches that only accumulate, and samples/s. docs/scaling.md turns these into a
model of per-GPU efficiency.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import provenance, tiny_validation_file
from extractive_qa import cli
from extractive_qa.config import experiment
from extractive_qa.io.files import ROOT
from tests.support import allreduce_probe


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[int]]:
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
    args = parser.parse_args(argv)
    try:
        frequencies = [int(f) for f in args.frequencies.split(",")]
    except ValueError:
        parser.error(f"--frequencies {args.frequencies!r}: expected integers like 1,2,4")
    if min(frequencies) < 1 or args.batches < 2 or any(args.batches % f for f in frequencies):
        parser.error("--batches must be >= 2 and a multiple of every frequency (>= 1)")
    return args, frequencies


def describe(row: dict[str, Any]) -> str:
    return (
        f"  {row['allreduce_calls_per_step']} all-reduce calls / optimizer step "
        f"({row['allreduce_calls_per_batch']} per batch), {row['allreduce_mb_per_step']} MB / step, "
        f"comm {row['comm_seconds_per_step'] * 1000:.0f} ms / step = "
        f"{row['comm_seconds_per_batch'] * 1000:.0f} ms / batch; batch time communicating "
        f"{row['seconds_per_communicating_batch']} s, "
        f"accumulating {row['seconds_per_accumulating_batch']} s; {row['samples_per_s']} samples/s"
    )


@cli.boundary
def main(argv: list[str] | None = None) -> int:
    args, frequencies = parse_args(argv)

    conf = experiment.load_yaml(args.config)
    per_rank = int(conf["hyperparameters"]["global_batch_size"]) // allreduce_probe.WORLD
    rows = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        sets = [f"data.validation_file={tiny_validation_file(tmp)}", *args.set]
        for f in frequencies:
            print(f"aggregation_frequency {f}: torchrun x2, {args.batches} batches ...", flush=True)
            try:
                raw = allreduce_probe.launch(args.config, f, args.batches, sets, tmp)
            except RuntimeError as err:
                print(f"error: the run failed: {err}", file=sys.stderr)
                return 1
            rows.append(allreduce_probe.summarise(f, raw, per_rank))
            print(describe(rows[-1]), flush=True)
    result = {
        **provenance("bench.aggregation", sys.argv[1:] if argv is None else argv),
        "world_size": allreduce_probe.WORLD,
        "per_rank_batch": per_rank,
        "config": args.config,
        "rows": rows,
    }
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
