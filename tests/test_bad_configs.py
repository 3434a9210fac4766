"""Bad configs and launch settings: every malformed config ends in a message that names the field
and says what to do (exit 2), before any work -- never a traceback. Table-driven: each probe is a
change to local.yaml run through `train.py --dry-run`."""

from __future__ import annotations

import contextlib
import copy
import io
import json
from pathlib import Path
from typing import Any

import pytest

from extractive_qa.config import experiment
from tests.support.project import ROOT, run_train

BASE = experiment.load_yaml(ROOT / "local.yaml")


# --------------------------------------------------------------------------------------------
# Configs: each probe a change to local.yaml, refused by the dry run.
# --------------------------------------------------------------------------------------------


def asha(**searcher: Any) -> dict[str, Any]:
    conf = experiment.load_yaml(ROOT / "search.yaml")
    conf["searcher"].update(searcher)
    return conf


def changed(path: str, value: Any, conf: dict[str, Any] | None = None) -> dict[str, Any]:
    """local.yaml (or `conf`) with the dotted `path` set to `value` (None: removed)."""
    out = copy.deepcopy(conf if conf is not None else BASE)
    *parents, last = path.split(".")
    node = out
    for part in parents:
        node = node.setdefault(part, {})
    if value is None:
        node.pop(last, None)
    else:
        node[last] = value
    return out


def lr_space(spec: dict[str, Any]) -> dict[str, Any]:
    return changed("hyperparameters.learning_rate", spec)


def hp(name: str, value: Any) -> dict[str, Any]:
    return changed(f"hyperparameters.{name}", {"type": "const", "val": value})


