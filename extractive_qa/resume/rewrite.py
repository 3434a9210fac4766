"""A checkpoint to resume, decoded, checked against the run and written again: only bytes this
trial wrote reach a loader.

Determined restores a checkpoint with torch.load and pickle.load (pytorch/_pytorch_trial.py:907,
1041), which run whatever code a pickle names unless torch's weights_only guard is on -- and on
the cluster image's torch 2.3 it is not. Checking a file and then letting those loaders read it
leaves open every difference between the checker's reading and the loader's. So nothing of the
file reaches them: its records are read strictly (checkpoint_archive), its pickles decoded into
new plain values (checkpoint_decode), those values checked against the model and optimizer this
run builds, and a fresh checkpoint written from them with torch.save / pickle.dump, which is what
Determined restores.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pickle
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from extractive_qa.errors import ConfigError
from extractive_qa.io import model_files, reading
from extractive_qa.resume.archive import (
    PICKLE_LIMIT,
    SMALL_MEMBER,
    open_archive,
    open_plain,
    parse_json,
    read_record,
    refused,
    steps_of,
)
from extractive_qa.resume.decode import PLAIN, STATE_GLOBALS, decode, short
from extractive_qa.resume.identity import IDENTITY_RECORD

MIB = 1 << 20
# state_dict.pth: fp32 weights and the optimizer's two fp32 moments are 12 bytes a parameter.
STATE_BYTES_PER_PARAMETER = 16
STATE_OVERHEAD = 64 * MIB
MAX_RANKS = 4096

# What a resume writes into its private directory (and nothing else is restored from it).
STATE, TRIAL_STATE, METADATA = "state_dict.pth", "trial_state.pkl", "metadata.json"
RECORDS = (METADATA, "load_data.json", IDENTITY_RECORD)  # JSON, parsed and written again
REQUIRED = (STATE, TRIAL_STATE, METADATA)


def source_limits(expected: ExpectedState) -> dict[str, int]:
    """Every file a resume reads from a checkpoint, with the most bytes the rewrite's reads allow
    it: what a download of a checkpoint to resume fetches, and nothing else."""
    return {STATE: expected.state_limit, TRIAL_STATE: reading.RECORD.bytes} | dict.fromkeys(
        RECORDS, reading.RECORD.bytes
    )


# Determined's _TrialState (pytorch/_trainer_utils.py:121-137): trial_state.pkl is vars() of it.
TRIAL_STATE_FIELDS = ("trial_id", "last_ckpt", "step_id", "last_val", "batches_trained", "epochs_trained")


# --------------------------------------------------------------------------------------------
# What the run expects: the model's and optimizer's shapes, taken from a model on the meta device.
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ExpectedState:
    """The state this run's trial builds, by name and shape (no weights allocated)."""

    tensors: dict[str, tuple[tuple[int, ...], torch.dtype]]  # model.state_dict(): name -> shape, dtype
    groups: list[list[int]]  # the optimizer's parameter groups, as its state_dict numbers them
    parameters: list[tuple[str, tuple[int, ...]]]  # by optimizer index: name, shape
    parameter_count: int

    @property
    def state_limit(self) -> int:
        """The most bytes a state_dict.pth of this model can hold."""
        return STATE_BYTES_PER_PARAMETER * self.parameter_count + STATE_OVERHEAD


def expected_state(model: torch.nn.Module, optimizer: Any) -> ExpectedState:
    """From the model and optimizer as the trial builds them (trial.optimization.expected_state
    builds them on the meta device: no memory)."""
    names = {id(p): n for n, p in model.named_parameters()}
    groups, parameters, index = [], [], 0
    for group in optimizer.param_groups:
        groups.append(list(range(index, index + len(group["params"]))))
        parameters += [(names[id(p)], tuple(p.shape)) for p in group["params"]]
        index += len(group["params"])
    tensors = {n: (tuple(t.shape), t.dtype) for n, t in model.state_dict().items()}
    return ExpectedState(tensors, groups, parameters, sum(p.numel() for p in model.parameters()))


# --------------------------------------------------------------------------------------------
# The decoded checkpoint against the run: Determined's layout, the model's names and shapes.
# --------------------------------------------------------------------------------------------

TOP_KEYS = (
    "models_state_dict",
    "optimizers_state_dict",
    "lr_schedulers_state_dict",
    "callbacks",
    "rng_state",
)
OPTIONAL_TOP_KEYS = ("scaler_state_dict",)


def listed(keys: Any) -> str:
    """Planted keys for an error message: shortened reprs, sorted as text (mixed types sort too)."""
    names = sorted(short(k, 40) for k in keys)
    return "[" + ", ".join(names[:8]) + (", ..." if len(names) > 8 else "") + "]"


