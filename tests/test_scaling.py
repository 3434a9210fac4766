"""scaling.py: the series of configs, the report from metric series, the SDK glue, local end to end."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

import scaling
from bench.docs import png_text
from extractive_qa import scaling_runs
from extractive_qa.config import experiment
from extractive_qa.io.files import drawn_from
from extractive_qa.trial.optimizer_recipes import OPTIMIZER_RECIPES
from tests.support.project import ROOT, tiny_config, write_yaml


def _load(name: str) -> dict[str, Any]:
    return experiment.load_yaml(ROOT / name)


def test_variants_change_only_slots_aggregation_optimizer_batch_name_labels() -> None:
    base = _load("distributed.yaml")
    series = scaling.variants(base, [1, 8, 16], [1, 2], ["adamw", "radam"], "s7")
    assert len(series) == 12
    per_slot = base["hyperparameters"]["global_batch_size"] // base["resources"]["slots_per_trial"]
    for v in series:
        c = v.config
        assert c["resources"]["slots_per_trial"] == v.slots
        assert c["optimizations"]["aggregation_frequency"] == v.aggregation
        assert c["hyperparameters"]["optimizer"] == v.optimizer
        assert c["hyperparameters"]["global_batch_size"] == per_slot * v.slots
        assert {"scaling-study", "study=s7", f"slots={v.slots}", f"agg={v.aggregation}"} <= set(c["labels"])
        changed = {k for k in set(base) | set(c) if base.get(k) != c.get(k)}
        assert changed <= {"name", "labels", "resources", "optimizations", "hyperparameters"}
        for key in ("resources", "optimizations", "hyperparameters"):
            other = {
                k
                for k in set(base.get(key) or {}) | set(c[key])
                if (base.get(key) or {}).get(k) != c[key].get(k)
            }
            # ... and what the optimizer's recipe sets (RAdam: beta2, no linear warm-up)
            recipe = {k for k in OPTIMIZER_RECIPES[v.optimizer] if k != "learning_rate_factor"}
            assert other <= {
                "slots_per_trial",
                "aggregation_frequency",
                "optimizer",
                "global_batch_size",
                *recipe,
            }
    assert len({v.name for v in series}) == 12
    # The recipe's rule gives each run its learning rate: 5e-5 x sqrt(samples per step / 32).
    hp = base["hyperparameters"]
    assert (hp["lr_scaling"], hp["reference_batch_size"], hp["learning_rate"]) == ("sqrt", 32, 5e-5)
    for v in series:
        samples = per_slot * v.slots * v.aggregation
        assert v.learning_rate == pytest.approx(5e-5 * (samples / 32) ** 0.5)
    assert len({v.learning_rate for v in series}) == 5  # 12, 24, 96, 192 (8x2 and 16x1), 384


def test_variant_configs_pass_determineds_schema(tmp_path: Path) -> None:
    checker = ROOT.parent / "shared" / "tools" / "expconf_check.py"
    if not checker.exists():
        pytest.skip("../shared/tools/expconf_check.py is not beside this checkout")
    series = scaling.variants(_load("multi_machine.yaml"), [1, 16], [1, 4], ["adamw", "radam"], "s1")
    paths = []
    for i, v in enumerate(series):
        paths.append(tmp_path / f"v{i}.yaml")
        paths[-1].write_text(yaml.safe_dump(v.config))
    out = subprocess.run([sys.executable, str(checker), *map(str, paths)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["launch", "--config", "search.yaml", "--dry-run"], "searcher.name is 'adaptive_asha'"),
        (["launch", "--config", "const.yaml", "--slots", "0,2", "--dry-run"], "--slots '0,2'"),
        (["launch", "--config", "const.yaml", "--optimizer", "sgd", "--dry-run"], "--optimizer 'sgd'"),
        (["launch", "--config", "nope.yaml", "--dry-run"], "nope.yaml: no such file"),
        (["report", "--study", "x"], "--master URL (or DET_MASTER) is required"),
        (["report", "--study", "x", "--master", "http://127.0.0.1:9"], "no reachable Determined master"),
    ],
)
def test_clear_errors(args: list[str], message: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DET_MASTER"}
    out = subprocess.run(
        [sys.executable, str(ROOT / "scaling.py"), *args], capture_output=True, text=True, cwd=ROOT, env=env
    )
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def _run(name: str, slots: int, batch: int, times: list[float], state: str = "COMPLETED", **kw: Any) -> Any:
    steps = [10 * (i + 1) for i in range(len(times))]
    return scaling_runs.RunInputs(
        name,
        state,
        slots=slots,
        global_batch_size=batch,
        aggregation=kw.pop("aggregation", 1),
        optimizer="adamw",
        training=list(zip(steps, times, strict=True)),
        validation=kw.pop(
            "validation", [(steps[-1], times[-1] + 5, {"exact_match": 80.0, "f1": 88.0})] if times else []
        ),
        **kw,
    )


def test_report_from_recorded_series_speedup_efficiency_and_failures(tmp_path: Path) -> None:
    runs = [
        # 1 slot, batch 8: 10 steps (80 samples) every 10 s = 8 samples/s.
        _run("one", 1, 8, [100.0, 110.0, 120.0, 130.0]),
        # 2 slots, batch 16: 160 samples per 12.5 s = 12.8/s, except the interval holding a
        # validation (at 120), which is left out.
        _run(
            "two",
            2,
            16,
            [100.0, 112.5, 140.0, 152.5],
            validation=[(20, 120.0, {"f1": 80.0}), (40, 160.0, {"exact_match": 81.0, "f1": 88.5})],
        ),
        _run("broken", 4, 32, [], state="ERROR", error="exit 1: CUDA out of memory"),
        _run("lonely", 2, 16, [0.0, 5.0], aggregation=4),
    ]
    report = scaling.build_report(runs, "rec")
    by = {r["name"]: r for r in report["runs"]}
    assert (
        by["one"]["samples_per_s"] == 8.0 and by["one"]["speedup"] == 1.0 and by["one"]["efficiency"] == 1.0
    )
    assert by["two"]["samples_per_s"] == 12.8
    assert by["two"]["speedup"] == 1.6 and by["two"]["efficiency"] == 0.8
    assert by["two"]["train_seconds"] == pytest.approx(40 * 16 / 12.8)
    assert (by["two"]["exact_match"], by["two"]["f1"]) == (81.0, 88.5)  # the last validation
    assert by["broken"]["state"] == "ERROR" and by["broken"]["samples_per_s"] is None
    assert "CUDA out of memory" in by["broken"]["notes"][0]
    assert by["lonely"]["speedup"] is None and "no finished 1-slot run" in by["lonely"]["notes"][0]
    paths = scaling.write_report(report, tmp_path)
    md = paths[1].read_text()
    assert "| broken | ERROR | 4 |" in md and "CUDA out of memory" in md
    assert (
        "| two | COMPLETED | 2 | 8 | 1 | adamw | 50.0 s | 12.80 | 1.60 | 0.80 | - | - | - | 81.0 | 88.5 |"
        in md
    )
    assert paths[2].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(paths[0].read_text())["study"] == "rec"
    # the plot names the report.json it shows, so a check can tell when it no longer does
    assert (
        png_text(paths[2].read_bytes())["Source"]
        == drawn_from("report.json", paths[0].read_bytes())["Source"]
    )


def test_a_study_that_draws_its_own_plot_draws_only_that(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench.multi_machine draws efficiency against the link; the speedup plot is not drawn first."""
    from extractive_qa import scaling_report

    drawn: list[Any] = []
    monkeypatch.setattr(scaling_report, "plot", lambda *args: drawn.append("speedup against slots"))
    report = scaling.build_report([_run("one", 1, 8, [100.0, 110.0, 120.0])], "own")
    paths = scaling.write_report(report, tmp_path, draw=lambda r, path, source: drawn.append((path, source)))
    assert drawn == [(paths[2], drawn_from("report.json", paths[0].read_bytes()))]


