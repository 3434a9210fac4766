"""Answer extraction: the logits of every window -> one answer per example (n-best spans, the
v2.0 null score). Evaluation and predict.py both use it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from extractive_qa.data.features import Features
from extractive_qa.data.squad_files import Example

# --------------------------------------------------------------------------------------------
# Answer extraction: logits of every window -> one answer per example.
# --------------------------------------------------------------------------------------------


def _top_k(x: np.ndarray, k: int) -> np.ndarray:
    """Indices of each row's k largest values, largest first, ties by lower index.

    argpartition + sorting k values is much cheaper than a full argsort of every row.
    """
    if k >= x.shape[1]:
        return np.argsort(-x, axis=1, kind="stable")
    part = np.argpartition(-x, k - 1, axis=1)[:, :k]
    values = np.take_along_axis(x, part, axis=1)
    order = np.lexsort((part, -values), axis=1)
    return np.take_along_axis(part, order, axis=1)


def trim_span(context: str, start: int, end: int) -> tuple[int, int]:
    """A span's character offsets without whitespace at its edges: SentencePiece and byte-level
    BPE offsets include a token's leading space, WordPiece offsets do not."""
    while start < end and context[start].isspace():
        start += 1
    while end > start and context[end - 1].isspace():
        end -= 1
    return start, end


@dataclass
class Answers:
    text: dict[str, str]  # question id -> answer ("" = no answer)
    score: np.ndarray  # [E] softmax probability of the chosen answer among the n-best
    start: np.ndarray  # [E] character offsets into the context (-1 for no answer)
    end: np.ndarray
    null_score_diff: np.ndarray  # [E] null score minus best span score (inf where no span)
    # question id -> its best span's text whatever the threshold ("" only where no valid span):
    # what the official v2.0 script's best-threshold search scores
    span_text: dict[str, str] = field(default_factory=dict)


def extract_answers(
    examples: Sequence[Example],
    features: Features,
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    *,
    n_best: int = 20,
    max_answer_length: int = 30,
    version_2: bool = False,
    null_score_diff_threshold: float = 0.0,
) -> Answers:
    """Best span per example over all its windows, vectorised over features.

    Candidates are the n_best start and end positions of each window (context tokens only), with
    start <= end and at most max_answer_length tokens. v2.0: answer "" when the null (CLS) score
    beats the best span by more than null_score_diff_threshold.
    """
    start_logits = np.asarray(start_logits, dtype=np.float32)
    end_logits = np.asarray(end_logits, dtype=np.float32)
    offsets = np.asarray(features.offsets)
    n_examples = len(examples)
    ranked = rank_spans(features, start_logits, end_logits, n_best, max_answer_length)

    best_score = np.full(n_examples, -np.inf, dtype=np.float64)
    has_span = np.zeros(n_examples, dtype=bool)
    best_score[ranked.example[ranked.is_best]] = ranked.score[ranked.is_best]
    has_span[ranked.example[ranked.is_best]] = True
    null = _null_scores(features, start_logits, end_logits, n_examples)
    prob = _best_probability(ranked, best_score, has_span, null, version_2, n_examples)
    null_diff = np.where(has_span, null - best_score, np.inf)
    choose_null = ~has_span | (version_2 & (null_diff > null_score_diff_threshold))

    text: dict[str, str] = {}
    span_text: dict[str, str] = {}
    start = np.full(n_examples, -1, dtype=np.int64)
    end = np.full(n_examples, -1, dtype=np.int64)
    rows = np.flatnonzero(ranked.is_best)
    chosen, window = ranked.example[rows], ranked.feature[rows]
    start[chosen] = offsets[window, ranked.start_token[rows], 0]
    end[chosen] = offsets[window, ranked.end_token[rows], 1]
    for e, ex in enumerate(examples):
        if has_span[e]:
            start[e], end[e] = trim_span(ex.context, int(start[e]), int(end[e]))
        span_text[ex.id] = ex.context[start[e] : end[e]] if has_span[e] else ""
        if choose_null[e]:
            start[e] = end[e] = -1
            text[ex.id] = ""
        else:
            text[ex.id] = ex.context[start[e] : end[e]]
    if version_2:
        prob = np.where(choose_null & has_span, 1.0 - prob, prob)
    return Answers(text, prob, start, end, null_diff, span_text)


