"""Reference implementations the tests compare data.py against (benchmarks time them too).

The standard feature recipe of the transformers QA examples: tokenize (question, context) pairs
with overflow windows and offset mappings, padded to max length, and label start/end tokens in a
Python loop -- in batches of 1,000 examples, as `datasets.map(batched=True)` runs it by default.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from extractive_qa.config.settings import WindowSpec
from extractive_qa.data import squad_files
from extractive_qa.data.features import Features


def standard_recipe(
    examples: Sequence[squad_files.Example], tokenizer: Any, spec: WindowSpec, batch_size: int = 1000
) -> dict[str, np.ndarray]:
    """The usual way, in batches of `batch_size` examples as `datasets.map(batched=True)` runs it."""
    parts = [
        _standard_batch(examples[lo : lo + batch_size], tokenizer, spec)
        for lo in range(0, len(examples), batch_size)
    ]
    out = {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}
    # Each batch numbers its examples from 0; batch k starts at example k * batch_size.
    out["example_index"] = np.concatenate([p["example_index"] + k * batch_size for k, p in enumerate(parts)])
    return out


def _standard_batch(
    examples: Sequence[squad_files.Example], tokenizer: Any, spec: WindowSpec
) -> dict[str, np.ndarray]:
    """One batch: tokenize every (question, context) pair with overflow, label in Python."""
    # The recipe does not truncate questions; on SQuAD none exceeds max_query_length (64), so
    # the features are comparable with ours, which do.
    questions = [ex.question.lstrip() for ex in examples]
    enc = tokenizer(
        questions,
        [ex.context for ex in examples],
        truncation="only_second",
        max_length=spec.max_seq_length,
        stride=spec.doc_stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        padding="max_length",
    )
    sample_map = enc.pop("overflow_to_sample_mapping")
    starts, ends = [], []
    for i, offsets in enumerate(enc["offset_mapping"]):
        input_ids = enc["input_ids"][i]
        cls_index = input_ids.index(tokenizer.cls_token_id)
        sequence_ids = enc.sequence_ids(i)
        ex = examples[sample_map[i]]
        if ex.is_impossible:
            starts.append(cls_index)
            ends.append(cls_index)
            continue
        start_char = ex.answers[0]["answer_start"]
        end_char = start_char + len(ex.answers[0]["text"])
        token_start = 0
        while sequence_ids[token_start] != 1:
            token_start += 1
        token_end = len(input_ids) - 1
        while sequence_ids[token_end] != 1:
            token_end -= 1
        if not (offsets[token_start][0] <= start_char and offsets[token_end][1] >= end_char):
            starts.append(cls_index)
            ends.append(cls_index)
        else:
            while token_start < len(offsets) and offsets[token_start][0] <= start_char:
                token_start += 1
            starts.append(token_start - 1)
            while offsets[token_end][1] >= end_char:
                token_end -= 1
            ends.append(token_end + 1)
    out = {
        "input_ids": np.asarray(enc["input_ids"], dtype=np.int32),
        "lengths": np.asarray(enc["attention_mask"], dtype=np.int32).sum(1),
        "example_index": np.asarray(sample_map, dtype=np.int32),
        "start_positions": np.asarray(starts, dtype=np.int32),
        "end_positions": np.asarray(ends, dtype=np.int32),
    }
    if "token_type_ids" in enc:
        types = np.asarray(enc["token_type_ids"], dtype=np.int8)
        out["token_type_ids"] = types * np.asarray(enc["attention_mask"], dtype=np.int8)
    return out


def compare(ours: Features, standard: dict[str, np.ndarray]) -> list[str]:
    """Names of the arrays that differ (empty = identical features)."""
    diff = []
    for name, ref in standard.items():
        mine = getattr(ours, name)
        if mine is None or mine.shape != ref.shape or not np.array_equal(mine, ref):
            diff.append(name)
    return diff