def test_a_plot_that_fails_while_drawing_leaves_the_one_before(tmp_path: Path) -> None:
    """Every plot goes through scaling_report.png_axes: written whole once drawn, naming its
    source; a drawing that raises leaves the file that was there."""
    from extractive_qa import scaling_report

    png = tmp_path / "report.png"
    with scaling_report.png_axes(png, {"Source": "a.json sha256:1"}, (3, 2)) as ax:
        ax.plot([1, 2], [1, 2])
    before = png.read_bytes()
    assert png_text(before)["Source"] == "a.json sha256:1"
    with pytest.raises(KeyError), scaling_report.png_axes(png, {"Source": "b.json sha256:2"}, (3, 2)) as ax:
        ax.plot([1, 2], [2, 1])
        raise KeyError("a field the report lacks")
    assert png.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["report.png"]


def test_study_without_finished_runs_is_an_error() -> None:
    with pytest.raises(scaling.ScalingError, match="study s9: no finished runs"):
        scaling.build_report([_run("x", 1, 8, [], state="ERROR")], "s9")


class _RecordedSDK:
    """Determined SDK stand-in returning objects shaped as the 0.38.1 client returns them."""

    def __init__(self, experiments: list[Any]) -> None:
        self.experiments, self.calls, self.created = experiments, [], []

    def list_experiments(self, labels: list[str] | None = None) -> list[Any]:
        self.calls.append(labels)
        return [e for e in self.experiments if set(labels or []) & e.labels]

    def create_experiment(self, config: dict, model_dir: str) -> Any:
        self.created.append((config, model_dir))
        return SimpleNamespace(id=100 + len(self.created))