@dataclass
class _Spans:
    """Each window's n_best start and end tokens and the score of every pair ([windows, k * k])."""

    score: np.ndarray  # -inf where the pair is not a valid span
    start_token: np.ndarray  # [windows, k]
    end_token: np.ndarray  # [windows, k]
    k: int


def _window_spans(
    start_logits: np.ndarray, end_logits: np.ndarray, offsets: np.ndarray, n_best: int, max_answer_length: int
) -> _Spans:
    n_windows, width = start_logits.shape
    k = min(n_best, width)
    in_context = offsets[:, :, 0] >= 0
    start_in = np.where(in_context, start_logits, -np.inf)
    end_in = np.where(in_context, end_logits, -np.inf)
    start_token = _top_k(start_in, k)  # [windows, k]
    end_token = _top_k(end_in, k)
    start_value = np.take_along_axis(start_in, start_token, axis=1)
    end_value = np.take_along_axis(end_in, end_token, axis=1)
    score = start_value[:, :, None] + end_value[:, None, :]  # [windows, k, k]
    length = end_token[:, None, :] - start_token[:, :, None]
    valid = (length >= 0) & (length < max_answer_length) & np.isfinite(score)
    score = np.where(valid, score, -np.inf).reshape(n_windows, k * k)
    return _Spans(score, start_token, end_token, k)


def rank_spans(
    features: Features, start_logits: np.ndarray, end_logits: np.ndarray, n_best: int, max_answer_length: int
) -> RankedSpans:
    """Every example's candidate spans over all its windows, best first (extraction and n-best)."""
    offsets = np.asarray(features.offsets)
    spans = _window_spans(start_logits, end_logits, offsets, n_best, max_answer_length)
    return _rank_by_example(spans, np.asarray(features.example_index), n_best)


@dataclass
class RankedSpans:
    """Every window's n_best spans, sorted by example, then score (descending; first wins ties)."""

    score: np.ndarray
    feature: np.ndarray
    start_token: np.ndarray
    end_token: np.ndarray
    example: np.ndarray
    kept: np.ndarray  # among its example's n_best, with a finite score
    is_best: np.ndarray  # its example's best span


def _rank_by_example(spans: _Spans, example_index: np.ndarray, n_best: int) -> RankedSpans:
    n_windows, k = len(spans.score), spans.k
    top = _top_k(spans.score, min(n_best, k * k))  # [windows, n]
    score = np.take_along_axis(spans.score, top, axis=1).ravel()
    feature = np.repeat(np.arange(n_windows), top.shape[1])
    start_token = spans.start_token[feature, top.ravel() // k]
    end_token = spans.end_token[feature, top.ravel() % k]
    example = example_index[feature]
    order = np.lexsort((-score, example))
    score, feature, start_token, end_token, example = (
        score[order], feature[order], start_token[order], end_token[order], example[order]
    )  # fmt: skip
    n_examples = int(example_index.max()) + 1 if len(example_index) else 0
    first_of_example = np.searchsorted(example, np.arange(n_examples), side="left")
    rank = np.arange(len(example)) - first_of_example[example]
    kept = (rank < n_best) & np.isfinite(score)
    return RankedSpans(score, feature, start_token, end_token, example, kept, kept & (rank == 0))


def _null_scores(
    features: Features, start_logits: np.ndarray, end_logits: np.ndarray, n_examples: int
) -> np.ndarray:
    """The smallest CLS score over an example's windows (the usual SQuAD 2.0 rule)."""
    cls = features.cls_index
    null = np.full(n_examples, np.inf, dtype=np.float64)
    np.minimum.at(null, np.asarray(features.example_index), start_logits[:, cls] + end_logits[:, cls])
    return null


def _best_probability(
    ranked: RankedSpans,
    best_score: np.ndarray,
    has_span: np.ndarray,
    null: np.ndarray,
    version_2: bool,
    n_examples: int,
) -> np.ndarray:
    """Softmax over the kept n-best (plus the null for v2.0): the best span's probability."""
    top_score = np.where(has_span, best_score, 0.0)
    if version_2:
        top_score = np.maximum(top_score, np.where(np.isfinite(null), null, -np.inf))
    exp = np.where(ranked.kept, np.exp(ranked.score - top_score[ranked.example]), 0.0)
    total = np.bincount(ranked.example, weights=exp, minlength=n_examples)
    if version_2:
        total = total + np.exp(null - top_score)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(has_span, np.exp(best_score - top_score) / total, 0.0)
