"""The trial as a Determined 0.38.1 cluster runs it (tests/det_cluster.py), and the config as a
master hands it over. Only model, data, lengths and slots differ from the repo's YAMLs."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import DEV_V1, ROOT, TRAIN_V1, one_process_scores, run_cli

import config

det_cluster = pytest.importorskip("det_cluster")
WHY_NOT = det_cluster.supported()
needs_containers = pytest.mark.skipif(WHY_NOT is not None, reason=f"emulated cluster: {WHY_NOT}")
YAMLS = sorted(p.name for p in ROOT.glob("*.yaml"))
EXPCONF_DEFAULTS = det_cluster.EXPCONF_DEFAULTS


def shaped_like(
    yaml_name: str, model: Path, tmp: Path, batches: int, slots: int, **extra: Any
) -> tuple[dict, dict]:
    """A repo YAML with only model, data, lengths and slots overridden; returns (config, hparams
    as the master samples them: the YAML's values, a search space's first value)."""
    conf = config.load_yaml(ROOT / yaml_name)
    conf["data"].update(
        pretrained_model=str(model),
        train_file=str(TRAIN_V1),
        validation_file=str(DEV_V1),
        cache_dir=str(tmp / "features"),
        max_seq_length=128,
        doc_stride=32,
        max_query_length=32,
    )
    conf["resources"]["slots_per_trial"] = slots
    hp = config.local_hparams(conf)
    hp.update(global_batch_size=4 * slots, precision="fp32", learning_rate=1e-3)
    searcher = conf["searcher"]
    if searcher.get("max_time") is not None:
        searcher["max_time"] = batches
        # search.yaml's 16 trials, divisor 4: rungs at max_time/16, /4 and max_time.
        conf["min_validation_period"] = {"batches": batches // 16}
    else:
        hp["train_length"] = {"batches": batches}
        conf["min_validation_period"] = {"batches": batches}
        conf["min_checkpoint_period"] = {"batches": max(1, batches // 4)}
    conf["scheduling_unit"] = 2
    conf["reproducibility"] = {"experiment_seed": 7}
    conf.update(extra)
    return conf, hp


def final(master: Any) -> dict[str, Any]:
    """What a run ends with, as the master recorded it."""
    last_val = master.validations()[-1]
    training = [r for r in master.metrics if r["group"] == "training"]
    return {
        "steps": master.checkpoints[-1].steps_completed,
        "loss": training[-1]["metrics"]["loss"],
        "exact_match": last_val["metrics"]["exact_match"],
        "f1": last_val["metrics"]["f1"],
    }


def assert_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a["steps"] == b["steps"]
    for key in ("loss", "exact_match", "f1"):
        assert a[key] == pytest.approx(b[key], abs=1e-6), key


def assert_equals_one_process_evaluation(cluster: Any, tmp: Path) -> None:
    """The trial's last validation scores what predict.py + squad_metric.py, one process,
    score on the same checkpoint."""
    ckpt = cluster.storage / cluster.master.checkpoints[-1].uuid
    single = one_process_scores(ckpt, DEV_V1, tmp)
    val = cluster.master.validations()[-1]["metrics"]
    assert single["exact_match"] == val["exact_match"] and single["f1"] == val["f1"]


def trial_run(tmp: Path, conf: dict, hp: dict, slots: int = 1, **kw: Any) -> tuple[Any, Any]:
    with det_cluster.emulated_cluster(tmp) as cluster:
        if "on_report" in kw:
            cluster.master.on_report = kw.pop("on_report")(cluster)
        record = cluster.run_trial(conf, hp, slots_per_container=slots, timeout=400, **kw)
        assert cluster.master.errors == [], cluster.master.errors
        return cluster, record


# --------------------------------------------------------------------------------------------
# The config as a master hands it.
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", YAMLS)
def test_every_yaml_as_the_master_hands_it_passes_the_dry_run(name: str, tmp_path: Path) -> None:
    if not EXPCONF_DEFAULTS.is_file():
        pytest.skip("../shared/tools/expconf_defaults.py (the master's schemas) is not beside the repo")
    filled = subprocess.run(
        [sys.executable, str(EXPCONF_DEFAULTS), str(ROOT / name)], capture_output=True, text=True, check=True
    ).stdout
    (tmp_path / "handed.json").write_text(filled)
    handed = run_cli(["train.py", "--config", str(tmp_path / "handed.json"), "--dry-run"])
    ours = run_cli(["train.py", "--config", str(ROOT / name), "--dry-run"])
    # Our own filling of the master's defaults plans the same run as the master's schemas.
    assert handed == ours
    assert handed["slots"] == json.loads(filled)["resources"]["slots_per_trial"]
    # The learning rate the run will use: the YAML's rule worked out by hand (a search space's
    # first value, as a local run picks it).
    conf = config.load_yaml(ROOT / name)
    hp = config.local_hparams(conf)
    samples = hp["global_batch_size"] * (conf.get("optimizations") or {}).get("aggregation_frequency", 1)
    power = {"sqrt": 0.5, "linear": 1.0}[hp["lr_scaling"]]
    expected = hp["learning_rate"] * (samples / hp["reference_batch_size"]) ** power
    assert (
        handed["learning_rate"] == pytest.approx(expected) and handed["samples_per_optimizer_step"] == samples
    )


CLUSTER_YAMLS = ("const.yaml", "distributed.yaml", "multi_machine.yaml", "search.yaml")


def test_the_cluster_yamls_are_one_recipe_at_different_scales() -> None:
    """const / distributed / multi_machine / search share data, learning rate, reference batch and
    rule; they differ in slots, batch, aggregation and optimizer (search: what it searches)."""
    confs = {name: config.load_yaml(ROOT / name) for name in CLUSTER_YAMLS}
    base = confs["const.yaml"]["hyperparameters"]
    assert (base["learning_rate"], base["reference_batch_size"], base["lr_scaling"]) == (5e-5, 32, "sqrt")
    for name, conf in confs.items():
        assert conf["data"] == confs["const.yaml"]["data"], name
        hp = conf["hyperparameters"]
        assert (hp["reference_batch_size"], hp["lr_scaling"]) == (32, "sqrt"), name
        differ = {k for k in base.keys() | hp.keys() if base.get(k) != hp.get(k)}
        if name == "search.yaml":
            space = hp["learning_rate"]
            assert 10 ** space["minval"] <= base["learning_rate"] <= 10 ** space["maxval"]
            assert differ == {
                "global_batch_size",
                "learning_rate",
                "warmup_ratio",
                "optimizer",
                "train_length",
            }
        else:
            assert differ <= {"global_batch_size", "optimizer"}, name


def test_zero_periods_from_the_master_mean_unset() -> None:
    conf = config.with_master_defaults(config.load_yaml(ROOT / "search.yaml"))
    assert conf["min_checkpoint_period"] == {"batches": 0}
    plan = config.run_plan(conf, config.local_hparams(conf), 1)
    assert plan.checkpoint_period is None


def test_dry_run_prints_the_plan_without_a_model(tmp_path: Path) -> None:
    out = run_cli(["train.py", "--config", str(ROOT / "multi_machine.yaml"), "--dry-run"])
    assert out["slots"] == 16 and out["aggregation_frequency"] == 2 and out["optimizer"] == "radam"
    assert out["per_slot_batch_size"] * 16 == out["global_batch_size"]
    assert out["training_length"] == {"epochs": 2} and out["batches"] is None and "note" in out
    search = run_cli(["train.py", "--config", str(ROOT / "search.yaml"), "--dry-run"])
    assert search["asha_brackets"] == [[625, 2500, 10000], [2500, 10000]]
    assert search["batches"] == 10000 and search["validation_period"] == {"batches": 625}


def test_dry_run_names_the_bad_field(tmp_path: Path) -> None:
    conf = config.load_yaml(ROOT / "search.yaml")
    conf["min_validation_period"] = {"batches": 2500}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(conf))
    out = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "--config", str(path), "--dry-run"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "min_validation_period" in out.stderr and "625" in out.stderr


def test_asha_brackets_match_the_masters_arithmetic() -> None:
    # adaptive_asha.go: max_rungs = min(5, log4(10000)+1, log4(16)+1) = 3; standard mode -> 3 and 2.
    searcher = {"max_time": 10000, "max_trials": 16, "mode": "standard", "divisor": 4, "max_rungs": 5}
    assert config.asha_brackets(searcher) == [[625, 2500, 10000], [2500, 10000]]
    assert config.asha_brackets({**searcher, "mode": "aggressive"}) == [[625, 2500, 10000]]
    assert config.asha_brackets({**searcher, "mode": "conservative"}) == [
        [625, 2500, 10000],
        [2500, 10000],
        [10000],
    ]


# --------------------------------------------------------------------------------------------
# Runs on the emulated cluster.
# --------------------------------------------------------------------------------------------


@needs_containers
def test_profiler_reports_system_metrics_when_the_yaml_enables_it(tiny_bert: Path, tmp_path: Path) -> None:
    """const.yaml's `profiling: {enabled: true}` reaches Trainer.fit: the master receives the
    profiler's system metrics (every ~10 s, so this run trains long enough for a few)."""
    conf, hp = shaped_like("const.yaml", tiny_bert, tmp_path, batches=600, slots=1)
    assert conf["profiling"] == {"enabled": True}
    cluster, record = trial_run(tmp_path, conf, hp)
    assert record.exit_codes == [0], record.failures()
    groups = {r["group"] for r in cluster.master.system_metrics}
    assert {"cpu", "memory", "disk", "network"} <= groups, groups
    cpu = [r["metrics"] for r in cluster.master.system_metrics if r["group"] == "cpu"]
    (agent,) = cpu[0]  # keyed by the agent, as the WebUI's Profiler tab reads them
    assert 0 <= cpu[0][agent]["cpu_util_simple"] <= 100
    # Off: no system metrics (a local run never asks; Determined only profiles on a cluster).
    off = {**conf, "profiling": {"enabled": False}}
    assert not config.run_plan(off, config.local_hparams(off), 1).fit_kwargs(None)["profiling_enabled"]


