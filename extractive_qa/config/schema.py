"""The experiment config's shape, checked field by field before any work: what a Determined
0.38.1 master would reject (unknown keys, wrong types, out-of-range values) and what this trial
cannot run (a search space under the `single` searcher, windows longer than the model's
positions). Each problem is a ConfigError naming the field and the fix.

The key lists mirror Determined 0.38.1's experiment-config schemas
(master/pkg/schemas/expconf/*.json); tests compare them with those files.
"""

from __future__ import annotations

import math
from typing import Any

from extractive_qa.config.model_family import model_position_limit
from extractive_qa.errors import ConfigError

# experiment.json's properties: a master refuses any other top-level key.
TOP_LEVEL_KEYS = frozenset({
    "bind_mounts", "checkpoint_policy", "checkpoint_storage", "data", "data_layer", "debug",
    "description", "entrypoint", "environment", "hyperparameters", "integrations", "internal",
    "labels", "log_policies", "max_restarts", "min_checkpoint_period", "min_validation_period",
    "name", "optimizations", "pbs", "perform_initial_validation", "preemption_timeout",
    "profiling", "project", "records_per_epoch", "reproducibility", "resources", "retention_policy",
    "scheduling_unit", "searcher", "security", "slurm", "tensorboard_storage", "workspace",
})  # fmt: skip
SECTION_KEYS = {
    "resources": frozenset({
        "agent_label", "devices", "is_single_node", "max_slots", "native_parallel", "priority",
        "resource_pool", "shm_size", "slots", "slots_per_trial", "weight",
    }),
    "optimizations": frozenset({
        "aggregation_frequency", "auto_tune_tensor_fusion", "average_aggregated_gradients",
        "average_training_metrics", "grad_updates_size_file", "gradient_compression",
        "mixed_precision", "tensor_fusion_cycle_time", "tensor_fusion_threshold",
    }),
    "reproducibility": frozenset({"experiment_seed"}),
    "profiling": frozenset({"begin_on_batch", "enabled", "end_after_batch", "sync_timings"}),
}  # fmt: skip
_SEARCHER_COMMON = {"name", "metric", "smaller_is_better", "max_length", "source_checkpoint_uuid",
                    "source_trial_id"}  # fmt: skip
SEARCHER_KEYS = {
    "single": frozenset(_SEARCHER_COMMON),
    "random": frozenset(_SEARCHER_COMMON | {"max_trials", "max_concurrent_trials"}),
    "grid": frozenset(_SEARCHER_COMMON | {"max_concurrent_trials"}),
    "adaptive_asha": frozenset(_SEARCHER_COMMON | {
        "bracket_rungs", "divisor", "max_concurrent_trials", "max_rungs", "max_time", "max_trials",
        "mode", "stop_once", "time_metric",
    }),
}  # fmt: skip
# checkpoint-storage.json's union: each type's own keys (all strings) and the retention counts.
STORAGE_KEYS = {
    "shared_fs": frozenset({"host_path", "storage_path", "propagation", "container_path", "checkpoint_path",
                            "tensorboard_path"}),
    "s3": frozenset({"access_key", "bucket", "secret_key", "endpoint_url", "prefix"}),
    "gcs": frozenset({"bucket", "prefix"}),
    "azure": frozenset({"container", "connection_string", "account_url", "credential"}),
    "directory": frozenset({"container_path"}),
}  # fmt: skip
RETENTION_KEYS = ("save_experiment_best", "save_trial_best", "save_trial_latest")
# A name and a description are copied into every checkpoint's record and model card.
TEXT_LIMITS = {"name": 512, "description": 16_384}
HPARAM_TYPES = ("const", "categorical", "int", "double", "log")
SEARCH_SPACES = ("categorical", "int", "double", "log")


