"""A config -> a checked run plan: typed, frozen settings (every hyperparameters.* / data.* value
checked where the config is read), `--set` overrides, and the shipped YAMLs as the master checks them."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from extractive_qa import dry_run
from extractive_qa.config import experiment, run_plan
from extractive_qa.config.settings import DataSettings, Hyperparameters
from extractive_qa.errors import ConfigError
from tests.support.project import ROOT

FILES = {"train_file": "a.json", "validation_file": "b.json"}
LENGTH = {"train_length": {"epochs": 1}}


def _plan(data: dict | None = None, hparams: dict | None = None) -> run_plan.RunPlan:
    return run_plan.run_plan({"data": {**FILES, **(data or {})}}, {**LENGTH, **(hparams or {})}, slots=1)


def test_settings_are_typed_frozen_and_normalised() -> None:
    plan = _plan({"squad_version": 2, "null_score_diff_threshold": 0}, {"learning_rate": 1})
    assert isinstance(plan.hparams, Hyperparameters) and isinstance(plan.data, DataSettings)
    assert plan.hparams == dataclasses.replace(Hyperparameters(), learning_rate=1.0)
    assert plan.data.squad_version == "2.0" and _plan({"squad_version": 1.1}).data.squad_version == "1.1"
    assert isinstance(plan.hparams.learning_rate, float) and plan.data.null_score_diff_threshold == 0.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.hparams.learning_rate = 0.1  # type: ignore[misc]
    # What Determined's context hands back to the trial stays the config's own mapping.
    assert plan.init_kwargs({})["hparams"] == {**LENGTH, "learning_rate": 1}
    assert plan.data.eval_batch_size_per_slot(6) == 12
    assert _plan({"eval_batch_size": 5}).data.eval_batch_size_per_slot(6) == 5


BAD = {
    "data typo": ({"max_seq_len": 256}, {}, "data: unknown ['max_seq_len'] (a typo?)"),
    "hparam typo": ({}, {"lr": 1e-4}, "hyperparameters: unknown ['lr'] (a typo?)"),
    "text for int": ({"max_seq_length": "384"}, {}, "data.max_seq_length: expected an integer, got '384'"),
    "bool for int": ({"doc_stride": True}, {}, "data.doc_stride: expected an integer, got True"),
    "zero eval batch": ({"eval_batch_size": 0}, {}, "data.eval_batch_size: must be >= 1"),
    "negative workers": ({"num_workers": -1}, {}, "data.num_workers: must be >= 0"),
    "version": ({"squad_version": 3}, {}, "data.squad_version: 3 is not one of 1.1, 2.0"),
    "model not text": ({"pretrained_model": 5}, {}, "data.pretrained_model: expected a string"),
    "bool for number": ({}, {"learning_rate": True}, "hyperparameters.learning_rate: expected a number"),
    "nan": ({}, {"weight_decay": float("nan")}, "hyperparameters.weight_decay: expected a number"),
    "warmup": ({}, {"warmup_ratio": 1.0}, "hyperparameters.warmup_ratio: must be < 1"),
    "negative lr": ({}, {"learning_rate": -1e-5}, "hyperparameters.learning_rate: must be > 0"),
    "batch": ({}, {"global_batch_size": 0}, "hyperparameters.global_batch_size: must be >= 1"),
    "compile": ({}, {"torch_compile": "no"}, "hyperparameters.torch_compile: expected true or false"),
    "batching": ({}, {"batching": "grouped"}, "hyperparameters.batching: 'grouped' is not one of padded"),
    "old grouping key": ({}, {"group_by_length": True}, "group_by_length was replaced by hyperparameters"),
    "rule": ({}, {"lr_scaling": "cubic"}, "hyperparameters.lr_scaling: 'cubic' is not one of none, sqrt"),
    "rule without reference": (
        {}, {"lr_scaling": "sqrt"}, "hyperparameters.reference_batch_size: lr_scaling sqrt scales"
    ),
    "reference below 1": (
        {}, {"lr_scaling": "linear", "reference_batch_size": 0},
        "hyperparameters.reference_batch_size: must be >= 1",
    ),
    "reference not int": (
        {}, {"reference_batch_size": 3.5}, "hyperparameters.reference_batch_size: expected an integer"
    ),
    "beta2": ({}, {"adam_beta2": 1.0}, "hyperparameters.adam_beta2: must be < 1"),
}  # fmt: skip


@pytest.mark.parametrize("name", BAD)
def test_bad_settings_name_the_field(name: str) -> None:
    data, hparams, message = BAD[name]
    with pytest.raises(ConfigError) as err:
        _plan(data, hparams)
    assert message in str(err.value)


def test_missing_required_data_setting() -> None:
    with pytest.raises(ConfigError, match="data.validation_file is missing: give SQuAD JSON, or the flat"):
        run_plan.run_plan({"data": {"train_file": "a.json"}}, LENGTH, slots=1)


def test_batch_not_divisible_by_slots() -> None:
    conf = {"data": FILES}
    hp = {"global_batch_size": 12, **LENGTH}
    with pytest.raises(ConfigError, match="not divisible by the 8 slots"):
        run_plan.run_plan(conf, hp, slots=8)
    assert run_plan.run_plan(conf, hp, slots=4).hparams.global_batch_size == 12


def test_settings_listing_covers_every_field(capsys: pytest.CaptureFixture) -> None:
    """`train.py --settings`: each setting, its default and help, from the dataclasses themselves."""
    import train

    assert train.main(["--settings"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    for section, cls in (("hyperparameters", Hyperparameters), ("data", DataSettings)):
        for field in dataclasses.fields(cls):
            line = lines[f"{section}.{field.name}"]
            assert field.metadata["help"] in line
            if field.default is not dataclasses.MISSING:
                assert line.split()[1] == json.dumps(field.default)
    assert "(required)" in lines["data.train_file"] and "(required)" in lines["hyperparameters.train_length"]


@pytest.mark.parametrize(
    "rule, aggregation, expected",
    [
        ("none", 4, 2e-4),
        ("sqrt", 1, 2e-4 * 0.5),
        ("sqrt", 4, 2e-4),
        ("linear", 8, 2e-4 * 2),
        ("linear", 2, 2e-4 / 2),
    ],
)
def test_learning_rate_follows_samples_per_optimizer_step(
    rule: str, aggregation: int, expected: float
) -> None:
    """Resolved = learning_rate x (global batch x aggregation / reference) ^ (0, 1/2, 1)."""
    hp = {
        **LENGTH,
        "learning_rate": 2e-4,
        "global_batch_size": 8,
        "lr_scaling": rule,
        "reference_batch_size": 32,
    }
    conf = {"data": FILES, "optimizations": {"aggregation_frequency": aggregation}}
    plan = run_plan.run_plan(conf, hp, slots=2)
    assert plan.learning_rate == pytest.approx(expected)
    assert plan.hparams.learning_rate == 2e-4  # the reference stays what the config says

    described = dry_run.describe(plan, conf, 2)
    assert described["learning_rate"] == plan.learning_rate
    assert (described["reference_learning_rate"], described["lr_scaling"]) == (2e-4, rule)
    assert described["samples_per_optimizer_step"] == 8 * aggregation


def test_set_overrides_parse_values() -> None:
    conf = experiment.apply_overrides(
        {"data": {}},
        [
            "hyperparameters.learning_rate=2e-4",
            "data.squad_version=2.0",
            "data.pretrained_model=x1",
            "min_validation_period.batches=3",
        ],
    )
    assert conf["hyperparameters"]["learning_rate"] == {"type": "const", "val": 2e-4}
    assert conf["data"] == {"squad_version": 2.0, "pretrained_model": "x1"}
    assert conf["min_validation_period"] == {"batches": 3}
    with pytest.raises(ConfigError, match="dotted.key=value"):
        experiment.apply_overrides({}, ["novalue"])


def test_one_function_maps_config_to_init_and_fit() -> None:
    conf = experiment.load_yaml(ROOT / "multi_machine.yaml")
    plan = run_plan.run_plan(conf, experiment.local_hparams(conf), experiment.slots_of(conf))
    assert plan.aggregation_frequency == conf["optimizations"]["aggregation_frequency"] >= 2
    assert plan.hparams.optimizer == "radam"
    kw = plan.fit_kwargs(latest_checkpoint="abc")
    assert kw["latest_checkpoint"] == "abc" and kw["max_length"].value == plan.length.value
    asha = experiment.load_yaml(ROOT / "search.yaml")
    plan = run_plan.run_plan(asha, experiment.local_hparams(asha), experiment.slots_of(asha))
    assert (plan.length.unit, plan.length.value) == (
        asha["searcher"]["time_metric"],
        asha["searcher"]["max_time"],
    )


def test_every_yaml_passes_determineds_schema() -> None:
    checker = ROOT.parent / "shared" / "tools" / "expconf_check.py"
    if not checker.exists():
        pytest.skip("../shared/tools/expconf_check.py is not beside this checkout")
    yamls = sorted(str(p) for p in ROOT.glob("*.yaml"))
    assert len(yamls) >= 5
    out = subprocess.run([sys.executable, str(checker), *yamls], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_float_setting_has_a_bound_above_with_its_reason() -> None:
    """A float setting without an upper bound can overflow the run it configures
    (no_answer_loss_weight=1e300 overflowed the first loss): each has a maximum with its reason,
    or an exclusive bound below 1 (a ratio or a decay)."""
    import dataclasses

    from extractive_qa.config.settings import DataSettings, Hyperparameters, check_setting
    from extractive_qa.errors import ConfigError

    for cls in (Hyperparameters, DataSettings):
        for field in dataclasses.fields(cls):
            if field.type not in ("float", "float | None"):
                continue
            meta = field.metadata
            assert ("maximum" in meta and meta.get("why_maximum")) or "below" in meta, field.name
    with pytest.raises(
        ConfigError, match=r"no_answer_loss_weight: must be <= 100.0 \(the loss is a weighted mean"
    ):
        check_setting("no_answer_loss_weight", 1e300, "hyperparameters.no_answer_loss_weight")
