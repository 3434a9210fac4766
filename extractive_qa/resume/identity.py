"""What a checkpoint records of its run -- experiment.json: the settings that identify the run, the
training data's digest, the planned length, the latest validation -- and how a resume holds a
checkpoint to the run that resumes it (changed settings and data are named; --allow-changed
continues anyway).
"""

from __future__ import annotations

import logging
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from extractive_qa.errors import ConfigError
from extractive_qa.io import reading

if TYPE_CHECKING:
    from extractive_qa.config.run_plan import RunPlan

logger = logging.getLogger("squad")


# The settings that make a checkpoint's state mean something: another model, data, windowing,
# optimizer, batch, schedule or seed would continue a different run. Not among them: the
# training length (extending a run is normal; the schedule is re-planned for the new total) and
# what only changes speed or memory (precision, batching, attention, gradient checkpointing).
IDENTITY_RECORD = "experiment.json"  # in every checkpoint: {"identity": run_identity(...)}
IDENTITY_DATA = ("pretrained_model", "train_file", "max_train_examples", "squad_version", "max_seq_length",
                 "doc_stride", "max_query_length")  # fmt: skip
IDENTITY_HPARAMS = ("global_batch_size", "learning_rate", "lr_scaling", "reference_batch_size",
                    "weight_decay", "warmup_ratio", "adam_epsilon", "adam_beta1", "adam_beta2",
                    "max_grad_norm", "optimizer")  # fmt: skip
# The span loss's no-answer weighting (trial/span_loss.py) is another objective, but recorded only
# where it is not the standard recipe's: checkpoints written before it existed still match.
IDENTITY_LOSS = {"no_answer_loss_weight": 1.0, "answerable_first": 0.0}


def run_identity(plan: RunPlan, name: str | None) -> dict[str, Any]:
    """The settings a checkpoint must share with the run that resumes it, by config path."""
    identity: dict[str, Any] = {"name": name}
    identity.update({f"data.{key}": getattr(plan.data, key) for key in IDENTITY_DATA})
    identity.update({f"hyperparameters.{key}": getattr(plan.hparams, key) for key in IDENTITY_HPARAMS})
    identity.update({f"hyperparameters.{key}": getattr(plan.hparams, key) for key, standard in
                     IDENTITY_LOSS.items() if getattr(plan.hparams, key) != standard})  # fmt: skip
    identity["optimizations.aggregation_frequency"] = plan.aggregation_frequency
    identity["reproducibility.experiment_seed"] = plan.seed
    return identity


def run_settings(plan: RunPlan) -> dict[str, Any]:
    """Every setting of the run, resolved, by config path (experiment.json's `settings`): with
    the command's --config, what a printed command needs to reproduce the whole run."""
    import dataclasses
    import json

    settings: dict[str, Any] = {}
    for section, values in (("data", plan.data), ("hyperparameters", plan.hparams)):
        for field in dataclasses.fields(values):
            value = getattr(values, field.name)
            settings[f"{section}.{field.name}"] = json.loads(json.dumps(value, default=str))
    settings["optimizations.aggregation_frequency"] = plan.aggregation_frequency
    settings["reproducibility.experiment_seed"] = plan.seed
    return settings


