"""Trials on the emulated cluster as the tests run them: a repo YAML shaped for a tiny run, one
trial run to its end, and the comparisons the cluster tests share."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from extractive_qa.config import experiment
from extractive_qa.io.files import ROOT
from tests.support import det_cluster
from tests.support.project import DEV_V1, TRAIN_V1, one_process_scores

WHY_NOT = det_cluster.supported()
needs_containers = pytest.mark.skipif(WHY_NOT is not None, reason=f"emulated cluster: {WHY_NOT}")


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
    ckpt = cluster.checkpoint_dir(cluster.master.checkpoints[-1].uuid)
    single = one_process_scores(ckpt, DEV_V1, tmp)
    val = cluster.master.validations()[-1]["metrics"]
    assert single["exact_match"] == val["exact_match"] and single["f1"] == val["f1"]


def trial_run(
    tmp: Path, conf: dict, hp: dict, slots: int = 1, store: Any = None, **kw: Any
) -> tuple[Any, Any]:
    with det_cluster.emulated_cluster(tmp, store=store) as cluster:
        if "on_report" in kw:
            cluster.master.on_report = kw.pop("on_report")(cluster)
        record = cluster.run_trial(conf, hp, slots_per_container=slots, timeout=400, **kw)
        assert cluster.master.errors == [], cluster.master.errors
        return cluster, record
