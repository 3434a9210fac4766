"""Experiment config -> the run: the one place configs are read and checked.

A YAML means the same run on a cluster and locally. On a cluster Determined hands us the full
experiment config (`det.get_cluster_info().trial._config`, defaults filled) and the trial's
hyperparameters; locally we read the YAML (`--config`), apply `--set` overrides, and pick each
hyperparameter's value (its `val`; for a search space, the first category or the minimum).
Either way `run_plan()` turns it into the arguments of `det.pytorch.init()` and
`Trainer.fit()`, because with a script entrypoint Determined applies none of them for us.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

OPTIMIZERS = ("adamw", "radam", "lamb")
PRECISIONS = ("fp32", "fp16", "bf16")

HPARAM_DEFAULTS: dict[str, Any] = {
    "global_batch_size": 12,
    "learning_rate": 3e-5,
    "weight_decay": 0.01,
    "warmup_ratio": 0.1,
    "adam_epsilon": 1e-6,
    "max_grad_norm": 1.0,
    "optimizer": "adamw",
    "precision": "fp32",
    "group_by_length": True,  # length-grouped batches, padded per batch (dynamic padding)
    "pad_to_multiple_of": 8,
    "attn_implementation": "sdpa",
    "torch_compile": False,
}
DATA_DEFAULTS: dict[str, Any] = {
    "pretrained_model": "bert-base-uncased",
    "squad_version": "1.1",
    "cache_dir": None,
    "max_seq_length": 384,
    "doc_stride": 128,
    "max_query_length": 64,
    "n_best_size": 20,
    "max_answer_length": 30,
    "null_score_diff_threshold": 0.0,
    "eval_batch_size": None,  # per slot; default 2x the per-slot training batch
    "num_workers": 0,
}


class ConfigError(Exception):
    """A bad config: the message names the file / field and what to do."""


# --------------------------------------------------------------------------------------------
# Reading a YAML file (local runs).
# --------------------------------------------------------------------------------------------


def load_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file.") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot read ({err}).") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({err}).") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: expected a YAML mapping (an experiment config).")
    return doc


def apply_overrides(conf: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """`--set data.squad_version=2.0 hyperparameters.learning_rate=1e-4` (values parsed as YAML).

    A key under `hyperparameters` replaces that hyperparameter's whole definition with a const.
    """
    conf = copy.deepcopy(conf)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected dotted.key=value.")
        try:
            value = yaml.safe_load(raw) if raw else ""
        except yaml.YAMLError:
            value = raw
        if isinstance(value, str):
            # YAML 1.1 reads 2e-4 as text; the master's YAML 1.2 reads it as a number.
            try:
                value = float(value) if any(c in value for c in ".eE") else int(value)
            except ValueError:
                pass
        parts = key.split(".")
        node = conf
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"--set {key}: {part!r} is not a section.")
            node = child
        if parts[0] == "hyperparameters" and len(parts) == 2:
            value = {"type": "const", "val": value}
        node[parts[-1]] = value
    return conf


def local_hparams(conf: dict[str, Any]) -> dict[str, Any]:
    """One value per hyperparameter, as a local run takes it from the YAML."""
    out: dict[str, Any] = {}
    for name, spec in (conf.get("hyperparameters") or {}).items():
        out[name] = _hparam_value(name, spec)
    return out


def _hparam_value(name: str, spec: Any) -> Any:
    if not isinstance(spec, dict):
        return spec
    kind = spec.get("type")
    if kind is None:  # a nested group
        return {k: _hparam_value(f"{name}.{k}", v) for k, v in spec.items()}
    if kind == "const":
        return spec.get("val")
    if kind == "categorical":
        return spec["vals"][0]
    if kind in ("int", "double"):
        return spec["minval"]
    if kind == "log":
        return spec["base"] ** spec["minval"]
    raise ConfigError(f"hyperparameters.{name}: unknown type {kind!r}.")


# --------------------------------------------------------------------------------------------
# Validated settings.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Length:
    unit: str  # "batches" or "epochs"
    value: int


@dataclass
class RunPlan:
    """Everything a run needs, derived from one experiment config."""

    hparams: dict[str, Any]
    data: dict[str, Any]
    length: Length
    aggregation_frequency: int
    average_aggregated_gradients: bool
    gradient_compression: bool
    validation_period: Length | None
    checkpoint_period: Length | None
    checkpoint_policy: str
    step_zero_validation: bool
    reporting_period: int
    seed: int

    def init_kwargs(self, exp_conf: dict[str, Any]) -> dict[str, Any]:
        return {
            "hparams": self.hparams,
            "exp_conf": exp_conf,
            "aggregation_frequency": self.aggregation_frequency,
        }

    def fit_kwargs(self, latest_checkpoint: str | None) -> dict[str, Any]:
        from determined import pytorch

        def unit(length: Length | None) -> Any:
            if length is None:
                return None
            return (pytorch.Batch if length.unit == "batches" else pytorch.Epoch)(length.value)

        return {
            "max_length": unit(self.length),
            "validation_period": unit(self.validation_period),
            "checkpoint_period": unit(self.checkpoint_period),
            "checkpoint_policy": self.checkpoint_policy,
            "step_zero_validation": self.step_zero_validation,
            "reporting_period": pytorch.Batch(self.reporting_period),
            "latest_checkpoint": latest_checkpoint,
        }


def _length(value: Any, field: str, allow_records: bool = False) -> Length | None:
    """A Determined length: {batches: N} or {epochs: N} (an empty mapping = not set)."""
    if value in (None, {}):
        return None
    if isinstance(value, dict) and len(value) == 1:
        ((unit, n),) = value.items()
        if unit in ("batches", "epochs") and isinstance(n, int) and n > 0:
            return Length(unit, n)
        if unit == "records" and not allow_records:
            raise ConfigError(f"{field}: use batches or epochs (records are not supported).")
    raise ConfigError(f"{field}: expected {{batches: N}} or {{epochs: N}} with N > 0, got {value!r}.")


def training_length(conf: dict[str, Any], hparams: dict[str, Any]) -> Length:
    """The one place the training length lives.

    Adaptive ASHA owns it (`searcher.max_time` + `time_metric`, so rungs and training agree);
    every other searcher reads `hyperparameters.train_length: {epochs: N}` (or batches).
    """
    searcher = conf.get("searcher") or {}
    if searcher.get("max_time") is not None or searcher.get("time_metric") is not None:
        if "train_length" in hparams:
            raise ConfigError(
                "hyperparameters.train_length and searcher.max_time both set the training length; "
                "keep only searcher.max_time / time_metric for adaptive_asha."
            )
        metric = searcher.get("time_metric")
        if metric not in ("batches", "epochs"):
            raise ConfigError(
                f"searcher.time_metric: must be 'batches' or 'epochs' for this trial, got {metric!r}."
            )
        length = _length({metric: searcher.get("max_time")}, "searcher.max_time")
    else:
        if "train_length" not in hparams:
            raise ConfigError(
                "hyperparameters.train_length is missing: add e.g. "
                "`train_length: {type: const, val: {epochs: 2}}` (or pass --epochs / --batches)."
            )
        length = _length(hparams["train_length"], "hyperparameters.train_length")
    assert length is not None
    return length


def run_plan(conf: dict[str, Any], hparams: dict[str, Any], slots: int) -> RunPlan:
    """Check a config and turn it into a RunPlan. Raises ConfigError naming the field."""
    unknown = set(hparams) - set(HPARAM_DEFAULTS) - {"train_length"}
    if unknown:
        raise ConfigError(
            f"hyperparameters: unknown {sorted(unknown)}; known: {sorted(HPARAM_DEFAULTS)} and train_length."
        )
    hp = {**HPARAM_DEFAULTS, **hparams}
    data = {**DATA_DEFAULTS, **(conf.get("data") or {})}
    for key in ("train_file", "validation_file"):
        if not data.get(key):
            raise ConfigError(f"data.{key} is missing: give a SQuAD JSON path or official URL.")
    if hp["optimizer"] not in OPTIMIZERS:
        raise ConfigError(
            f"hyperparameters.optimizer: {hp['optimizer']!r} is not one of {', '.join(OPTIMIZERS)}."
        )
    if hp["precision"] not in PRECISIONS:
        raise ConfigError(
            f"hyperparameters.precision: {hp['precision']!r} is not one of {', '.join(PRECISIONS)}."
        )
    gbs = hp["global_batch_size"]
    if not isinstance(gbs, int) or gbs < 1:
        raise ConfigError(f"hyperparameters.global_batch_size: expected a positive integer, got {gbs!r}.")
    if gbs % slots:
        raise ConfigError(
            f"hyperparameters.global_batch_size={gbs} is not divisible by the {slots} slots "
            f"(resources.slots_per_trial); use a multiple of {slots}."
        )
    for key in ("learning_rate", "weight_decay", "warmup_ratio", "adam_epsilon", "max_grad_norm"):
        value = hp[key]
        if not isinstance(value, (int, float)) or value < 0 or not math.isfinite(value):
            raise ConfigError(f"hyperparameters.{key}: expected a number >= 0, got {value!r}.")
    if not 0 <= hp["warmup_ratio"] < 1:
        raise ConfigError("hyperparameters.warmup_ratio: must be in [0, 1).")
    if str(data["squad_version"]) not in ("1.1", "2.0", "2"):
        raise ConfigError(f"data.squad_version: {data['squad_version']!r} must be 1.1 or 2.0.")
    data["squad_version"] = "2.0" if str(data["squad_version"]).startswith("2") else "1.1"
    for key in ("max_seq_length", "doc_stride", "max_query_length", "n_best_size", "max_answer_length"):
        if not isinstance(data[key], int) or data[key] < 1:
            raise ConfigError(f"data.{key}: expected a positive integer, got {data[key]!r}.")

    opt = conf.get("optimizations") or {}
    agg = opt.get("aggregation_frequency", 1)
    if not isinstance(agg, int) or agg < 1:
        raise ConfigError(f"optimizations.aggregation_frequency: expected an integer >= 1, got {agg!r}.")
    policy = conf.get("checkpoint_policy", "best")
    if policy not in ("best", "all", "none"):
        raise ConfigError(f"checkpoint_policy: {policy!r} must be best, all or none.")
    seed = (conf.get("reproducibility") or {}).get("experiment_seed", 0)
    return RunPlan(
        hparams=hp,
        data=data,
        length=training_length(conf, hparams),
        aggregation_frequency=agg,
        average_aggregated_gradients=bool(opt.get("average_aggregated_gradients", True)),
        gradient_compression=bool(opt.get("gradient_compression", False)),
        validation_period=_length(conf.get("min_validation_period"), "min_validation_period"),
        checkpoint_period=_length(conf.get("min_checkpoint_period"), "min_checkpoint_period"),
        checkpoint_policy=policy,
        step_zero_validation=bool(conf.get("perform_initial_validation", False)),
        reporting_period=int(conf.get("scheduling_unit", 100)),
        seed=int(seed),
    )


def slots_of(conf: dict[str, Any]) -> int:
    return int((conf.get("resources") or {}).get("slots_per_trial", 1))
