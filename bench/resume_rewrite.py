"""What a resume's decode-check-write costs, beside Determined's own restore of the same file.

A resume decodes the checkpoint with the trial's restricted decoder, checks it against the model
and writes a new one (resume/rewrite.py) before Determined's torch.load reads that. This
times, for a checkpoint of the embedded default (MiniLM, 22.7 M parameters) and of a BERT-base-
sized model (109 M), each in a fresh process so that peak memory is its own:

    load      torch.load of state_dict.pth (what any resume costs: Determined's restore)
    rewrite   checkpoint_rewrite.rewrite into a new directory (decode, check, torch.save)

and prints the ratio rewrite / load. The checkpoints are Determined's layout with AdamW's two
moments and one rank's random states, from randomly initialised models (the bytes' values do not
matter here, only their amount).

    python3 -m bench.resume_rewrite [--models minilm,bert-base] [--repeat 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import pickle
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.common import BERT_BASE, ROOT, provenance
from extractive_qa import cli
from extractive_qa.config.model_family import EMBEDDED_MODEL, pretrained_config

MODELS = {"minilm": None, "bert-base": BERT_BASE}


def build(kind: str, device: str = "cpu") -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    from transformers import AutoModelForQuestionAnswering, BertConfig

    from extractive_qa.config.settings import Hyperparameters
    from extractive_qa.trial.optimization import build_optimizer

    config = pretrained_config(EMBEDDED_MODEL, local_only=True) if kind == "minilm" else None
    config = config or BertConfig(**MODELS[kind])
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForQuestionAnswering.from_config(config)
    optimizer = build_optimizer(model, Hyperparameters(), 3e-5, torch.device(device))
    return model, optimizer


def write_checkpoint(kind: str, directory: Path) -> None:
    """A checkpoint as the trial writes one, after one optimizer step (both moments allocated)."""
    model, optimizer = build(kind)
    for parameter in model.parameters():
        parameter.grad = torch.zeros_like(parameter)
    optimizer.step()
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    rng = {"cpu_rng_state": torch.random.get_rng_state(), "np_rng_state": np.random.get_state(),
           "random_rng_state": random.getstate()}  # fmt: skip
    rank = {"torch": rng["cpu_rng_state"], "numpy": rng["np_rng_state"], "random": rng["random_rng_state"]}
    state = {
        "models_state_dict": [model.state_dict()],
        "optimizers_state_dict": [optimizer.state_dict()],
        "lr_schedulers_state_dict": [schedule.state_dict()],
        "callbacks": {"rank_random_state": {"ranks": [rank]}, "run_log": {}},
        "rng_state": rng,
    }
    directory.mkdir(parents=True)
    torch.save(state, directory / "state_dict.pth")
    trial_state = {"trial_id": 1, "last_ckpt": 1, "step_id": 0, "last_val": 0, "batches_trained": 1,
                   "epochs_trained": 0}  # fmt: skip
    (directory / "trial_state.pkl").write_bytes(pickle.dumps(trial_state))
    (directory / "metadata.json").write_text(json.dumps({"steps_completed": 1, "framework": "torch"}))


def child(mode: str, kind: str, directory: Path) -> dict[str, Any]:
    """One measurement in this (fresh) process."""
    from extractive_qa.resume import rewrite as checkpoint_rewrite

    model, optimizer = build(kind, "meta")  # the expected shapes, as a resume builds them
    expected = checkpoint_rewrite.expected_state(model, optimizer)
    before = memory_mb("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := the RSS now: the peak is this step's
    start = time.perf_counter()
    if mode == "load":
        # As Determined restores on the cluster image's torch 2.3 (unrestricted, pytorch/
        # _pytorch_trial.py:907): the cost a rewrite adds to. The file is this benchmark's own.
        torch.load(directory / "state_dict.pth", map_location="cpu", weights_only=False)
    else:
        with tempfile.TemporaryDirectory(dir=directory.parent) as private:
            checkpoint_rewrite.rewrite(directory, Path(private), expected, directory)
    seconds = time.perf_counter() - start
    # RSS before (imports, the model on the meta device) and the peak while loading or rewriting
    return {"seconds": seconds, "peak_rss_mb": memory_mb("VmHWM"), "rss_before_mb": before}


def memory_mb(field: str) -> float:
    """A field of /proc/self/status (VmRSS, VmHWM: this process's alone, unlike getrusage's
    ru_maxrss, which an exec'd child inherits from its parent)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


@cli.boundary
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="minilm,bert-base")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each (the median is kept)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--child", nargs=3, metavar=("MODE", "MODEL", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], Path(args.child[2]))))
        return
    kinds = [k.strip() for k in args.models.split(",")]
    unknown = [k for k in kinds if k not in MODELS]
    if unknown:
        parser.error(f"--models: unknown {unknown}; choose from {', '.join(MODELS)}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in kinds:
            directory = Path(tmp) / kind
            write_checkpoint(kind, directory)
            size = (directory / "state_dict.pth").stat().st_size
            row: dict[str, Any] = {"model": kind, "state_mb": size / 1e6}
            runs: dict[str, list[dict[str, Any]]] = {"load": [], "rewrite": []}
            for _ in range(args.repeat):  # alternating, so both see the same page cache and load
                for mode in runs:
                    done = subprocess.run(
                        [sys.executable, "-m", "bench.resume_rewrite", "--child", mode, kind, str(directory)],
                        cwd=ROOT, capture_output=True, text=True, check=True,
                    )  # fmt: skip
                    runs[mode].append(json.loads(done.stdout.splitlines()[-1]))
            for mode, measured in runs.items():  # the median run by time
                row[mode] = sorted(measured, key=lambda r: r["seconds"])[len(measured) // 2]
                row[mode]["all_seconds"] = [r["seconds"] for r in measured]
            row["rewrite_over_load_seconds"] = row["rewrite"]["seconds"] / row["load"]["seconds"]
            rows.append(row)
            print(  # medians of --repeat runs each
                f"{kind}: state_dict.pth {row['state_mb']:.0f} MB; load {row['load']['seconds']:.2f} s "
                f"(peak RSS {row['load']['peak_rss_mb']:.0f} MB); rewrite {row['rewrite']['seconds']:.2f} s "
                f"(peak RSS {row['rewrite']['peak_rss_mb']:.0f} MB); rewrite / load "
                f"{row['rewrite_over_load_seconds']:.2f}x; RSS before either "
                f"{row['load']['rss_before_mb']:.0f} MB",
                flush=True,
            )
    record = {**provenance("bench.resume_rewrite", sys.argv[1:]), "rows": rows}
    if args.json:
        args.json.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
