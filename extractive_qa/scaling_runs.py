"""scaling.py's series of runs: a planned run and what it reported, and the runners -- a
Determined master through the SDK, or local torchrun processes -- that produce those reports."""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from extractive_qa import det_internals
from extractive_qa.config import experiment
from extractive_qa.config.settings import Hyperparameters
from extractive_qa.errors import ScalingError
from extractive_qa.io import reading
from extractive_qa.io.files import ROOT, write_text_atomic

# --------------------------------------------------------------------------------------------
# A planned run, and what a run reported.
# --------------------------------------------------------------------------------------------


STUDY_LABEL = "scaling-study"


@dataclass
class Variant:
    name: str
    slots: int
    aggregation: int
    optimizer: str
    per_slot_batch: int
    config: dict[str, Any]
    learning_rate: float  # the peak the run will use: the config's lr_scaling rule applied


@dataclass
class RunInputs:
    """What one run reported: the same shape from the master (SDK) or a local metrics file."""

    name: str
    state: str
    slots: int
    global_batch_size: int
    aggregation: int
    optimizer: str
    training: list[tuple[int, float]]  # (steps_completed, end time in seconds)
    validation: list[tuple[int, float, dict[str, Any]]]
    error: str | None = None
    # (steps_completed, metrics) of each training report: the trial's own perf_* (perf_metrics.py)
    reported: list[tuple[int, dict[str, Any]]] = field(default_factory=list)


# --------------------------------------------------------------------------------------------
# Determined's SDK: kept thin (tested with recorded objects).
# --------------------------------------------------------------------------------------------


def connect(master: str) -> Any:
    from determined.experimental import client

    try:
        client.login(master=master)
        client.list_experiments(labels=[STUDY_LABEL])  # the first call that needs the master
    except Exception as err:  # the SDK raises many kinds; all mean "no usable master"
        raise ScalingError(
            f"--master {master}: no reachable Determined master ({str(err).splitlines()[0][:200]}); "
            "check the URL and log in with `det user login`."
        ) from None
    return client


def runs_from_sdk(sdk: Any, study: str) -> list[RunInputs]:
    det_internals.check_version()
    runs = []
    for exp in sdk.list_experiments(labels=[f"study={study}"]):
        conf = exp.config or {}
        hp, defaults = experiment.local_hparams(conf), Hyperparameters()
        common = dict(
            slots=experiment.slots_of(conf),
            global_batch_size=int(hp.get("global_batch_size", defaults.global_batch_size)),
            aggregation=experiment.aggregation_of(conf),
            optimizer=str(hp.get("optimizer", defaults.optimizer)),
        )
        trials = list(exp.list_trials())
        if not trials:
            state = getattr(exp.state, "name", str(exp.state))
            runs.append(RunInputs(exp.name, state, training=[], validation=[], error="no trial", **common))
        for trial in trials:
            reports = det_internals.metric_reports(trial, "training")  # end times to the microsecond
            training = [(steps, end) for steps, end, _ in reports]
            reported = [(steps, metrics) for steps, _, metrics in reports]
            validation = det_internals.metric_reports(trial, "validation")
            state = getattr(trial.state, "name", str(trial.state))
            runs.append(
                RunInputs(
                    exp.name, state, training=training, validation=validation, reported=reported, **common
                )
            )
    return runs


def launch(sdk: Any, series: Sequence[Variant], context_dir: Path = ROOT) -> list[int]:
    ids = []
    for v in series:
        exp = sdk.create_experiment(config=v.config, model_dir=str(context_dir))
        ids.append(exp.id)
        print(f"experiment {exp.id}: {v.name}", flush=True)
    return ids


# --------------------------------------------------------------------------------------------
# Local: the same series as torchrun processes on this machine.
# --------------------------------------------------------------------------------------------


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9=._-]+", "_", name).strip("_")


def check_local_slots(series: Sequence[Variant]) -> None:
    """Before the first run: each local process needs a GPU of its own, or on a CPU at least a
    core (64 processes on 2 cores spend minutes on start-up and contention, then measure nothing)."""
    import torch

    most = max(v.slots for v in series)
    devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    have, unit = (devices, "GPUs") if devices else (os.cpu_count() or 1, "CPU cores")
    if most > have:
        raise ScalingError(
            f"--slots {most}: more processes than this machine's {have} {unit}; a local series runs "
            f"each process on its own {unit[:-1]}. Give --slots up to {have}, or launch the series on "
            "a cluster (scaling.py launch)."
        )


