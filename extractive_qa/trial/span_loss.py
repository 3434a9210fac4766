"""The span loss with a weight on no-answer windows (SQuAD 2.0 recipes).

A window is labelled "no answer" when its start and end positions are the CLS token: every
window of an unanswerable question, and the windows of an answerable one that miss its answer.
The standard recipe (weight 1) is the model's own loss, the mean over windows of the start and
end cross-entropies; `model_def.py` uses the model's loss then, so the standard recipe's numbers
stay exactly those of Hugging Face's models. A weight below 1 lets a small model learn to find
answers before it learns to abstain; weight 0 trains on the answer-bearing windows only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def no_answer_weight(step: int, answerable_first_steps: int, weight: float) -> float:
    """The weight of no-answer windows at optimizer step `step`: 0 during the first
    `answerable_first_steps` steps (hyperparameters.answerable_first), then `weight`."""
    return 0.0 if step < answerable_first_steps else weight


def weighted_span_loss(
    start_logits: torch.Tensor,
    end_logits: torch.Tensor,
    start_positions: torch.Tensor,
    end_positions: torch.Tensor,
    cls_index: int,
    weight: float,
) -> torch.Tensor:
    """Mean over the batch's windows of (start CE + end CE) / 2, each no-answer window's term
    times `weight`. Divided by the number of windows, not by the weights' sum, so a batch of
    no-answer windows at weight 0 gives a zero gradient rather than a division by zero."""
    start = F.cross_entropy(start_logits.float(), start_positions, reduction="none")
    end = F.cross_entropy(end_logits.float(), end_positions, reduction="none")
    no_answer = (start_positions == cls_index) & (end_positions == cls_index)
    weights = torch.where(no_answer, torch.full_like(start, weight), torch.ones_like(start))
    return ((start + end) / 2 * weights).mean()
