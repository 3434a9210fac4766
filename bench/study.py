"""Paired-seed accuracy studies: run train.py per (cell, seed), keep one JSON row per finished run,
and compare cells on the seeds they share.

bench/batching.py and bench/lr_scaling.py are built on this. A cell is a dict of the settings it
varies (e.g. {"batching": "buckets"}); its runs are `train.py --config C --set ...` with
`reproducibility.experiment_seed` = each seed, exactly as a user would run them. Rows are saved
as each run finishes (atomically), so a study that is stopped resumes where it was: re-running
skips every (cell, seed) already in the file. Runs may go side by side (`jobs`): on a GPU
several small trials share the card; the accuracy of each run does not depend on that.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from extractive_qa.io.files import ROOT
from tests.support.cli_result import last_json

# What a study's runs train in unless its cells vary it: fp32 with torch's own dropout masks, not
# the YAML's `precision: auto` and fast masks, which differ by CPU. Even so a run is not the same
# on every CPU: of the learning-rate study's rows re-run on another x86 CPU, most reproduced their
# EM and F1 exactly, a few moved in the last digits, and a run on the edge of divergence (LAMB at
# its highest lr) moved by points of F1. So a study's rows come from one machine, which its file
# names, and a paired difference pairs seeds run there.
FP32 = "hyperparameters.precision=fp32"
TORCH_MASKS = "hyperparameters.dropout_masks=torch"

# Two-sided 95 % Student t quantiles by degrees of freedom (1..30); beyond that ~1.96.
T975 = [
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
]  # fmt: skip


@dataclass(frozen=True)
class Run:
    cell: dict[str, Any]  # what identifies the cell in the JSON rows
    seed: int
    overrides: tuple[str, ...]  # train.py --set values

    @property
    def key(self) -> str:
        return json.dumps({**self.cell, "seed": self.seed}, sort_keys=True)


def device_name() -> str:
    """Where train.py's runs train: the GPU's name, or the CPU."""
    import platform

    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return f"{platform.machine()} CPU, {os.cpu_count()} cores"


def load(path: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """The study file (rows so far), refusing one made for another study setup."""
    if not path.exists():
        return {**meta, "rows": []}
    result = json.loads(path.read_text())
    for field, value in meta.items():
        if field in result and result[field] != value:
            raise SystemExit(
                f"{path}: its rows were measured with {field}={result[field]!r}, not {value!r}; "
                "pass another --json"
            )
    return result


def save(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.tmp")
    partial.write_text(json.dumps(result, indent=1))
    partial.replace(path)


def train(run: Run, config: str, workdir: Path, threads: int | None) -> dict[str, Any]:
    """One train.py run; its result line with the cell, the seed and the wall time."""
    out = workdir / run.key.replace('"', "").replace(" ", "").translate(str.maketrans("{}:,", "__-_"))
    command = [sys.executable, str(ROOT / "train.py"), "--config", config, "--checkpoint-dir", str(out)]
    for value in (*run.overrides, f"reproducibility.experiment_seed={run.seed}"):
        command += ["--set", value]
    env = dict(os.environ)
    if threads:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"run {run.key} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    result = last_json(done.stdout)
    return {
        **run.cell,
        "seed": run.seed,
        "exact_match": result["exact_match"],
        "f1": result["f1"],
        "last_train_loss": result.get("last_train_loss"),
        "steps_completed": result.get("steps_completed"),
        "train_seconds": result.get("train_seconds"),
        "samples_per_s": result.get("samples_per_s"),
        "wall_seconds": round(time.perf_counter() - started, 1),
    }


def run_all(
    runs: Sequence[Run],
    path: Path,
    result: dict[str, Any],
    config: str,
    jobs: int = 1,
    row_extra: Callable[[Run], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Run what is not in `result` yet, `jobs` at a time, saving after each finished run."""
    # Rows hold extra fields (row_extra, measurements); a run is done if a row has its cell and seed.
    todo = [run for run in runs if run.seed not in by_seed(result["rows"], run.cell)]
    print(f"{len(runs) - len(todo)} of {len(runs)} runs already in {path}; {len(todo)} to go", flush=True)

    def work(run: Run, workdir: Path, threads: int | None) -> dict[str, Any]:
        return {**train(run, config, workdir, threads), **(row_extra(run) if row_extra else {})}

    run_parallel(todo, work, path, result, jobs)
    return result