def check_state(state: Any, expected: ExpectedState, where: str) -> None:
    """Determined's checkpoint dict (pytorch/_pytorch_trial.py:1109-1127) as this trial writes it,
    with the model's names, shapes and dtypes and the optimizer's groups and moment shapes."""

    def fail(what: str) -> ConfigError:
        return ConfigError(f"{where}: {what}. Resume a checkpoint of this model and optimizer.")

    if not isinstance(state, dict):
        raise fail("holds no checkpoint dictionary")
    keys = set(state)
    if not set(TOP_KEYS) <= keys or keys - set(TOP_KEYS) - set(OPTIONAL_TOP_KEYS):
        raise fail(f"holds {listed(keys)}, not Determined's {list(TOP_KEYS)}")
    models, optimizers, schedulers = (state[k] for k in TOP_KEYS[:3])
    for name, value in (("models_state_dict", models), ("optimizers_state_dict", optimizers),
                        ("lr_schedulers_state_dict", schedulers)):  # fmt: skip
        if not isinstance(value, list) or len(value) != 1 or not isinstance(value[0], dict):
            raise fail(f"{name} is not one state dictionary")
    check_model(models[0], expected, fail)
    check_optimizer(optimizers[0], expected, fail)
    if not all(type(k) is str and plain_tree(v) for k, v in schedulers[0].items()):
        raise fail("lr_schedulers_state_dict holds more than numbers")
    step = schedulers[0].get("last_epoch")
    if type(step) is not int or not 0 <= step <= MAX_STEP:  # the first resumed rate is computed from it
        raise fail(f"lr_schedulers_state_dict's last_epoch is {short(step)}, not a count of optimizer steps")
    if "scaler_state_dict" in state and not (
        isinstance(state["scaler_state_dict"], dict) and plain_tree(state["scaler_state_dict"])
    ):
        raise fail("scaler_state_dict holds more than numbers")
    check_rng(
        state["rng_state"],
        ("cpu_rng_state", "np_rng_state", "random_rng_state"),
        "gpu_rng_state",
        fail,
        "rng_state",
    )
    callbacks = state["callbacks"]
    if not isinstance(callbacks, dict) or not all(
        type(k) is str and isinstance(v, dict) for k, v in callbacks.items()
    ):
        raise fail("callbacks is not a dictionary of callback states")
    for name, value in callbacks.items():
        if name != "rank_random_state" and value:
            raise fail(f"callback {short(name)} has a state; none of this trial's does")
    ranks = callbacks.get("rank_random_state", {}).get("ranks")
    if set(callbacks.get("rank_random_state", {})) - {"ranks"} or (
        ranks is not None and (not isinstance(ranks, list) or not 0 < len(ranks) <= MAX_RANKS)
    ):
        raise fail("rank_random_state is not a list of per-rank random states")
    for i, rank in enumerate(ranks or []):
        check_rng(rank, ("torch", "numpy", "random"), "cuda", fail, f"rank_random_state rank {i}")


def plain_tree(value: Any) -> bool:
    """Numbers (finite), strings, None, and lists/tuples of them (a scheduler's or scaler's state)."""
    if isinstance(value, (list, tuple)):
        return all(plain_tree(v) for v in value)
    return type(value) in PLAIN and not (type(value) is float and not math.isfinite(value))


# An optimizer group's settings a resume takes over: each finite and in its range (an lr of NaN
# would train to F1 0 and write a NaN checkpoint).
GROUP_RANGES = {"lr": (0.0, 1.0), "eps": (0.0, 1.0), "weight_decay": (0.0, 10.0), "initial_lr": (0.0, 1.0)}


# Per-parameter state that is a count or a mean of squares: never below zero.
NON_NEGATIVE_MOMENTS = ("step", "exp_avg_sq", "max_exp_avg_sq")
MAX_STEP = 2**40


def check_group_settings(group: dict, fail: Any) -> None:
    for key, (low, high) in GROUP_RANGES.items():
        value = group.get(key)
        if value is not None and (type(value) not in (int, float) or not low <= value <= high):
            raise fail(f"optimizer setting {key} is {short(value)}, outside [{low}, {high}]")
    betas = group.get("betas")
    if betas is not None and not (
        isinstance(betas, (list, tuple)) and len(betas) == 2
        and all(type(b) in (int, float) and 0.0 <= b < 1.0 for b in betas)
    ):  # fmt: skip
        raise fail(f"optimizer setting betas is {short(betas)}, not two numbers in [0, 1)")