# What `local` writes first into its --out: the directory is then its own to fill again
# (files.check_new_directory), and a report.md a user keeps elsewhere is never taken for one.
LOCAL_MARKER = ".scaling-local.json"


def run_local(series: Sequence[Variant], batches: int, out: Path) -> list[RunInputs]:
    import yaml

    check_local_slots(series)
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / LOCAL_MARKER, '{"written_by": "scaling.py local"}\n')
    runs = []
    for v in series:
        conf = copy.deepcopy(v.config)
        conf["scheduling_unit"] = max(1, batches // 5)  # several training reports per run
        stem = slug(v.name)
        conf_path, metrics = out / "configs" / f"{stem}.yaml", out / "runs" / f"{stem}.json"
        conf_path.parent.mkdir(parents=True, exist_ok=True)
        metrics.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(conf_path, yaml.safe_dump(conf, sort_keys=False))
        program = [str(ROOT / "train.py"), "--config", str(conf_path), "--batches", str(batches)]
        program += ["--metrics-out", str(metrics), "--checkpoint-dir", str(out / "checkpoints")]
        program += ["--restart"]  # every run of a series trains from the beginning, as on a cluster
        # Each process gets its share of the cores, as each GPU is its own device on a cluster.
        threads = str(max(1, (os.cpu_count() or 1) // v.slots))
        cmd, env = torchrun(v.slots, program, OMP_NUM_THREADS=threads)
        print(f"{v.name}: torchrun x{v.slots}, {batches} batches ...", flush=True)
        log = out / "runs" / f"{stem}.log"
        with log.open("w") as f:
            proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        common = dict(
            slots=v.slots,
            global_batch_size=v.per_slot_batch * v.slots,
            aggregation=v.aggregation,
            optimizer=v.optimizer,
        )
        if proc.returncode != 0 or not metrics.is_file():
            text = reading.read_bytes(log, reading.DATA).decode("utf-8", "replace")
            lines = [ln for ln in text.splitlines() if ln.strip()]
            last = next((ln for ln in reversed(lines) if "rror" in ln), lines[-1] if lines else "")
            runs.append(
                RunInputs(
                    v.name,
                    "ERROR",
                    training=[],
                    validation=[],
                    error=f"exit {proc.returncode}: {last.strip()[:300]} (log: {log})",
                    **common,
                )
            )
            continue
        runs.append(from_series(v.name, reading.read_json_object(metrics, reading.DATA), **common))
    return runs


def from_series(name: str, series: dict[str, Any], **common: Any) -> RunInputs:
    """A run from what train.py --metrics-out wrote (callbacks.MetricSeries: the master's shape)."""
    training, validation = series["training"], series["validation"]
    return RunInputs(
        name,
        series["state"],
        training=[(r["steps_completed"], r["end_time"]) for r in training],
        validation=[(r["steps_completed"], r["end_time"], r["metrics"]) for r in validation],
        reported=[(r["steps_completed"], r["metrics"]) for r in training],
        **common,
    )


def torchrun(nproc: int, program: Sequence[str], **env: str) -> tuple[list[str], dict[str, str]]:
    """`torchrun --standalone --nproc_per_node=N PROGRAM...` and the environment to run it in.

    --standalone: a local rendezvous on a port the OS picks (no fixed ports). The environment
    drops USE_TORCH_DISTRIBUTED, Determined's switch for torch DDP, which its launcher
    (determined/launch/torch_distributed.py:81) and launch.join_process_group set in their own
    process: inherited from a caller that ran a trial in-process (a test, a benchmark), it
    would make every one of the new ranks expect a process group the launch has not made yet.
    `env` adds or overrides variables.
    """
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    clean = {k: v for k, v in os.environ.items() if k != "USE_TORCH_DISTRIBUTED"}
    return [*command, *program], {**clean, **env}


def from_cluster(master: str, study: str) -> list[RunInputs]:
    return runs_from_sdk(connect(master), study)
