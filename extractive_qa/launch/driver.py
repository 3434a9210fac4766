"""Which driver a run gets: the master's trial (cluster_run) or a run without a master
(local_run), both launch.trial_run.RunDriver."""

from __future__ import annotations

import contextlib

from extractive_qa.config import run_plan
from extractive_qa.config.experiment import RunOptions, Source
from extractive_qa.launch.cluster_run import ClusterRun
from extractive_qa.launch.local_run import LocalRun
from extractive_qa.launch.trial_run import RunDriver


def driver_for(
    options: RunOptions, source: Source, plan: run_plan.RunPlan, cleanup: contextlib.ExitStack
) -> RunDriver:
    """The run's driver; `cleanup` takes what the run leaves behind (a resume's private copy)."""
    if source.on_cluster:
        return ClusterRun(source, plan, cleanup)
    return LocalRun(options, source, plan, cleanup)
