"""The trial through Determined's local Trainer (tiny random-init BERT, real SQuAD text)."""

from __future__ import annotations

import concurrent.futures
import json
import logging
import math
import os
import subprocess
from pathlib import Path

import pytest
import torch

from extractive_qa import scaling_runs
from extractive_qa.config.schema import VALIDATION_METRICS
from extractive_qa.data.features import load_tokenizer
from extractive_qa.errors import DataError
from extractive_qa.qa import mixed_precision
from tests.support import allreduce_probe
from tests.support.cli_result import last_json
from tests.support.project import (
    DEV_V2,
    ROOT,
    one_process_scores,
    run_cli,
    run_train,
    tiny_config,
    write_yaml,
)


def _run(conf: dict, tmp: Path, *extra: str) -> tuple[int, dict | None, str]:
    path = write_yaml(conf, tmp / "exp.yaml")
    return run_train(["--config", str(path), "--checkpoint-dir", str(tmp / "ckpt"), *extra])


def _state(checkpoint: str) -> dict:
    """Determined's state_dict.pth that this test's run just wrote."""
    from extractive_qa import compat

    # torch < 2.4 cannot allow the NumPy RNG types under weights_only (compat.py); there
    # Determined itself loads the file unrestricted, and so does this test.
    restricted = compat.allow_determined_checkpoints()
    return torch.load(Path(checkpoint) / "state_dict.pth", map_location="cpu", weights_only=restricted)


@pytest.mark.cluster_stack
def test_train_validate_checkpoint_and_hf_export(tiny_bert: Path, tmp_path: Path) -> None:
    code, result, err = _run(tiny_config(tiny_bert, tmp_path), tmp_path)
    assert code == 0, err
    assert result["steps_completed"] == 4 and math.isfinite(result["last_train_loss"])
    assert 0 <= result["exact_match"] <= result["f1"] <= 100
    assert set(VALIDATION_METRICS["1.1"]) <= set(result)  # what searcher.metric may name is reported
    ckpt = Path(result["checkpoint"])
    assert (ckpt / "state_dict.pth").is_file() and (ckpt / "hf" / "model.safetensors").is_file()
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer

    model = AutoModelForQuestionAnswering.from_pretrained(ckpt / "hf")
    tok = AutoTokenizer.from_pretrained(ckpt / "hf")
    saved = _state(result["checkpoint"])["models_state_dict"][0]
    assert torch.equal(model.qa_outputs.weight, saved["qa_outputs.weight"])
    # transformers 5 has no question-answering pipeline; plain transformers inference works.
    enc = tok("Who won?", "The Denver Broncos won Super Bowl 50.", return_tensors="pt")
    with torch.no_grad():
        out = model(**enc)
    assert out.start_logits.shape == enc["input_ids"].shape and torch.isfinite(out.end_logits).all()
    # Only what a trial needs travels in the checkpoint's code/ (the .detignore at work).
    code_files = {p.name for p in (ckpt / "code").iterdir()}
    assert "model_def.py" in code_files and not code_files & {"tests", "bench", "checkpoints"}
    # of the bundled text, what local.yaml and local_v2.yaml read (so they run on a cluster too)
    # and its licence
    bundled = {p.name for p in (ckpt / "code" / "squad_data").iterdir()}
    local = {"local-train-v1.1.json", "dev-v1.1-excerpt.json", "local-train-v2.0.json", "local-dev-v2.0.json"}
    assert bundled == {"README.md", *local}