def run_parallel(
    items: Sequence[Any],
    work: Callable[[Any, Path, int | None], dict[str, Any]],
    path: Path,
    result: dict[str, Any],
    jobs: int,
) -> None:
    """work(item, scratch directory, threads per run) -> one row, for every item, `jobs` at a time;
    each row is saved as it finishes. Failed runs are reported and end the study after the rest."""
    import torch

    from bench.common import provenance

    lock = threading.Lock()
    threads = max(1, (os.cpu_count() or 1) // jobs) if jobs > 1 else None
    # The file names where and at which commit its rows ran, and each row its own machine (the
    # GPU where the runs train on one), so that a study resumed elsewhere says which rows ran where.
    here = provenance("bench", [], torch.device("cuda") if torch.cuda.is_available() else None)
    machines = {str(r["machine"]) for r in result["rows"] if "machine" in r} | {here["machine"]}
    if result.get("machine") and any("machine" not in r for r in result["rows"]):
        machines.add(str(result["machine"]))  # rows of before: the file's own machine
    result.update({k: here[k] for k in ("commit", "date", "versions")}, machine="; ".join(sorted(machines)))
    failures = []
    with tempfile.TemporaryDirectory(prefix="study-") as tmp, ThreadPoolExecutor(jobs) as pool:
        futures = [pool.submit(work, item, Path(tmp), threads) for item in items]
        for future in as_completed(futures):
            try:
                row = future.result()
            except RuntimeError as err:
                failures.append(str(err))
                print(str(err)[:2000], file=sys.stderr, flush=True)
                continue
            with lock:
                result["rows"].append({**row, "machine": here["machine"]})
                save(path, result)
            print(json.dumps(row), flush=True)
    if failures:
        raise SystemExit(f"{len(failures)} run(s) failed; the finished ones are saved in {path}")


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return mean, std


def paired(values: dict[int, float], baseline: dict[int, float]) -> dict[str, Any] | None:
    """Mean difference (values - baseline) over shared seeds, with its 95 % t interval."""
    seeds = sorted(set(values) & set(baseline))
    if len(seeds) < 2:
        return None
    diffs = [values[s] - baseline[s] for s in seeds]
    mean, std = mean_std(diffs)
    half = T975[min(len(seeds) - 2, len(T975) - 1)] * std / math.sqrt(len(seeds))
    return {"n": len(seeds), "mean": mean, "lo": mean - half, "hi": mean + half}


# A setting's default changes only if the paired F1 difference's 95 % interval lies within
# +-BOUND of zero or reaches above it (precision: auto, dropout_masks: fast).
BOUND = 1.5
RULE = f"the interval within +-{BOUND} of zero, or above it"


def passes_rule(diff: dict[str, Any]) -> bool:
    return diff["lo"] >= -BOUND


def by_seed(rows: Sequence[dict[str, Any]], cell: dict[str, Any], metric: str = "f1") -> dict[int, float]:
    return {r["seed"]: r[metric] for r in rows if all(r.get(k) == v for k, v in cell.items())}


def summary(
    rows: Sequence[dict[str, Any]], cell: dict[str, Any], baseline: dict[str, Any] | None
) -> dict[str, Any] | None:
    """n, F1 and EM mean / std, and the paired F1 difference to `baseline` (when given)."""
    f1, em = by_seed(rows, cell, "f1"), by_seed(rows, cell, "exact_match")
    if not f1:
        return None
    out: dict[str, Any] = {"n": len(f1)}
    out["f1_mean"], out["f1_std"] = mean_std(list(f1.values()))
    out["em_mean"], out["em_std"] = mean_std(list(em.values()))
    out["diff"] = paired(f1, by_seed(rows, baseline)) if baseline is not None else None
    return out


def fmt_diff(diff: dict[str, Any] | None) -> str:
    if diff is None:
        return "-"
    return f"{diff['mean']:+.2f} [{diff['lo']:+.2f}, {diff['hi']:+.2f}]"


def fmt_summary(s: dict[str, Any] | None) -> str:
    if s is None:
        return "- | - | -"
    return f"{s['n']} | {s['f1_mean']:.2f} ± {s['f1_std']:.2f} | {s['em_mean']:.2f} ± {s['em_std']:.2f}"
