"""The suite's workers share the machine's cores (tests/conftest.py): a worker, and each process it
starts, computes on its share, so two workers' thread pools do not spin against each other."""

from __future__ import annotations

import os
import subprocess
import sys


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
