"""A checkpoint's hf/ model, loaded only from bytes that were checked against the model they must
fill: config.json read strictly and built into its config class, model.safetensors read once
(bounded by what the model can hold), its header checked -- every tensor the model has, present,
floating point, of the model's shape; nothing else -- and the model built from those same bytes
(the reading and the header's layout: extractive_qa/model_files.py).

transformers' from_pretrained would start a missing or mistyped tensor at random (a QA head
absent from the file answers with noise) and warn at most; here such a file is refused before
any weights load; so is a file holding NaN or infinite values, naming the tensor.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from extractive_qa import model_files, reading

WEIGHTS = model_files.WEIGHTS
AGAIN = "copy the checkpoint again"


def expected_tensors(model: Any) -> dict[str, tuple[tuple[int, ...], bool]]:
    """The model's saved tensors: name -> (shape, floating point)."""
    return {n: (tuple(t.shape), t.dtype.is_floating_point) for n, t in model.state_dict().items()}


def check_header(
    header: dict[str, Any], expected: dict[str, tuple[tuple[int, ...], bool]], shown: Path
) -> None:
    """A safetensors header (model_files.safetensors_header) against the model: the names exactly
    the model's; floats where the model has floats (a QA head stored as int32 would load as
    garbage), shapes the model's."""

    def fail(what: str) -> reading.UnreadableFile:
        return reading.UnreadableFile(f"{shown}: cannot load the model: {what}; {AGAIN}.")

    missing, extra = sorted(set(expected) - set(header)), sorted(set(header) - set(expected))
    if missing:
        raise fail(f"lacks {len(missing)} of the model's tensors, e.g. {missing[0]}")
    if extra:
        raise fail(f"holds {len(extra)} tensor(s) the model has not, e.g. {extra[0][:80]!r}")
    for name, (shape, floating) in expected.items():
        entry = header[name]
        if tuple(entry["shape"]) != shape or (entry["dtype"] in model_files.FLOAT_DTYPES) != floating:
            got = f"{entry['dtype']} {tuple(entry['shape'])}"
            raise fail(f"tensor {name} is {got}; the model's is {'float' if floating else 'integer'} {shape}")


def load_model(hf: Path, **config_kwargs: Any) -> Any:
    """The QA model of `hf`, from config.json and model.safetensors checked as above;
    `config_kwargs` go to from_config (export.py's attn_implementation)."""
    import torch
    from transformers import AutoModelForQuestionAnswering

    config = model_files.model_config(hf)
    with torch.device("meta"):
        shape_only = AutoModelForQuestionAnswering.from_config(config)
    expected, path = expected_tensors(shape_only), hf / WEIGHTS
    limit = model_files.weights_limit(shape_only, 1)
    state, _ = model_files.read_safetensors(
        path, limit, AGAIN, lambda header: check_header(header, expected, path)
    )
    model = AutoModelForQuestionAnswering.from_config(config, **config_kwargs)
    model.load_state_dict(state, strict=True)
    return model
