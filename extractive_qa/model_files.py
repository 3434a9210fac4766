"""A model directory on this machine, read through the one reader: config.json built into its
transformers config class (no code from the directory runs), and the safetensors weights read once,
bounded by what the config's model can hold, their header checked before a tensor is made.

The plan's look at a model's class, the trial's pretrained encoder, a resume's expected state and
predict.py's and export.py's hf/ model (`load_qa_model`) load a local directory through here, so
transformers builds models from bytes the reader checked and never opens the directory's files
itself (tests/test_model_files.py trains, resumes, answers and exports from directories and fails
if transformers is handed one). A hub name is downloaded and read by transformers.
"""

from __future__ import annotations

import math
import os
import struct
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from extractive_qa import reading

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"  # a sharded save: which file holds each tensor
PICKLED = ("pytorch_model.bin", "pytorch_model.bin.index.json")
HEADER_LIMIT = 100 * reading.MIB  # safetensors' own cap on its JSON header
# safetensors' dtypes this project reads: torch's name and the bytes of one element.
DTYPES = {"F64": ("float64", 8), "F32": ("float32", 4), "F16": ("float16", 2), "BF16": ("bfloat16", 2),
          "I64": ("int64", 8), "I32": ("int32", 4), "I16": ("int16", 2), "I8": ("int8", 1),
          "U8": ("uint8", 1), "BOOL": ("bool", 1)}  # fmt: skip
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")


