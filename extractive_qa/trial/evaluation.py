"""Distributed evaluation: every rank keeps its windows' logits; the chief reassembles them,
extracts the answers and scores them.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from determined import pytorch

from extractive_qa.data.batching import assemble_logits
from extractive_qa.data.features import Features
from extractive_qa.data.squad_files import Example
from extractive_qa.qa import outputs, qa_settings, squad_metric
from extractive_qa.trial import perf_metrics

# --------------------------------------------------------------------------------------------
# Distributed evaluation: every rank scores its windows; the chief extracts and scores.
# --------------------------------------------------------------------------------------------


class SquadEvaluator(pytorch.MetricReducer):
    """Gathers (feature index, start logits, end logits) from every rank; the chief turns them into
    `score(start, end)`'s metrics plus the validation's questions per second."""

    def __init__(
        self,
        rank: int,
        features: Features,
        questions: int,
        score: Callable[[np.ndarray, np.ndarray], dict[str, Any]],
    ) -> None:
        self.rank, self.features, self.questions, self.score = rank, features, questions, score
        self.reset()

    def reset(self) -> None:  # at the start of each validation
        self.parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.started = time.perf_counter()

    def update(self, index: torch.Tensor, start: torch.Tensor, end: torch.Tensor) -> None:
        self.parts.append((index.cpu().numpy(), start.float().cpu().numpy(), end.float().cpu().numpy()))

    def per_slot_reduce(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        return self.parts

    def cross_slot_reduce(self, per_slot: list[list[tuple]]) -> dict[str, Any]:
        if self.rank != 0:
            return {}  # only the chief reports; the other ranks skip the extraction
        parts = [p for slot in per_slot for p in slot]
        start, end = assemble_logits(parts, self.features)
        scores = self.score(start, end)
        return {**scores, **perf_metrics.validation_rates(time.perf_counter() - self.started, self.questions)}


def score_validation(
    qa: qa_settings.QASettings,
    examples: Sequence[Example],
    features: Features,
    start: np.ndarray,
    end: np.ndarray,
    save_predictions: bool,
) -> tuple[dict[str, Any], qa_settings.QASettings, Callable[[Any], Any] | None]:
    """The validation's scores from its window logits, as the official scripts compute them: EM/F1,
    and on v2.0 `exact_match` beside the official `exact`, best_* and their thresholds. Returns
    (metrics, the settings with v2.0's tuned no-answer threshold, a writer of the predictions /
    null odds / n-best files when save_predictions asks for them)."""
    answers = qa.extract_answers(examples, features, start, end)
    metrics = squad_metric.score(examples, answers.text, qa.squad_version)
    if qa.squad_version == "2.0":
        # One name for EM in every run's metrics; `exact` stays, the official v2.0 script's.
        metrics = {"exact_match": metrics["exact"], **metrics}
        odds = outputs.null_odds(examples, answers)
        metrics.update(squad_metric.best_thresholds(examples, answers.span_text, odds))
        tuned = squad_metric.tuned_null_threshold(examples, answers.span_text, odds)
        qa = dataclasses.replace(qa, tuned_null_threshold=tuned)
    if not save_predictions:
        return metrics, qa, None
    nbest = qa.nbest(examples, features, start, end)
    return metrics, qa, lambda out_dir: outputs.write_outputs(out_dir, examples, answers, nbest)
