"""The project's CLIs (train.py, predict.py, squad_metric.py, data.py, scaling.py) print their
result as one JSON object on the last stdout line; this reads it, for the tests and benchmarks."""

from __future__ import annotations

import json
from typing import Any


def last_json(stdout: str) -> dict[str, Any]:
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        raise ValueError("no output: expected a JSON object on the last stdout line")
    return json.loads(lines[-1])
