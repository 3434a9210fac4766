"""Experiment config -> the run: the one place a config is checked and turned into the
arguments of `det.pytorch.init()` and `Trainer.fit()`.

A YAML means the same run on a cluster and locally. With a script entrypoint Determined applies
none of the config's lengths, periods or seed for us, so the plan carries them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from extractive_qa.config.experiment import aggregation_of, asha_brackets
from extractive_qa.config.model_family import check_gradient_checkpointing, resolve_attention
from extractive_qa.config.schema import check_config, check_windows
from extractive_qa.config.settings import LR_POWERS, DataSettings, Hyperparameters, typed_settings
from extractive_qa.errors import ConfigError

# --------------------------------------------------------------------------------------------
# Validated settings.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Length:
    unit: str  # "batches" or "epochs"
    value: int


@dataclass(frozen=True)
class RunPlan:
    """Everything a run needs, derived from one experiment config."""

    hparams: Hyperparameters
    data: DataSettings
    given_hparams: dict[str, Any]  # as the config holds them: what Determined's context returns
    length: Length
    aggregation_frequency: int
    learning_rate: float  # the peak the optimizer and schedule use: hparams' rule applied
    average_aggregated_gradients: bool
    gradient_compression: bool
    validation_period: Length | None
    checkpoint_period: Length | None
    checkpoint_policy: str
    step_zero_validation: bool
    reporting_period: int
    seed: int
    collective_timeout_s: float | None = None  # None: torch's default (gloo 30 min, NCCL 10 min)
    profiling: bool = False  # profiling.enabled: Determined's system-metrics profiler (cluster only)
    attention: str = "auto"  # the attention implementation the model loads with (hp's, resolved)
    attention_note: str = ""  # how it was chosen

    def summary(self) -> str:
        """The settings that shape training, for each rank's start-up log line."""
        hp = self.hparams
        return (
            f"aggregation_frequency={self.aggregation_frequency} optimizer={hp.optimizer} "
            f"gradient_compression={self.gradient_compression} global_batch_size={hp.global_batch_size} "
            f"learning_rate={self.learning_rate:.6g} (lr_scaling {hp.lr_scaling} from {hp.learning_rate:g} "
            f"at {hp.reference_batch_size} samples per step) batching={hp.batching}"
        )

    def init_kwargs(self, exp_conf: dict[str, Any]) -> dict[str, Any]:
        return {
            "hparams": self.given_hparams,
            "exp_conf": exp_conf,
            "aggregation_frequency": self.aggregation_frequency,
        }

    def fit_kwargs(self, latest_checkpoint: str | None, on_cluster: bool = True) -> dict[str, Any]:
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
            # The WebUI's Profiler tab (GPU/CPU use, memory, network, disk): Determined collects
            # only on a cluster, and says so with a warning locally -- so it is asked for there.
            "profiling_enabled": self.profiling and on_cluster,
        }


MAX_LENGTH = 2**63 - 1  # the master stores batch counts as 64-bit integers


def _length(value: Any, field: str, allow_records: bool = False) -> Length | None:
    """A Determined length: {batches: N} or {epochs: N}.

    Not set: absent, an empty mapping, or a zero count -- a master fills every period the YAML
    leaves out with `{batches: 0}` (the schema default) before handing the config to the trial.
    """
    if value in (None, {}):
        return None
    if isinstance(value, dict) and len(value) == 1:
        ((unit, n),) = value.items()
        if unit in ("batches", "epochs", "records") and n == 0 and not isinstance(n, bool):
            return None
        if unit in ("batches", "epochs") and isinstance(n, int) and 0 < n <= MAX_LENGTH:
            return Length(unit, n)
        if unit == "records" and not allow_records:
            raise ConfigError(f"{field}: use batches or epochs (records are not supported).")
    raise ConfigError(
        f"{field}: expected {{batches: N}} or {{epochs: N}} with 0 < N <= 2**63 - 1 (the master's counts are "
        f"64-bit), got {str(value)[:80]}."
    )


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
    if length is None:
        raise ConfigError(
            f"hyperparameters.train_length: {hparams.get('train_length', {})!r} trains nothing; give "
            "{epochs: N} or {batches: N} with N > 0."
        )
    return length


def _check_rungs(conf: dict[str, Any], validation: Length | None) -> None:
    """ASHA compares trials at rungs using the validations they report; a rung that falls between
    validations is judged only at the next one, so every rung must be a validation point."""
    searcher = conf.get("searcher") or {}
    if searcher.get("name") not in ("adaptive_asha", "async_halving") or searcher.get("max_time") is None:
        return
    brackets = asha_brackets(searcher) if searcher["name"] == "adaptive_asha" else []
    rungs = sorted({r for bracket in brackets for r in bracket})
    if validation is None or validation.unit != searcher.get("time_metric"):
        raise ConfigError(
            f"min_validation_period: adaptive ASHA judges trials at rungs {rungs} "
            f"({searcher.get('time_metric')}); set min_validation_period in "
            f"{searcher.get('time_metric')} so every rung is a validation point."
        )
    off = [r for r in rungs if r % validation.value]
    if off:
        raise ConfigError(
            f"min_validation_period: {{{validation.unit}: {validation.value}}} does not line up with "
            f"adaptive ASHA's rungs {rungs} (not multiples: {off}); use a divisor of {math.gcd(*rungs)}."
        )


TIMEOUT_VARIABLE = "SQUAD_COLLECTIVE_TIMEOUT_S"


