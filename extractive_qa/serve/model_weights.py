"""A checkpoint's hf/ model, loaded only from bytes that were checked against the model they must
fill: config.json read strictly and built into its config class, model.safetensors read once
(bounded by what the model can hold), its header checked -- every tensor the model has, present,
floating point, of the model's shape; nothing else -- and the model built from those same bytes.

transformers' from_pretrained would start a missing or mistyped tensor at random (a QA head
absent from the file answers with noise) and warn at most; here such a file is refused before
any weights load.
"""

from __future__ import annotations

import math
import struct
from pathlib import Path
from typing import Any

from extractive_qa import reading
from extractive_qa.errors import DataError

WEIGHTS = "model.safetensors"
HEADER_LIMIT = 100 * reading.MIB  # safetensors' own cap on its JSON header
FLOAT_DTYPES = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8}
OTHER_DTYPES = {"I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def model_config(hf: Path) -> Any:
    """hf/config.json as its transformers config class (no code from the checkpoint runs)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    path = hf / "config.json"
    raw = reading.read_json_object(path, reading.MODEL_FILE)
    model_type = raw.get("model_type")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        raise DataError(f"{path}: model_type {model_type!r} is not a model transformers knows; re-export it.")
    try:
        return CONFIG_MAPPING[model_type].from_dict(raw)
    except (TypeError, ValueError, KeyError) as err:
        raise DataError(f"{path}: not a {model_type} config ({str(err)[:200]}); re-export it.") from None


def expected_tensors(model: Any) -> dict[str, tuple[tuple[int, ...], bool]]:
    """The model's saved tensors: name -> (shape, floating point)."""
    return {n: (tuple(t.shape), t.dtype.is_floating_point) for n, t in model.state_dict().items()}


def check_header(data: bytes, expected: dict[str, tuple[tuple[int, ...], bool]], shown: Path) -> None:
    """The safetensors header against the model: each tensor once, of a known dtype, its bytes
    inside the file and of its shape's size; the names exactly the model's; floats where the model
    has floats (a QA head stored as int32 would load as garbage), shapes the model's."""

    def fail(what: str) -> DataError:
        return DataError(f"{shown}: cannot load the model: {what}; copy the checkpoint again.")

    if len(data) < 8:
        raise fail("is too short to be a safetensors file")
    (length,) = struct.unpack("<Q", data[:8])
    if length > min(HEADER_LIMIT, len(data) - 8):
        raise fail("has a header longer than the file")
    try:
        header = reading.parse_json(data[8 : 8 + length], shown, "safetensors header")
    except reading.UnreadableFile as err:
        raise fail(str(err).removeprefix(f"{shown}: ").rstrip(".")) from None
    if not isinstance(header, dict):
        raise fail("has a header that is not a JSON object")
    header.pop("__metadata__", None)
    body = len(data) - 8 - length
    for name, entry in header.items():
        if not (isinstance(entry, dict) and set(entry) == {"dtype", "shape", "data_offsets"}):
            raise fail(f"tensor {name[:80]!r} is not described by dtype, shape and data_offsets")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        size = {**FLOAT_DTYPES, **OTHER_DTYPES}.get(dtype) if isinstance(dtype, str) else None
        whole = isinstance(shape, list) and all(type(d) is int and 0 <= d < 1 << 40 for d in shape)
        spans = isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)
        if size is None or not whole or not spans or not 0 <= offsets[0] <= offsets[1] <= body:
            raise fail(f"tensor {name[:80]!r} has a dtype, shape or position safetensors never writes")
        if offsets[1] - offsets[0] != math.prod(shape) * size:
            raise fail(f"tensor {name[:80]!r} does not hold the bytes its shape needs")
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


def load_model(hf: Path) -> Any:
    """The QA model of `hf`, from config.json and model.safetensors checked as above."""
    import torch
    from safetensors.torch import load as load_safetensors
    from transformers import AutoModelForQuestionAnswering

    config = model_config(hf)
    with torch.device("meta"):
        shape_only = AutoModelForQuestionAnswering.from_config(config)
    expected = expected_tensors(shape_only)
    parameters = sum(math.prod(shape) for shape, _ in expected.values())
    limit = 8 * parameters + HEADER_LIMIT + 8  # fp64 at most, plus the header
    path = hf / WEIGHTS
    data = reading.read_bytes(path, reading.MODEL_FILE, limit=limit)
    check_header(data, expected, path)
    state = load_safetensors(data)
    del data
    model = AutoModelForQuestionAnswering.from_config(config)
    model.load_state_dict(state, strict=True)
    return model