@pytest.mark.parametrize("optimizer, precision", [("adamw", "bf16"), ("radam", "fp32"), ("lamb", "fp32")])
def test_each_optimizer_and_precision(
    optimizer: str, precision: str, tiny_bert: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    conf = tiny_config(tiny_bert, tmp_path)
    conf["hyperparameters"].update(optimizer=optimizer, precision=precision, learning_rate=5e-3)
    code, result, err = _run(conf, tmp_path, "--batches", "6")
    assert code == 0, err
    from transformers import AutoModelForQuestionAnswering

    init = AutoModelForQuestionAnswering.from_pretrained(tiny_bert).state_dict()
    trained = _state(result["checkpoint"])["models_state_dict"][0]
    assert not torch.equal(init["qa_outputs.weight"], trained["qa_outputs.weight"])  # it trained
    assert math.isfinite(result["last_train_loss"])
    # 6 optimizer steps are far too few for RAdam's rectifier: the run says so before training.
    warned = [r for r in caplog.records if "rectifier keeps the step under half" in r.getMessage()]
    assert len(warned) == (optimizer == "radam")


@pytest.mark.parametrize("units", [["AVX512-BF16"], []], ids=["bf16-units", "no-bf16-units"])
def test_auto_precision_is_settled_on_the_machine_said_and_saved(
    units: list[str], tiny_bert: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    """`precision: auto` on a CPU with and without bf16 matrix units (torch's probe forced both
    ways): the dry run and the run's model line say what was picked and why, and the checkpoint's
    qa_settings.json holds the pick, so predict.py answers with the same arithmetic."""
    monkeypatch.setattr(mixed_precision, "cpu_bf16_units", lambda: units)
    caplog.set_level(logging.INFO, logger="squad")
    want = (
        ("bf16", "auto: this CPU has AVX512-BF16")
        if units
        else ("fp32", "auto: this CPU has no bf16 matrix units (AMX, AVX512-BF16)")
    )
    conf = tiny_config(tiny_bert, tmp_path)
    conf["hyperparameters"]["precision"] = "auto"
    code, plan, err = _run(conf, tmp_path, "--dry-run")
    assert code == 0, err
    assert plan["precision"] == f"{want[0]} ({want[1]})"
    code, result, err = _run(conf, tmp_path, "--batches", "2")
    assert code == 0, err
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("model ")]
    assert said and f"precision {want[0]} ({want[1]})" in said[0], said
    saved = json.loads((Path(result["checkpoint"]) / "hf" / "qa_settings.json").read_text())
    assert saved["precision"] == want[0]


def test_gradient_checkpointing_in_bf16_changes_nothing_but_memory(tiny_bert: Path, tmp_path: Path) -> None:
    results = []
    for on in (False, True):
        (tmp_path / str(on)).mkdir()
        conf = tiny_config(tiny_bert, tmp_path / str(on))
        conf["hyperparameters"].update(precision="bf16", gradient_checkpointing=on)
        code, result, err = _run(conf, tmp_path / str(on), "--batches", "3")
        assert code == 0, err
        results.append(result)
    for key in ("last_train_loss", "exact_match", "f1"):
        assert results[0][key] == pytest.approx(results[1][key], abs=1e-6), key


def test_a_gpu_torch_cannot_use_leaves_the_local_run_on_the_cpu(
    tiny_bert: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """nvidia-smi lists a GPU that torch cannot use (`CUDA_VISIBLE_DEVICES=` on a GPU machine, or a
    CPU build of torch there): Determined's local Trainer counts it, and without
    det_internals.local_gpus_torch_sees the run fails moving the model to CUDA; with it, the run
    trains on the CPU."""
    if torch.cuda.is_available():
        pytest.skip("this torch sees a GPU")
    from determined import gpu

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, GPU-00000000-0000-0000-0000-000000000000, 0, 0, 81559'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    assert len(gpu.get_gpu_uuids()) == 1  # what the local Trainer counts
    code, result, err = _run(tiny_config(tiny_bert, tmp_path), tmp_path, "--batches", "2")
    assert code == 0, err[-3000:]
    assert result["steps_completed"] == 2


def test_aggregation_frequency_from_the_yaml_reaches_the_trial(tiny_bert: Path, tmp_path: Path) -> None:
    conf = tiny_config(tiny_bert, tmp_path)
    conf["optimizations"] = {"aggregation_frequency": 2}
    conf["hyperparameters"]["warmup_ratio"] = 0.25
    code, result, err = _run(conf, tmp_path, "--batches", "8")
    assert code == 0, err
    state = _state(result["checkpoint"])
    opt = state["optimizers_state_dict"][0]
    steps = {float(s["step"]) for s in opt["state"].values()}
    assert steps == {4.0}, "8 batches at aggregation 2 are 4 optimizer steps"
    sched = state["lr_schedulers_state_dict"][0]
    assert sched["last_epoch"] == 4  # the schedule advances once per optimizer step
    # total 4 steps, warm-up 1 step: lr after step 4 is 0 (linear decay to the end).
    assert sched["_last_lr"][0] == 0.0


def test_resolved_learning_rate_reaches_optimizer_schedule_and_the_lr_metric(
    tiny_bert: Path, tmp_path: Path
) -> None:
    """lr_scaling sqrt from 1e-3 at 4 samples per step, run at 8 x aggregation 2 = 16: the
    optimizer and schedule peak at 2e-3, the reported lr is that peak, the dry-run says so too."""
    conf = tiny_config(tiny_bert, tmp_path)
    conf["optimizations"] = {"aggregation_frequency": 2}
    conf["hyperparameters"].update(
        learning_rate=1e-3, lr_scaling="sqrt", reference_batch_size=4, warmup_ratio=0.5
    )
    path = write_yaml(conf, tmp_path / "exp.yaml")
    metrics = tmp_path / "metrics.json"
    code, result, err = _run(conf, tmp_path, "--batches", "8", "--metrics-out", str(metrics))
    assert code == 0, err
    resolved = 1e-3 * (16 / 4) ** 0.5
    state = _state(result["checkpoint"])
    # LambdaLR keeps the rate the optimizer was built with as each group's initial_lr.
    groups = state["optimizers_state_dict"][0]["param_groups"]
    assert [g["initial_lr"] for g in groups] == [pytest.approx(resolved)] * len(groups)
    # 4 optimizer steps, warm-up 2: step 0 at half the peak, step 1 at the peak; reports of 2
    # batches (one optimizer step each) carry the rate that step was taken with.
    lrs = [r["metrics"]["lr"] for r in json.loads(metrics.read_text())["training"]]
    assert lrs[:2] == [pytest.approx(resolved / 2), pytest.approx(resolved)] and max(lrs) == lrs[1]
    dry = run_cli(["train.py", "--config", str(path), "--dry-run"])
    assert dry["learning_rate"] == pytest.approx(resolved) and dry["reference_learning_rate"] == 1e-3


def test_final_throughput_is_the_reports_own_pooled_over_windows(tiny_bert: Path, tmp_path: Path) -> None:
    """train.py's last line states the samples/s the WebUI charts (perf_samples_per_s), pooled
    over the run's windows -- one measurement, not a second clock beside it."""
    conf = tiny_config(tiny_bert, tmp_path)
    conf["scheduling_unit"] = 2
    metrics = tmp_path / "metrics.json"
    code, result, err = _run(conf, tmp_path, "--batches", "6", "--metrics-out", str(metrics))
    assert code == 0, err
    record = json.loads(metrics.read_text())
    samples, seconds, done = 0, 0.0, 0
    for report in record["training"]:
        window = (report["steps_completed"] - done) * record["global_batch_size"]
        done = report["steps_completed"]
        samples += window
        seconds += window / report["metrics"]["perf_samples_per_s"]
    assert done == 6 and len(record["training"]) == 3
    assert result["train_seconds"] == pytest.approx(seconds, abs=0.006)
    assert result["samples_per_s"] == pytest.approx(samples / seconds, rel=1e-3, abs=0.006)


def test_distilbert_without_token_type_ids(tiny_distilbert: Path, tmp_path: Path) -> None:
    code, result, err = _run(tiny_config(tiny_distilbert, tmp_path), tmp_path, "--batches", "2")
    assert code == 0, err
    assert result["steps_completed"] == 2


def test_squad_v2_reports_v2_metrics(tiny_bert: Path, tmp_path: Path) -> None:
    conf = tiny_config(
        tiny_bert, tmp_path, train_file=str(DEV_V2), validation_file=str(DEV_V2), squad_version="2.0"
    )
    code, result, err = _run(conf, tmp_path, "--batches", "2")
    assert code == 0, err
    assert result["NoAns_total"] == 702 and result["HasAns_total"] == 705
    assert {"exact", "f1", "HasAns_f1", "NoAns_exact"} <= set(result)
    assert result["exact_match"] == result["exact"]  # one EM name for both versions
    assert set(VALIDATION_METRICS["2.0"]) <= set(result)  # what searcher.metric may name is reported


BAD = {
    "optimizer": ({"hyperparameters.optimizer": "sgd"}, "hyperparameters.optimizer: 'sgd'"),
    "precision": ({"hyperparameters.precision": "fp8"}, "hyperparameters.precision: 'fp8'"),
    "fp16-on-cpu": ({"hyperparameters.precision": "fp16"}, "fp16 needs a CUDA GPU"),
    "missing-file": ({"data.train_file": "/nope/train.json"}, "/nope/train.json: no such file"),
    "version-mismatch": ({"data.train_file": str(DEV_V2)}, "set data.squad_version: 2.0"),
    "length": ({"hyperparameters.train_length": {"records": 5}}, "hyperparameters.train_length"),
    "tf32": ({"hyperparameters.tf32": "yes"}, "hyperparameters.tf32: expected true or false"),
}


@pytest.mark.parametrize("name", BAD)
def test_bad_configs_fail_before_training(name: str, tiny_bert: Path, tmp_path: Path) -> None:
    overrides, message = BAD[name]
    sets = [f"--set={k}={json.dumps(v)}" for k, v in overrides.items()]
    code, result, err = _run(tiny_config(tiny_bert, tmp_path), tmp_path, *sets)
    assert code == 2 and message in err, err
    assert "Traceback" not in err and not (tmp_path / "ckpt" / "determined").exists()


@pytest.mark.cluster_stack
def test_slow_tokenizer_is_refused(tmp_path: Path, tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tokenizer transformers hands back without character offsets (a slow, Python one) is refused
    with the reason. transformers 5 converts a slow vocabulary to a fast tokenizer by itself, and
    4.57 does so where it has a converter, so the slow one is what AutoTokenizer returns here: the
    refusal is checked on both stacks whatever their converters do."""
    import transformers

    class Slow:
        is_fast = False

    real = transformers.AutoTokenizer.from_pretrained
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: Slow())
    with pytest.raises(DataError, match="slow .Python. tokenizer.*fast .Rust."):
        load_tokenizer(str(Path(tokenizer.name_or_path)))
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", real)
    assert load_tokenizer(str(Path(tokenizer.name_or_path))).is_fast


def test_two_multi_process_runs_at_once_each_equal_a_one_process_evaluation(
    tiny_bert: Path, tmp_path: Path
) -> None:
    """Two 2-process gloo runs on one machine at once -- one in fp32, one in bf16 autocast -- each
    train and evaluate, and one process evaluating each checkpoint (predict.py at the precision
    the checkpoint saved, then squad_metric) scores the same. At once: Determined's
    DistributedContext defaults to fixed ports (12360...), on which two runs on one machine collide
    ("got non-_HelloMessage"); each run picks free ports instead."""
    runs = {}
    for precision in ("fp32", "bf16"):
        (tmp_path / precision).mkdir()
        conf = tiny_config(tiny_bert, tmp_path / precision)
        conf["hyperparameters"]["precision"] = precision
        path = write_yaml(conf, tmp_path / precision / "exp.yaml")
        program = [str(ROOT / "train.py"), "--config", str(path), "--batches", "4"]
        program += ["--checkpoint-dir", str(tmp_path / precision / "ckpt")]
        cmd, env = scaling_runs.torchrun(2, program)
        started = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        runs[precision] = (started, conf)
    for precision, (run, conf) in runs.items():
        out, err = run.communicate(timeout=600)
        assert run.returncode == 0, err[-3000:]
        result = last_json(out)
        assert result["steps_completed"] == 4
        data = conf["data"]["validation_file"]
        single = one_process_scores(result["checkpoint"], data, tmp_path / precision)
        assert (single["exact_match"], single["f1"]) == (result["exact_match"], result["f1"]), precision


def test_two_processes_all_reduce_only_on_optimizer_step_batches(tiny_bert: Path, tmp_path: Path) -> None:
    """aggregation_frequency 2 halves the all-reduces per batch (Determined alone does not: its
    no_sync() wraps only backward, and DDP decides in forward)."""
    path = write_yaml(tiny_config(tiny_bert, tmp_path), tmp_path / "exp.yaml")
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # both at once: each picks free ports
        raw = list(pool.map(lambda f: allreduce_probe.launch(path, f, 6, [], tmp_path), (1, 2)))
    one, two = (allreduce_probe.summarise(f, r, 4) for f, r in zip((1, 2), raw, strict=True))
    assert one["communicating_batches"] == one["optimizer_steps"] == 6
    assert two["communicating_batches"] == two["optimizer_steps"] == 3
    assert one["allreduce_calls_per_batch"] == one["allreduce_calls_per_step"] > 0
    assert two["allreduce_calls_per_batch"] == pytest.approx(two["allreduce_calls_per_step"] / 2)
    assert two["allreduce_mb_per_step"] == pytest.approx(one["allreduce_mb_per_step"])
