"""The inspectable outputs of a prediction run, in the formats the official SQuAD tools read:
predictions.json (id -> answer), null_odds.json (id -> no-answer score difference, the v2.0
script's --na-prob-file) and nbest_predictions.json (per question its top spans with text,
character offsets, probability and logits). Evaluation and predict.py write them the same way."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from extractive_qa.data.features import Features
from extractive_qa.data.squad_files import Example
from extractive_qa.io.files import write_text_atomic
from extractive_qa.qa.answers import Answers, rank_spans, trim_span

PREDICTIONS = "predictions.json"
NULL_ODDS = "null_odds.json"
NBEST = "nbest_predictions.json"
OUTPUT_FILES = (PREDICTIONS, NULL_ODDS, NBEST)
NBest = dict[str, list[dict[str, Any]]]  # id -> its top spans, as nbest_predictions.json holds them
# Written first into every predict.py --out-dir (write_outputs' record): the mark of a directory
# predict.py filled (files).
OUTPUT_RECORD = "predict.json"
# A question whose windows hold no valid span always answers "": its null odds are the largest
# float JSON can carry portably (Infinity is not JSON).
ALWAYS_NULL = float(np.finfo(np.float32).max)


def null_odds(examples: Sequence[Example], answers: Answers) -> dict[str, float]:
    """id -> null score minus best span score: "" is predicted where this exceeds the threshold."""
    diffs = np.minimum(np.asarray(answers.null_score_diff, dtype=np.float64), ALWAYS_NULL)
    return {ex.id: float(d) for ex, d in zip(examples, diffs, strict=True)}


def nbest_predictions(
    examples: Sequence[Example],
    features: Features,
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    *,
    n_best: int,
    max_answer_length: int,
    version_2: bool,
) -> NBest:
    """Each question's n_best spans, best first, with their softmax probability over those spans
    (v2.0: and the null, listed as text "" at offsets -1): each question's probabilities sum to 1."""
    start_logits = np.asarray(start_logits, dtype=np.float32)
    end_logits = np.asarray(end_logits, dtype=np.float32)
    ranked = rank_spans(features, start_logits, end_logits, n_best, max_answer_length)
    offsets = np.asarray(features.offsets)
    entries: list[list[dict[str, Any]]] = [[] for _ in examples]
    for row in np.flatnonzero(ranked.kept):
        e, f = int(ranked.example[row]), int(ranked.feature[row])
        s_tok, e_tok = int(ranked.start_token[row]), int(ranked.end_token[row])
        start, end = trim_span(examples[e].context, int(offsets[f, s_tok, 0]), int(offsets[f, e_tok, 1]))
        entries[e].append(
            {
                "text": examples[e].context[start:end],
                "start": start,
                "end": end,
                "start_logit": float(start_logits[f, s_tok]),
                "end_logit": float(end_logits[f, e_tok]),
                "score": float(ranked.score[row]),
            }
        )
    if version_2:
        add_null_entries(entries, features, start_logits, end_logits)
    out = {}
    for ex, spans in zip(examples, entries, strict=True):
        spans.sort(key=lambda s: -s["score"])
        if spans:
            scores = np.array([s["score"] for s in spans], dtype=np.float64)
            prob = np.exp(scores - scores.max())
            prob /= prob.sum()
            for span, p in zip(spans, prob, strict=True):
                span["probability"] = float(p)
                del span["score"]
        out[ex.id] = spans
    return out


def add_null_entries(
    entries: list[list[dict[str, Any]]], features: Features, start_logits: np.ndarray, end_logits: np.ndarray
) -> None:
    """v2.0: each question's null (CLS) span, at the smallest CLS score over its windows (as
    extraction scores the null), listed as text "" at offsets -1."""
    cls = features.cls_index
    null = np.full(len(entries), np.inf)
    which = np.zeros(len(entries), dtype=np.int64)
    scores = start_logits[:, cls] + end_logits[:, cls]
    for f, e in enumerate(np.asarray(features.example_index)):
        if scores[f] < null[e]:
            null[e], which[e] = scores[f], f
    for e in range(len(entries)):
        if np.isfinite(null[e]):
            f = int(which[e])
            entries[e].append({"text": "", "start": -1, "end": -1, "start_logit": float(start_logits[f, cls]),
                               "end_logit": float(end_logits[f, cls]), "score": float(null[e])})  # fmt: skip


def write_outputs(
    out_dir: Path,
    examples: Sequence[Example],
    answers: Answers,
    nbest: NBest | None = None,
    record: dict[str, str] | None = None,
) -> dict[str, str]:
    """predictions.json, null_odds.json and (given) nbest_predictions.json in out_dir, each written
    atomically; returns their paths by name. A `record` (predict.py's: what wrote the directory,
    from what) is written first, as OUTPUT_RECORD: the mark files.check_new_directory reads to let
    a later run fill the same directory again."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if record is not None:
        write_text_atomic(out_dir / OUTPUT_RECORD, json.dumps(record))
    files = {
        PREDICTIONS: answers.text,
        NULL_ODDS: null_odds(examples, answers),
        **({NBEST: nbest} if nbest is not None else {}),
    }
    for name, content in files.items():
        write_text_atomic(out_dir / name, json.dumps(content, ensure_ascii=False))
    return {name: str(out_dir / name) for name in files}