def check_model(model: dict, expected: ExpectedState, fail: Any) -> None:
    names = list(model)
    if names and all(isinstance(n, str) and n.startswith("module.") for n in names):  # DDP's ranks wrote it
        names = [n[len("module.") :] for n in names]
    if set(names) != set(expected.tensors):
        extra = sorted(short(n) for n in set(names) - set(expected.tensors))
        missing = sorted(set(expected.tensors) - set(names))
        differs = (f"{len(extra)} name(s) the model lacks, e.g. {extra[0]}" if extra else "") + (
            f"{'; ' if extra else ''}lacks {len(missing)} of the model's, e.g. {missing[0]}"
            if missing
            else ""
        )
        raise fail(f"models_state_dict does not match the model ({differs})")
    for name, tensor in zip(names, model.values(), strict=True):
        shape, dtype = expected.tensors[name]
        # Weights load across float dtypes (load_state_dict casts); integer buffers must match.
        same_kind = isinstance(tensor, torch.Tensor) and (
            tensor.dtype == dtype or tensor.dtype.is_floating_point and dtype.is_floating_point
        )
        if not same_kind or tuple(tensor.shape) != shape:
            got = (
                f"{tuple(tensor.shape)} {tensor.dtype}"
                if isinstance(tensor, torch.Tensor)
                else type(tensor).__name__
            )
            raise fail(f"models_state_dict {name} is {got}, the model's is {shape} {dtype}")
        if model_files.non_finite([(name, tensor)]):
            raise fail(f"models_state_dict {name} holds NaN or infinite values")


def check_optimizer(optimizer: dict, expected: ExpectedState, fail: Any) -> None:
    if set(optimizer) != {"state", "param_groups"}:
        raise fail(f"optimizers_state_dict holds {listed(optimizer)}, not state and param_groups")
    groups, states = optimizer["param_groups"], optimizer["state"]
    if (
        not isinstance(groups, list)
        or [g.get("params") if isinstance(g, dict) else None for g in groups] != expected.groups
    ):
        raise fail("optimizers_state_dict's parameter groups are not this optimizer's")
    for group in groups:
        if not all(type(k) is str and plain_tree(v) for k, v in group.items()):
            raise fail("optimizers_state_dict's parameter groups hold more than finite settings")
        check_group_settings(group, fail)
    if not isinstance(states, dict):
        raise fail("optimizers_state_dict's state is not a dictionary")
    for index, moments in states.items():
        if (
            type(index) is not int
            or not 0 <= index < len(expected.parameters)
            or not isinstance(moments, dict)
        ):
            raise fail(f"optimizers_state_dict's state has an entry {short(index)} for no parameter")
        name, shape = expected.parameters[index]
        for key, value in moments.items():
            if type(key) is not str:
                raise fail(f"optimizers_state_dict's state of {name} has a key {short(key)}")
            if isinstance(value, torch.Tensor):
                if tuple(value.shape) not in (shape, ()) or not value.dtype.is_floating_point:
                    got = f"{tuple(value.shape)} {value.dtype}"
                    raise fail(f"optimizer state {key} of {name} is {got}, the parameter is {shape}")
                if model_files.non_finite([(key, value)]):
                    raise fail(f"optimizer state {key} of {name} holds NaN or infinite values")
                if key in NON_NEGATIVE_MOMENTS and bool((value < 0).any()):  # its square root is taken
                    raise fail(f"optimizer state {key} of {name} holds negative values (a mean of squares)")
            elif type(value) not in (int, float, bool) or not plain_tree(value):
                raise fail(f"optimizer state {key} of {name} is {short(value)}, not a finite number")


def check_rng(state: Any, required: tuple[str, str, str], optional: str, fail: Any, where: str) -> None:
    """torch's, NumPy's and Python's generator states (and CUDA's), in the forms they restore."""
    if not isinstance(state, dict) or not set(required) <= set(state) or set(state) - {*required, optional}:
        raise fail(f"{where} is not the torch, NumPy and Python random states")
    torch_state, numpy_state, python_state = (state[k] for k in required)
    cpu_size = torch.random.get_rng_state().numel()
    if not (isinstance(torch_state, torch.Tensor) and torch_state.dtype == torch.uint8
            and tuple(torch_state.shape) == (cpu_size,)):  # fmt: skip
        raise fail(f"{where}: torch's random state is not a generator's state")
    if optional in state:
        cuda = state[optional]
        if not (
            isinstance(cuda, torch.Tensor)
            and cuda.dtype == torch.uint8
            and cuda.dim() == 1
            and cuda.numel() <= 1024
        ):
            raise fail(f"{where}: the CUDA random state is not a generator's state")
    key = numpy_state[1] if isinstance(numpy_state, tuple) and len(numpy_state) == 5 else None
    if not (isinstance(key, np.ndarray) and key.dtype == np.uint32 and key.shape == (624,)
            and numpy_state[0] == "MT19937" and type(numpy_state[2]) is int and 0 <= numpy_state[2] <= 624
            and numpy_state[3] in (0, 1) and type(numpy_state[4]) is float):  # fmt: skip
        raise fail(f"{where}: NumPy's random state is not an MT19937 state")
    words = python_state[1] if isinstance(python_state, tuple) and len(python_state) == 3 else None
    if not (isinstance(words, tuple) and python_state[0:1] == (3,) and len(words) == 625
            and all(type(w) is int and 0 <= w < 1 << 32 for w in words)
            and (python_state[2] is None or type(python_state[2]) is float)):  # fmt: skip
        raise fail(f"{where}: Python's random state is not a Mersenne Twister state")


