"""What scaling.py (planning, report, CLI) and scaling_runs.py (the runners) share: the error a
user can fix, a planned run, and what a run reported. The bottom layer: imports neither."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]  # the repository root: entry scripts and YAMLs
STUDY_LABEL = "scaling-study"


class ScalingError(Exception):
    """A problem the user can fix; the message says which and how."""


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