# What a validation reports (model_def.score_logits, perf_metrics): what searcher.metric may name.
# tests/test_trial.py checks these lists against a real run's metrics.
VALIDATION_METRICS = {
    "1.1": ("exact_match", "f1", "eval_windows", "perf_val_s", "perf_val_questions_per_s"),
    "2.0": ("exact_match", "exact", "f1", "total", "HasAns_exact", "HasAns_f1", "HasAns_total",
            "NoAns_exact", "NoAns_f1", "NoAns_total", "best_exact", "best_exact_thresh", "best_f1",
            "best_f1_thresh", "eval_windows", "perf_val_s", "perf_val_questions_per_s"),
}  # fmt: skip


def check_config(conf: dict[str, Any], complete: bool = True) -> None:
    """Every field this trial or a 0.38.1 master reads, checked; raises ConfigError. `complete`:
    the config is a whole experiment (a YAML to submit or run), so what the master requires
    (the searcher and its metric) must be there; a partial config is checked for what it holds."""
    unknown = sorted(set(conf) - TOP_LEVEL_KEYS)
    if unknown:
        raise ConfigError(
            f"unknown top-level key(s) {unknown} (a typo?); a Determined 0.38.1 master refuses "
            "them. Known keys: " + ", ".join(sorted(TOP_LEVEL_KEYS)) + "."
        )
    for section, known in SECTION_KEYS.items():
        value = conf.get(section)
        if value is None:
            continue
        if not isinstance(value, dict):
            raise ConfigError(f"{section}: expected a mapping of settings, got {value!r}.")
        if extra := sorted(set(value) - known):
            raise ConfigError(
                f"{section}: unknown key(s) {extra} (a typo?); known: {', '.join(sorted(known))}."
            )
    for section in ("hyperparameters", "data", "searcher", "environment"):
        if conf.get(section) is not None and not isinstance(conf[section], dict):
            raise ConfigError(f"{section}: expected a mapping, got {conf[section]!r}.")
    resources = conf.get("resources") or {}
    _integer(resources, "slots_per_trial", "resources", minimum=1)
    # NumPy's and Python's generators take seeds below 2**32.
    _integer(
        conf.get("reproducibility") or {}, "experiment_seed", "reproducibility", minimum=0, maximum=2**32 - 1
    )
    _check_storage(conf.get("checkpoint_storage"))
    for key, limit in TEXT_LIMITS.items():
        value = conf.get(key)
        if value is not None and (not isinstance(value, str) or len(value) > limit):
            got = f"{len(value):,} characters" if isinstance(value, str) else f"a {type(value).__name__}"
            raise ConfigError(f"{key}: expected text of at most {limit:,} characters, got {got}.")
    labels = conf.get("labels")
    if labels is not None and not (isinstance(labels, list) and all(isinstance(x, str) for x in labels)):
        raise ConfigError(f"labels: expected a list of strings, got {str(labels)[:80]}.")
    _integer(conf, "scheduling_unit", "", minimum=1)
    _integer(conf, "max_restarts", "", minimum=0)
    _integer(conf, "records_per_epoch", "", minimum=0)
    optimizations = conf.get("optimizations") or {}
    _integer(optimizations, "aggregation_frequency", "optimizations", minimum=1)
    for key in ("average_aggregated_gradients", "gradient_compression"):
        _boolean(optimizations, key, "optimizations")
    _boolean(conf.get("profiling") or {}, "enabled", "profiling")
    _boolean(conf, "perform_initial_validation", "")
    if complete or conf.get("searcher") is not None:
        _check_searcher(conf.get("searcher") or {}, conf.get("hyperparameters") or {})
        _check_metric(conf)
    _check_environment_variables((conf.get("environment") or {}).get("environment_variables"))
    for name, spec in (conf.get("hyperparameters") or {}).items():
        _check_hparam(f"hyperparameters.{name}", spec)