@needs_containers
def test_one_slot_trains_validates_and_checkpoints_like_a_cluster(tiny_bert: Path, tmp_path: Path) -> None:
    conf, hp = shaped_like("const.yaml", tiny_bert, tmp_path, batches=8, slots=1)
    cluster, record = trial_run(tmp_path, conf, hp)
    assert record.exit_codes == [0], record.failures()
    val = cluster.master.validations()[-1]
    assert val["steps_completed"] == 8 and val["metrics"]["batches"] == 8
    assert {"exact_match", "f1"} <= set(val["metrics"])
    ckpt = cluster.master.checkpoints[-1]
    assert ckpt.steps_completed == 8 and "hf/model.safetensors" in ckpt.resources
    path = cluster.storage / ckpt.uuid  # shared_fs host_path/UUID
    from transformers import AutoModelForQuestionAnswering

    AutoModelForQuestionAnswering.from_pretrained(path / "hf")
    # The trial logs in Determined's format, so the WebUI's level filter reads it.
    assert re.search(r"\[rank=0\] INFO: \[\d+\] determined\.core: report_training_metrics", record.logs[0])
    # const.yaml turns the profiler on (reports come every 10 s: this run is shorter).
    assert conf["profiling"] == {"enabled": True}
    assert "[rank=0] INFO: [" in record.logs[0] and "Starting system metrics profiling." in record.logs[0]


