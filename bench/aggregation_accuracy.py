"""F1 against aggregation_frequency, with AdamW and with RAdam: the accuracy side of the trade.

    python3 -m bench.aggregation_accuracy [--frequencies 1,2,4,8] [--optimizers adamw,radam]
                                          [--config local.yaml] [--json FILE]

The published write-up tabulated SQuAD F1 for aggregation frequencies 1..N and found that Adam's
F1 falls as the frequency grows while RAdam's holds. This runs that experiment on the embedded
default, exactly as a user would change it: `train.py --config local.yaml --set
optimizations.aggregation_frequency=A --set hyperparameters.optimizer=O`. Everything else stays
(per-batch size, epochs, learning rate, warm-up ratio, seed), so aggregation A means A times the
samples per optimizer step and 1/A as many steps. Runs are serial (one at a time, all cores) and
each finished row is saved at once: re-running with the same --json skips rows already there.
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

from bench.common import provenance
from extractive_qa import cli
from extractive_qa.io.files import ROOT


def run_one(config: str, frequency: int, optimizer: str, workdir: Path) -> dict[str, Any]:
    metrics = workdir / f"agg{frequency}-{optimizer}.json"
    command = [
        sys.executable, str(ROOT / "train.py"), "--config", config,
        "--set", f"optimizations.aggregation_frequency={frequency}",
        "--set", f"hyperparameters.optimizer={optimizer}",
        "--set", "hyperparameters.lr_scaling=none",  # the lr unchanged: what this table measures
        "--checkpoint-dir", str(workdir / "checkpoints"), "--restart",
        "--metrics-out", str(metrics),
    ]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"run failed (aggregation {frequency}, {optimizer}):\n{done.stderr[-3000:]}")
    record = json.loads(metrics.read_text())
    validation = record["validation"][-1]["metrics"]
    training = record["training"]
    return {
        "aggregation_frequency": frequency,
        "optimizer": optimizer,
        "batches": record["validation"][-1]["steps_completed"],
        "samples_per_optimizer_step": record["global_batch_size"] * frequency,
        "exact_match": validation["exact_match"],
        "f1": validation["f1"],
        "last_train_loss": training[-1]["metrics"].get("loss") if training else None,
        "wall_seconds": round(seconds, 1),
    }


def table(rows: list[dict[str, Any]], frequencies: list[int], optimizers: list[str]) -> str:
    by_key = {(r["aggregation_frequency"], r["optimizer"]): r for r in rows}
    header = "| aggregation | samples/step | " + " | ".join(f"{o} EM / F1" for o in optimizers) + " |"
    lines = [header, "|" + " --- |" * (2 + len(optimizers))]
    for frequency in frequencies:
        cells = []
        for optimizer in optimizers:
            row = by_key.get((frequency, optimizer))
            cells.append(f"{row['exact_match']:.2f} / {row['f1']:.2f}" if row else "-")
        samples = next(
            (r["samples_per_optimizer_step"] for r in rows if r["aggregation_frequency"] == frequency), "-"
        )
        lines.append(f"| {frequency} | {samples} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


@cli.boundary
def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--frequencies", default="1,2,4,8")
    parser.add_argument("--optimizers", default="adamw,radam")
    parser.add_argument("--config", default="local.yaml")
    default_json = ROOT / "bench" / "results" / "aggregation-accuracy-cpu.json"
    parser.add_argument("--json", type=Path, default=default_json)
    args = parser.parse_args()
    try:
        frequencies = [int(f) for f in args.frequencies.split(",")]
    except ValueError:
        parser.error(f"--frequencies: expected comma-separated integers, got {args.frequencies!r}")
    if any(f < 1 for f in frequencies):
        parser.error("--frequencies: each aggregation frequency must be >= 1")
    optimizers = args.optimizers.split(",")
    if unknown := set(optimizers) - {"adamw", "radam"}:
        parser.error(f"--optimizers: unknown {sorted(unknown)}; choose from adamw, radam")

    result: dict[str, Any] = {"config": args.config, "rows": []}
    if args.json.exists():
        result = json.loads(args.json.read_text())
        if result.get("config") != args.config:
            parser.error(
                f"{args.json} holds rows for {result.get('config')}, not {args.config}; pass another --json"
            )
    result.update(provenance("bench.aggregation_accuracy", sys.argv[1:]))
    done = {(r["aggregation_frequency"], r["optimizer"]) for r in result["rows"]}
    with tempfile.TemporaryDirectory(prefix="agg-accuracy-") as tmp:
        for frequency in frequencies:
            for optimizer in optimizers:
                if (frequency, optimizer) in done:
                    continue
                row = run_one(args.config, frequency, optimizer, Path(tmp))
                print(json.dumps(row), flush=True)
                result["rows"].append(row)
                args.json.parent.mkdir(parents=True, exist_ok=True)
                partial = args.json.with_name(f".{args.json.name}.tmp")
                partial.write_text(json.dumps(result, indent=1))
                partial.replace(args.json)
    print(table(result["rows"], frequencies, optimizers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
