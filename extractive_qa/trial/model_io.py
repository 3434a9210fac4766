"""The pretrained encoder as the trial loads it: one line about the new QA head instead of
transformers' report, and the model under the wrappers Determined and torch.compile put on it.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

from extractive_qa.config.model_family import qa_class
from extractive_qa.io import model_files


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The Hugging Face model under torch.compile's and DDP's wrappers."""
    model = getattr(model, "_orig_mod", model)  # torch.compile
    return getattr(model, "module", model)  # DDP


# --------------------------------------------------------------------------------------------
# Loading the pretrained encoder: one line about the new head instead of transformers' report.
# --------------------------------------------------------------------------------------------

# Weights a pretraining checkpoint holds that a QA model has no use for, by name prefix (BERT's
# pooler and MLM/NSP heads, RoBERTa's lm_head, ELECTRA's discriminator/generator heads,
# ALBERT's SOP classifier, DeBERTa's mask predictions).
UNUSED_PRETRAINING_HEADS = ("pooler.", "cls.", "lm_head.", "discriminator_predictions.",
                            "generator_predictions.", "generator_lm_head.", "sop_classifier.",
                            "mask_predictions.", "predictions.", "head.")  # fmt: skip
QA_HEAD = "qa_outputs."


def _own_name(key: str) -> str:
    """'bert.pooler.dense.weight' -> 'pooler.dense.weight': the key without the encoder's prefix."""
    first, _, rest = key.partition(".")
    return key if key.startswith((*UNUSED_PRETRAINING_HEADS, QA_HEAD)) or not rest else rest


def _listed(keys: list[str]) -> str:
    return ", ".join(keys[:5]) + (" ..." if len(keys) > 5 else "")


def load_qa_model(source: str, **kwargs: Any) -> tuple[torch.nn.Module, str, list[str]]:
    """AutoModelForQuestionAnswering.from_pretrained without transformers' load report (a table
    that calls the new QA head MISSING and asks to train it -- the point of fine-tuning). Returns
    (model, one-line summary, warnings): anything missing beyond the QA head, left over beyond
    pretraining heads, or of the wrong shape is a warning, since it means weights start random.
    A local directory's config and weights are read through the reader (model_files) and handed
    to transformers as objects; transformers matches the names and heads as it would from the
    files. A hub name is loaded by transformers."""
    from transformers import AutoModelForQuestionAnswering
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        if Path(source).is_dir():
            model, info = _from_directory(Path(source), **kwargs)
        else:
            model, info = AutoModelForQuestionAnswering.from_pretrained(
                source, output_loading_info=True, **kwargs
            )
    finally:
        hf_logging.set_verbosity(verbosity)
    missing_all = [_own_name(k) for k in info.get("missing_keys") or []]
    unexpected_all = [_own_name(k) for k in info.get("unexpected_keys") or []]
    missing = [k for k in missing_all if not k.startswith(QA_HEAD)]
    unused = [k for k in unexpected_all if not k.startswith(UNUSED_PRETRAINING_HEADS)]
    heads = sorted({k.split(".")[0] for k in unexpected_all if k.startswith(UNUSED_PRETRAINING_HEADS)})
    summary = "new QA head initialised" if len(missing) < len(missing_all) else "QA head from the checkpoint"
    if heads:
        summary += f", pretraining heads unused ({', '.join(heads)})"
    mismatched = [str(m[0] if isinstance(m, (tuple, list)) else m) for m in info.get("mismatched_keys") or []]
    problems = (
        (missing, "encoder weights not in the checkpoint start random"),
        (unused, "checkpoint weights match nothing in the model"),
        (mismatched, "weights of another shape here start random"),
    )
    return model, summary, [f"{len(keys)} {what}: {_listed(keys)}" for keys, what in problems if keys]


def _from_directory(directory: Path, **kwargs: Any) -> tuple[torch.nn.Module, dict[str, Any]]:
    """The QA model of a local pretrained directory, from its config and weights as the reader
    read them. The same model, QA head draw and loading report as from_pretrained on the path."""
    with model_files.opened_model(directory, model_files.SAVE_AGAIN) as (config, weights):
        cls = qa_class(config, str(directory))
        with torch.device("meta"):
            shape_only = cls(copy.deepcopy(config))  # only its sizes: no weights, no random draws
        state = model_files.read_weights(weights, shape_only, model_files.SAVE_AGAIN)
    model, info = cls.from_pretrained(
        None, config=config, state_dict=state, output_loading_info=True, **kwargs
    )
    model.config.name_or_path = str(directory)
    return model, info
