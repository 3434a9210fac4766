"""The trial as a Determined 0.38.1 cluster runs it (tests/support/det_cluster.py), and the config as a
master hands it over. Only model, data, lengths and slots differ from the repo's YAMLs."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from extractive_qa.config import experiment, run_plan
from extractive_qa.config.settings import Hyperparameters
from extractive_qa.trial import model_io
from tests.support import det_cluster, det_master
from tests.support.project import DEV_V1, ROOT, TRAIN_V1, one_process_scores, run_cli

WHY_NOT = det_cluster.supported()
needs_containers = pytest.mark.skipif(WHY_NOT is not None, reason=f"emulated cluster: {WHY_NOT}")
YAMLS = sorted(p.name for p in ROOT.glob("*.yaml"))
EXPCONF_DEFAULTS = det_cluster.EXPCONF_DEFAULTS


def shaped_like(
    yaml_name: str, model: Path, tmp: Path, batches: int, slots: int, **extra: Any
) -> tuple[dict, dict]:
    """A repo YAML with only model, data, lengths and slots overridden; returns (config, hparams
    as the master samples them: the YAML's values, a search space's first value)."""
    conf = experiment.load_yaml(ROOT / yaml_name)
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
    hp = experiment.local_hparams(conf)
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
    # Our own filling of the master's defaults plans the same run as the master's schemas (the
    # windowing's wall time, which the counting note quotes, aside).
    for plan in (handed, ours):
        plan["training_windows_from"] = re.sub(r" in [0-9.]+ s\)", ")", plan["training_windows_from"])
    assert handed == ours
    assert handed["slots"] == json.loads(filled)["resources"]["slots_per_trial"]
    # The learning rate the run will use: the YAML's rule worked out by hand (a search space's
    # first value, as a local run picks it).
    conf = experiment.load_yaml(ROOT / name)
    hp = experiment.local_hparams(conf)
    samples = hp["global_batch_size"] * (conf.get("optimizations") or {}).get("aggregation_frequency", 1)
    power = {"sqrt": 0.5, "linear": 1.0}[hp["lr_scaling"]]
    expected = hp["learning_rate"] * (samples / hp["reference_batch_size"]) ** power
    assert (
        handed["learning_rate"] == pytest.approx(expected) and handed["samples_per_optimizer_step"] == samples
    )


CLUSTER_YAMLS = ("const.yaml", "distributed.yaml", "multi_machine.yaml", "search.yaml")


def test_the_cluster_yamls_are_one_recipe_at_different_scales() -> None:
    """const / distributed / multi_machine / search share data, learning rate, reference batch and
    rule; they differ in slots, batch, aggregation and optimizer, with what the optimizer needs
    (RAdam: its beta2 and no linear warm-up; search: what it searches)."""
    confs = {name: experiment.load_yaml(ROOT / name) for name in CLUSTER_YAMLS}
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
            assert differ == {"global_batch_size", "learning_rate", "warmup_ratio", "train_length"}
        elif hp["optimizer"] == "radam":
            assert differ == {"global_batch_size", "optimizer", "adam_beta2", "warmup_ratio"}, name
        else:
            assert differ <= {"global_batch_size"}, name


def test_multi_machine_ships_the_radam_form_the_study_chose() -> None:
    """multi_machine.yaml's RAdam settings are the form bench/lr_scaling.py's committed rows rank best
    at 2x, once every form has the seeds the choice is made on; on full SQuAD's ~461 optimizer steps
    (88.6k windows, 2 epochs, 384 per step) that form trains without optimization.radam_warning."""
    from bench import lr_scaling, study
    from extractive_qa.trial.optimization import radam_warning

    rows = lr_scaling.with_epochs(study.load(ROOT / "bench" / "results" / "lr-scaling-cpu.json", {})["rows"])
    first3 = tuple(int(s) for s in lr_scaling.SEEDS.split(","))[:3]
    ref = lr_scaling.reference_lr(rows, first3)
    rule = lr_scaling.best_rule(rows, ref, first3)
    assert all(lr_scaling.has_seeds(rows, c, first3) for c in lr_scaling.radam_forms(2, rule, ref))
    form = lr_scaling.radam_choice(rows, rule, ref, first3)
    hp = experiment.load_yaml(ROOT / "multi_machine.yaml")["hyperparameters"]
    assert (hp["optimizer"], hp["warmup_ratio"], hp["adam_beta2"]) == (
        "radam",
        form["warmup_ratio"],
        form["adam_beta2"],
    )
    shipped = Hyperparameters(optimizer="radam", warmup_ratio=hp["warmup_ratio"], adam_beta2=hp["adam_beta2"])
    assert radam_warning(shipped, 461, round(461 * hp["warmup_ratio"])) is None
    assert radam_warning(Hyperparameters(optimizer="radam", warmup_ratio=0.1), 461, 46)  # as before


def test_zero_periods_from_the_master_mean_unset() -> None:
    conf = experiment.with_master_defaults(experiment.load_yaml(ROOT / "search.yaml"))
    assert conf["min_checkpoint_period"] == {"batches": 0}
    plan = run_plan.run_plan(conf, experiment.local_hparams(conf), 1)
    assert plan.checkpoint_period is None


def test_dry_run_prints_the_plan_without_a_model(tmp_path: Path) -> None:
    out = run_cli(["train.py", "--config", str(ROOT / "multi_machine.yaml"), "--dry-run"])
    assert out["slots"] == 16 and out["aggregation_frequency"] == 2 and out["optimizer"] == "radam"
    assert out["per_slot_batch_size"] * 16 == out["global_batch_size"]
    yaml_hp = experiment.load_yaml(ROOT / "multi_machine.yaml")["hyperparameters"]
    assert out["adam_betas"] == [yaml_hp.get(f"adam_beta{i}", d) for i, d in ((1, 0.9), (2, 0.999))]
    assert out["training_length"] == {"epochs": 2}
    # epochs become batches and steps from the training windows (counted, cached or estimated)
    assert out["batches"] == 2 * out["batches_per_epoch"] and out["optimizer_steps"] == out["batches"] // 2
    search = run_cli(["train.py", "--config", str(ROOT / "search.yaml"), "--dry-run"])
    assert search["asha_brackets"] == [[625, 2500, 10000], [2500, 10000]]
    assert search["batches"] == 10000 and search["validation_period"] == {"batches": 625}


def test_dry_run_names_the_bad_field(tmp_path: Path) -> None:
    conf = experiment.load_yaml(ROOT / "search.yaml")
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
    assert experiment.asha_brackets(searcher) == [[625, 2500, 10000], [2500, 10000]]
    assert experiment.asha_brackets({**searcher, "mode": "aggressive"}) == [[625, 2500, 10000]]
    assert experiment.asha_brackets({**searcher, "mode": "conservative"}) == [
        [625, 2500, 10000],
        [2500, 10000],
        [10000],
    ]


# --------------------------------------------------------------------------------------------
# Runs on the emulated cluster.
# --------------------------------------------------------------------------------------------


@pytest.mark.cluster_stack
@needs_containers
def test_one_slot_trains_validates_checkpoints_and_profiles_like_a_cluster(
    tiny_bert: Path, tmp_path: Path
) -> None:
    """One slot shaped like const.yaml: the master receives training and validation reports, the
    checkpoint (with hf/ and its model card holding the master's scores), Determined-format logs,
    and -- const.yaml's `profiling: {enabled: true}` reaching Trainer.fit -- the profiler's system
    metrics (every ~10 s, so this run trains long enough for a few)."""
    batches = 600
    conf, hp = shaped_like("const.yaml", tiny_bert, tmp_path, batches=batches, slots=1)
    assert conf["profiling"] == {"enabled": True}
    cluster, record = trial_run(tmp_path, conf, hp)
    assert record.exit_codes == [0], record.failures()
    val = cluster.master.validations()[-1]
    assert val["steps_completed"] == batches and val["metrics"]["batches"] == batches
    assert {"exact_match", "f1"} <= set(val["metrics"])
    ckpt = cluster.master.checkpoints[-1]
    assert ckpt.steps_completed == batches and "hf/model.safetensors" in ckpt.resources
    path = cluster.storage / ckpt.uuid  # shared_fs host_path/UUID
    from transformers import AutoModelForQuestionAnswering

    AutoModelForQuestionAnswering.from_pretrained(path / "hf")
    # The model card the trial wrote holds the scores the master recorded.
    front = yaml.safe_load((path / "hf" / "README.md").read_text().split("---\n")[1])
    shown = {m["type"]: m["value"] for m in front["model-index"][0]["results"][0]["metrics"]}
    assert shown == {"exact_match": val["metrics"]["exact_match"], "f1": val["metrics"]["f1"]}
    # The trial logs in Determined's format, so the WebUI's level filter reads it.
    assert re.search(r"\[rank=0\] INFO: \[\d+\] determined\.core: report_training_metrics", record.logs[0])
    assert "Starting system metrics profiling." in record.logs[0]
    groups = {r["group"] for r in cluster.master.system_metrics}
    assert {"cpu", "memory", "disk", "network"} <= groups, groups
    cpu = [r["metrics"] for r in cluster.master.system_metrics if r["group"] == "cpu"]
    (agent,) = cpu[0]  # keyed by the agent, as the WebUI's Profiler tab reads them
    assert 0 <= cpu[0][agent]["cpu_util_simple"] <= 100
    # Off: no system metrics (a local run never asks; Determined only profiles on a cluster).
    off = {**conf, "profiling": {"enabled": False}}
    plan_off = run_plan.run_plan(off, experiment.local_hparams(off), 1)
    assert not plan_off.fit_kwargs(None)["profiling_enabled"]


def test_the_upload_carries_the_bundled_data_local_yaml_reads() -> None:
    """`det experiment create local.yaml .` (or local_v2.yaml) uploads what .detignore lets through:
    those YAMLs' data files (relative paths, read from the context on a cluster) and no tests,
    caches, benchmarks or the serving export the trial never imports; 2 MB at most (Determined
    refuses contexts over 96 MB; checkpoints, caches or an export let through would be tens to
    hundreds of MB)."""
    files = {f.path: f for f in det_master.context_files(ROOT)}
    wanted = {"squad_data/README.md"}  # the licence and attribution travel with the text
    for name in ("local.yaml", "local_v2.yaml"):
        data = experiment.load_yaml(ROOT / name)["data"]
        for key in ("train_file", "validation_file"):
            assert data[key] in files, f"{name} {key} {data[key]} is not uploaded"
            wanted.add(data[key])
    assert {p for p in files if p.startswith("squad_data/")} == wanted
    assert not {p.split("/")[0] for p in files} & {"tests", "bench", "docs", ".venv", ".cache", "runs"}
    assert "export.py" not in files and "requirements-export.txt" not in files
    size = sum(len(f.content) // 4 * 3 for f in files.values() if f.content)
    assert size < 2_000_000, size


@pytest.mark.cluster_stack
@needs_containers
def test_local_yaml_runs_on_the_cluster_from_the_upload(tmp_path: Path) -> None:
    """local.yaml as the master hands it (only its length cut to 2 batches): the context brings
    the bundled data, the startup hook finds (or installs) the embedded model, the trial trains and
    validates on the 810 bundled questions, in the precision `auto` picks for this CPU."""
    conf = experiment.load_yaml(ROOT / "local.yaml")
    hp = experiment.local_hparams(conf)
    hp["train_length"] = {"batches": 2}
    conf["min_validation_period"] = {"batches": 2}
    cluster, record = trial_run(tmp_path, conf, hp)
    assert record.exit_codes == [0], record.failures()
    assert "startup-hook: ok" in record.logs[0]
    val = cluster.master.validations()[-1]
    assert val["steps_completed"] == 2 and 0 <= val["metrics"]["exact_match"] <= val["metrics"]["f1"] <= 100
    assert val["metrics"]["eval_windows"] >= 810  # every bundled question has a window
    # precision: auto, settled in the container for its CPU and saved with the checkpoint
    picked, why = model_io.resolve_precision("auto", "cpu")
    ckpt = cluster.storage / cluster.master.checkpoints[-1].uuid
    assert json.loads((ckpt / "hf" / "qa_settings.json").read_text())["precision"] == picked
    assert f"precision {picked} ({why})" in record.logs[0]


@pytest.fixture(scope="module")
def two_slots(tiny_bert: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, dict, Any]:
    """An uninterrupted 2-slot run shaped like distributed.yaml, 24 batches, checkpoints every 6."""
    tmp = tmp_path_factory.mktemp("two-slots")
    if WHY_NOT is not None:
        pytest.skip(f"emulated cluster: {WHY_NOT}")
    conf, hp = shaped_like("distributed.yaml", tiny_bert, tmp, batches=24, slots=2)
    # Another cluster's chief on Determined's default ZMQ ports: an allocation must get its own,
    # as the master's port registry gives it (without, ranks met a stranger's broadcast).
    with holding(12360, 12376):  # constants.INTER_TRAIN_PROCESS_COMM_PORT_1 / _2 defaults
        cluster, record = trial_run(tmp, conf, hp, slots=2)
    assert record.exit_codes == [0], record.failures()
    return tmp, conf, hp, cluster


@contextlib.contextmanager
def holding(*ports: int) -> Any:
    """Listen on these ports (those still free) for the duration, as another process would."""
    with contextlib.ExitStack() as stack:
        for port in ports:
            sock = stack.enter_context(socket.socket())
            with contextlib.suppress(OSError):  # already held by someone: just as good
                sock.bind(("0.0.0.0", port))
                sock.listen()
        yield


@pytest.mark.cluster_stack
@needs_containers
def test_two_slots_equal_a_one_process_evaluation_of_the_checkpoint(two_slots) -> None:
    tmp, _, _, cluster = two_slots
    assert_equals_one_process_evaluation(cluster, tmp)


@needs_containers
def test_every_report_carries_the_windows_throughput_for_the_webui(two_slots) -> None:
    """perf_* reach the master in the training group (charted beside loss) at every report,
    computed across both ranks; validations carry their own seconds and questions/s."""
    _, conf, hp, cluster = two_slots
    training = [r["metrics"] for r in cluster.master.metrics if r["group"] == "training"]
    aggregation = (conf.get("optimizations") or {}).get("aggregation_frequency", 1)
    assert len(training) == 24 // conf["scheduling_unit"]
    for m in training:
        assert m["perf_samples_per_s"] > 0 and m["perf_tokens_per_s"] > 0
        assert m["perf_samples_per_s_per_slot"] == pytest.approx(m["perf_samples_per_s"] / 2)
        assert m["perf_samples_per_step"] == hp["global_batch_size"] * aggregation
        assert 0 <= m["perf_padding_frac"] < 1 and 0 <= m["perf_data_wait_frac"] < 1
        # steps of the window / the window's seconds: one optimizer step's samples at that rate
        assert m["perf_step_s"] == pytest.approx(m["perf_samples_per_step"] / m["perf_samples_per_s"])
    val = cluster.master.validations()[-1]["metrics"]
    questions = sum(len(p["qas"]) for a in json.loads(DEV_V1.read_text())["data"] for p in a["paragraphs"])
    assert val["perf_val_s"] > 0
    assert val["perf_val_questions_per_s"] * val["perf_val_s"] == pytest.approx(questions)


@pytest.mark.cluster_stack
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
    # Every rank restored the chief's private, checked copy, which is gone after the run.
    restored = r"\[rank=1\].*Restoring trial from checkpoint \.resume-"
    assert re.search(restored, record.logs[-1]), record.logs[-1][-3000:]
    assert not list(cluster.storage.glob(".resume-*"))


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


@pytest.mark.cluster_stack
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
        conf = experiment.load_yaml(ROOT / name)
        assert isinstance(conf.get("description"), str) and conf["description"], name
        (scale,) = [label for label in conf["labels"] if label.startswith("scale-")]
        scales[name] = scale
    assert len({scales[n] for n in ("const.yaml", "distributed.yaml", "multi_machine.yaml")}) == 3


# --------------------------------------------------------------------------------------------
# The scaling report from a master's answers (Determined's SDK against the stand-in).
# --------------------------------------------------------------------------------------------


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
    ran = [v for v in series if not (v.slots == 1 and v.aggregation == 2)]
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
    running = copy.deepcopy(ran[1].config)
    running["name"] = running["name"].replace("slots=2", "slots=2 (again)")
    partial = [r for r in registry.experiments[1].reports if r["group"] == "training"][:2]
    registry.add_experiment(running, partial, state="ACTIVE", trial_state="RUNNING")
    registry.add_experiment({**ran[0].config, "labels": ["another-study"]}, [])  # not this study's
    return ran, expected, failed, running


def test_scaling_report_from_the_master_equals_the_report_from_the_same_reports(
    tiny_bert: Path, tmp_path: Path
) -> None:
    """A study on the emulated cluster (1 slot; 2 slots; 2 slots x aggregation 2), a failed and a
    still-running experiment beside it; `scaling.py report --master` reads them through
    Determined's SDK from the stand-in and writes the table, JSON and PNG, whose figures equal
    the report computed from the very reports the trials made (the local report's path)."""
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