def _check_storage(storage: Any) -> None:
    """checkpoint_storage: a mapping of one storage type's keys (strings) and whole retention
    counts (a local run keeps checkpoints by them, as a master does). Without `type` the cluster's
    storage fills it in, so only the keys are checked."""
    if storage is None:
        return
    if not isinstance(storage, dict):
        raise ConfigError(f"checkpoint_storage: expected a mapping of settings, got {storage!r}.")
    kind = storage.get("type")
    if kind is not None and kind not in STORAGE_KEYS:
        raise ConfigError(
            f"checkpoint_storage.type: {str(kind)[:40]!r} is not one of {', '.join(STORAGE_KEYS)}."
        )
    known = STORAGE_KEYS[kind] if kind is not None else frozenset().union(*STORAGE_KEYS.values())
    if extra := sorted(set(storage) - known - set(RETENTION_KEYS) - {"type"}):
        raise ConfigError(
            f"checkpoint_storage: unknown key(s) {extra} for type {kind}; known: {', '.join(sorted(known))}."
        )
    for key in known & set(storage):
        if storage[key] is not None and not isinstance(storage[key], str):
            raise ConfigError(f"checkpoint_storage.{key}: expected text, got {str(storage[key])[:40]}.")
    container = str(storage.get("container") or "").strip("/")
    if kind == "azure" and "/" in container:
        # Determined 0.38.1 uploads to CONTAINER/PATH but lists the blobs of a container by that
        # whole name (common/storage/azure.py:72), which Azure answers as a blob that does not
        # exist: the storage check at every trial's start fails (exec/launch.py:86-94).
        raise ConfigError(
            f"checkpoint_storage.container: {container[:80]!r} names a path inside a container, which "
            f"Determined cannot read back; give the container alone ({container.split('/')[0]!r})."
        )
    for key in RETENTION_KEYS:
        _integer(storage, key, "checkpoint_storage", minimum=0)


def _check_metric(conf: dict[str, Any]) -> None:
    """searcher.metric must be one a validation reports, or the searcher waits for it forever."""
    metric = (conf.get("searcher") or {}).get("metric")
    version = str((conf.get("data") or {}).get("squad_version", "1.1"))
    reported = VALIDATION_METRICS.get(version)
    if reported and metric not in reported:
        raise ConfigError(
            f"searcher.metric: {metric!r} is never reported by a SQuAD {version} validation; use one "
            f"of {', '.join(reported)} (f1 with smaller_is_better: false is the usual choice)."
        )


def _check_environment_variables(value: Any) -> None:
    """environment.environment_variables: a list of NAME=VALUE strings, or such lists per device
    type (cpu, cuda, rocm), as the master's schema takes them."""
    if value is None:
        return
    lists = value.items() if isinstance(value, dict) else [("", value)]
    for device, entries in lists:
        where = "environment.environment_variables" + (f".{device}" if device else "")
        if device and device not in ("cpu", "cuda", "rocm"):
            raise ConfigError(f"{where}: per-device lists are keyed cpu, cuda or rocm; for one list for "
                              "all, write - NAME=VALUE items.")  # fmt: skip
        if not isinstance(entries, list) or not all(isinstance(e, str) and "=" in e for e in entries):
            raise ConfigError(f"{where}: expected a list of NAME=VALUE strings, got {entries!r}.")


def _where(section: str, key: str) -> str:
    return f"{section}.{key}" if section else key


