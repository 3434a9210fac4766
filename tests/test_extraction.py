"""Answer extraction on constructed logits, and equality with the per-pair loop."""

from __future__ import annotations

import numpy as np

from extractive_qa.data import squad_files
from extractive_qa.data.features import Features
from extractive_qa.qa.answers import extract_answers
from tests.support.reference_extraction import loop_extract, setup

CONTEXT = "alpha beta gamma delta epsilon zeta eta theta"


def _two_windows() -> tuple[list[squad_files.Example], Features]:
    """One example, two windows over its 8 words; context tokens at positions 2.. of each."""
    words = CONTEXT.split()
    starts = [sum(len(w) + 1 for w in words[:i]) for i in range(len(words))]
    L = 8
    offsets = np.full((2, L, 2), -1, dtype=np.int32)
    for row, first in enumerate((0, 3)):  # window 0: words 0-4, window 1: words 3-7
        for j in range(5):
            w = first + j
            offsets[row, 2 + j] = (starts[w], starts[w] + len(words[w]))
    f = Features(
        input_ids=np.zeros((2, L), np.int32),
        lengths=np.full(2, L, np.int32),
        example_index=np.zeros(2, np.int32),
        offsets=offsets,
    )
    return [squad_files.Example("q", "?", CONTEXT, [])], f


def _logits(pairs: dict[tuple[int, int], float], fill: float = -5.0) -> np.ndarray:
    x = np.full((2, 8), fill, dtype=np.float32)
    for (row, pos), v in pairs.items():
        x[row, pos] = v
    return x


def test_best_span_across_two_windows() -> None:
    examples, f = _two_windows()
    start = _logits({(0, 2): 3.0, (1, 4): 4.0})  # window 1 pos 4 = word 5 'zeta'
    end = _logits({(0, 3): 3.0, (1, 5): 4.0})  # window 1 pos 5 = word 6 'eta'
    answers = extract_answers(examples, f, start, end)
    assert answers.text == {"q": "zeta eta"}
    assert CONTEXT[answers.start[0] : answers.end[0]] == "zeta eta"
    assert 0 < answers.score[0] <= 1


def test_span_longer_than_max_answer_length_is_rejected() -> None:
    examples, f = _two_windows()
    start = _logits({(0, 2): 9.0, (0, 4): 1.0})
    end = _logits({(0, 6): 9.0, (0, 5): 1.0})
    assert extract_answers(examples, f, start, end).text["q"] == "alpha beta gamma delta epsilon"
    short = extract_answers(examples, f, start, end, max_answer_length=3)
    assert short.text["q"] != "alpha beta gamma delta epsilon"
    assert len(short.text["q"].split()) <= 3


def test_end_before_start_and_question_tokens_never_chosen() -> None:
    examples, f = _two_windows()
    start = _logits({(0, 0): 50.0, (0, 5): 9.0, (0, 3): 1.0}, fill=-50)  # pos 0: question
    end = _logits({(0, 0): 50.0, (0, 2): 9.0, (0, 4): 1.0}, fill=-50)
    answers = extract_answers(examples, f, start, end)
    assert answers.text["q"] == "beta gamma"  # (5,2) is backwards; (3,4) is the best valid


def test_v2_null_chosen_by_threshold() -> None:
    examples, f = _two_windows()
    start = _logits({(0, 0): 2.0, (1, 0): 3.0, (0, 3): 2.5})
    end = _logits({(0, 0): 2.0, (1, 0): 3.0, (0, 3): 2.5})
    # best span 5.0; null = min over windows of CLS scores = 4.0; diff = -1.0
    v2 = extract_answers(examples, f, start, end, version_2=True)
    assert v2.text["q"] == "beta" and v2.null_score_diff[0] == -1.0
    assert (
        extract_answers(examples, f, start, end, version_2=True, null_score_diff_threshold=-2.0).text["q"]
        == ""
    )
    assert extract_answers(examples, f, start, end, version_2=False).text["q"] == "beta"


def test_matches_the_per_pair_loop_on_real_windows() -> None:
    examples, features, start, end = setup(600, seed=3)
    ours = extract_answers(examples, features, start, end)
    assert ours.text == loop_extract(examples, features, start, end)
