"""An experiment's config as the trial sees it: read from a YAML locally (safe YAML, `--set
KEY=VALUE` overrides, the const values of its hyperparameters) or handed over by the master on a
cluster, with the defaults the master fills in and adaptive ASHA's brackets mirrored so that a
local run and the dry run see what a cluster run sees."""

from __future__ import annotations

import copy
import dataclasses
import difflib
import json
import math
import re
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from extractive_qa import det_internals
from extractive_qa.config.schema import SEARCHER_KEYS, SECTION_KEYS, TOP_LEVEL_KEYS, check_config
from extractive_qa.config.settings import DataSettings, Hyperparameters, settings_help
from extractive_qa.errors import ConfigError
from extractive_qa.io import reading
from extractive_qa.io.files import ROOT
from extractive_qa.storage import where
from extractive_qa.storage.source import CheckpointSource

# --------------------------------------------------------------------------------------------
# Reading a YAML file (local runs).
# --------------------------------------------------------------------------------------------


class _Loader(yaml.SafeLoader):
    """PyYAML reads YAML 1.1, where `3e-5` (no dot) is text; the master's Go YAML and JSON read
    it as a number. Resolving such scalars as floats makes a YAML, its JSON as the master hands
    it, and a --set value mean the same thing here as on a cluster. A key given twice in one
    mapping is an error (PyYAML would keep the last one silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, (str, int, float, bool)):
                continue  # unhashable keys: the base class says what is wrong with them
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice in this mapping", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep)


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


MAX_VALUES = 100_000  # an experiment config holds hundreds of values; aliases may not expand past this


class AliasError(yaml.YAMLError):
    """YAML aliases that make a value contain itself, or expand past MAX_VALUES values."""


def parse_yaml(text: str) -> Any:
    """A YAML document, safely loaded (a SafeLoader subclass: no tags that build objects, no key
    given twice) and then walked once as its aliases expand -- before anything else walks, copies
    or serialises it: a value that contains itself (`a: &x [*x]`) and aliases that expand past
    MAX_VALUES values (a "billion laughs" of a few kilobytes) are refused."""
    doc = yaml.load(text, Loader=_Loader)  # noqa: S506 -- a SafeLoader subclass
    pending: list[tuple[Any, frozenset[int]]] = [(doc, frozenset())]
    seen = 0
    while pending:
        node, enclosing = pending.pop()
        seen += 1
        if seen > MAX_VALUES:
            raise AliasError(f"its aliases expand to more than {MAX_VALUES:,} values")
        if isinstance(node, (dict, list)):
            if id(node) in enclosing:
                raise AliasError("an alias makes a value contain itself")
            inner = enclosing | {id(node)}
            pending.extend((child, inner) for child in (node.values() if isinstance(node, dict) else node))
    return doc


def where_the_configs_are(path: Path) -> str:
    """Where a missing config may be: the project's own YAMLs lie beside train.py, and a command
    typed in another directory takes `--config local.yaml` from there."""
    shipped = sorted(p.name for p in ROOT.glob("*.yaml"))
    project = ROOT / path.name
    if project.is_file() and project.resolve() != path.resolve():
        return f"The project's {path.name} is {project}: run from {ROOT} or give that path."
    return f"The project's configs are in {ROOT}: {', '.join(shipped)}."


def yaml_reason(err: yaml.YAMLError) -> str:
    """PyYAML's reason in one line: what is wrong and where (its own message quotes the line
    under a caret, over several lines)."""
    problem = getattr(err, "problem", None) or getattr(err, "context", None) or str(err)
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return " ".join(f"{problem}{where}".split())


def load_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        doc = parse_yaml(reading.read_text(path, reading.CONFIG))
    except reading.MissingFile:
        raise ConfigError(f"{path}: no such config file. {where_the_configs_are(path)}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({yaml_reason(err)}).") from None
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


def _check_override_path(key: str, raw: str = "") -> None:
    """`--set` may only name what exists: a top-level key of the master's schema, a setting of
    `data:` / `hyperparameters:`, or a key of the sections the master defines. `raw` is the value
    typed, so a suggestion is the whole word to type."""
    parts = key.split(".")
    if parts[0] not in TOP_LEVEL_KEYS:
        settings = {f"{section}.{f.name}" for section, cls in (("data", DataSettings), ("hyperparameters",
                    Hyperparameters)) for f in dataclasses.fields(cls)}  # fmt: skip
        leaf = {name.split(".", 1)[1]: name for name in settings}
        if parts[0] in leaf:  # a setting without its section: say which
            raise ConfigError(f"--set {key}: {parts[0]!r} is a setting of {leaf[parts[0]].split('.')[0]}: "
                              f"--set {leaf[parts[0]]}{key[len(parts[0]):]}={raw}")  # fmt: skip
        raise ConfigError(
            f"--set {key}: {parts[0]!r} is not an experiment-config key{_nearest(parts[0], TOP_LEVEL_KEYS)}."
        )
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
            f"--set {key}: {parts[0]} has no {parts[1]!r}{_nearest(parts[1], known, parts[0] + '.')}; "
            f"known: {', '.join(sorted(known))}."
        )


def _nearest(word: str, known: Collection[str], prefix: str = "") -> str:
    """' (did you mean X?)' for the closest known name, or ' (a typo?)' where none is close."""
    close = difflib.get_close_matches(word, sorted(known), n=1, cutoff=0.6)
    return f" (did you mean {prefix}{close[0]}?)" if close else " (a typo?)"


def apply_overrides(conf: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """`--set data.squad_version=2.0 hyperparameters.learning_rate=1e-4` (values parsed as YAML).

    A key under `hyperparameters` replaces that hyperparameter's whole definition with a const.
    """
    conf = copy.deepcopy(conf)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected dotted.key=value.")
        _check_override_path(key, raw)
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


# --------------------------------------------------------------------------------------------
# What a 0.38.1 master fills in: schema defaults and adaptive ASHA's brackets.
# --------------------------------------------------------------------------------------------


def asha_brackets(searcher: dict[str, Any]) -> list[list[int]]:
    """Adaptive ASHA's brackets as a 0.38.1 master builds them: each bracket's rungs in units of
    `time_metric`. Mirrors master/pkg/searcher/adaptive_asha.go:86-112 (makeBrackets, standard /
    conservative / aggressive modes) and asha_stopping.go:54-66 (makeRungs)."""
    max_time = int(searcher["max_time"])
    divisor = float(searcher.get("divisor") or 4)
    rungs_per_bracket = list(searcher.get("bracket_rungs") or [])
    if not rungs_per_bracket:
        max_trials = int(searcher.get("max_trials") or 1)
        max_rungs = min(
            int(searcher.get("max_rungs") or 5),
            int(math.log(max_time) / math.log(divisor)) + 1,
            int(math.log(max_trials) / math.log(divisor)) + 1,
        )
        mode = searcher.get("mode") or "standard"
        first = {"conservative": 1, "standard": (max_rungs - 1) // 2 + 1, "aggressive": max_rungs}
        if mode not in first:
            raise ConfigError(f"searcher.mode: {mode!r} must be conservative, standard or aggressive.")
        rungs_per_bracket = list(range(first[mode], max_rungs + 1))
    return [
        [max(int(max_time / divisor ** (n - i - 1)), 1) for i in range(n)]
        for n in sorted(rungs_per_bracket, reverse=True)
    ]


# What a 0.38.1 master fills in before the trial sees the config, for the fields run_plan reads
# (schema defaults in master/pkg/schemas/expconf/*.json: experiment.json, optimizations.json,
# resources.json; plus the clock-drawn experiment_seed). tests/test_cluster.py checks the plans
# built from this against the configs the master's own schemas produce.
MASTER_DEFAULTS: dict[str, Any] = {
    "min_validation_period": {"batches": 0},
    "min_checkpoint_period": {"batches": 0},
    "checkpoint_policy": "best",
    "scheduling_unit": 100,
    "perform_initial_validation": False,
    "records_per_epoch": 0,
    "max_restarts": 5,
    "resources": {"slots_per_trial": 1},
    "optimizations": {
        "aggregation_frequency": 1,
        "average_aggregated_gradients": True,
        "gradient_compression": False,
    },
    "reproducibility": {"experiment_seed": 0},
}


def with_master_defaults(conf: dict[str, Any]) -> dict[str, Any]:
    """The config as a master hands it to the trial (for the fields this trial reads)."""
    out = copy.deepcopy(conf)
    for key, default in MASTER_DEFAULTS.items():
        if out.get(key) is None:
            out[key] = copy.deepcopy(default)
        elif key in ("resources", "optimizations", "reproducibility") and isinstance(out[key], dict):
            for sub, value in default.items():
                out[key].setdefault(sub, value)
    return out


def slots_of(conf: dict[str, Any]) -> int:
    return int((conf.get("resources") or {}).get("slots_per_trial", 1))


def aggregation_of(conf: dict[str, Any]) -> int:
    """optimizations.aggregation_frequency as the master reads it: absent or null is 1. The value is
    checked once, by schema.check_config, before a config gets here."""
    return int((conf.get("optimizations") or {}).get("aggregation_frequency") or 1)


# --------------------------------------------------------------------------------------------
# Where a run's config comes from: the master, or the command line.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """Where this run's config comes from: the master (a cluster trial) or the command line."""

    exp_conf: dict[str, Any]
    hparams: dict[str, Any]
    slots: int
    on_cluster: bool
    # The master's latest checkpoint, to verify, in whichever storage holds it. What fit restores
    # is the driver's (launch.cluster_run): its rewritten private copy.
    checkpoint_path: CheckpointSource | None = None