# (probe id) -> (config, a string the error must contain)
PROBES: dict[str, tuple[Any, str]] = {
    "slots-zero": (changed("resources.slots_per_trial", 0), "resources.slots_per_trial"),
    "slots-word": (changed("resources.slots_per_trial", "two"), "resources.slots_per_trial"),
    "slots-negative": (changed("resources.slots_per_trial", -2), "resources.slots_per_trial"),
    "slots-fraction": (changed("resources.slots_per_trial", 1.9), "resources.slots_per_trial"),
    "resources-list": (changed("resources", [1]), "resources"),
    "seed-word": (changed("reproducibility.experiment_seed", "abc"), "reproducibility.experiment_seed"),
    "seed-negative": (changed("reproducibility.experiment_seed", -1), "reproducibility.experiment_seed"),
    "seed-2-to-the-32": (
        changed("reproducibility.experiment_seed", 2**32),
        "reproducibility.experiment_seed",
    ),
    "retention-word": (changed("checkpoint_storage.save_trial_latest", "abc"), "save_trial_latest"),
    "epsilon-zero": (hp("adam_epsilon", 0), "adam_epsilon"),
    "weight-decay-huge": (hp("weight_decay", 1e9), "weight_decay"),
    "reproducibility-number": (changed("reproducibility", 5), "reproducibility"),
    "scheduling-word": (changed("scheduling_unit", "often"), "scheduling_unit"),
    "scheduling-zero": (changed("scheduling_unit", 0), "scheduling_unit"),
    "length-zero": (hp("train_length", {"batches": 0}), "train_length"),
    "length-negative": (hp("train_length", {"epochs": -1}), "train_length"),
    "length-two-units": (hp("train_length", {"epochs": 1, "batches": 5}), "train_length"),
    "length-word": (hp("train_length", "long"), "train_length"),
    "asha-divisor-one": (asha(divisor=1), "searcher.divisor"),
    "asha-max-time-zero": (asha(max_time=0), "searcher.max_time"),
    "asha-max-trials-zero": (asha(max_trials=0), "searcher.max_trials"),
    "asha-max-rungs-zero": (asha(max_rungs=0), "searcher.max_rungs"),
    "asha-mode": (asha(mode="wild"), "searcher.mode"),
    "asha-time-metric": (asha(time_metric="seconds"), "searcher.time_metric"),
    "searcher-name": (changed("searcher.name", "bogus"), "searcher.name"),
    "searcher-no-name": (changed("searcher.name", None), "searcher.name"),
    "searcher-no-metric": (changed("searcher.metric", None), "searcher.metric"),
    "searcher-list": (changed("searcher", ["single"]), "searcher"),
    "categorical-no-vals": (lr_space({"type": "categorical"}), "learning_rate"),
    "categorical-empty": (
        changed("hyperparameters.learning_rate", {"type": "categorical", "vals": []}),
        "learning_rate",
    ),
    "range-inverted": (
        changed("hyperparameters.learning_rate", {"type": "double", "minval": 1e-3, "maxval": 1e-5}),
        "learning_rate",
    ),
    "range-under-single": (
        changed("hyperparameters.learning_rate", {"type": "double", "minval": 1e-5, "maxval": 1e-3}),
        "searcher",
    ),
    "hp-type-unknown": (lr_space({"type": "uniform", "val": 1}), "learning_rate"),
    "hyperparameters-list": (changed("hyperparameters", [1, 2]), "hyperparameters"),
    "optimizations-number": (changed("optimizations", 5), "optimizations"),
    "aggregation-bool": (changed("optimizations.aggregation_frequency", True), "aggregation_frequency"),
    "aggregation-zero": (changed("optimizations.aggregation_frequency", 0), "aggregation_frequency"),
    "compression-word": (changed("optimizations.gradient_compression", "yes"), "gradient_compression"),
    "average-number": (
        changed("optimizations.average_aggregated_gradients", 3),
        "average_aggregated_gradients",
    ),
    "optimizations-typo": (changed("optimizations.agregation_frequency", 2), "agregation_frequency"),
    "profiling-bool": (changed("profiling", True), "profiling"),
    "profiling-enabled-word": (changed("profiling.enabled", "sure"), "profiling.enabled"),
    "top-level-typo": (changed("min_validaton_period", {"epochs": 1}), "min_validaton_period"),
    "validation-negative": (changed("min_validation_period", {"batches": -5}), "min_validation_period"),
    "validation-unit": (changed("min_validation_period", {"seconds": 5}), "min_validation_period"),
    "checkpoint-period-number": (changed("min_checkpoint_period", 7), "min_checkpoint_period"),
    "checkpoint-policy": (changed("checkpoint_policy", "sometimes"), "checkpoint_policy"),
    "metric-never-reported": (changed("searcher.metric", "accuracy"), "searcher.metric: 'accuracy'"),
    "metric-of-v2-on-v1": (changed("searcher.metric", "best_f1"), "SQuAD 1.1 validation"),
    "env-vars-map": (changed("environment.environment_variables", {"A": 1}), "environment_variables.A"),
    "env-vars-no-equals": (changed("environment.environment_variables", ["A"]), "NAME=VALUE"),
    "initial-validation-word": (changed("perform_initial_validation", "yes"), "perform_initial_validation"),
    "max-restarts-negative": (changed("max_restarts", -1), "max_restarts"),
    "records-negative": (changed("records_per_epoch", -3), "records_per_epoch"),
    "lr-negative": (hp("learning_rate", -1), "learning_rate"),
    "lr-zero": (hp("learning_rate", 0), "learning_rate: must be > 0"),
    "lr-word": (hp("learning_rate", "fast"), "learning_rate"),
    "lr-infinite": (hp("learning_rate", float("inf")), "learning_rate"),
    "batch-zero": (hp("global_batch_size", 0), "global_batch_size"),
    "batch-indivisible": (changed("resources.slots_per_trial", 3), "global_batch_size"),
    "warmup-above-one": (hp("warmup_ratio", 1.5), "warmup_ratio"),
    "weight-decay-negative": (hp("weight_decay", -1), "weight_decay"),
    "optimizer": (hp("optimizer", "sgd"), "optimizer"),
    "lr-scaling": (hp("lr_scaling", "cubic"), "lr_scaling"),
    "batching": (hp("batching", "weird"), "batching"),
    "precision": (hp("precision", "fp8"), "precision"),
    "attention": (hp("attn_implementation", "flashy"), "attn_implementation"),
    "hp-typo": (hp("learnin_rate", 1e-4), "learnin_rate"),
    "data-list": (changed("data", ["x"]), "data"),
    "data-typo": (changed("data.max_seq_len", 128), "max_seq_len"),
    "squad-version": (changed("data.squad_version", "3.0"), "squad_version"),
    # v1.1 files (they say so, and none of their questions can be unanswerable) trained as v2.0
    "squad-version-not-the-files": (
        changed("data.squad_version", "2.0"),
        "is SQuAD v1.1 (it says so, and no question in it can be unanswerable) but data.squad_version is 2.0",
    ),
    "no-answer-weight-overflows": (
        hp("no_answer_loss_weight", 1e300),
        "no_answer_loss_weight: must be <= 100",
    ),
    "seq-zero": (changed("data.max_seq_length", 0), "max_seq_length"),
    "stride-word": (changed("data.doc_stride", "x"), "doc_stride"),
    "stride-above-window": (changed("data.doc_stride", 256), "doc_stride"),
    "query-above-window": (changed("data.max_query_length", 300), "max_query_length"),
    "seq-above-model-positions": (changed("data.max_seq_length", 100000), "max_seq_length"),
    "nbest-zero": (changed("data.n_best_size", 0), "n_best_size"),
    "eval-batch-zero": (changed("data.eval_batch_size", 0), "eval_batch_size"),
    "workers-negative": (changed("data.num_workers", -1), "num_workers"),
    "workers-thousands": (changed("data.num_workers", 5000), "data.num_workers: must be <= 64"),
    "batch-astronomic": (hp("global_batch_size", 10**20), "global_batch_size: must be <= 65,536"),
    "eval-batch-astronomic": (changed("data.eval_batch_size", 10**9), "data.eval_batch_size: must be <="),
    "train-file-missing": (changed("data.train_file", "squad_data/nope.json"), "relative paths start"),
    "python-object-tag": ("name: !!python/object/apply:os.system ['true']\n", "could not determine a"),
    "duplicate-key": (
        "name: a\nhyperparameters:\n  learning_rate: 1e-4\n  learning_rate: 1e-2\n",
        "given twice",
    ),
    "train-file-number": (changed("data.train_file", 5), "train_file"),
    "timeout-word": (
        changed("environment", {"environment_variables": ["SQUAD_COLLECTIVE_TIMEOUT_S=soon"]}),
        "SQUAD_COLLECTIVE_TIMEOUT_S",
    ),
    "deep-nesting": ("hyperparameters: " + "[" * 5000 + "]" * 5000, "deep-nesting.yaml"),
    "huge-int": ("scheduling_unit: " + "9" * 5000 + "\n", "huge-int.yaml"),
    "not-a-mapping": ("- just\n- a list\n", "mapping"),
    # Values a master's schema refuses and this trial took: a "maybe" kept the worst checkpoint
    # as the best, a list as the name reached every model card.
    "smaller-is-better-maybe": (changed("searcher.smaller_is_better", "maybe"), "searcher.smaller_is_better"),
    "name-a-list": (changed("name", [1, 2]), "name: expected text"),
    "description-too-long": (changed("description", "x" * 20_000), "description: expected text of at most"),
    "labels-not-strings": (changed("labels", [1]), "labels: expected a list of strings"),
    "storage-type-unknown": (changed("checkpoint_storage", {"type": "nope"}), "checkpoint_storage.type"),
    "storage-bucket-a-number": (
        changed("checkpoint_storage", {"type": "s3", "bucket": 5}),
        "checkpoint_storage.bucket",
    ),
    "storage-key-of-another-type": (
        changed("checkpoint_storage", {"type": "gcs", "host_path": "/x"}),
        "host_path",
    ),
    "storage-azure-container-with-a-path": (  # Determined uploads there and cannot list it back
        changed("checkpoint_storage", {"type": "azure", "container": "my-checkpoints/squad"}),
        "checkpoint_storage.container: 'my-checkpoints/squad' names a path inside a container",
    ),
    "learning-rate-above-1": (hp("learning_rate", 2.0), "hyperparameters.learning_rate: must be <= 1.0"),
    "broken-yaml": ("name: [unclosed\n", "YAML"),
    "empty-file": ("", "mapping"),
}