def model_config(directory: Path) -> Any:
    """directory/config.json, read strictly, as its transformers config class."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    path = directory / CONFIG
    raw = reading.read_json_object(path, reading.MODEL_FILE)
    model_type = raw.get("model_type")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        raise reading.UnreadableFile(
            f"{path}: model_type {model_type!r} is not a model this transformers knows (no code "
            "from a model directory is run); give a directory written by save_pretrained."
        )
    try:
        config = CONFIG_MAPPING[model_type].from_dict(raw)
    except Exception as err:  # a config class's validators raise errors of their own
        raise reading.UnreadableFile(
            f"{path}: not a {model_type} config ({str(err)[:200]}); give a directory written by "
            "save_pretrained."
        ) from None
    layers_within_weights(config, directory)
    return config


def layers_within_weights(config: Any, directory: Path) -> None:
    """Refuse a config.json naming more layers than the directory's weights hold tensors, before
    any model of it is built (a model of a million layers takes minutes and gigabytes to build,
    even on the meta device). Every layer stores at least one tensor of its own, except ALBERT's,
    which share a group whose tensors outnumber the layers of any ALBERT."""
    layers = getattr(config, "num_hidden_layers", None)
    if type(layers) is not int or layers <= 1:
        return
    tensors = 0
    for path in weight_files(directory):  # the headers' names only; read_safetensors checks the rest
        with reading.open_regular(path, reading.WEIGHTS) as file:
            head, _ = header_bytes(file, path, "save the model again with save_pretrained")
        header = reading.parse_json(head[8:], path, "safetensors header")
        tensors += len(set(header) - {"__metadata__"}) if isinstance(header, dict) else 0
    if layers > tensors:
        raise reading.UnreadableFile(
            f"{directory / CONFIG}: num_hidden_layers is {layers:,}, more layers than its weights hold "
            f"tensors ({tensors:,}); give the config.json saved with these weights."
        )


def weight_files(directory: Path) -> list[Path]:
    """model.safetensors, or each shard model.safetensors.index.json names (file names in this
    directory, nothing else). Pickled weights alone are refused: unpickling runs code."""
    if (directory / WEIGHTS).exists() or (directory / WEIGHTS).is_symlink():
        return [directory / WEIGHTS]
    index = directory / WEIGHTS_INDEX
    if index.exists() or index.is_symlink():
        weight_map = reading.read_json_object(index, reading.MODEL_FILE).get("weight_map")
        names = list(weight_map.values()) if isinstance(weight_map, dict) else []
        plain = all(isinstance(n, str) and n not in ("", ".", "..") and n == Path(n).name for n in names)
        if not names or not plain:
            raise reading.UnreadableFile(
                f"{index}: its weight_map must map tensor names to shard files in this directory; "
                "save the model again with save_pretrained."
            )
        return [directory / name for name in sorted(set(names))]
    pickled = [name for name in PICKLED if (directory / name).exists()]
    if pickled:
        raise reading.UnreadableFile(
            f"{directory}: holds pickled weights ({pickled[0]}) only, and unpickling can run code; "
            f"load it once and save it with save_pretrained, which writes {WEIGHTS}."
        )
    raise reading.MissingFile(f"{directory}: has no {WEIGHTS}; give a directory written by save_pretrained.")


def weights_limit(model: Any, files: int) -> int:
    """The most bytes `files` safetensors files can need for `model` (a meta-device model will
    do): every parameter and buffer in fp64, plus a header each. A pretraining checkpoint's extra
    heads fit in the slack that fp32 weights leave."""
    numbers = sum(math.prod(t.shape) for t in model.state_dict().values())
    return 8 * numbers + files * (HEADER_LIMIT + 8)


def safetensors_header(head: bytes, body: int, shown: Path, hint: str) -> dict[str, Any]:
    """The header of a safetensors file from `head` (its length prefix and JSON), for `body` bytes
    of tensors after it: each tensor once, of a known dtype, of its shape's size, and together
    tiling the body (as safetensors writes them: none overlaps, no byte is left over). Anything
    else is refused naming `shown`, then `hint` (what to do). Returns name -> entry."""

    def fail(what: str) -> reading.UnreadableFile:
        return reading.UnreadableFile(f"{shown}: cannot load the model: {what}; {hint}.")

    try:
        header = reading.parse_json(head[8:], shown, "safetensors header")
    except reading.UnreadableFile as err:
        raise fail(str(err).removeprefix(f"{shown}: ").rstrip(".")) from None
    if not isinstance(header, dict):
        raise fail("has a header that is not a JSON object")
    header.pop("__metadata__", None)
    for name, entry in header.items():
        if not (isinstance(entry, dict) and set(entry) == {"dtype", "shape", "data_offsets"}):
            raise fail(f"tensor {name[:80]!r} is not described by dtype, shape and data_offsets")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        size = DTYPES.get(dtype) if isinstance(dtype, str) else None
        whole = isinstance(shape, list) and all(type(d) is int and 0 <= d < 1 << 40 for d in shape)
        spans = isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)
        if size is None or not whole or not spans or not 0 <= offsets[0] <= offsets[1] <= body:
            raise fail(f"tensor {name[:80]!r} has a dtype, shape or position safetensors never writes")
        if offsets[1] - offsets[0] != math.prod(shape) * size[1]:
            raise fail(f"tensor {name[:80]!r} does not hold the bytes its shape needs")
    end = 0
    for name, entry in sorted(header.items(), key=lambda item: item[1]["data_offsets"]):
        if entry["data_offsets"][0] != end:
            raise fail(f"tensor {name[:80]!r} overlaps another or leaves a gap before it")
        end = entry["data_offsets"][1]
    if end != body:
        raise fail(f"holds {body - end} bytes after its last tensor")
    return header


def header_bytes(file: Any, path: Path, hint: str) -> tuple[bytes, int]:
    """The length prefix and JSON header of the safetensors file open as `file` (read from its
    start, bounded by HEADER_LIMIT and the file's size), and the file's size."""
    size = os.fstat(file.fileno()).st_size
    prefix = file.read(8)
    if len(prefix) < 8:
        raise reading.UnreadableFile(
            f"{path}: cannot load the model: is too short to be a safetensors file; {hint}."
        )
    (length,) = struct.unpack("<Q", prefix)
    if length > min(HEADER_LIMIT, size - 8):
        raise reading.UnreadableFile(
            f"{path}: cannot load the model: has a header longer than the file; {hint}."
        )
    return prefix + file.read(length), size


def read_safetensors(
    path: Path, limit: int, hint: str, check: Callable[[dict[str, Any]], None] | None = None
) -> tuple[dict[str, Any], int]:
    """The tensors of one safetensors file and its size, read once through the reader (a regular
    file of at most `limit` bytes): its header checked (`safetensors_header`, then `check` if
    given) before any tensor is made, then each tensor's bytes read straight into a new tensor --
    no second copy of the file in memory, and no byte used that was not read and checked here."""
    import torch

    def fail(what: str) -> reading.UnreadableFile:
        return reading.UnreadableFile(f"{path}: cannot load the model: {what}; {hint}.")

    if sys.byteorder != "little":
        raise fail("safetensors stores little-endian numbers, and this machine is big-endian")
    with reading.open_regular(path, reading.WEIGHTS, limit=limit) as file:
        head, size = header_bytes(file, path, hint)
        header = safetensors_header(head, size - len(head), path, hint)
        if check is not None:
            check(header)
        state = {}
        for name, entry in sorted(header.items(), key=lambda item: item[1]["data_offsets"]):
            tensor = torch.empty(entry["shape"], dtype=getattr(torch, DTYPES[entry["dtype"]][0]))
            raw = tensor.view(-1).view(torch.uint8).numpy()  # the tensor's own memory, as bytes
            if raw.size and file.readinto(memoryview(raw)) != raw.size:
                raise fail("is shorter than its header says (it changed while it was read)")
            state[name] = tensor
        if file.read(1):
            raise fail("grew while it was read")
    bad = non_finite(state.items())
    if bad is not None:  # a NaN weight answers "" everywhere, trains to NaN and exports as such
        raise fail(f"tensor {bad[:80]!r} holds NaN or infinite values (a diverged run, or a damaged file)")
    return state, size


def non_finite(named: Any) -> str | None:
    """The first name of (name, tensor) pairs whose floating-point tensor holds a NaN or an
    infinity; None when every value is finite. Integer and bool tensors are finite by type."""
    import torch

    for name, tensor in named:
        if isinstance(tensor, torch.Tensor) and tensor.is_floating_point():
            if not bool(torch.isfinite(tensor).all()):
                return str(name)
    return None


def read_weights(directory: Path, model: Any, hint: str) -> dict[str, Any]:
    """Every tensor of the directory's safetensors file(s), each file read once through the reader,
    all of them together within what `model` can hold (`weights_limit`)."""
    files = weight_files(directory)
    left = weights_limit(model, len(files))
    state: dict[str, Any] = {}
    for path in files:
        tensors, size = read_safetensors(path, left, hint)
        again = sorted(set(tensors) & set(state))
        if again:  # two shards holding one tensor: which one transformers would keep is not said
            raise reading.UnreadableFile(
                f"{path}: holds {again[0][:80]!r} again, which another shard holds; {hint}."
            )
        state.update(tensors)
        left -= size
    return state


# --------------------------------------------------------------------------------------------
# A checkpoint's hf/ QA model: every tensor the model has, and nothing else.
# --------------------------------------------------------------------------------------------
#
# transformers' from_pretrained would start a missing or mistyped tensor at random (a QA head
# absent from the file answers with noise) and warn at most; a trained model's file is refused
# instead, before any weights load. (A pretrained encoder, read_weights above, may lack the QA
# head: the trial starts it and says so.)

AGAIN = "copy the checkpoint again"


def expected_tensors(model: Any) -> dict[str, tuple[tuple[int, ...], bool]]:
    """The model's saved tensors: name -> (shape, floating point)."""
    return {n: (tuple(t.shape), t.dtype.is_floating_point) for n, t in model.state_dict().items()}


def check_header(
    header: dict[str, Any], expected: dict[str, tuple[tuple[int, ...], bool]], shown: Path
) -> None:
    """A safetensors header (safetensors_header) against the model: the names exactly the
    model's; floats where the model has floats (a QA head stored as int32 would load as garbage),
    shapes the model's."""

    def fail(what: str) -> reading.UnreadableFile:
        return reading.UnreadableFile(f"{shown}: cannot load the model: {what}; {AGAIN}.")

    missing, extra = sorted(set(expected) - set(header)), sorted(set(header) - set(expected))
    if missing:
        raise fail(f"lacks {len(missing)} of the model's tensors, e.g. {missing[0]}")
    if extra:
        raise fail(f"holds {len(extra)} tensor(s) the model has not, e.g. {extra[0][:80]!r}")
    for name, (shape, floating) in expected.items():
        entry = header[name]
        if tuple(entry["shape"]) != shape or (entry["dtype"] in FLOAT_DTYPES) != floating:
            got = f"{entry['dtype']} {tuple(entry['shape'])}"
            raise fail(f"tensor {name} is {got}; the model's is {'float' if floating else 'integer'} {shape}")


def load_qa_model(hf: Path, **config_kwargs: Any) -> Any:
    """The QA model of a checkpoint's `hf` directory, from config.json and model.safetensors
    checked as above, built from the bytes that were checked; `config_kwargs` go to from_config
    (export.py's attn_implementation)."""
    import torch
    from transformers import AutoModelForQuestionAnswering

    config = model_config(hf)
    with torch.device("meta"):
        shape_only = AutoModelForQuestionAnswering.from_config(config)
    expected, path = expected_tensors(shape_only), hf / WEIGHTS
    state, _ = read_safetensors(
        path, weights_limit(shape_only, 1), AGAIN, lambda header: check_header(header, expected, path)
    )
    model = AutoModelForQuestionAnswering.from_config(config, **config_kwargs)
    model.load_state_dict(state, strict=True)
    return model
