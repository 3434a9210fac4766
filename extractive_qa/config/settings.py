"""The typed settings of a run: the `hyperparameters:` and `data:` sections, each field with its
default, its check and its help text (`train.py --settings` prints them).
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass
from typing import Any, TypeVar

from extractive_qa.errors import ConfigError, DataError

T = TypeVar("T")

OPTIMIZERS = ("adamw", "radam", "lamb")
# How training windows become batches (hyperparameters.batching; bench/batching.py measures them):
#   padded   random batches, every window padded to max_seq_length (the standard recipe)
#   random   random batches, each padded to its longest window (dynamic padding)
#   buckets  random batches inside width buckets of pad_to_multiple_of tokens: a batch's windows
#            share their padded width, so padding stays small, a run sees only
#            max_seq_length / pad_to_multiple_of widths (what torch.compile and CUDA graphs
#            need), and batches are drawn afresh every epoch
#   sorted   windows sorted by length inside chunks of 50 global batches: least padding, but on a
#            small data set a chunk is most of it and the same windows meet epoch after epoch.
#            The default: paired seeds found no F1 cost against random batches (docs/batching.md)
BATCHINGS = ("padded", "random", "buckets", "sorted")
# hyperparameters.lr_scaling: the power of (samples per optimizer step / reference_batch_size).
LR_POWERS = {"none": 0.0, "sqrt": 0.5, "linear": 1.0}
LR_SCALINGS = tuple(LR_POWERS)
PRECISIONS = ("auto", "fp32", "fp16", "bf16")


@dataclass(frozen=True)
class WindowSpec:
    """How a question and its context become windows (the defaults are BERT's SQuAD recipe)."""

    max_seq_length: int = 384
    doc_stride: int = 128
    max_query_length: int = 64

    def check(self, special_tokens: int = 3) -> None:
        room = self.max_seq_length - self.max_query_length - special_tokens
        if self.max_query_length < 1 or self.doc_stride < 1 or room <= self.doc_stride:
            raise DataError(
                f"max_seq_length={self.max_seq_length}, max_query_length={self.max_query_length}, "
                f"doc_stride={self.doc_stride}: the context window ({room} tokens after the "
                "question and special tokens) must be longer than doc_stride."
            )


# --------------------------------------------------------------------------------------------
# Typed settings: the `hyperparameters:` and `data:` sections, each field with its help text.
# --------------------------------------------------------------------------------------------


def setting(default: Any = dataclasses.MISSING, help: str = "", **check: Any) -> Any:  # noqa: A002
    """A settings field: its default, help text (train.py --settings prints it) and checks:
    `choices`, `minimum` / `maximum` (inclusive), `above` (exclusive lower bound), `below`
    (exclusive upper bound)."""
    return dataclasses.field(default=default, metadata={"help": help, **check})


@dataclass(frozen=True)
class Hyperparameters:
    """`hyperparameters:` (each a `{type: const, val: ...}` or a search space). The training
    length, `train_length`, is read by training_length() and is not one of these fields."""

    global_batch_size: int = setting(
        12,
        "samples per batch over all slots; a multiple of resources.slots_per_trial",
        minimum=1,
        maximum=65536,
        why_maximum="the largest batches BERT has been trained with",
    )
    learning_rate: float = setting(
        3e-5,
        "peak learning rate at reference_batch_size samples per optimizer step (all of it with "
        "lr_scaling: none), reached after the warm-up",
        above=0,  # 0 would train nothing
        maximum=1.0,
        why_maximum="an Adam step moves each weight by up to the learning rate (fine-tuning: 1e-5 to 1e-3)",
    )
    lr_scaling: str = setting(
        "none",
        "how the peak learning rate follows samples per optimizer step (global_batch_size x "
        "aggregation_frequency): none, sqrt or linear in (samples per step / reference_batch_size)",
        choices=LR_SCALINGS,
    )
    reference_batch_size: int | None = setting(
        None, "samples per optimizer step at which learning_rate is right (needed by lr_scaling)", minimum=1
    )
    weight_decay: float = setting(
        0.01, "decoupled weight decay (not on biases / LayerNorm)", minimum=0, maximum=1,
        why_maximum="each step shrinks a weight by learning_rate x weight_decay; fine-tuning uses 0-0.1",
    )  # fmt: skip
    warmup_ratio: float = setting(
        0.1, "fraction of optimizer steps spent warming up linearly", minimum=0, below=1
    )
    adam_epsilon: float = setting(
        1e-6, "the optimizer's epsilon", above=0,  # 0 divides by zero
        maximum=1.0, why_maximum="it is added to the root of the squared gradients (around 1e-3 and below); "
        "past 1 it is most of the denominator and Adam is no longer adaptive",
    )  # fmt: skip
    adam_beta1: float = setting(0.9, "AdamW / RAdam / LAMB: decay of the gradient mean", minimum=0, below=1)
    adam_beta2: float = setting(
        0.999, "AdamW / RAdam / LAMB: decay of the squared-gradient average", minimum=0, below=1
    )
    no_answer_loss_weight: float = setting(
        1.0,
        "the span loss's weight on windows labelled no answer (CLS): 1 is the standard recipe; "
        "below 1 a small model learns to find answers before it learns to abstain",
        minimum=0,
        maximum=100.0,
        why_maximum="the loss is a weighted mean over windows: past 100 the no-answer windows alone set "
        "it, and the loss's scale grows with the weight into overflow",
    )
    answerable_first: float = setting(
        0.0,
        "share of the optimizer steps, from the start, in which windows labelled no answer weigh 0 "
        "(the model first learns to find answers, then to abstain); 0: off",
        minimum=0,
        below=1,
    )
    max_grad_norm: float = setting(
        1.0, "clip gradients to this global norm; 0 turns clipping off", minimum=0, maximum=1e6,
        why_maximum="a fine-tuning step's gradient norm is within the hundreds: past 1e6 nothing is "
        "clipped (use 0)",
    )  # fmt: skip
    optimizer: str = setting(
        "adamw", "adamw, radam (the write-up's choice for aggregation) or lamb", choices=OPTIMIZERS
    )
    precision: str = setting(
        "auto",
        "auto (on a CPU with bf16 matrix units -- AMX or AVX512-BF16 -- bf16, else fp32; fp32 on CUDA), "
        "fp32, bf16 (autocast) or fp16 (autocast + loss scaling, CUDA only)",
        choices=PRECISIONS,
    )
    batching: str = setting(
        "sorted",
        "padded (random batches at max_seq_length), random (random batches, dynamic padding), buckets "
        "(random batches inside width buckets of pad_to_multiple_of tokens) or sorted (by length)",
        choices=BATCHINGS,
    )
    pad_to_multiple_of: int = setting(
        8, "round each batch's width up to a multiple of this; the width of a bucket (buckets: 64)", minimum=1
    )
    attn_implementation: str = setting(
        "auto",
        "transformers' attention: auto (SDPA where the model supports it, else eager), sdpa, eager, "
        "flash_attention_2 or flex_attention where installed",
        choices=("auto", "sdpa", "eager", "flash_attention_2", "flex_attention"),
    )
    gradient_checkpointing: bool = setting(
        False, "recompute activations in backward: far less memory per sample for ~30 % more compute"
    )
    dropout_masks: str = setting(
        "fast",
        "CPU training: fast (dropout masks drawn in bulk from numpy's SFC64, seeded from torch's "
        "generator) or torch (torch's element-by-element bernoulli_); CUDA and torch.compile use torch's",
        choices=("fast", "torch"),
    )
    torch_compile: bool = setting(False, "torch.compile the model (recompiles for each padded width)")
    tf32: bool = setting(True, "CUDA: fp32 matmuls on tensor cores (TF32 inputs, fp32 accumulate)")


def _squad_version(value: Any) -> Any:
    """YAML reads `2.0` and `1.1` as numbers; `2` is accepted as 2.0."""
    text = str(value)
    return {"1.1": "1.1", "2.0": "2.0", "2": "2.0"}.get(text, value)


DATA_FILE_HELP = (
    "SQuAD JSON, or the flat squad schema as JSON Lines or Parquet (told apart by content), a "
    "datasets:NAME_OR_DIR:SPLIT source, or an official URL (downloaded, SHA-256 checked)"
)


@dataclass(frozen=True)
class DataSettings:
    """`data:`: where SQuAD and the model come from, and how questions become windows."""

    train_file: str = setting(help=DATA_FILE_HELP)
    validation_file: str = setting(help=DATA_FILE_HELP)
    max_train_examples: int | None = setting(
        None, "train on the file's first N questions only (a quick check); default: all", minimum=1
    )
    max_eval_examples: int | None = setting(
        None, "validate on the file's first N questions only (a quick check); default: all", minimum=1
    )
    pretrained_model: str = setting(
        "bert-base-uncased", "a hub name, a local save_pretrained directory, or the embedded default's name"
    )
    squad_version: str = setting(
        "1.1", "1.1, or 2.0 (with unanswerable questions)", choices=("1.1", "2.0"), parse=_squad_version
    )
    cache_dir: str | None = setting(None, "tokenized-feature cache; default: $SQUAD_DOWNLOAD_DIR/features")
    max_seq_length: int = setting(
        WindowSpec.max_seq_length, "tokens per window (question + context + special tokens)", minimum=1
    )
    doc_stride: int = setting(
        WindowSpec.doc_stride, "tokens of overlap between a context's consecutive windows", minimum=1
    )
    max_query_length: int = setting(
        WindowSpec.max_query_length, "questions are cut to this many tokens", minimum=1
    )
    n_best_size: int = setting(20, "start and end candidates per window in answer extraction", minimum=1)
    max_answer_length: int = setting(30, "longest answer span in tokens", minimum=1)
    null_score_diff_threshold: float = setting(
        0.0, "v2.0: answer 'no answer' when its score beats the best span's by more than this",
        minimum=-1e4, maximum=1e4,
        why_maximum="scores are sums of two logits, within tens: past 1e4 every question gets the "
        "same answer",
    )  # fmt: skip
    eval_batch_size: int | None = setting(
        None,
        "windows per evaluation batch per slot; default: twice the per-slot training batch",
        minimum=1,
        maximum=65536,
        why_maximum="a batch of windows held in memory at once",
    )
    save_predictions: bool = setting(
        False,
        "write the latest validation's predictions.json, null_odds.json and nbest_predictions.json "
        "into every checkpoint's predictions/",
    )
    num_workers: int = setting(
        0, "DataLoader worker processes", minimum=0, maximum=64, why_maximum="a process each, per slot"
    )

    def eval_batch_size_per_slot(self, per_slot_batch_size: int) -> int:
        """Windows per evaluation batch per slot: eval_batch_size, else twice the training batch."""
        return self.eval_batch_size or 2 * per_slot_batch_size


def _checked(field: dataclasses.Field, kind: Any, value: Any, where: str) -> Any:
    """One field's value, parsed and checked against its type and metadata."""
    meta = field.metadata
    value = meta["parse"](value) if "parse" in meta else value
    if value is None and type(None) in typing.get_args(kind):
        return None
    if "choices" in meta and value not in meta["choices"]:
        raise ConfigError(f"{where}: {value!r} is not one of {', '.join(meta['choices'])}.")
    base = next((t for t in (bool, int, float, str) if t is kind or t in typing.get_args(kind)), None)
    if base is bool and not isinstance(value, bool):
        raise ConfigError(f"{where}: expected true or false, got {value!r}.")
    if base is int and (not isinstance(value, int) or isinstance(value, bool)):
        raise ConfigError(f"{where}: expected an integer, got {value!r}.")
    if base is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"{where}: expected a number, got {value!r}.")
        value = float(value)
    if base is str and not isinstance(value, str):
        raise ConfigError(f"{where}: expected a string, got {value!r}.")
    if "minimum" in meta and value < meta["minimum"]:
        reason = f" ({meta['why_maximum']})" if meta["minimum"] < 0 and "why_maximum" in meta else ""
        raise ConfigError(f"{where}: must be >= {meta['minimum']:,}{reason}, got {value!r}.")
    if "maximum" in meta and value > meta["maximum"]:
        raise ConfigError(f"{where}: must be <= {meta['maximum']:,} ({meta['why_maximum']}), got {value!r}.")
    if "above" in meta and not value > meta["above"]:
        raise ConfigError(f"{where}: must be > {meta['above']}, got {value!r}.")
    if "below" in meta and not value < meta["below"]:
        raise ConfigError(f"{where}: must be < {meta['below']}, got {value!r}.")
    return value