def _experiment(slots: int, per_report_s: float, trial_state: Any) -> Any:
    from determined.common.experimental.metrics import TrialMetrics
    from determined.experimental.client import ExperimentState

    conf = _load("distributed.yaml")
    conf["resources"]["slots_per_trial"] = slots
    conf["hyperparameters"] = {k: {"type": "const", "val": v} for k, v in conf["hyperparameters"].items()}
    conf["hyperparameters"]["global_batch_size"]["val"] = 12 * slots
    t0 = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.timezone.utc)

    def metrics(group: str) -> list[TrialMetrics]:
        if group == "training":
            return [
                TrialMetrics(7, 1, 100 * i, t0 + dt.timedelta(seconds=per_report_s * i), {"loss": 1.0}, group)
                for i in range(1, 4)
            ]
        end = t0 + dt.timedelta(seconds=per_report_s * 3 + 30)
        return [TrialMetrics(7, 1, 300, end, {"exact_match": 80.5, "f1": 88.1}, group)]

    trial = SimpleNamespace(state=trial_state, iter_metrics=metrics)
    return SimpleNamespace(
        name=f"s{slots}",
        config=conf,
        state=ExperimentState.COMPLETED,
        labels={"study=abc", f"slots={slots}"},
        list_trials=lambda: [trial],
    )


def test_sdk_glue_with_recorded_objects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from determined.experimental.client import TrialState

    from extractive_qa import det_internals

    # The reports come through det_internals.metric_reports (the SDK's own binding with full end
    # times; against a master's answers in tests/test_cluster.py); here from the recorded trial.
    def recorded(trial: Any, group: str) -> list[tuple[int, float, dict]]:
        return [(m.steps_completed, m.end_time.timestamp(), m.metrics) for m in trial.iter_metrics(group)]

    monkeypatch.setattr(det_internals, "metric_reports", recorded)

    sdk = _RecordedSDK(
        [
            _experiment(1, 100.0, TrialState.COMPLETED),
            _experiment(8, 14.0, TrialState.COMPLETED),
            _experiment(16, 10.0, TrialState.ERROR),
        ]
    )
    runs = scaling_runs.runs_from_sdk(sdk, "abc")
    assert sdk.calls == [["study=abc"]]
    assert [(r.slots, r.global_batch_size, r.state) for r in runs] == [
        (1, 12, "COMPLETED"),
        (8, 96, "COMPLETED"),
        (16, 192, "ERROR"),
    ]
    report = scaling.build_report(runs, "abc")
    by = {r["slots"]: r for r in report["runs"]}
    assert by[1]["samples_per_s"] == 12.0  # 100 steps x 12 / 100 s
    assert by[8]["speedup"] == pytest.approx(9600 / 14 / 12, abs=1e-3)
    assert by[16]["state"] == "ERROR" and by[16]["speedup"] is None and by[8]["f1"] == 88.1

    series = scaling.variants(_load("distributed.yaml"), [1, 2], [1], ["adamw"], "abc")
    assert scaling_runs.launch(sdk, series, tmp_path) == [101, 102]
    assert [c["resources"]["slots_per_trial"] for c, _ in sdk.created] == [1, 2]
    assert {d for _, d in sdk.created} == {str(tmp_path)}


