"""The trial as a Determined 0.38.1 cluster runs it (tests/support/det_cluster.py): one and two
slots, local.yaml from the upload, a pause, a killed rank, a searcher stop, a truncated latest
checkpoint, a checkpoint planted in a bucket -- on shared_fs and on S3, GCS and Azure Blob on loopback. Only
model, data, lengths and slots differ from the repo's YAMLs."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
from pathlib import Path
from typing import Any

import pytest
import yaml

from extractive_qa.config import experiment, run_plan
from extractive_qa.qa import mixed_precision
from tests.support import det_cluster, object_stores
from tests.support.cluster_trials import (
    WHY_NOT,
    assert_equals_one_process_evaluation,
    assert_same,
    final,
    needs_containers,
    shaped_like,
    trial_run,
)
from tests.support.project import DEV_V1, ROOT

# --------------------------------------------------------------------------------------------
# The config as a master hands it.
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# Runs on the emulated cluster.
# --------------------------------------------------------------------------------------------


@needs_containers
@pytest.mark.parametrize("storage", ["gcs"], indirect=True)
def test_one_slot_trains_validates_checkpoints_and_profiles_like_a_cluster(
    tiny_bert: Path, tmp_path: Path, storage: Any
) -> None:
    """One slot shaped like const.yaml: the master receives training and validation reports, the
    checkpoint (with hf/ and its model card holding the master's scores), Determined-format logs,
    and -- const.yaml's `profiling: {enabled: true}` reaching Trainer.fit -- the profiler's system
    metrics (every ~10 s, so this run trains long enough for a few); checkpoints go to GCS."""
    batches = 600
    conf, hp = shaped_like("const.yaml", tiny_bert, tmp_path, batches=batches, slots=1)
    assert conf["profiling"] == {"enabled": True}
    cluster, record = trial_run(tmp_path, conf, hp, store=storage)
    assert record.exit_codes == [0], record.failures()
    val = cluster.master.validations()[-1]
    assert val["steps_completed"] == batches and val["metrics"]["batches"] == batches
    assert {"exact_match", "f1"} <= set(val["metrics"])
    ckpt = cluster.master.checkpoints[-1]
    assert ckpt.steps_completed == batches and "hf/model.safetensors" in ckpt.resources
    path = cluster.checkpoint_dir(ckpt.uuid)  # downloaded from the bucket
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


@pytest.mark.cluster_stack
@needs_containers
def test_local_yaml_runs_on_the_cluster_from_the_upload(tmp_path: Path) -> None:
    """local.yaml as the master hands it (only its length cut to 2 batches and its validation to
    the first 100 of the bundled questions): the context brings the bundled data, the startup hook
    finds (or installs) the embedded model, the trial trains and validates, in the precision
    `auto` picks for this CPU. (All 810 questions get windows: tests/test_data.py.)"""
    conf = experiment.load_yaml(ROOT / "local.yaml")
    hp = experiment.local_hparams(conf)
    hp["train_length"] = {"batches": 2}
    conf["min_validation_period"] = {"batches": 2}
    conf["data"]["max_eval_examples"] = 100  # 810 take MiniLM's fp32 a minute on an AVX2-only CPU
    cluster, record = trial_run(tmp_path, conf, hp)
    assert record.exit_codes == [0], record.failures()
    assert "startup-hook: ok" in record.logs[0]
    val = cluster.master.validations()[-1]
    assert val["steps_completed"] == 2 and 0 <= val["metrics"]["exact_match"] <= val["metrics"]["f1"] <= 100
    assert val["metrics"]["eval_windows"] >= 100  # each question it validated has a window
    # precision: auto, settled in the container for its CPU and saved with the checkpoint
    picked, why = mixed_precision.resolve_precision("auto", "cpu")
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


@pytest.fixture
def storage(request: pytest.FixtureRequest) -> Any:
    """checkpoint_storage for a run: shared_fs (None), or an S3, GCS or Azure bucket on loopback."""
    if request.param == "shared_fs":
        yield None
        return
    with object_stores.object_store(request.param) as store:
        yield store


def stored_nowhere_but_the_checkpoints(cluster: Any) -> None:
    """Nothing of a resume's private copies reached the storage: only the trial's checkpoints and
    Determined's TensorBoard files (PREFIX/CLUSTER_ID/tensorboard/, tensorboard/build.py:17)."""
    if cluster.store is None:
        assert not list(cluster.storage.glob("*resume-*"))
        return
    keys = cluster.store.listing(f"{object_stores.PREFIX}/")
    tops = {key.split("/")[1] for key in keys}
    assert tops <= {c.uuid for c in cluster.master.checkpoints} | {"emulated-cluster"}, tops
    assert not [k for k in keys if "resume-" in k]


@needs_containers
@pytest.mark.parametrize("storage", ["s3"], indirect=True)
def test_pause_and_resume_equal_an_uninterrupted_run(two_slots, tmp_path: Path, storage: Any) -> None:
    """Paused at a report after step 10 and activated again, with checkpoints in S3: the run ends
    exactly as the uninterrupted one on shared_fs did (a restart from Azure Blob: the killed-rank
    test; from GCS: tests/test_buckets.py's restore, in-process, as each store is one source)."""
    _, conf, hp, baseline = two_slots

    def preempt_at_step_10(cluster: Any) -> Any:
        def hook(report: dict) -> None:
            if report["group"] == "training" and report["steps_completed"] == 10:
                cluster.master.preempt()

        return hook

    cluster, record = trial_run(tmp_path, conf, hp, slots=2, store=storage, on_report=preempt_at_step_10)
    assert record.preempted == 1 and record.exit_codes == [0, 0], record.failures()
    # The pause checkpointed at a report after step 10 and the restart continued right there.
    training = [r for r in cluster.master.metrics if r["group"] == "training"]
    paused_at = max(r["steps_completed"] for r in training if r["trial_run_id"] == 1)
    resumed_at = min(r["steps_completed"] for r in training if r["trial_run_id"] == 2)
    assert 10 <= paused_at < 24 and resumed_at == paused_at + conf["scheduling_unit"]
    assert paused_at in [c.steps_completed for c in cluster.master.checkpoints]
    assert_same(final(cluster.master), final(baseline.master))
    # Every rank restored its machine's private, checked copy (in the container's own temp
    # directory, out of the storage's reach), none of which lies in the storage; the local chief
    # downloaded only the files a resume reads.
    restored = r"\[rank=1\].*Restoring trial from checkpoint /\S+/extractive-qa-\d+/resume-"
    assert re.search(restored, record.logs[-1]), record.logs[-1][-3000:]
    paused = next(c.uuid for c in cluster.master.checkpoints if c.steps_completed == paused_at)
    fetched = re.search(
        rf"DET_LATEST_CHECKPOINT {re.escape(storage.url(paused))}: downloaded (.*) \(", record.logs[-1]
    )
    assert fetched and fetched.group(1).split(", ") == [
        "experiment.json", "load_data.json", "metadata.json", "state_dict.pth", "trial_state.pkl"
    ], record.logs[-1][-3000:]  # fmt: skip
    stored_nowhere_but_the_checkpoints(cluster)


@needs_containers
@pytest.mark.parametrize("storage", ["azure"], indirect=True)
def test_killed_rank_restarts_from_the_latest_checkpoint(two_slots, tmp_path: Path, storage: Any) -> None:
    """Rank 1 killed at step 8, checkpoints in Azure Blob: the restart continues from step
    6's and ends as the uninterrupted run on shared_fs did."""
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

    cluster, record = trial_run(tmp_path, conf, hp, slots=2, store=storage, on_report=kill_rank_1_at_step_8)
    assert killed, "found no rank-1 process to kill"
    assert record.exit_codes[0] != 0 and record.exit_codes[-1] == 0 and len(record.exit_codes) == 2
    # The restart began at the checkpoint of step 6 (DET_LATEST_CHECKPOINT / DET_STEPS_COMPLETED).
    second = [r for r in cluster.master.metrics if r["trial_run_id"] == 2 and r["group"] == "training"]
    assert second[0]["steps_completed"] == 8
    assert_same(final(cluster.master), final(baseline.master))


@needs_containers
@pytest.mark.parametrize("storage", ["s3"], indirect=True)
def test_searcher_stop_ends_the_trial_with_a_checkpoint(
    tiny_bert: Path, tmp_path: Path, storage: Any
) -> None:
    conf, hp = shaped_like("search.yaml", tiny_bert, tmp_path, batches=400, slots=1)

    def stop_at_step_6(cluster: Any) -> Any:
        def hook(report: dict) -> None:
            if report["group"] == "training" and report["steps_completed"] == 6:
                cluster.master.stop_by_searcher()

        return hook

    cluster, record = trial_run(tmp_path, conf, hp, store=storage, on_report=stop_at_step_6)
    assert record.exit_codes == [0], record.failures()
    # Within one scheduling unit (2 batches) of the decision, with a final checkpoint there.
    assert cluster.master.checkpoints[-1].steps_completed <= 6 + conf["scheduling_unit"]
    assert max(r["steps_completed"] for r in cluster.master.metrics) <= 6 + conf["scheduling_unit"]
    assert "the searcher stopped this trial" in record.logs[0]
    last = cluster.master.checkpoints[-1]  # uploaded whole to the bucket
    assert cluster.store.listing(f"{object_stores.PREFIX}/{last.uuid}/")


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
    # Only the machine's local chief read the state file; both ranks stopped with its verdict.
    log = record.logs[0]
    assert re.search(r"\[rank=0\].*verifying DET_LATEST_CHECKPOINT .* for the 2 local rank", log)
    assert not re.search(r"\[rank=1\].*verifying DET_LATEST_CHECKPOINT", log)
    assert re.search(r"\[rank=1\].*error: DET_LATEST_CHECKPOINT .*damaged or truncated checkpoint", log)


@needs_containers
def test_a_diverging_trial_ends_as_an_invalid_hyperparameter(tiny_bert: Path, tmp_path: Path) -> None:
    """Two slots with an epsilon that fp32 holds as 0: Adam's first step writes 0/0 into the
    weights of unused embeddings. At the end of that workload (one batch) both ranks find the same
    NaN weight, stop, and the trial ends as an invalid hyperparameter, so a search moves on: the
    container exits 0, the log names the setting, no checkpoint of those weights is written.
    Without the guard the trial trained on and checkpointed NaN weights; with only det.InvalidHP
    Determined checkpointed them on the way out, and a check in the chief's save alone left the
    other rank waiting in the save's broadcast."""
    conf, hp = shaped_like("distributed.yaml", tiny_bert, tmp_path, batches=8, slots=2)
    conf["scheduling_unit"] = 1
    hp["adam_epsilon"] = 1e-50
    cluster, record = trial_run(tmp_path, conf, hp, slots=2)
    assert record.exit_codes == [0], record.failures()
    assert cluster.master.early_exits == ["EXITED_REASON_INVALID_HP"] * 2  # one per rank
    stops = dict(re.findall(r"\[rank=(\d)\] ERROR: \[\d+\] squad: training stopped: (.*)", record.logs[0]))
    assert set(stops) == {"0", "1"} and stops["0"] == stops["1"], stops
    assert "model weight" in stops["0"] and "hyperparameters.adam_epsilon: 1e-50" in stops["0"]
    assert max((r["steps_completed"] for r in cluster.master.metrics), default=0) < 8
    assert cluster.master.checkpoints == []


class RunsACommand:
    """What a hostile checkpoint carries: unpickling it would run `command`."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple:
        return (os.system, (self.command,))


@needs_containers
@pytest.mark.parametrize(
    "storage",
    # On the image's torch 2.3 too (.ci/compat). Every store feeds the same download and decode
    # (tests/test_buckets.py plants one in each, in-process); here two stores end to end.
    [
        pytest.param("s3", marks=pytest.mark.cluster_stack),
        pytest.param("azure", marks=pytest.mark.cluster_stack),
    ],
    indirect=True,
)
def test_a_checkpoint_planted_in_the_bucket_runs_nothing(two_slots, tmp_path: Path, storage: Any) -> None:
    """Whoever can write to the bucket plants a checkpoint whose trial_state.pkl runs a command
    when unpickled, and it is the latest the master hands the trial: each machine's local chief
    downloads it into its private directory and decodes it, both ranks stop with that verdict,
    nothing trains, and the command never runs (torch 2.13 here, the image's torch 2.3 in
    .ci/compat)."""
    import dataclasses
    import pickle
    import shutil

    _, conf, hp, baseline = two_slots
    latest = baseline.master.checkpoints[-1]
    planted, marker = tmp_path / "planted", tmp_path / "ran"
    shutil.copytree(baseline.checkpoint_dir(latest.uuid), planted)
    (planted / "trial_state.pkl").write_bytes(pickle.dumps(RunsACommand(f"touch {marker}")))
    storage.upload(planted, latest.uuid)
    with det_cluster.emulated_cluster(tmp_path, store=storage) as cluster:
        cluster.master.checkpoints.append(dataclasses.replace(latest))
        record = cluster.run_trial({**conf, "max_restarts": 0}, hp, slots_per_container=2, timeout=200)
    log = record.logs[0]
    assert record.exit_codes[0] != 0 and not marker.exists()
    assert re.search(rf"\[rank=1\].*error: DET_LATEST_CHECKPOINT .*{latest.uuid}/trial_state\.pkl", log), log[
        -3000:
    ]
    assert not [r for r in cluster.master.metrics if r["group"] == "training"]


# --------------------------------------------------------------------------------------------
# The scaling report from a master's answers (Determined's SDK against the stand-in).
# --------------------------------------------------------------------------------------------