@pytest.fixture(scope="module")
def two_slots(tiny_bert: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, dict, Any]:
    """An uninterrupted 2-slot run shaped like distributed.yaml, 24 batches, checkpoints every 6."""
    tmp = tmp_path_factory.mktemp("two-slots")
    if WHY_NOT is not None:
        pytest.skip(f"emulated cluster: {WHY_NOT}")
    conf, hp = shaped_like("distributed.yaml", tiny_bert, tmp, batches=24, slots=2)
    cluster, record = trial_run(tmp, conf, hp, slots=2)
    assert record.exit_codes == [0], record.failures()
    return tmp, conf, hp, cluster


@needs_containers
def test_two_slots_equal_a_one_process_evaluation_of_the_checkpoint(two_slots) -> None:
    tmp, _, _, cluster = two_slots
    assert_equals_one_process_evaluation(cluster, tmp)


@needs_containers
def test_pause_and_resume_equal_an_uninterrupted_run(two_slots, tmp_path: Path) -> None:
    _, conf, hp, baseline = two_slots

    def preempt_at_step_10(cluster: Any) -> Any:
        def hook(report: dict) -> None:
            if report["group"] == "training" and report["steps_completed"] == 10:
                cluster.master.preempt()

        return hook

    cluster, record = trial_run(tmp_path, conf, hp, slots=2, on_report=preempt_at_step_10)
    assert record.preempted == 1 and record.exit_codes == [0, 0], record.failures()
    # The pause checkpointed at a report after step 10 and the restart continued right there.
    training = [r for r in cluster.master.metrics if r["group"] == "training"]
    paused_at = max(r["steps_completed"] for r in training if r["trial_run_id"] == 1)
    resumed_at = min(r["steps_completed"] for r in training if r["trial_run_id"] == 2)
    assert 10 <= paused_at < 24 and resumed_at == paused_at + conf["scheduling_unit"]
    assert paused_at in [c.steps_completed for c in cluster.master.checkpoints]
    assert_same(final(cluster.master), final(baseline.master))


