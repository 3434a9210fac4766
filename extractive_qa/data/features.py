"""Questions and contexts -> windows (features): the tokenizer, and each question with a window
of its context, padded to max_seq_length, with answer labels and offsets."""

from __future__ import annotations

import copy
import hashlib
import json
import sys
import tempfile
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from extractive_qa.config.model_family import loadable_pretrained, resolve_pretrained
from extractive_qa.config.settings import WindowSpec
from extractive_qa.data.squad_files import Example
from extractive_qa.errors import DataError
from extractive_qa.io import reading

# --------------------------------------------------------------------------------------------
# Tokenizer and model names.
# --------------------------------------------------------------------------------------------


# What a tokenizer's from_pretrained may read from a model directory: config.json names the model
# type where tokenizer_config.json names no tokenizer class; the vocabularies build a fast tokenizer
# where tokenizer.json is missing.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "config.json", "vocab.txt", "vocab.json", "merges.txt",
                   "spm.model", "spiece.model", "sentencepiece.bpe.model", "tokenizer.model",
                   "chat_template.jinja", "chat_template.json")  # fmt: skip


def private_tokenizer_files(files: Mapping[str, bytes]) -> tempfile.TemporaryDirectory:
    """A new directory that only this user can open (mkdtemp: 0700) holding `files` (name ->
    bytes, read through the reader: `reading.read_present(directory, TOKENIZER_FILES, ...)`).
    transformers then reads the very bytes the reader checked: a file swapped for a pipe or a
    larger one after the check never reaches it."""
    private = tempfile.TemporaryDirectory(prefix="tokenizer-")
    try:
        for name, data in files.items():
            (Path(private.name) / name).write_bytes(data)
    except BaseException:
        private.cleanup()
        raise
    return private


def load_tokenizer(name: str, local_only: bool = False) -> Any:
    """The model's fast tokenizer; `local_only`: from this machine only (no hub request). A local
    directory's files are loaded from a private copy (`private_tokenizer_files`), kept while the
    tokenizer lives: a fast tokenizer may name its vocabulary file again when it is saved."""
    source = resolve_pretrained(name) if local_only else loadable_pretrained(name)
    local = Path(source).is_dir()
    files = reading.read_present(Path(source), TOKENIZER_FILES, reading.MODEL_FILE) if local else None
    return _fast_tokenizer(source, name, local_only, files)


def directory_tokenizer(directory: Path, files: Mapping[str, bytes]) -> Any:
    """The fast tokenizer of a model directory (a checkpoint's hf/: nothing to resolve, no hub
    request) from its tokenizer files, read already (`files`), as load_tokenizer loads one."""
    return _fast_tokenizer(str(directory), str(directory), True, files)


def _fast_tokenizer(source: str, name: str, local_only: bool, files: Mapping[str, bytes] | None) -> Any:
    """load_tokenizer's loading of `name`, resolved to `source`: a hub name, or a directory whose
    tokenizer `files` are loaded from a private copy."""
    from transformers import AutoTokenizer

    private = private_tokenizer_files(files) if files is not None else None
    try:
        loaded_from = private.name if private is not None else source
        tokenizer = AutoTokenizer.from_pretrained(loaded_from, local_files_only=local_only)
    except Exception as err:  # a missing, foreign or damaged tokenizer file: many kinds, one answer
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        if private is not None:
            reason = reason.replace(private.name, source)
            private.cleanup()
        raise DataError(
            f"could not load tokenizer {name!r}: {reason} "
            "Give a local model directory, or a hub name on a machine that can reach the hub."
        ) from None
    if private is not None:
        weakref.finalize(tokenizer, private.cleanup)
        tokenizer.name_or_path = source  # the directory the user named, not the copy, in messages
    if not getattr(tokenizer, "is_fast", False):
        raise DataError(
            f"tokenizer {name!r} is a slow (Python) tokenizer; windowing needs character "
            "offsets, which only fast (Rust) tokenizers give. Use a model with tokenizer.json."
        )
    return tokenizer


def vocabulary_sha256(tokenizer: Any) -> str:
    """The tokenizer's vocabulary (token -> id), as a digest: another tokenizer of the same size
    gives another digest (qa_settings.json keeps it; predict.py compares)."""
    items = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    return hashlib.sha256(json.dumps(items, ensure_ascii=False).encode()).hexdigest()


def tokenizer_fingerprint(tokenizer: Any) -> str:
    return hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode()).hexdigest()


# --------------------------------------------------------------------------------------------
# Features: each question + a window of its context, padded to max_seq_length.
# --------------------------------------------------------------------------------------------