def check_setting(name: str, value: Any, where: str) -> Any:
    """One hyperparameters.* or data.* value checked as a config's is (type, choices, range);
    names of neither section pass unchanged."""
    for cls in (Hyperparameters, DataSettings):
        fields = {f.name: f for f in dataclasses.fields(cls)}
        if name in fields:
            return _checked(fields[name], typing.get_type_hints(cls)[name], value, where)
    return value


def typed_settings(cls: type[T], values: dict[str, Any], section: str, also_known: tuple = ()) -> T:
    """A section of the config as `cls` (Hyperparameters or DataSettings): unknown keys, missing
    required fields and bad values raise ConfigError naming `section.field`. `also_known`: keys
    the section may hold that are read elsewhere."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields) - set(also_known))
    if unknown:
        known = sorted([*fields, *also_known])
        raise ConfigError(f"{section}: unknown {unknown} (a typo?); known: {', '.join(known)}.")
    hints = typing.get_type_hints(cls)
    out = {}
    for name, field in fields.items():
        where = f"{section}.{name}"
        if name in values:
            out[name] = _checked(field, hints[name], values[name], where)
        elif field.default is dataclasses.MISSING:
            raise ConfigError(f"{where} is missing: give {field.metadata['help']}.")
    return cls(**out)


def settings_help() -> list[tuple[str, Any, str]]:
    """(field, default, help) for every setting, as train.py --settings prints them."""
    rows = []
    for section, cls in (("hyperparameters", Hyperparameters), ("data", DataSettings)):
        for field in dataclasses.fields(cls):
            default = "(required)" if field.default is dataclasses.MISSING else field.default
            rows.append((f"{section}.{field.name}", default, field.metadata["help"]))
    rows.insert(1, ("hyperparameters.train_length", "(required)", TRAIN_LENGTH_HELP))
    return rows


TRAIN_LENGTH_HELP = "{epochs: N} or {batches: N}; adaptive ASHA sets it with searcher.max_time instead"
