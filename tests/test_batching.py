"""Training batches (FeatureBatchSampler): coverage, determinism, widths, rank sharding,
and no repetition across epochs beyond what the batching's own randomness gives."""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pytest

from extractive_qa.config.settings import BATCHINGS
from extractive_qa.data.batching import Collator, FeatureBatchSampler, evaluation_batches

BATCHINGS = BATCHINGS


def lengths(n: int, seed: int = 0, max_len: int = 256) -> np.ndarray:
    """SQuAD-like window lengths: many full windows (long contexts), the rest spread out."""
    rng = np.random.default_rng(seed)
    full = rng.random(n) < 0.3
    return np.where(full, max_len, rng.integers(40, max_len, n)).astype(np.int32)


def sampler(lens: np.ndarray, batching: str, batch: int = 16, ranks: int = 1, seed: int = 7):
    return FeatureBatchSampler(
        lens, batch, shuffle=True, batching=batching, seed=seed, ranks=ranks, bucket_width=64
    )


@pytest.mark.parametrize("batching", BATCHINGS)
@pytest.mark.parametrize("ranks", [1, 3])
def test_every_window_once_per_epoch_and_a_pure_function_of_seed_and_epoch(batching: str, ranks: int) -> None:
    lens = lengths(1_001)
    s = sampler(lens, batching, ranks=ranks)
    first = s.batches(0)
    assert len(first) == len(s)  # what Determined's epoch length is computed from
    assert sorted(np.concatenate(first).tolist()) == list(range(len(lens)))
    assert sum(len(b) < 16 for b in first) <= 1  # one short batch at most
    again = sampler(lens, batching, ranks=ranks).batches(0)
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(first, s.batches(1), strict=True))
    assert [b.tolist() for b in first] == list(iter(sampler(lens, batching, ranks=ranks)))


def test_buckets_share_a_width_across_the_ranks_of_a_global_batch() -> None:
    lens, ranks, width = lengths(2_000), 2, 64
    batches = sampler(lens, "buckets", ranks=ranks).batches(0)
    bucket = -(-lens // width)
    # Global batches: one per-slot batch per rank, consecutive (Determined shards them that way).
    global_batches = [np.concatenate(batches[g : g + ranks]) for g in range(0, len(batches), ranks)]
    mixed = [g for g in global_batches if len(set(bucket[g].tolist())) > 1]
    # A bucket's remainder joins the next bucket's windows: at most one mixed global batch per
    # bucket boundary (4 buckets: 3), plus the short last one.
    assert len(mixed) <= 3 + 1
    assert len(global_batches) - len(mixed) > 0.9 * len(global_batches)
    # The collator pads to the bucket's width: a run sees max_seq_length / width shapes at most.
    features = type("F", (), {})()
    features.lengths = lens
    features.input_ids = np.zeros((len(lens), 256), dtype=np.int32)
    features.token_type_ids = None
    collate = Collator(features, True, width, labels=False)
    widths = {collate(b.tolist())["input_ids"].shape[1] for b in batches}
    assert widths <= {64, 128, 192, 256}


def repeat_share(s: FeatureBatchSampler) -> float:
    def pairs(batches: list[np.ndarray]) -> set[tuple[int, int]]:
        return {p for b in batches for p in combinations(sorted(b.tolist()), 2)}

    first, second = pairs(s.batches(0)), pairs(s.batches(1))
    return len(first & second) / len(first)


def random_within_buckets(lens: np.ndarray, batch: int, width: int) -> float:
    """The share of a batch's pairs met again next epoch if batches were drawn at random inside
    each width bucket: a pair of a bucket of m windows meets again with chance (batch-1)/(m-1)."""
    _, m = np.unique(-(-lens // width), return_counts=True)
    return float((m * (batch - 1) / (m - 1)).sum() / m.sum())


@pytest.mark.parametrize("n", [1_000, 20_000])
def test_random_and_bucketed_batches_repeat_no_more_than_their_randomness_gives(n: int) -> None:
    """Random batches, and random batches inside width buckets, meet the same window pairs again
    next epoch no more often than random draws (inside the buckets) would; the sorted batching
    repeats far more on small data sets -- what bench/batching.py measures the F1 cost of."""
    lens = lengths(n, seed=n)
    expected = random_within_buckets(lens, 16, 64)
    assert repeat_share(sampler(lens, "buckets")) <= 1.5 * expected + 1e-3
    assert repeat_share(sampler(lens, "random")) <= 1.5 * 15 / (n - 1) + 1e-3
    if n <= 1_000:  # chunks of 50 batches are most of a small data set
        assert repeat_share(sampler(lens, "sorted")) > 3 * expected


def test_evaluation_batches_are_sorted_and_unshuffled() -> None:
    lens = lengths(300)
    features = type("F", (), {"lengths": lens})()
    s, _ = evaluation_batches(features, 32, 8)
    order = np.concatenate(s.batches(0))
    assert np.array_equal(lens[order], np.sort(lens)[::-1])
    assert all(np.array_equal(a, b) for a, b in zip(s.batches(0), s.batches(5), strict=True))