def dry_run(config: Path, *extra: str) -> tuple[int, str, str]:
    import train

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = train.main(["--config", str(config), "--dry-run", *extra])
        except SystemExit as stop:  # argparse's own exit for bad flags
            code = stop.code
    return code, out.getvalue(), err.getvalue()


def write_probe(conf: Any, path: Path) -> Path:
    if isinstance(conf, str):
        path.write_text(conf)
    else:  # JSON is YAML (and keeps inf, which the master's JSON would refuse too)
        path.write_text(json.dumps(conf))
    return path


@pytest.mark.parametrize("probe", sorted(PROBES))
def test_each_malformed_config_is_a_named_error_in_the_dry_run(probe: str, tmp_path: Path) -> None:
    conf, needle = PROBES[probe]
    path = write_probe(conf, tmp_path / f"{probe}.yaml")
    code, out, err = dry_run(path)
    assert code == 2, f"{probe}: exit {code}, stdout {out[-300:]!r}, stderr {err[-500:]!r}"
    assert "Traceback" not in err and needle in err, f"{probe}: {err[-800:]!r}"
    assert out == ""  # no plan printed for a config that cannot run


def test_every_shipped_yaml_passes() -> None:
    for name in sorted(p.name for p in ROOT.glob("*.yaml")):
        code, _, err = dry_run(ROOT / name)
        assert code == 0, f"{name}: {err}"


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("hyperparameter.learning_rate=1", "(did you mean hyperparameters?)"),
        ("hyperparameters.learnin_rate=1", "(did you mean hyperparameters.learning_rate?)"),
        ("data.max_seq_len=128", "(did you mean data.max_seq_length?)"),
        ("optimizations.agregation_frequency=2", "(did you mean optimizations.aggregation_frequency?)"),
        ("data.zzzq=1", "data has no 'zzzq' (a typo?)"),
        ("no_equals_sign", "--set"),
        ("hyperparameters.global_batch_size=abc", "global_batch_size"),
    ],
)
def test_set_paths_that_do_not_exist_are_refused(override: str, needle: str) -> None:
    """A --set typo is named with the nearest key, where one is close."""
    code, out, err = dry_run(ROOT / "local.yaml", "--set", override)
    assert code == 2 and needle in err and "Traceback" not in err, err


