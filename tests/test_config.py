"""Typed, frozen settings: every hyperparameters.* / data.* value is checked where the config is read."""

from __future__ import annotations

import dataclasses
import json

import pytest

import config

FILES = {"train_file": "a.json", "validation_file": "b.json"}
LENGTH = {"train_length": {"epochs": 1}}


def _plan(data: dict | None = None, hparams: dict | None = None) -> config.RunPlan:
    return config.run_plan({"data": {**FILES, **(data or {})}}, {**LENGTH, **(hparams or {})}, slots=1)


def test_settings_are_typed_frozen_and_normalised() -> None:
    plan = _plan({"squad_version": 2, "null_score_diff_threshold": 0}, {"learning_rate": 1})
    assert isinstance(plan.hparams, config.Hyperparameters) and isinstance(plan.data, config.DataSettings)
    assert plan.hparams == dataclasses.replace(config.Hyperparameters(), learning_rate=1.0)
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
    "negative lr": ({}, {"learning_rate": -1e-5}, "hyperparameters.learning_rate: must be >= 0"),
    "batch": ({}, {"global_batch_size": 0}, "hyperparameters.global_batch_size: must be >= 1"),
    "compile": ({}, {"torch_compile": "no"}, "hyperparameters.torch_compile: expected true or false"),
}


@pytest.mark.parametrize("name", BAD)
def test_bad_settings_name_the_field(name: str) -> None:
    data, hparams, message = BAD[name]
    with pytest.raises(config.ConfigError) as err:
        _plan(data, hparams)
    assert message in str(err.value)


def test_missing_required_data_setting() -> None:
    with pytest.raises(config.ConfigError, match="data.validation_file is missing: give a SQuAD JSON"):
        config.run_plan({"data": {"train_file": "a.json"}}, LENGTH, slots=1)


def test_batch_not_divisible_by_slots() -> None:
    conf = {"data": FILES}
    hp = {"global_batch_size": 12, **LENGTH}
    with pytest.raises(config.ConfigError, match="not divisible by the 8 slots"):
        config.run_plan(conf, hp, slots=8)
    assert config.run_plan(conf, hp, slots=4).hparams.global_batch_size == 12


def test_settings_listing_covers_every_field(capsys: pytest.CaptureFixture) -> None:
    """`train.py --settings`: each setting, its default and help, from the dataclasses themselves."""
    import train

    assert train.main(["--settings"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    for section, cls in (("hyperparameters", config.Hyperparameters), ("data", config.DataSettings)):
        for field in dataclasses.fields(cls):
            line = lines[f"{section}.{field.name}"]
            assert field.metadata["help"] in line
            if field.default is not dataclasses.MISSING:
                assert line.split()[1] == json.dumps(field.default)
    assert "(required)" in lines["data.train_file"] and "(required)" in lines["hyperparameters.train_length"]
