"""The plan before launch tells the truth: `train.py --dry-run` counts the training windows, batches,
optimizer steps, warm-up and validation points that the run then does (locally and on the
emulated cluster), warns where the measurements predict an F1 cost or waste -- and stays silent on
every shipped YAML -- and the project's scaling and search tools compare fair recipes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from extractive_qa.config import experiment, run_plan
from extractive_qa.dry_run import STEP_FLOOR
from extractive_qa.trial.optimization import linear_warmup_decay
from extractive_qa.trial.optimizer_recipes import OPTIMIZER_RECIPES
from tests.support.project import ROOT, run_cli, run_train, tiny_config, write_yaml


def dry(config: Path, *extra: str) -> dict[str, Any]:
    return run_cli(["train.py", "--config", str(config), "--dry-run", *extra])


def epoch_config(model: Path, tmp: Path) -> dict[str, Any]:
    """Two epochs of the v1.1 train excerpt, a validation every 10 batches, a report per batch."""
    conf = tiny_config(model, tmp)
    conf["hyperparameters"].update(
        train_length={"type": "const", "val": {"epochs": 2}}, warmup_ratio=0.25, global_batch_size=32
    )
    conf["min_validation_period"] = {"batches": 10}
    conf["scheduling_unit"] = 1
    return conf


def test_the_counts_are_what_the_run_then_does(tiny_bert: Path, tmp_path: Path) -> None:
    conf = epoch_config(tiny_bert, tmp_path)
    path = write_yaml(conf, tmp_path / "exp.yaml")
    plan = dry(path)
    assert plan["training_windows_from"].startswith("counted") and plan["training_windows"] > 0
    assert plan["batches"] == 2 * plan["batches_per_epoch"] and plan["optimizer_steps"] == plan["batches"]
    assert plan["warmup_steps"] == int(0.25 * plan["optimizer_steps"])
    metrics = tmp_path / "metrics.json"
    code, result, err = run_train(
        ["--config", str(path), "--checkpoint-dir", str(tmp_path / "c"), "--metrics-out", str(metrics)]
    )
    assert code == 0, err
    assert result["steps_completed"] == plan["batches"]
    series = json.loads(metrics.read_text())
    validated = [r["steps_completed"] for r in series["validation"]]
    assert validated == plan["validations"]["at_batches"]
    # The learning rate of every step follows the schedule of the counted steps and warm-up.
    peak = plan["learning_rate"]
    factor = linear_warmup_decay(plan["optimizer_steps"], plan["warmup_steps"])
    lrs = [r["metrics"]["lr"] for r in series["training"]]
    assert lrs == pytest.approx([peak * factor(step) for step in range(len(lrs))], rel=1e-6)
    # A second dry run finds the cache the run built: the same count, exactly.
    again = dry(path)
    assert again["training_windows_from"].startswith("feature cache")
    assert again["training_windows"] == plan["training_windows"]


def test_the_counts_match_the_emulated_cluster(tiny_bert: Path, tmp_path: Path) -> None:
    from tests.support import det_cluster

    if (why := det_cluster.supported()) is not None:
        pytest.skip(f"emulated cluster: {why}")
    conf = epoch_config(tiny_bert, tmp_path)
    conf["hyperparameters"]["train_length"]["val"] = {"epochs": 1}
    plan = dry(write_yaml(conf, tmp_path / "exp.yaml"))
    hp = experiment.local_hparams(conf)
    with det_cluster.emulated_cluster(tmp_path) as cluster:
        record = cluster.run_trial(experiment.with_master_defaults(conf), hp, timeout=400)
        assert record.exit_codes == [0], record.failures()
        validated = [v["steps_completed"] for v in cluster.master.validations()]
    assert validated == plan["validations"]["at_batches"]


def test_every_shipped_yaml_plans_without_a_warning() -> None:
    for name in sorted(p.name for p in ROOT.glob("*.yaml")):
        plan = dry(ROOT / name)
        assert plan["warnings"] == [], (name, plan["warnings"])
        assert plan["optimizer_steps"] is not None or plan["training_windows"] is None, name


def test_the_official_file_gets_an_estimate_marked_as_one() -> None:
    plan = dry(ROOT / "distributed.yaml")
    if plan["training_windows_from"].startswith(("counted", "feature cache")):
        pytest.skip("the official training file is on this machine: counted, not estimated")
    assert plan["training_windows_from"].startswith("estimate") and plan["training_windows"] == 88_600
    assert plan["optimizer_steps"] == 2 * -(-88_600 // 96)  # 2 epochs of 96-window batches


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        # 8x the reference batch with aggregation: 24 optimizer steps on the bundled text
        (["hyperparameters.global_batch_size=64", "optimizations.aggregation_frequency=2"], str(STEP_FLOOR)),
        (["hyperparameters.optimizer=radam", "hyperparameters.adam_beta2=0.999"], "rectifier"),
        (["min_validation_period={batches: 4}", "optimizations.aggregation_frequency=2"], "a validation"),
        (["data.max_seq_length=96", "data.doc_stride=64", "data.max_query_length=16"], "repeat part"),
    ],
)
def test_each_warning_fires_on_a_config_made_to_trip_it(overrides: list[str], needle: str) -> None:
    args = [arg for item in overrides for arg in ("--set", item)]
    plan = dry(ROOT / "local.yaml", *args)
    assert any(needle in w for w in plan["warnings"]), plan["warnings"]


@pytest.mark.parametrize(
    ("config", "overrides", "device", "warned"),
    [
        # bf16 at the shipped 12 per GPU: measured slower than fp32 + TF32 on an H100
        ("distributed.yaml", ["hyperparameters.precision=bf16"], "cpu", True),  # 8 GPUs, planned here
        ("const.yaml", ["hyperparameters.precision=fp16"], "cuda", True),  # one GPU, this machine's
        ("const.yaml", ["hyperparameters.precision=bf16"], "cpu", False),  # a CPU run: bf16 is fast
        ("const.yaml", ["hyperparameters.precision=bf16", "hyperparameters.global_batch_size=64"], "cuda", 0),
        ("const.yaml", ["hyperparameters.precision=auto"], "cuda", False),  # auto is fp32 + TF32 there
    ],
)
def test_bf16_at_a_small_per_gpu_batch_is_warned_of_where_it_runs_on_gpus(
    config: str, overrides: list[str], device: str, warned: bool | int
) -> None:
    """docs/gpu.md: at 12-32 windows per GPU bf16 autocast was slower than fp32 with TF32."""
    from extractive_qa.dry_run import speed_warnings

    conf = experiment.load_experiment(ROOT / config, overrides)
    slots = experiment.slots_of(conf)
    plan = run_plan.run_plan(conf, experiment.local_hparams(conf), slots)
    found = [w for w in speed_warnings(plan, slots, device) if "windows per GPU" in w]
    assert bool(found) == warned, found


def test_torch_compile_over_dynamic_widths_is_warned_of_and_buckets_are_not() -> None:
    plan = dry(ROOT / "const.yaml", "--set", "hyperparameters.torch_compile=true")
    assert any("compiled again for every padded width, up to 48" in w for w in plan["warnings"]), plan
    bucketed = ["hyperparameters.batching=buckets", "hyperparameters.pad_to_multiple_of=64"]
    args = [a for o in ["hyperparameters.torch_compile=true", *bucketed] for a in ("--set", o)]
    assert not any("torch_compile" in w for w in dry(ROOT / "const.yaml", *args)["warnings"])


def test_the_scaling_series_takes_each_optimizers_recipe() -> None:
    import scaling

    base = experiment.load_yaml(ROOT / "distributed.yaml")
    series = {v.optimizer: v for v in scaling.variants(base, [8], [1], ["adamw", "radam", "lamb"], "t")}
    radam = series["radam"].config["hyperparameters"]
    shipped = experiment.load_yaml(ROOT / "multi_machine.yaml")["hyperparameters"]
    for key, value in OPTIMIZER_RECIPES["radam"].items():
        assert radam[key] == value == shipped[key], key
    adamw = series["adamw"]
    assert series["lamb"].learning_rate == pytest.approx(
        adamw.learning_rate * OPTIMIZER_RECIPES["lamb"]["learning_rate_factor"]
    )


def test_every_trial_of_the_search_meets_a_rung_having_seen_the_same_samples() -> None:
    conf = experiment.load_yaml(ROOT / "search.yaml")
    hparams = conf["hyperparameters"]
    searched = {n for n, s in hparams.items() if isinstance(s, dict) and s.get("type") != "const"}
    assert "global_batch_size" not in searched  # the samples per batch are the same for every trial
    assert "aggregation_frequency" not in (conf.get("optimizations") or {})
    plan = dry(ROOT / "search.yaml")
    batch = conf["hyperparameters"]["global_batch_size"]
    for bracket in plan["asha_rungs"]:
        for rung in bracket:
            assert rung["samples"] == rung["batches"] * batch
    # Whatever values the searcher draws, a rung is the same number of samples.
    for lr, warmup in ((1e-5, 0.0), (2e-4, 0.2)):
        other = dry(
            ROOT / "search.yaml",
            "--set", f"hyperparameters.learning_rate={lr}", "--set", f"hyperparameters.warmup_ratio={warmup}",
        )  # fmt: skip
        assert other["asha_rungs"] == plan["asha_rungs"]


def test_the_dry_run_asks_no_network() -> None:
    """A hub model name not downloaded yet: the plan says so instead of asking the hub (before,
    an offline dry run retried for about 25 s per YAML)."""
    import os
    import subprocess
    import sys
    import time

    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env["HF_ENDPOINT"] = "http://127.0.0.1:9"  # nothing listens: any request fails or hangs
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "train.py", "--config", "const.yaml", "--dry-run"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Retrying" not in done.stderr and "127.0.0.1:9" not in done.stderr
    assert time.perf_counter() - started < 20


def test_a_relative_data_file_outside_the_upload_is_warned_of(tmp_path: Path) -> None:
    """A cluster trial works in the upload: a relative file .detignore leaves out, or one outside
    the project, is not there (a local run still finds it). One that is nowhere: bad_configs."""
    import os
    import shutil

    left_out = dry(ROOT / "local.yaml", "--set", "data.train_file=squad_data/train-v1.1-excerpt.json")
    assert any("left out of the upload by .detignore" in w for w in left_out["warnings"])
    elsewhere = shutil.copy(ROOT / "squad_data" / "dev-v1.1-excerpt.json", tmp_path / "dev.json")
    relative = os.path.relpath(elsewhere, ROOT)
    outside = dry(ROOT / "local.yaml", "--set", f"data.validation_file={relative}")
    assert any("data.validation_file" in w and "outside the project" in w for w in outside["warnings"])
    assert not any("upload" in w for w in dry(ROOT / "local.yaml")["warnings"])