# --------------------------------------------------------------------------------------------
# The master's schemas, and the processes of a local run.
# --------------------------------------------------------------------------------------------


def test_the_key_lists_are_the_masters_schemas() -> None:
    """schema's key lists equal Determined 0.38's experiment-config schemas."""
    from extractive_qa.config.schema import SEARCHER_KEYS, SECTION_KEYS, TOP_LEVEL_KEYS

    schemas = ROOT.parent / "shared" / "determined-expconf"
    if not schemas.is_dir():
        pytest.skip("../shared/determined-expconf (the master's schemas) is not beside the repo")

    def properties(name: str) -> set[str]:
        return set(json.loads((schemas / name).read_text())["properties"])

    assert TOP_LEVEL_KEYS == properties("experiment.json")
    for section, keys in SECTION_KEYS.items():
        assert keys == properties(f"{section}.json"), section
    for searcher, keys in SEARCHER_KEYS.items():
        assert keys == properties(f"searcher-{searcher.replace('_', '-')}.json"), searcher


@pytest.mark.parametrize("value", ["abc", "0", "2"])
def test_a_world_size_not_set_by_torchrun_is_named(value: str, tmp_path: Path, monkeypatch) -> None:

    monkeypatch.setenv("WORLD_SIZE", value)
    for name in ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "MASTER_ADDR"):
        monkeypatch.delenv(name, raising=False)
    code, _, err = run_train(["--batches", "1", "--checkpoint-dir", str(tmp_path / "c")])
    assert code == 2 and f"WORLD_SIZE={value}" in err.replace("'", "") and "torchrun" in err, err[-1500:]


def test_a_local_series_with_more_processes_than_cores_is_refused(tmp_path: Path) -> None:
    import os

    import scaling

    too_many = str((os.cpu_count() or 1) + 1)
    args = ["local", "--config", str(ROOT / "local.yaml"), "--slots", too_many, "--batches", "2",
            "--out", str(tmp_path)]  # fmt: skip
    assert scaling.main(args) == 2
    assert not (tmp_path / "runs").exists()  # refused before the first run
    a_file = tmp_path / "report.md"
    a_file.write_text("kept")
    args = [*args[:4], "1", "--batches", "2", "--out", str(a_file)]  # --slots 1, --out a file
    assert scaling.main(args) == 2 and a_file.read_text() == "kept"


def test_a_learning_rate_far_out_of_range_warns_with_the_plan(tmp_path: Path) -> None:
    """hyperparameters.learning_rate 0.5 may be a probe on purpose: the plan is printed (exit 0)
    with a warning naming the field and the usual range."""
    code, out, err = dry_run(ROOT / "local.yaml", "--set", "hyperparameters.learning_rate=0.5")
    assert code == 0, err
    warnings = json.loads(out.splitlines()[-1])["warnings"]
    assert any("hyperparameters.learning_rate" in w and "diverges" in w for w in warnings), warnings


def test_a_config_missing_from_another_directory_names_where_the_projects_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--config local.yaml` typed in another directory: the error says the path is taken from
    there and names the project's file; an unknown name lists the project's YAMLs."""
    monkeypatch.chdir(tmp_path)
    code, _, err = run_train(["--config", "local.yaml", "--dry-run"])
    assert code == 2 and f"The project's local.yaml is {ROOT / 'local.yaml'}" in err, err
    code, _, err = run_train(["--config", "nope.yaml", "--dry-run"])
    assert code == 2 and "The project's configs are in" in err and "distributed.yaml" in err, err
