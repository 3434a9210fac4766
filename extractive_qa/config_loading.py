"""Reading an experiment YAML locally: safe YAML, `--set KEY=VALUE` overrides, and each
hyperparameter's local value (its `val`; for a search space, the first category or the minimum).
"""

from __future__ import annotations

import copy
import dataclasses
import re
from pathlib import Path
from typing import Any

import yaml

from extractive_qa.config_checks import SEARCHER_KEYS, SECTION_KEYS, TOP_LEVEL_KEYS, check_config
from extractive_qa.settings import ConfigError

# --------------------------------------------------------------------------------------------
# Reading a YAML file (local runs).
# --------------------------------------------------------------------------------------------


class _Loader(yaml.SafeLoader):
    """PyYAML reads YAML 1.1, where `3e-5` (no dot) is text; the master's Go YAML and JSON read
    it as a number. Resolving such scalars as floats makes a YAML, its JSON as the master hands
    it, and a --set value mean the same thing here as on a cluster."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def parse_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)  # noqa: S506 -- a SafeLoader subclass


def load_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        doc = parse_yaml(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file.") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot read ({err}).") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({err}).") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to be an experiment config.") from None
    except ValueError as err:  # e.g. an integer of thousands of digits
        raise ConfigError(f"{path}: unreadable value ({str(err)[:200]}).") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: expected a YAML mapping (an experiment config).")
    return doc


def load_experiment(path: str | Path, overrides: list[str]) -> dict[str, Any]:
    """A YAML with `--set` overrides applied, its shape checked before anything reads it."""
    conf = apply_overrides(load_yaml(path), overrides)
    check_config(conf)
    return conf


def _check_override_path(key: str) -> None:
    """`--set` may only name what exists: a top-level key of the master's schema, a setting of
    `data:` / `hyperparameters:`, or a key of the sections the master defines."""
    from extractive_qa.settings import DataSettings, Hyperparameters

    parts = key.split(".")
    if parts[0] not in TOP_LEVEL_KEYS:
        raise ConfigError(f"--set {key}: {parts[0]!r} is not an experiment-config key (a typo?).")
    if len(parts) < 2:
        return
    known = {
        "data": {f.name for f in dataclasses.fields(DataSettings)},
        "hyperparameters": {f.name for f in dataclasses.fields(Hyperparameters)} | {"train_length"},
        "searcher": set().union(*SEARCHER_KEYS.values()),
        **SECTION_KEYS,
    }.get(parts[0])
    if known is not None and parts[1] not in known:
        raise ConfigError(
            f"--set {key}: {parts[0]} has no {parts[1]!r} (a typo?); known: {', '.join(sorted(known))}."
        )


def apply_overrides(conf: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """`--set data.squad_version=2.0 hyperparameters.learning_rate=1e-4` (values parsed as YAML).

    A key under `hyperparameters` replaces that hyperparameter's whole definition with a const.
    """
    conf = copy.deepcopy(conf)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected dotted.key=value.")
        _check_override_path(key)
        try:
            value = parse_yaml(raw) if raw else ""
        except yaml.YAMLError:
            value = raw
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