def test_local_study_end_to_end(tiny_bert: Path, tmp_path: Path) -> None:
    path = write_yaml(tiny_config(tiny_bert, tmp_path), tmp_path / "exp.yaml")
    out_dir = tmp_path / "study"
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scaling.py"),
            "local",
            "--config",
            str(path),
            "--slots",
            "1,2",
            "--batches",
            "10",
            "--out",
            str(out_dir),
            "--study",
            "t",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((out_dir / "report.json").read_text())
    one, two = sorted(report["runs"], key=lambda r: r["slots"])
    assert (one["state"], two["state"]) == ("COMPLETED", "COMPLETED")
    assert (one["per_slot_batch"], two["per_slot_batch"]) == (8, 8)
    assert one["speedup"] == 1.0 and two["speedup"] > 0
    assert two["efficiency"] == pytest.approx(two["speedup"] / 2, abs=1e-3)
    assert one["steps"] == two["steps"] == 10 and one["f1"] is not None
    # Each rate comes from the run's own metrics file (measured end times, not assumed).
    metrics = json.loads(next((out_dir / "runs").glob("*slots=2*.json")).read_text())
    assert metrics["slots"] == 2 and len(metrics["training"]) >= 3
    assert (out_dir / "report.md").read_text().count("| COMPLETED |") == 2
    assert (out_dir / "report.png").stat().st_size > 1000


def test_master_timestamps_keep_their_fraction() -> None:
    """The SDK's own parser drops sub-seconds (det_internals.metric_reports says why); ours not."""
    from extractive_qa.det_internals import rfc3339_seconds

    base = dt.datetime(2026, 11, 23, 14, 35, 1, tzinfo=dt.timezone.utc).timestamp()
    assert rfc3339_seconds("2026-11-23T14:35:01Z") == base
    assert rfc3339_seconds("2026-11-23T14:35:01.5Z") == base + 0.5
    assert rfc3339_seconds("2026-11-23T14:35:01.123456Z") == pytest.approx(base + 0.123456, abs=1e-6)
    assert rfc3339_seconds("2026-11-23T14:35:01.123456789Z") == pytest.approx(base + 0.123456789, abs=1e-6)
    assert rfc3339_seconds("2026-11-23T16:35:01.250+02:00") == base + 0.25
    with pytest.raises(ValueError, match="not an RFC 3339"):
        rfc3339_seconds("yesterday")


def test_the_trials_own_rates_pool_over_windows_by_their_batches() -> None:
    """perf_samples_per_s of windows of 10 and 20 batches at 10 and 40 samples/s: all their
    samples over all their seconds, 30 / (10/10 + 20/40) = 20/s (the mean of the rates would say
    25); the shares weighted by batches; a restart's repeated step and reports without perf_*
    are left out."""
    run = scaling_runs.RunInputs(
        "r", "COMPLETED", slots=1, global_batch_size=4, aggregation=1, optimizer="adamw",
        training=[(10, 1.0), (30, 3.0)], validation=[],
        reported=[
            (10, {"perf_samples_per_s": 10.0, "perf_padding_frac": 0.2, "perf_data_wait_frac": 0.1}),
            (30, {"perf_samples_per_s": 40.0, "perf_padding_frac": 0.4, "perf_data_wait_frac": 0.4}),
            (30, {"perf_samples_per_s": 1.0}),  # the same step again (a restart): no window
            (40, {"loss": 1.0}),  # no perf_*: an older trial
        ],
    )  # fmt: skip
    rec = scaling.record(run)
    assert rec.reported_samples_per_s == pytest.approx(30 / (10 / 10 + 20 / 40))  # 20.0, not 25
    assert rec.padding_frac == pytest.approx((10 * 0.2 + 20 * 0.4) / 30, abs=1e-4)
    assert rec.data_wait_frac == pytest.approx((10 * 0.1 + 20 * 0.4) / 30, abs=1e-4)
    assert rec.peak_mem_gib is None
