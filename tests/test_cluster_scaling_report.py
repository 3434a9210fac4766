"""scaling.py report against a master: a study run on the emulated cluster beside a failed and a
still-running experiment, read back through Determined's SDK, equals the report computed from the
trials' own reports."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from extractive_qa.config import experiment
from tests.support import det_master
from tests.support.cluster_trials import needs_containers, shaped_like, trial_run
from tests.support.project import ROOT


def as_metrics_file(conf: dict, state: str, reports: list[dict[str, Any]]) -> dict[str, Any]:
    """The reports a master recorded, in train.py --metrics-out's shape (end times as the master
    keeps them: microseconds)."""
    rows = {"training": [], "validation": []}
    for r in reports:
        row = {
            "steps_completed": r["steps_completed"],
            "end_time": round(r["time"], 6),
            "metrics": r["metrics"],
        }
        rows[r["group"]].append(row)
    return {"name": conf["name"], "state": state, **rows}


@needs_containers
def _study_on_the_cluster(tiny_bert: Path, tmp_path: Path, registry: det_master.Master) -> tuple:
    """Runs a study's finished trials on the emulated cluster and registers them with `registry`,
    beside a failed, a still-running and another study's experiment; (finished variants, the
    report inputs their own metrics give, the failed config, the running config)."""
    import scaling
    from extractive_qa import scaling_runs

    base, hp = shaped_like("distributed.yaml", tiny_bert, tmp_path, batches=12, slots=1)
    base["hyperparameters"].update(hp)
    base["min_validation_period"] = {"batches": 12}
    series = scaling.variants(base, slots=[1, 2], aggregation=[1, 2], optimizers=["adamw"], study="emu")
    ran = [v for v in series if v.aggregation == 1]  # aggregation in the report: tests/test_scaling.py
    expected = []
    for i, v in enumerate(ran):
        hparams = experiment.local_hparams(v.config)
        cluster, record = trial_run(tmp_path / f"run{i}", v.config, hparams, slots=v.slots)
        assert record.exit_codes[-1] == 0, record.failures()
        registry.add_experiment(v.config, cluster.master.metrics)
        common = dict(slots=v.slots, global_batch_size=v.per_slot_batch * v.slots)
        common.update(aggregation=v.aggregation, optimizer=v.optimizer)
        local = as_metrics_file(v.config, "COMPLETED", cluster.master.metrics)
        expected.append(scaling_runs.from_series(v.config["name"], local, **common))
    # The 1-slot aggregation-2 run: failed before its first report; one more still running.
    failed = next(v for v in series if v.slots == 1 and v.aggregation == 2).config
    registry.add_experiment(failed, [], state="ERROR", trial_state="ERROR")
    running = copy.deepcopy(next(v for v in series if v.slots == 2 and v.aggregation == 2).config)
    partial = [r for r in registry.experiments[1].reports if r["group"] == "training"][:2]
    registry.add_experiment(running, partial, state="ACTIVE", trial_state="RUNNING")
    registry.add_experiment({**ran[0].config, "labels": ["another-study"]}, [])  # not this study's
    return ran, expected, failed, running


def test_scaling_report_from_the_master_equals_the_report_from_the_same_reports(
    tiny_bert: Path, tmp_path: Path
) -> None:
    """A study on the emulated cluster (1 slot; 2 slots), a failed (1 slot x aggregation 2) and
    a still-running (2 slots x aggregation 2) experiment beside it; `scaling.py report --master`
    reads them through Determined's SDK from the stand-in and writes the table, JSON and PNG,
    whose figures equal the report computed from the very reports the trials made (the local
    report's path)."""
    pytest.importorskip("matplotlib", reason="scaling.py report draws report.png (a local tool's need)")
    import scaling

    registry, out = det_master.Master(), tmp_path / "report"
    try:
        ran, expected, failed, running = _study_on_the_cluster(tiny_bert, tmp_path, registry)
        env = {k: v for k, v in os.environ.items() if not k.startswith("DET_")}
        env["HOME"] = str(tmp_path / "home")  # no cached login: the SDK logs in as `determined`
        cmd = [sys.executable, "scaling.py", "report", "--master", registry.url, "--study", "emu"]
        done = subprocess.run(
            [*cmd, "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr
        assert registry.errors == [], registry.errors
    finally:
        registry.close()
    report = json.loads((out / "report.json").read_text())
    assert (out / "report.png").stat().st_size > 0
    table = (out / "report.md").read_text()
    by_name = {r["name"]: r for r in report["runs"]}
    assert set(by_name) == {v.config["name"] for v in ran} | {failed["name"], running["name"]}
    assert by_name[failed["name"]]["state"] == "ERROR" and by_name[running["name"]]["state"] != "COMPLETED"
    assert f"| {running['name']} | {by_name[running['name']]['state']} |" in table
    # The finished runs: speedup, efficiency and F1 from what the trials reported, the trial's own
    # throughput (perf_*) included -- the same figures as the report from the reports themselves.
    for want in scaling.build_report(expected, "emu")["runs"]:
        got = by_name[want["name"]]
        without_notes = {k: v for k, v in want.items() if k != "notes"}
        assert {k: v for k, v in got.items() if k != "notes"} == without_notes
        assert got["f1"] is not None and got["reported_samples_per_s"] > 0
    two = by_name[ran[1].config["name"]]
    assert (
        two["slots"] == 2
        and two["speedup"] is not None
        and two["efficiency"] == pytest.approx(two["speedup"] / 2, abs=1e-3)
    )