@needs_containers
def test_killed_rank_restarts_from_the_latest_checkpoint(two_slots, tmp_path: Path) -> None:
    _, conf, hp, baseline = two_slots
    killed: list[int] = []

    def kill_rank_1_at_step_8(cluster: Any) -> Any:
        def hook(report: dict) -> None:
            if report["group"] == "training" and report["steps_completed"] == 8 and not killed:
                alloc = list(cluster.master.allocations.values())[-1]
                for pid in det_cluster.rank_pids(alloc, rank=1):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)

        return hook

    cluster, record = trial_run(tmp_path, conf, hp, slots=2, on_report=kill_rank_1_at_step_8)
    assert killed, "found no rank-1 process to kill"
    assert record.exit_codes[0] != 0 and record.exit_codes[-1] == 0 and len(record.exit_codes) == 2
    # The restart began at the checkpoint of step 6 (DET_LATEST_CHECKPOINT / DET_STEPS_COMPLETED).
    second = [r for r in cluster.master.metrics if r["trial_run_id"] == 2 and r["group"] == "training"]
    assert second[0]["steps_completed"] == 8
    assert_same(final(cluster.master), final(baseline.master))


@needs_containers
def test_searcher_stop_ends_the_trial_with_a_checkpoint(tiny_bert: Path, tmp_path: Path) -> None:
    conf, hp = shaped_like("search.yaml", tiny_bert, tmp_path, batches=400, slots=1)

    def stop_at_step_6(cluster: Any) -> Any:
        def hook(report: dict) -> None:
            if report["group"] == "training" and report["steps_completed"] == 6:
                cluster.master.stop_by_searcher()

        return hook

    cluster, record = trial_run(tmp_path, conf, hp, on_report=stop_at_step_6)
    assert record.exit_codes == [0], record.failures()
    # Within one scheduling unit (2 batches) of the decision, with a final checkpoint there.
    assert cluster.master.checkpoints[-1].steps_completed <= 6 + conf["scheduling_unit"]
    assert max(r["steps_completed"] for r in cluster.master.metrics) <= 6 + conf["scheduling_unit"]
    assert "the searcher stopped this trial" in record.logs[0]


@needs_containers
def test_truncated_latest_checkpoint_is_refused_before_training(two_slots, tmp_path: Path) -> None:
    _, conf, hp, baseline = two_slots
    with det_cluster.emulated_cluster(tmp_path) as cluster:
        source = baseline.storage / baseline.master.checkpoints[-1].uuid
        import shutil

        target = cluster.storage / source.name
        shutil.copytree(source, target)
        state = target / "state_dict.pth"
        state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
        cluster.master.checkpoints.append(baseline.master.checkpoints[-1])
        conf = {**conf, "max_restarts": 0}
        record = cluster.run_trial(conf, hp, slots_per_container=2, timeout=200)
    assert record.exit_codes[0] != 0
    assert "DET_LATEST_CHECKPOINT" in record.logs[0] and "state_dict.pth" in record.logs[0]
    assert "damaged or truncated checkpoint" in record.logs[0]
    assert not [r for r in cluster.master.metrics if r["group"] == "training"]
    # Only the chief read the state file; both ranks stopped with its verdict.
    log = record.logs[0]
    assert re.search(r"\[rank=0\].*verifying DET_LATEST_CHECKPOINT .* for all 2 ranks", log)
    assert not re.search(r"\[rank=1\].*verifying DET_LATEST_CHECKPOINT", log)
    assert re.search(r"\[rank=1\].*error: DET_LATEST_CHECKPOINT .*damaged or truncated checkpoint", log)


def test_each_yaml_names_its_scale_for_the_webui() -> None:
    """description and a scale-* label: the WebUI's experiment list filters and compares by them."""
    scales = {}
    for name in YAMLS:
        conf = config.load_yaml(ROOT / name)
        assert isinstance(conf.get("description"), str) and conf["description"], name
        (scale,) = [label for label in conf["labels"] if label.startswith("scale-")]
        scales[name] = scale
    assert len({scales[n] for n in ("const.yaml", "distributed.yaml", "multi_machine.yaml")}) == 3