def check_trial_state(state: Any, steps: int, shown: Path) -> dict[str, int]:
    """trial_state.pkl: exactly Determined's _TrialState fields, counts that agree with
    metadata.json's steps_completed."""
    if not isinstance(state, dict) or set(state) != set(TRIAL_STATE_FIELDS):
        got = listed(state) if isinstance(state, dict) else type(state).__name__
        raise refused(str(shown), f"holds {got}, not Determined's trial state {list(TRIAL_STATE_FIELDS)}")
    for name in TRIAL_STATE_FIELDS:
        if type(state[name]) is not int or state[name] < 0:
            raise refused(str(shown), f"{name} is {short(state[name])}, not a non-negative integer")
    if state["batches_trained"] != steps:
        raise refused(
            str(shown), f"records {state['batches_trained']} batches trained, metadata.json {steps}; "
            "the two were edited apart",
        )  # fmt: skip
    return {name: state[name] for name in TRIAL_STATE_FIELDS}


# --------------------------------------------------------------------------------------------
# Decode, check, write again.
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Rewritten:
    steps: int
    bytes_read: int
    record: dict[str, Any]  # the checkpoint's experiment.json as parsed here ({} without one)


def rewrite(
    source: Path,
    private: Path,
    expected: ExpectedState,
    shown: Path,
    on_record: Callable[[dict[str, Any]], None] | None = None,
) -> Rewritten:
    """Decode `source`'s checkpoint, check it against `expected`, and write a new one into
    `private` (an empty directory of this user's) from the decoded values alone. `on_record` sees
    the checkpoint's experiment.json first ({} without one), so that a checkpoint of another run
    is named by its settings before its state is read."""
    records: dict[str, dict[str, Any]] = {}
    for name in RECORDS:
        if name == METADATA or (source / name).exists() or (source / name).is_symlink():
            records[name] = parse_json(read_record(source / name, shown / name), shown / name)
    steps = steps_of(records[METADATA], shown / METADATA)
    if on_record is not None:
        on_record(records.get(IDENTITY_RECORD, {}))
    trial_state = check_trial_state(
        decode(read_record(source / TRIAL_STATE, shown / TRIAL_STATE), str(shown / TRIAL_STATE), {}),
        steps, shown / TRIAL_STATE,
    )  # fmt: skip
    with open_plain(source / STATE, expected.state_limit, shown / STATE) as file:
        size = os.fstat(file.fileno()).st_size
        free = shutil.disk_usage(private).free
        if free < size + STATE_OVERHEAD:
            raise ConfigError(
                f"{shown}: resuming writes a checked copy of its {size / 1e9:.2f} GB state into "
                f"{private.parent}, which has {free / 1e9:.2f} GB free. Free space there and resume again."
            )
        archive = open_archive(file, size, str(shown / STATE))
        if archive.read("byteorder", SMALL_MEMBER) != b"little":
            raise refused(str(shown / STATE), "was written on a big-endian machine")
        for name in ("version", ".format_version", ".storage_alignment", ".data/version"):
            if name in archive.members and not re.fullmatch(
                rb"[0-9]{1,3}\n?", archive.read(name, SMALL_MEMBER)
            ):
                raise refused(str(shown / STATE), f"has a {name} record torch never writes")
        state = decode(
            archive.read("data.pkl", PICKLE_LIMIT), f"{shown / STATE} (data.pkl)", STATE_GLOBALS, archive
        )
    check_state(state, expected, str(shown / STATE))
    write_new(private, state, trial_state, records)
    return Rewritten(steps, size, records.get(IDENTITY_RECORD, {}))


def write_new(private: Path, state: dict, trial_state: dict[str, int], records: dict[str, dict]) -> None:
    """The checkpoint Determined restores, from decoded values only; a failed write names the space."""
    try:
        torch.save(state, private / STATE)
        with open(private / TRIAL_STATE, "xb") as out:
            pickle.dump(trial_state, out, protocol=4)
        for name, record in records.items():
            (private / name).write_text(json.dumps(record, indent=1))
    except (OSError, RuntimeError) as err:
        reason = getattr(err, "strerror", None) or str(err).splitlines()[0][:160]
        raise ConfigError(
            f"--resume: writing the checked copy of the checkpoint into {private.parent} failed "
            f"({reason}). Free space there and resume again."
        ) from None
