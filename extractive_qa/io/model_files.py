"""A model directory on this machine, read through the one reader, each file once: config.json
built into its transformers config class (no code from the directory runs); each safetensors file
opened once (`opened_model`), its header read then, and its tensors read later from the same open
file -- bounded by what the config's model can hold, the header checked before a tensor is made.

The plan's look at a model's class, the trial's pretrained encoder, a resume's expected state and
predict.py's and export.py's hf/ model (`load_qa_model`) load a local directory through here, so
transformers builds models from bytes the reader checked and never opens the directory's files
itself (tests/test_model_files.py trains, resumes, answers and exports from directories and fails
if transformers is handed one). A hub name is downloaded and read by transformers. What a config
says of the windows its model takes (`position_limit`) is read here too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import struct
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from extractive_qa.io import reading

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
SAVE_AGAIN = "save the model again with save_pretrained"  # what to do about a pretrained model's files


def position_limit(raw: dict[str, Any]) -> int | None:
    """How many tokens a window may hold under config.json's object `raw` (its absolute
    positions); None where it has relative positions only, or says nothing of them."""
    if raw.get("position_biased_input") is False:  # DeBERTa-v2/v3: relative positions only
        return None
    limit = raw.get("max_position_embeddings")
    if not isinstance(limit, int) or limit <= 0:
        return None
    if raw.get("model_type") in ("roberta", "xlm-roberta", "camembert", "longformer", "bart"):
        limit -= int(raw.get("pad_token_id") or 1) + 1  # positions start after the padding index
    return limit


def config_json(directory: Path) -> dict[str, Any]:
    """directory/config.json as the reader read it (read it once; `opened_model` takes it)."""
    return reading.read_json_object(directory / CONFIG, reading.MODEL_FILE)


def model_config(directory: Path) -> Any:
    """directory/config.json, read strictly, as its transformers config class, its layers within
    what the weights hold (the weights' headers only are read)."""
    with opened_model(directory, SAVE_AGAIN) as (config, _):
        return config


@dataclasses.dataclass
class WeightsFile:
    """One safetensors file open for reading, its header read and parsed (`parse_header`)."""

    path: Path
    file: BinaryIO  # positioned at the first tensor's bytes
    size: int  # the whole file's bytes
    start: int  # where the tensors start: the length prefix and header take the bytes before
    header: dict[str, Any]


@contextlib.contextmanager
def opened_model(
    directory: Path, hint: str, raw: dict[str, Any] | None = None
) -> Iterator[tuple[Any, list[WeightsFile]]]:
    """A model directory read once: config.json (`raw`, where the caller read it already) as its
    transformers config class, and each weight file open with its header parsed, held open so
    that the tensors are read from the file whose header is checked (`read_weights`). A config
    naming more layers than the weights hold tensors is refused here, before any model of it is
    built (a model of a million layers takes minutes and gigabytes to build, even on the meta
    device). Errors about the weights end in `hint` (what to do)."""
    config = _config_from(directory / CONFIG, config_json(directory) if raw is None else raw)
    with contextlib.ExitStack() as stack:
        weights = []
        for path in weight_files(directory):
            file = stack.enter_context(reading.open_regular(path, reading.WEIGHTS))
            head, size = header_bytes(file, path, hint)
            weights.append(WeightsFile(path, file, size, len(head), parse_header(head, path, hint)))
        layers_within_weights(config, weights, directory)
        yield config, weights


def _config_from(path: Path, raw: dict[str, Any]) -> Any:
    """config.json's object as its transformers config class; no code from a directory runs."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = raw.get("model_type")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        raise reading.UnreadableFile(
            f"{path}: model_type {model_type!r} is not a model this transformers knows (no code "
            "from a model directory is run); give a directory written by save_pretrained."
        )
    try:
        return CONFIG_MAPPING[model_type].from_dict(raw)
    except Exception as err:  # a config class's validators raise errors of their own
        raise reading.UnreadableFile(
            f"{path}: not a {model_type} config ({str(err)[:200]}); give a directory written by "
            "save_pretrained."
        ) from None


def layers_within_weights(config: Any, weights: list[WeightsFile], directory: Path) -> None:
    """Refuse a config naming more layers than the weights hold tensors. Every layer stores at
    least one tensor of its own, except ALBERT's, which share a group whose tensors outnumber the
    layers of any ALBERT."""
    layers = getattr(config, "num_hidden_layers", None)
    tensors = sum(len(w.header) for w in weights)
    if type(layers) is int and layers > 1 and layers > tensors:
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


def parse_header(head: bytes, shown: Path, hint: str) -> dict[str, Any]:
    """A safetensors file's header from `head` (its length prefix and JSON) as name -> entry,
    without its __metadata__; a header that is no JSON object is refused naming `shown`."""
    try:
        header = reading.parse_json(head[8:], shown, "safetensors header")
    except reading.UnreadableFile as err:
        raise _cannot_load(shown, str(err).removeprefix(f"{shown}: ").rstrip("."), hint) from None
    if not isinstance(header, dict):
        raise _cannot_load(shown, "has a header that is not a JSON object", hint)
    header.pop("__metadata__", None)
    return header


def _cannot_load(shown: Path, what: str, hint: str) -> reading.UnreadableFile:
    return reading.UnreadableFile(f"{shown}: cannot load the model: {what}; {hint}.")


def check_layout(header: dict[str, Any], body: int, shown: Path, hint: str) -> None:
    """A parsed header (`parse_header`) for `body` bytes of tensors after it: each tensor once, of
    a known dtype, of its shape's size, and together tiling the body (as safetensors writes them:
    none overlaps, no byte is left over). Anything else is refused naming `shown`, then `hint`."""
    for name, entry in header.items():
        if not (isinstance(entry, dict) and set(entry) == {"dtype", "shape", "data_offsets"}):
            raise _cannot_load(
                shown, f"tensor {name[:80]!r} is not described by dtype, shape and data_offsets", hint
            )
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        size = DTYPES.get(dtype) if isinstance(dtype, str) else None
        whole = isinstance(shape, list) and all(type(d) is int and 0 <= d < 1 << 40 for d in shape)
        spans = isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)
        if size is None or not whole or not spans or not 0 <= offsets[0] <= offsets[1] <= body:
            raise _cannot_load(
                shown, f"tensor {name[:80]!r} has a dtype, shape or position safetensors never writes", hint
            )
        if offsets[1] - offsets[0] != math.prod(shape) * size[1]:
            raise _cannot_load(shown, f"tensor {name[:80]!r} does not hold the bytes its shape needs", hint)
    end = 0
    for name, entry in sorted(header.items(), key=lambda item: item[1]["data_offsets"]):
        if entry["data_offsets"][0] != end:
            raise _cannot_load(
                shown, f"tensor {name[:80]!r} overlaps another or leaves a gap before it", hint
            )
        end = entry["data_offsets"][1]
    if end != body:
        raise _cannot_load(shown, f"holds {body - end} bytes after its last tensor", hint)


def header_bytes(file: Any, path: Path, hint: str) -> tuple[bytes, int]:
    """The length prefix and JSON header of the safetensors file open as `file` (read from its
    start, bounded by HEADER_LIMIT and the file's size), and the file's size."""
    size = os.fstat(file.fileno()).st_size
    prefix = file.read(8)
    if len(prefix) < 8:
        raise _cannot_load(path, "is too short to be a safetensors file", hint)
    (length,) = struct.unpack("<Q", prefix)
    if length > min(HEADER_LIMIT, size - 8):
        raise _cannot_load(path, "has a header longer than the file", hint)
    return prefix + file.read(length), size


def read_tensors(weights: WeightsFile, hint: str) -> dict[str, Any]:
    """The tensors of one open safetensors file whose layout was checked (`read_weights`), each
    tensor's bytes read straight into a new tensor -- no second copy of the file in memory, and
    no byte used that was not read and checked here."""
    import torch

    path, file = weights.path, weights.file
    if sys.byteorder != "little":
        raise _cannot_load(
            path, "safetensors stores little-endian numbers, and this machine is big-endian", hint
        )
    state = {}
    for name, entry in sorted(weights.header.items(), key=lambda item: item[1]["data_offsets"]):
        tensor = torch.empty(entry["shape"], dtype=getattr(torch, DTYPES[entry["dtype"]][0]))
        raw = tensor.view(-1).view(torch.uint8).numpy()  # the tensor's own memory, as bytes
        if raw.size and file.readinto(memoryview(raw)) != raw.size:
            raise _cannot_load(path, "is shorter than its header says (it changed while it was read)", hint)
        state[name] = tensor
    if file.read(1):
        raise _cannot_load(path, "grew while it was read", hint)
    bad = non_finite(state.items())
    if bad is not None:  # a NaN weight answers "" everywhere, trains to NaN and exports as such
        what = f"tensor {bad[:80]!r} holds NaN or infinite values (a diverged run, or a damaged file)"
        raise _cannot_load(path, what, hint)
    return state


def non_finite(named: Any) -> str | None:
    """The first name of (name, tensor) pairs whose floating-point tensor holds a NaN or an
    infinity; None when every value is finite. Integer and bool tensors are finite by type."""
    import torch

    for name, tensor in named:
        if isinstance(tensor, torch.Tensor) and tensor.is_floating_point():
            if not bool(torch.isfinite(tensor).all()):
                return str(name)
    return None


def read_weights(
    weights: list[WeightsFile],
    model: Any,
    hint: str,
    check: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Every tensor of the open weight files (`opened_model`), all of them together within what
    `model` (a meta-device model will do) can hold (`weights_limit`), no tensor in two files, and
    the headers together passing `check` (if given) before any tensor is made."""
    left, names = weights_limit(model, len(weights)), set()
    for file in weights:
        if file.size > left:
            raise reading.too_large(file.path, file.size, reading.WEIGHTS, left)
        left -= file.size
        check_layout(file.header, file.size - file.start, file.path, hint)
        again = sorted(set(file.header) & names)
        if again:  # two shards holding one tensor: which one transformers would keep is not said
            raise reading.UnreadableFile(
                f"{file.path}: holds {again[0][:80]!r} again, which another shard holds; {hint}."
            )
        names |= set(file.header)
    if check is not None:
        check({name: entry for file in weights for name, entry in file.header.items()})
    state: dict[str, Any] = {}
    for file in weights:
        state.update(read_tensors(file, hint))
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
    """A safetensors header (`parse_header`, `check_layout`) against the model: the names exactly the
    model's; floats where the model has floats (a QA head stored as int32 would load as garbage),
    shapes the model's."""

    def fail(what: str) -> reading.UnreadableFile:
        return _cannot_load(shown, what, AGAIN)

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


def load_qa_model(hf: Path, raw: dict[str, Any] | None = None, **config_kwargs: Any) -> Any:
    """The QA model of a checkpoint's `hf` directory, from config.json (`raw`, where the caller
    read it already) and the weights checked as above, built from the bytes that were checked;
    `config_kwargs` go to from_config (export.py's attn_implementation)."""
    import torch
    from transformers import AutoModelForQuestionAnswering

    with opened_model(hf, AGAIN, raw) as (config, weights):
        with torch.device("meta"):
            shape_only = AutoModelForQuestionAnswering.from_config(config)
        expected = expected_tensors(shape_only)
        state = read_weights(
            weights, shape_only, AGAIN, lambda header: check_header(header, expected, weights[0].path)
        )
    model = AutoModelForQuestionAnswering.from_config(config, **config_kwargs)
    model.load_state_dict(state, strict=True)
    return model
