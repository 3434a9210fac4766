"""Feature preparation: our paragraph-once path vs the standard fast-tokenizer recipe.

The standard recipe (the transformers QA examples' method): one batched tokenizer call over
(question, context) pairs with overflow windows and offset mappings, padded to max length, then a
Python loop that labels start/end tokens. Both run side by side on the same ~40k real examples
(the v1.1 train excerpt repeated with fresh ids, each copy's contexts given a distinct tail so no
copy shares a paragraph with another), features are compared for identity, and the ratio printed.

    python3 bench/features.py [--copies 150] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import data  # noqa: E402


def standard_recipe(examples, tokenizer, spec: data.WindowSpec) -> dict[str, np.ndarray]:
    """The usual way: tokenize every (question, context) pair with overflow, label in Python."""
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


def compare(ours: data.Features, standard: dict[str, np.ndarray]) -> list[str]:
    """Names of the arrays that differ (empty = identical features)."""
    diff = []
    for name, ref in standard.items():
        mine = getattr(ours, name)
        if mine is None or mine.shape != ref.shape or not np.array_equal(mine, ref):
            diff.append(name)
    return diff


def replicate(examples, copies: int) -> list[data.Example]:
    """Copies of the excerpt with fresh ids; each copy's contexts get a distinct tail."""
    out = []
    for c in range(copies):
        tail = f" (copy {c})"
        for ex in examples:
            out.append(data.Example(f"{ex.id}-{c}", ex.question, ex.context + tail, ex.answers))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--copies", type=int, default=150, help="150 copies = ~40k examples")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    squad = data.load_squad(ROOT / "squad_data/train-v1.1-excerpt.json", training=True)
    tokenizer = data.load_tokenizer(data.EMBEDDED_MODEL)
    examples = replicate(squad.examples, args.copies)
    spec = data.WindowSpec()

    t0 = time.perf_counter()
    standard = standard_recipe(examples, tokenizer, spec)
    t_standard = time.perf_counter() - t0
    t0 = time.perf_counter()
    ours = data.build_features(examples, tokenizer, spec, labels=True, offsets=False)
    t_ours = time.perf_counter() - t0
    differ = compare(ours, standard)
    result = {
        "examples": len(examples),
        "features": len(ours),
        "standard_examples_per_s": round(len(examples) / t_standard, 1),
        "ours_examples_per_s": round(len(examples) / t_ours, 1),
        "speedup": round(t_standard / t_ours, 2),
        "identical_features": not differ,
        "differing_arrays": differ,
        "machine": f"{platform.node()} {platform.processor() or platform.machine()}",
    }
    print(f"{'path':<28}{'examples/s':>12}")
    print(f"{'standard recipe':<28}{result['standard_examples_per_s']:>12}")
    print(f"{'ours (paragraph once)':<28}{result['ours_examples_per_s']:>12}")
    print(f"speedup {result['speedup']}x, identical features: {result['identical_features']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
