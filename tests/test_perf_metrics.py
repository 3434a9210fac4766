"""perf_metrics.TrainingThroughput: the window's rates from wall-clock time and real counts."""

from __future__ import annotations

import time

import pytest
import torch

from extractive_qa.trial import perf_metrics


def window(wait_s: float, step_s: float, mask: torch.Tensor, batches: int) -> tuple:
    """One rank's window: each batch waits `wait_s` for data, then trains for `step_s`."""
    perf = perf_metrics.TrainingThroughput(torch.device("cpu"), slots=2, samples_per_step=16, aggregation=2)
    perf.reset()
    for _ in range(batches):
        time.sleep(wait_s)
        perf.batch_started()
        time.sleep(step_s)
        perf.batch_ended(mask)
    return perf, perf.per_slot_reduce()


def test_rates_are_counts_over_the_window_not_means_of_batches() -> None:
    mask = torch.tensor([[1] * 6 + [0] * 2, [1] * 4 + [0] * 4, [1] * 8, [1] * 2 + [0] * 6])  # 20 real of 32
    perf, fast = window(wait_s=0.0, step_s=0.01, mask=mask, batches=4)
    _, slow = window(wait_s=0.06, step_s=0.02, mask=mask, batches=4)
    out = perf.cross_slot_reduce([fast, slow])
    seconds = max(fast[0], slow[0])  # the slowest rank's window: ~0.32 s
    assert seconds == pytest.approx(0.32, abs=0.1)
    assert out["perf_samples_per_s"] == pytest.approx(2 * 4 * 4 / seconds)
    assert out["perf_samples_per_s_per_slot"] == pytest.approx(out["perf_samples_per_s"] / 2)
    assert out["perf_tokens_per_s"] == pytest.approx(2 * 4 * 20 / seconds)
    assert out["perf_padding_frac"] == pytest.approx(12 / 32)
    assert out["perf_step_s"] == pytest.approx(seconds / 2)  # 4 batches, aggregation 2
    assert out["perf_samples_per_step"] == 16 and "perf_peak_mem_gib" not in out  # CPU
    # waiting: ~0 on the fast rank, ~3/4 of the slow one's window; the mean over ranks
    slow_share = slow[5] / slow[0]
    assert slow_share == pytest.approx(0.75, abs=0.1)
    assert out["perf_data_wait_frac"] == pytest.approx((fast[5] / fast[0] + slow_share) / 2)


def test_reset_starts_a_new_window() -> None:
    mask = torch.ones(2, 4, dtype=torch.int64)
    perf, first = window(wait_s=0.0, step_s=0.0, mask=mask, batches=3)
    perf.reset()
    perf.batch_started()
    perf.batch_ended(mask)
    _, batches, samples, real, tokens, _, _ = perf.per_slot_reduce()
    assert (batches, samples, real, tokens) == (1, 2, 8, 8) and first[1:5] == (3, 6, 24, 24)
    perf.reset()
    assert perf.cross_slot_reduce([perf.per_slot_reduce()]) == {}  # an empty window reports nothing


def test_validation_rates() -> None:
    assert perf_metrics.validation_rates(4.0, 810) == {"perf_val_s": 4.0, "perf_val_questions_per_s": 202.5}