def collective_timeout(conf: dict[str, Any]) -> float | None:
    """How long a collective (all-reduce, broadcast) may wait for a peer before the run fails.

    Set in the YAML as `environment.environment_variables: [SQUAD_COLLECTIVE_TIMEOUT_S=300]`, so
    a cluster exports it too; read from the config here, so local runs honour the same YAML.
    """
    env = (conf.get("environment") or {}).get("environment_variables") or []
    if isinstance(env, dict):  # {cpu: [...], cuda: [...]}: the same value is expected in both
        env = [item for items in env.values() for item in (items or [])]
    values = {item.partition("=")[2] for item in env if str(item).startswith(TIMEOUT_VARIABLE + "=")}
    if not values:
        return None
    if len(values) > 1:
        raise ConfigError(f"environment.environment_variables: {TIMEOUT_VARIABLE} set to {sorted(values)}.")
    (raw,) = values
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ConfigError(
            f"environment.environment_variables: {TIMEOUT_VARIABLE}={raw!r} must be a number of seconds > 0."
        )
    return seconds


def resolved_learning_rate(hp: Hyperparameters, samples_per_step: int) -> float:
    """The peak learning rate at `samples_per_step` (global batch x aggregation) by hp's rule:
    learning_rate x (samples_per_step / reference_batch_size) ^ (0, 1/2 or 1). The one place the
    rule lives; bench/lr_scaling.py measures which rule keeps F1 as the batch grows."""
    if hp.lr_scaling == "none":
        return hp.learning_rate
    if hp.reference_batch_size is None:
        raise ConfigError(
            f"hyperparameters.reference_batch_size: lr_scaling {hp.lr_scaling} scales learning_rate "
            "from the samples per optimizer step it was set for; add e.g. `reference_batch_size: 32`."
        )
    return hp.learning_rate * (samples_per_step / hp.reference_batch_size) ** LR_POWERS[hp.lr_scaling]


def profiling_enabled(conf: dict[str, Any]) -> bool:
    """`profiling.enabled` (a master fills `false`; null means unset)."""
    value = (conf.get("profiling") or {}).get("enabled")
    if value is not None and not isinstance(value, bool):
        raise ConfigError(f"profiling.enabled: expected true or false, got {value!r}.")
    return bool(value)


def run_plan(conf: dict[str, Any], hparams: dict[str, Any], slots: int) -> RunPlan:
    """Check a config and turn it into a RunPlan. Raises ConfigError naming the field."""
    check_config(conf, complete=False)  # a whole YAML was checked when it was read
    if "group_by_length" in hparams:
        raise ConfigError(
            "hyperparameters.group_by_length was replaced by hyperparameters.batching: use "
            "`batching: sorted` for true, `batching: padded` for false (default: sorted)."
        )
    hp = typed_settings(
        Hyperparameters,
        {k: v for k, v in hparams.items() if k != "train_length"},
        "hyperparameters",
        also_known=("train_length",),
    )
    data = typed_settings(DataSettings, conf.get("data") or {}, "data")
    check_windows(data)
    attention, attention_note = resolve_attention(hp.attn_implementation, data.pretrained_model)
    if hp.gradient_checkpointing:
        check_gradient_checkpointing(data.pretrained_model)
    if hp.global_batch_size % slots:
        raise ConfigError(
            f"hyperparameters.global_batch_size={hp.global_batch_size} is not divisible by the "
            f"{slots} slots (resources.slots_per_trial); use a multiple of {slots}."
        )

    opt = conf.get("optimizations") or {}
    agg = aggregation_of(conf)
    learning_rate = resolved_learning_rate(hp, hp.global_batch_size * agg)
    policy = conf.get("checkpoint_policy", "best")
    if policy not in ("best", "all", "none"):
        raise ConfigError(f"checkpoint_policy: {policy!r} must be best, all or none.")
    seed = (conf.get("reproducibility") or {}).get("experiment_seed", 0)
    validation = _length(conf.get("min_validation_period"), "min_validation_period")
    _check_rungs(conf, validation)
    return RunPlan(
        hparams=hp,
        data=data,
        given_hparams=dict(hparams),
        length=training_length(conf, hparams),
        aggregation_frequency=agg,
        learning_rate=learning_rate,
        average_aggregated_gradients=bool(opt.get("average_aggregated_gradients", True)),
        gradient_compression=bool(opt.get("gradient_compression", False)),
        validation_period=validation,
        checkpoint_period=_length(conf.get("min_checkpoint_period"), "min_checkpoint_period"),
        checkpoint_policy=policy,
        step_zero_validation=bool(conf.get("perform_initial_validation", False)),
        reporting_period=int(conf.get("scheduling_unit", 100)),
        seed=int(seed),
        collective_timeout_s=collective_timeout(conf),
        profiling=profiling_enabled(conf),
        attention=attention,
        attention_note=attention_note,
    )


def batches_per_epoch(windows: int, per_slot_batch: int, ranks: int) -> int:
    """Batches one rank trains per epoch, as Determined counts them (the trial uses this too)."""
    per_slot = -(-windows // per_slot_batch)
    return per_slot // ranks + int(per_slot % ranks > 0)


def total_batches(length: Length, per_epoch: int | None) -> int | None:
    if length.unit == "batches":
        return length.value
    return None if per_epoch is None else length.value * per_epoch


def optimizer_steps(batches: int, aggregation_frequency: int) -> int:
    return max(1, batches // aggregation_frequency)
