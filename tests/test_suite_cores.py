"""The suite's own mechanics (tests/conftest.py): its workers share the machine's cores -- a worker,
and each process it starts, computes on its share, so two workers' thread pools do not spin
against each other -- and every Python process the tests start logs how long it spent starting."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

STARTUP = Path(__file__).parent / "support" / "startup"


def share() -> int:
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return max(1, len(os.sched_getaffinity(0)) // workers)


def test_a_worker_and_the_processes_it_starts_compute_on_its_share_of_the_cores() -> None:
    import torch

    started = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert torch.get_num_threads() <= share()
    assert int(started.stdout) <= share()


def test_a_process_the_tests_start_logs_its_life_and_start_up(tmp_path: Path) -> None:
    """Each Python process the suite starts appends its lifetime and start-up (the interpreter and
    the first import of torch) to the run's log, and the run prints their share."""
    from tests.conftest import startup_share

    log = tmp_path / "startup.jsonl"
    env = {**os.environ, "SUITE_STARTUP_LOG": str(log), "PYTHONPATH": str(STARTUP)}
    program = "import time; import torch; time.sleep(0.5)"
    for _ in range(2):
        subprocess.run([sys.executable, "-c", program], env=env, check=True)
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(records) == 2
    for record in records:
        assert 0.2 < record["startup_s"] < record["lived_s"] - 0.5, record  # torch's import is start-up
    assert startup_share(log).startswith("start-up: 2 Python processes the tests started lived ")
