"""Distributed evaluation: every rank keeps its windows' logits; the chief reassembles them,
extracts the answers and scores them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from determined import pytorch

from extractive_qa.data.batching import assemble_logits
from extractive_qa.data.features import Features
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