@dataclass
class Features:
    """Arrays over features (windows). Rows of `example_index` are non-decreasing."""

    input_ids: np.ndarray  # [F, L] int32, right-padded
    lengths: np.ndarray  # [F] int32, tokens before padding
    example_index: np.ndarray  # [F] int32, index into the example list
    token_type_ids: np.ndarray | None = None  # [F, L] int8, when the model takes them
    start_positions: np.ndarray | None = None  # [F] int32 (labels), cls_index if no answer
    end_positions: np.ndarray | None = None
    offsets: np.ndarray | None = None  # [F, L, 2] int32 char offsets, -1 outside the context
    cls_index: int = 0

    ARRAYS = (
        "input_ids",
        "lengths",
        "example_index",
        "token_type_ids",
        "start_positions",
        "end_positions",
        "offsets",
    )

    def __len__(self) -> int:
        return len(self.lengths)


class _Template:
    """Where special tokens go around (question, context), read off the tokenizer itself."""

    def __init__(self, tokenizer: Any) -> None:
        backend = copy.deepcopy(tokenizer.backend_tokenizer)
        backend.no_truncation()
        backend.no_padding()
        self.backend = backend
        pair = backend.encode("a", "b", add_special_tokens=True)
        seq = pair.sequence_ids
        q_at, c_at = seq.index(0), seq.index(1)
        ids, types = pair.ids, pair.type_ids
        self.prefix, self.middle, self.suffix = ids[:q_at], ids[q_at + 1 : c_at], ids[c_at + 1 :]
        self.prefix_type, self.q_type = (types[0] if q_at else types[q_at]), types[q_at]
        self.middle_type, self.c_type = (types[c_at - 1] if c_at > q_at + 1 else 0), types[c_at]
        self.suffix_type = types[-1] if len(ids) > c_at + 1 else types[c_at]
        self.specials = len(self.prefix) + len(self.middle) + len(self.suffix)
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        if getattr(tokenizer, "padding_side", "right") != "right":
            raise DataError(
                f"tokenizer {name!r} pads on the left (XLNet-style); windows here are padded on the "
                "right with the question first, so its model would see them wrong. Use a model whose "
                "tokenizer pads on the right (BERT, RoBERTa, DeBERTa, ELECTRA, ALBERT, ...)."
            )
        cls_id = tokenizer.cls_token_id
        if cls_id is None or cls_id not in self.prefix:
            raise DataError(
                f"tokenizer {name!r} does not start a (question, context) pair with its CLS token "
                "(it puts it last, or has none): SQuAD 2.0's no-answer label and score sit at CLS, "
                "so this windowing cannot serve it. Use a model whose pair starts with CLS."
            )
        self.cls_index = self.prefix.index(cls_id)
        self.pad_id = tokenizer.pad_token_id or 0
        self.uses_token_types = "token_type_ids" in tokenizer.model_input_names


def window_starts(n_context: int, budget: int, stride: int) -> list[int]:
    """Start token of each window: the Hugging Face tokenizers' overflow rule."""
    starts = [0]
    while starts[-1] + budget < n_context:
        starts.append(starts[-1] + budget - stride)
    return starts


def _tokenize_questions(examples: Sequence[Example], backend: Any, max_query_length: int) -> list[list[int]]:
    encoded = backend.encode_batch([ex.question.lstrip() for ex in examples], add_special_tokens=False)
    return [enc.ids[:max_query_length] for enc in encoded]


def _tokenize_contexts(
    examples: Sequence[Example], backend: Any, progress: bool
) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """Each distinct context once: (example -> context index, token ids, char starts, char ends)."""
    context_of: dict[str, int] = {}
    example_context = np.empty(len(examples), dtype=np.int64)
    for i, ex in enumerate(examples):
        example_context[i] = context_of.setdefault(ex.context, len(context_of))
    contexts = list(context_of)
    ids: list[np.ndarray] = []
    starts: list[np.ndarray] = []
    ends: list[np.ndarray] = []
    chunk = 2048
    bar = _progress(len(contexts), "tokenizing contexts", progress)
    for lo in range(0, len(contexts), chunk):
        for enc in backend.encode_batch(contexts[lo : lo + chunk], add_special_tokens=False):
            ids.append(np.asarray(enc.ids, dtype=np.int32))
            offsets = np.asarray(enc.offsets, dtype=np.int32).reshape(-1, 2)
            starts.append(offsets[:, 0])
            ends.append(offsets[:, 1])
        bar.update(min(chunk, len(contexts) - lo))
    bar.close()
    return example_context, ids, starts, ends