def from_cluster(info: Any) -> Source:
    exp_conf = det_internals.experiment_config(info)
    latest = info.latest_checkpoint
    return Source(
        exp_conf=exp_conf,
        hparams=dict(info.trial.hparams),
        slots=slots_of(exp_conf),
        on_cluster=True,
        checkpoint_path=latest_checkpoint_at(exp_conf, latest) if latest else None,
    )


def latest_checkpoint_at(exp_conf: dict[str, Any], uuid: str) -> CheckpointSource:
    """Where the master's latest checkpoint lies, as a source (storage.where)."""
    return where.in_storage(exp_conf, uuid)


@dataclass(frozen=True)
class RunOptions:
    """What train.py's command line asks of a run, typed: the CLI builds it from its arguments
    (train.run_options), and nothing past the CLI sees argparse."""

    config: Path
    overrides: tuple[str, ...] = ()
    batches: int | None = None
    epochs: int | None = None
    checkpoint_dir: Path = Path("checkpoints")
    # "auto", "latest", a checkpoint directory or URL; None: `auto` unless `restart` (a command typed
    # again continues its run)
    resume: str | Path | None = None
    restart: bool = False  # train from the beginning beside this run's checkpoints
    allow_changed: bool = False
    metrics_out: Path | None = None
    command_line: tuple[str, ...] = ()  # as typed: a refusal may print it mended


