"""What a Determined 0.38.1 master does to a config before the trial sees it, mirrored so a
local run and the dry run see the same: schema defaults and adaptive ASHA's brackets.
"""

from __future__ import annotations

import copy
import math
from typing import Any

from extractive_qa.settings import ConfigError


def asha_brackets(searcher: dict[str, Any]) -> list[list[int]]:
    """Adaptive ASHA's brackets as a 0.38.1 master builds them: each bracket's rungs in units of
    `time_metric`. Mirrors master/pkg/searcher/adaptive_asha.go:86-112 (makeBrackets, standard /
    conservative / aggressive modes) and asha_stopping.go:54-66 (makeRungs)."""
    max_time = int(searcher["max_time"])
    divisor = float(searcher.get("divisor") or 4)
    rungs_per_bracket = list(searcher.get("bracket_rungs") or [])
    if not rungs_per_bracket:
        max_trials = int(searcher.get("max_trials") or 1)
        max_rungs = min(
            int(searcher.get("max_rungs") or 5),
            int(math.log(max_time) / math.log(divisor)) + 1,
            int(math.log(max_trials) / math.log(divisor)) + 1,
        )
        mode = searcher.get("mode") or "standard"
        first = {"conservative": 1, "standard": (max_rungs - 1) // 2 + 1, "aggressive": max_rungs}
        if mode not in first:
            raise ConfigError(f"searcher.mode: {mode!r} must be conservative, standard or aggressive.")
        rungs_per_bracket = list(range(first[mode], max_rungs + 1))
    return [
        [max(int(max_time / divisor ** (n - i - 1)), 1) for i in range(n)]
        for n in sorted(rungs_per_bracket, reverse=True)
    ]


# What a 0.38.1 master fills in before the trial sees the config, for the fields run_plan reads
# (schema defaults in master/pkg/schemas/expconf/*.json: experiment.json, optimizations.json,
# resources.json; plus the clock-drawn experiment_seed). tests/test_cluster.py checks the plans
# built from this against the configs the master's own schemas produce.
MASTER_DEFAULTS: dict[str, Any] = {
    "min_validation_period": {"batches": 0},
    "min_checkpoint_period": {"batches": 0},
    "checkpoint_policy": "best",
    "scheduling_unit": 100,
    "perform_initial_validation": False,
    "records_per_epoch": 0,
    "max_restarts": 5,
    "resources": {"slots_per_trial": 1},
    "optimizations": {
        "aggregation_frequency": 1,
        "average_aggregated_gradients": True,
        "gradient_compression": False,
    },
    "reproducibility": {"experiment_seed": 0},
}


def with_master_defaults(conf: dict[str, Any]) -> dict[str, Any]:
    """The config as a master hands it to the trial (for the fields this trial reads)."""
    out = copy.deepcopy(conf)
    for key, default in MASTER_DEFAULTS.items():
        if out.get(key) is None:
            out[key] = copy.deepcopy(default)
        elif key in ("resources", "optimizations", "reproducibility") and isinstance(out[key], dict):
            for sub, value in default.items():
                out[key].setdefault(sub, value)
    return out


def slots_of(conf: dict[str, Any]) -> int:
    return int((conf.get("resources") or {}).get("slots_per_trial", 1))