def changed_fields(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """The identity fields whose values differ, sorted."""
    return [key for key in sorted(set(saved) | set(current)) if saved.get(key) != current.get(key)]


def identity_changes(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """'field: saved -> current' for every identity field that differs."""
    return [f"{key}: {saved.get(key)!r} -> {current.get(key)!r}" for key in changed_fields(saved, current)]


def json_record(checkpoint: Path) -> dict[str, Any]:
    """experiment.json of a checkpoint on disk, or {} (listing and choosing checkpoints; a resume
    takes the record its rewrite parsed)."""
    try:
        return reading.read_json_object(checkpoint / IDENTITY_RECORD, reading.RECORD, follow_links=False)
    except reading.UnreadableFile:
        return {}


def steps_completed(checkpoint: Path) -> int | None:
    """The batches a checkpoint's metadata.json says it trained; None where it is damaged or partial."""
    try:
        steps = reading.read_json_object(checkpoint / "metadata.json", reading.RECORD, follow_links=False)
    except reading.UnreadableFile:
        return None
    value = steps.get("steps_completed")
    return value if type(value) is int and value >= 0 else None


def recorded(record: dict[str, Any], key: str) -> dict[str, Any]:
    """One part of what a checkpoint recorded of its run (experiment.json): its `identity`
    (run_identity above), `train_length` or `validation`; {} where it has none."""
    value = record.get(key)
    return value if isinstance(value, dict) else {}


def checkpoint_identity(checkpoint: Path) -> dict[str, Any] | None:
    """The identity a checkpoint on disk records (choosing which one `--resume auto` continues)."""
    return recorded(json_record(checkpoint), "identity") or None


def set_value(value: Any) -> str:
    """A value as --set reads it back (YAML): '1.1' stays a string, None is null."""
    import yaml

    return yaml.safe_dump(value, default_flow_style=True, width=1 << 16).strip().removesuffix("...").strip()


def accepted_command(command_line: list[str], saved: dict[str, Any], changed: list[str]) -> str:
    """The command that resumes with the checkpoint's own settings: the one typed, with a `--set`
    for each setting the checkpoint recorded otherwise (an earlier `--set` of it is replaced)."""
    keys = set(changed)
    kept, words = [], iter(command_line)
    for word in words:
        if word == "--set":
            value = next(words, "")
            if value.split("=", 1)[0] in keys:
                continue
            kept += [word, value]
        elif word.startswith("--set=") and word[6:].split("=", 1)[0] in keys:
            continue
        else:
            kept.append(word)
    for key in changed:
        kept += ["--set", f"{key}={set_value(saved.get(key))}"]
    return shlex.join(["python3", "train.py", *kept])


def check_same_run(
    record: dict[str, Any],
    identity: dict[str, Any],
    allow_changed: bool,
    shown: Path,
    command_line: list[str] | None = None,
    settings: dict[str, Any] | None = None,
) -> None:
    """--resume DIR: the checkpoint's recorded settings (its experiment.json) against this run's; a
    difference is an error naming each field (both values) unless --allow-changed says it is
    meant. `shown` is the directory the user gave. The command the error prints sets every
    setting the checkpoint's run had otherwise than this one (`settings`: this run's,
    run_settings), not only the identifying ones: pasted, it reproduces the whole run."""
    saved = record.get("identity")
    if not isinstance(saved, dict):
        logger.warning("--resume %s: the checkpoint records no experiment settings (%s); "
                       "they cannot be compared with this run's", shown, IDENTITY_RECORD)  # fmt: skip
        return
    changes = identity_changes(saved, identity)
    if not changes:
        return
    listed = "; ".join(changes)
    if allow_changed:
        logger.warning("--resume %s with changed settings (--allow-changed): %s", shown, listed)
        return
    changed = changed_fields(saved, identity)
    to_set = [key for key in changed if key in saved and "." in key]
    recorded_settings = record.get("settings")
    if isinstance(recorded_settings, dict) and settings is not None:  # every setting, not only these
        saved = {**recorded_settings, **saved}  # the identity as recorded wins where both hold a key
        others = [key for key in changed_fields(recorded_settings, settings) if key in recorded_settings]
        to_set = sorted({*to_set, *others})
    retry = ""
    if command_line is not None and set(changed) <= set(to_set):
        retry = f" Resume with its settings: {accepted_command(command_line, saved, to_set)}"
    raise ConfigError(
        f"--resume {shown}: this run's settings differ from the checkpoint's ({listed}). "
        "Resume with the config it was written with, or pass --allow-changed to continue its "
        f"state under the new settings.{retry}"
    )


def check_same_data(record: dict[str, Any], train_sha256: str, allow_changed: bool, shown: Path) -> None:
    """The training questions this run read against those the checkpoint's run read (their SHA-256,
    subsets included): another file at the same path is another run, refused as changed settings
    are (--allow-changed continues anyway). Checkpoints from before the digest was recorded pass."""
    saved = record.get("train_sha256")
    if saved is None or saved == train_sha256:
        return
    change = f"the training data differ (SHA-256 {str(saved)[:12]}... -> {train_sha256[:12]}...)"
    if allow_changed:
        logger.warning("--resume %s with changed data (--allow-changed): %s", shown, change)
        return
    raise ConfigError(
        f"--resume {shown}: {change}: the file at data.train_file (or the subset data.max_train_examples "
        "takes) is not what the checkpoint was trained on. Restore that data, or pass --allow-changed to "
        "continue its state on this data."
    )


def note_length_change(record: dict[str, Any], length: dict[str, int]) -> None:
    """A resume with another total length than the checkpoint's run was planned for: say what
    happens to the schedule (it is planned again for the new total)."""
    planned = recorded(record, "train_length")
    if planned and planned != length:
        was, now = (" ".join(f"{v} {k}" for k, v in d.items()) for d in (planned, length))
        logger.warning(
            "--resume: the checkpoint's run was planned for %s, this one for %s; the warm-up/decay "
            "schedule is planned again for %s and the learning rate follows it from the "
            "checkpoint's step on", was, now, now,
        )  # fmt: skip


def finished_result(record: dict[str, Any], shown: Path, steps: int) -> dict[str, Any]:
    """What a finished run's checkpoint records of it: its latest validation, steps, where it is."""
    scores = {k: v for k, v in recorded(record, "validation").items() if isinstance(v, float)}
    return {**scores, "checkpoint": str(shown), "steps_completed": steps, "already_finished": True}