def _integer(node: dict[str, Any], key: str, section: str, minimum: int, maximum: int = 2**62) -> None:
    if key not in node or node[key] is None:
        return
    value = node[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{_where(section, key)}: expected an integer >= {minimum}, got {value!r}.")
    if value < minimum:
        raise ConfigError(f"{_where(section, key)}: must be >= {minimum}, got {value}.")
    if value > maximum:
        shown = f"{str(value)[:20]}..." if len(str(value)) > 20 else str(value)
        raise ConfigError(f"{_where(section, key)}: {shown} is too large (at most {maximum:,}).")


def _boolean(node: dict[str, Any], key: str, section: str) -> None:
    if key in node and node[key] is not None and not isinstance(node[key], bool):
        raise ConfigError(f"{_where(section, key)}: expected true or false, got {node[key]!r}.")


def _check_searcher(searcher: dict[str, Any], hparams: dict[str, Any]) -> None:
    name = searcher.get("name")
    if name not in SEARCHER_KEYS:
        raise ConfigError(
            f"searcher.name: {name!r} is not a searcher this trial runs with; use one of "
            f"{', '.join(SEARCHER_KEYS)}."
        )
    if extra := sorted(set(searcher) - SEARCHER_KEYS[name]):
        raise ConfigError(f"searcher: unknown key(s) {extra} for the {name} searcher (a typo?).")
    _boolean(searcher, "smaller_is_better", "searcher")  # "maybe" would keep the worst as the best
    if not isinstance(searcher.get("metric"), str) or not searcher["metric"]:
        raise ConfigError("searcher.metric: missing; name the validation metric to compare trials by (f1).")
    if name == "adaptive_asha":
        _integer(searcher, "max_trials", "searcher", minimum=1)
        _integer(searcher, "max_rungs", "searcher", minimum=1)
        _integer(searcher, "max_concurrent_trials", "searcher", minimum=0)
        divisor = searcher.get("divisor", 4)
        if isinstance(divisor, bool) or not isinstance(divisor, (int, float)) or not divisor > 1:
            raise ConfigError(f"searcher.divisor: must be a number > 1 (the default is 4), got {divisor!r}.")
        if "max_time" in searcher:
            _integer(searcher, "max_time", "searcher", minimum=1)
        if searcher.get("time_metric", "batches") not in ("batches", "epochs"):
            raise ConfigError(
                "searcher.time_metric: must be batches or epochs for this trial, got "
                f"{searcher['time_metric']!r}."
            )
    if name == "single":
        searched = sorted(
            n for n, spec in hparams.items() if isinstance(spec, dict) and spec.get("type") in SEARCH_SPACES
        )
        if searched:
            raise ConfigError(
                f"hyperparameters {searched} are search spaces, but searcher.name is single: a "
                "single trial would silently take their first value or minimum. Make them "
                "`type: const` or use a search (random, grid, adaptive_asha)."
            )


def _check_hparam(where: str, spec: Any) -> None:
    if not isinstance(spec, dict):
        return  # a plain value: typed_settings checks it
    kind = spec.get("type")
    if kind is None:  # a nested group
        for key, value in spec.items():
            _check_hparam(f"{where}.{key}", value)
        return
    if kind not in HPARAM_TYPES:
        raise ConfigError(f"{where}.type: {kind!r} is not one of {', '.join(HPARAM_TYPES)}.")
    if kind == "categorical":
        vals = spec.get("vals")
        if not isinstance(vals, list) or not vals:
            raise ConfigError(f"{where}: a categorical hyperparameter needs a non-empty `vals` list.")
    if kind in ("int", "double", "log"):
        low, high = spec.get("minval"), spec.get("maxval")
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (low, high))
        if not numbers or not (math.isfinite(low) and math.isfinite(high)) or low > high:
            raise ConfigError(f"{where}: needs numbers minval <= maxval, got minval={low!r} maxval={high!r}.")
        if kind == "log" and not isinstance(spec.get("base"), (int, float)):
            raise ConfigError(f"{where}: a log hyperparameter needs a numeric `base`.")


def check_windows(data: Any) -> None:
    """max_seq_length / doc_stride / max_query_length against each other and the model."""
    if data.doc_stride >= data.max_seq_length:
        raise ConfigError(
            f"data.doc_stride ({data.doc_stride}) must be smaller than data.max_seq_length "
            f"({data.max_seq_length}): it is the overlap between consecutive windows."
        )
    if data.max_query_length + 8 > data.max_seq_length:
        raise ConfigError(
            f"data.max_query_length ({data.max_query_length}) leaves no room for context in "
            f"data.max_seq_length ({data.max_seq_length}) tokens; make it well below."
        )
    limit = model_position_limit(data.pretrained_model)
    if limit is not None and data.max_seq_length > limit:
        raise ConfigError(
            f"data.max_seq_length ({data.max_seq_length}) is above the {limit} positions of "
            f"{data.pretrained_model}; use at most {limit} (384 is the usual SQuAD setting)."
        )
