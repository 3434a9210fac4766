"""The config as a master hands it to the trial: every YAML passes the dry run with the master's
defaults filled, the cluster YAMLs are one recipe at different scales, ASHA's brackets are the
master's arithmetic, each YAML names its scale for the WebUI, and the upload carries what
local.yaml reads."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from extractive_qa.config import experiment, run_plan
from extractive_qa.config.settings import Hyperparameters
from tests.support import det_cluster, det_master
from tests.support.project import ROOT, run_cli

YAMLS = sorted(p.name for p in ROOT.glob("*.yaml"))
EXPCONF_DEFAULTS = det_cluster.EXPCONF_DEFAULTS


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
    (88.6k windows, 2 epochs, 384 per step) that form trains without optimizer_recipes.radam_warning."""
    from bench import lr_scaling, study
    from extractive_qa.trial.optimizer_recipes import radam_warning

    rows = lr_scaling.with_epochs(
        study.load(ROOT / "bench" / "results" / "unrecorded-provenance" / "lr-scaling-epyc.json", {})["rows"]
    )
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


def test_each_yaml_names_its_scale_for_the_webui() -> None:
    """description and a scale-* label: the WebUI's experiment list filters and compares by them."""
    scales = {}
    for name in YAMLS:
        conf = experiment.load_yaml(ROOT / name)
        assert isinstance(conf.get("description"), str) and conf["description"], name
        (scale,) = [label for label in conf["labels"] if label.startswith("scale-")]
        scales[name] = scale
    assert len({scales[n] for n in ("const.yaml", "distributed.yaml", "multi_machine.yaml")}) == 3