def from_command_line(args: RunOptions, slots: int) -> Source:
    """The YAML as a master would hand it, with --set / --batches / --epochs applied."""
    exp_conf = load_experiment(args.config, list(args.overrides))
    exp_conf = with_master_defaults(exp_conf)
    hparams = local_hparams(exp_conf)
    if args.batches or args.epochs:
        if (exp_conf.get("searcher") or {}).get("max_time") is not None:
            exp_conf["searcher"]["max_time"] = args.batches or args.epochs
            exp_conf["searcher"]["time_metric"] = "batches" if args.batches else "epochs"
        else:
            hparams["train_length"] = {"batches": args.batches} if args.batches else {"epochs": args.epochs}
    return Source(exp_conf=exp_conf, hparams=hparams, slots=slots, on_cluster=False)


def run_source(info: Any, options: RunOptions, local_slots: int) -> Source:
    """The run's config: the master's on a cluster (`info`: det.get_cluster_info()), else the command
    line's with `local_slots` processes."""
    return from_cluster(info) if info is not None else from_command_line(options, local_slots)


def settings_table(config: Path, overrides: list[str]) -> list[str]:
    """`train.py --settings`: every setting's line -- the code's default, the value `config` (with
    --set) gives it, its meaning."""
    conf = load_experiment(config, overrides)
    given = {f"hyperparameters.{k}": v for k, v in (conf.get("hyperparameters") or {}).items()}
    given.update({f"data.{k}": v for k, v in (conf.get("data") or {}).items()})

    def shown(value: Any) -> str:
        if isinstance(value, dict) and value.get("type") == "const":
            value = value.get("val")
        elif isinstance(value, dict) and "type" in value:
            return f"searched ({value['type']})"
        return value if value == "(required)" else json.dumps(value)

    header = ("setting", "default", config.name, "meaning")
    rows = [header] + [
        (name, shown(default), shown(given[name]) if name in given else "(default)", help_text)
        for name, default, help_text in settings_help()
    ]
    # Aligned columns; a long value (a URL) overflows its column rather than widening it.
    widths = [min(36, max(len(row[i]) for row in rows)) for i in range(3)]
    lines = []
    for row in rows:
        cells = (f"{cell:<{width}}" for cell, width in zip(row[:3], widths, strict=False))
        lines.append("  ".join(cells) + "  " + row[3])
    return lines