def build_features(
    examples: Sequence[Example],
    tokenizer: Any,
    spec: WindowSpec,
    *,
    labels: bool,
    offsets: bool,
    progress: bool = False,
) -> Features:
    """Tokenize each distinct context once and each question once, then cut windows in NumPy.

    SQuAD asks ~4.6 questions per paragraph; the usual recipe re-tokenizes the paragraph for every
    question. The windows, ids and labels are the same as the usual recipe's
    (tests/support/reference_features.py; tests/test_data.py checks it), the tokenizer work about a
    quarter.
    """
    template = _Template(tokenizer)
    spec.check(template.specials)
    q_ids = _tokenize_questions(examples, template.backend, spec.max_query_length)
    example_context, c_ids, c_starts, c_ends = _tokenize_contexts(examples, template.backend, progress)
    heads = [np.asarray(template.prefix + q + template.middle, dtype=np.int32) for q in q_ids]
    # Window starts for every example first, so the arrays are allocated once.
    budgets = [spec.max_seq_length - len(head) - len(template.suffix) for head in heads]
    windows = [
        window_starts(len(c_ids[c]), budget, spec.doc_stride)
        for c, budget in zip(example_context, budgets, strict=True)
    ]
    out = _allocate(sum(len(w) for w in windows), spec.max_seq_length, template, labels, offsets)
    row = 0
    bar = _progress(len(examples), "cutting windows", progress)
    for i, example in enumerate(examples):
        c = example_context[i]
        context = (c_ids[c], c_starts[c], c_ends[c])
        answer = _answer_span(example, c_starts[c], c_ends[c]) if labels else None
        for start in windows[i]:
            window = _Window(row, i, heads[i], len(q_ids[i]), start, budgets[i])
            _write_window(out, template, window, context, answer)
            row += 1
        if (i + 1) % 4096 == 0 or i + 1 == len(examples):
            bar.update((i % 4096) + 1)
    bar.close()
    return out


def _allocate(n_features: int, max_len: int, template: _Template, labels: bool, offsets: bool) -> Features:
    """Empty feature arrays: ids padded, offsets -1 (outside the context) until written."""
    return Features(
        input_ids=np.full((n_features, max_len), template.pad_id, dtype=np.int32),
        lengths=np.empty(n_features, dtype=np.int32),
        example_index=np.empty(n_features, dtype=np.int32),
        token_type_ids=np.zeros((n_features, max_len), dtype=np.int8) if template.uses_token_types else None,
        start_positions=np.empty(n_features, dtype=np.int32) if labels else None,
        end_positions=np.empty(n_features, dtype=np.int32) if labels else None,
        offsets=np.full((n_features, max_len, 2), -1, dtype=np.int32) if offsets else None,
        cls_index=template.cls_index,
    )


@dataclass(frozen=True)
class _AnswerSpan:
    start_char: int
    end_char: int
    start_token: int  # last context token starting at or before the answer
    end_token: int  # first context token ending at or after it


def _answer_span(example: Example, starts: np.ndarray, ends: np.ndarray) -> _AnswerSpan | None:
    """The first answer's characters and tokens in its context; None if unanswerable."""
    if example.is_impossible:
        return None
    start_char = example.answers[0]["answer_start"]
    end_char = start_char + len(example.answers[0]["text"])
    start_token = int(np.searchsorted(starts, start_char, side="right")) - 1
    end_token = int(np.searchsorted(ends, end_char, side="left"))
    return _AnswerSpan(start_char, end_char, start_token, end_token)


@dataclass(slots=True)  # one per window: a plain slotted record is the cheapest to build
class _Window:
    row: int  # feature row to write
    example: int
    head: np.ndarray  # prefix + question + middle tokens
    question_len: int
    start: int  # first context token
    budget: int  # context tokens that fit


def _write_window(
    out: Features,
    template: _Template,
    window: _Window,
    context: tuple[np.ndarray, np.ndarray, np.ndarray],
    answer: _AnswerSpan | None,
) -> None:
    """One feature row: [head | context[start:start+budget] | suffix], its types, offsets, labels."""
    ids, starts, ends = context
    row, head, ws = window.row, window.head, window.start
    we = min(ws + window.budget, len(ids))
    h, n, s = len(head), we - ws, len(template.suffix)
    out.input_ids[row, :h] = head
    out.input_ids[row, h : h + n] = ids[ws:we]
    out.input_ids[row, h + n : h + n + s] = template.suffix
    out.lengths[row] = h + n + s
    out.example_index[row] = window.example
    if out.token_type_ids is not None:
        types = out.token_type_ids[row]
        q0 = len(template.prefix)
        q1 = q0 + window.question_len
        types[:q0] = template.prefix_type
        types[q0:q1] = template.q_type
        types[q1:h] = template.middle_type
        types[h : h + n] = template.c_type
        types[h + n : h + n + s] = template.suffix_type
    if out.offsets is not None:
        out.offsets[row, h : h + n, 0] = starts[ws:we]
        out.offsets[row, h : h + n, 1] = ends[ws:we]
    if out.start_positions is not None:
        inside = (  # the whole answer lies in this window's context
            answer is not None
            and n > 0
            and starts[ws] <= answer.start_char
            and ends[we - 1] >= answer.end_char
        )
        if inside:
            out.start_positions[row] = h + min(answer.start_token, we - 1) - ws
            out.end_positions[row] = h + max(answer.end_token, ws) - ws
        else:
            out.start_positions[row] = out.end_positions[row] = template.cls_index


def _progress(total: int, desc: str, enabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, disable=not enabled, file=sys.stderr, leave=False)
