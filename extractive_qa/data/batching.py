"""Training and evaluation batches: resumable random, width-bucketed or sorted batches with
dynamic padding, the evaluation batching that makes predict.py's logits equal the trial's, what
a model's forward accepts, and reassembling distributed logits.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterator, Sequence

import numpy as np
import torch

from extractive_qa.config.settings import BATCHINGS
from extractive_qa.data.features import Features

# --------------------------------------------------------------------------------------------
# Batches: random, width-bucketed (few padded widths) or sorted; resumable.
# --------------------------------------------------------------------------------------------


class FeatureBatchSampler(torch.utils.data.Sampler):
    """Per-slot batches of feature indices, a pure function of (seed, epoch).

    Determined wraps this in its repeat / shard / skip samplers: consecutive batches go to
    consecutive ranks, and a resumed run replays the same epochs and skips what was trained. For
    `buckets` and `sorted` a global batch (one per-slot batch per rank) is formed first and then
    cut, so ranks get windows of similar length and no rank waits on a long batch.
    """

    def __init__(
        self,
        lengths: np.ndarray,
        batch_size: int,
        *,
        shuffle: bool,
        batching: str,
        seed: int,
        ranks: int = 1,
        bucket_width: int = 64,
    ) -> None:
        if batching not in BATCHINGS:
            raise ValueError(f"batching {batching!r}: one of {', '.join(BATCHINGS)}")
        self.lengths = np.asarray(lengths)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.batching = batching
        self.seed = seed
        self.ranks = ranks
        self.bucket_width = max(1, bucket_width)
        self.epoch = 0

    def __len__(self) -> int:
        return math.ceil(len(self.lengths) / self.batch_size)

    def batches(self, epoch: int) -> list[np.ndarray]:
        n = len(self.lengths)
        rng = np.random.default_rng([self.seed, epoch])
        order = rng.permutation(n) if self.shuffle else np.arange(n)
        if self.batching == "buckets":
            global_batches = self._bucketed(order, rng)
        elif self.batching == "sorted":
            global_batches = self._sorted(order, rng)
        else:
            global_batches = [order]
        return [b[i : i + self.batch_size] for b in global_batches for i in range(0, len(b), self.batch_size)]

    def _bucketed(self, order: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
        """Global batches drawn at random inside each width bucket; each bucket's remainder joins
        the next wider bucket's, and the batches are shuffled (the one short batch stays last)."""
        size = self.batch_size * self.ranks
        bucket = -(-self.lengths[order] // self.bucket_width)
        order = order[np.argsort(bucket, kind="stable")]  # by bucket; random inside each
        bounds = np.flatnonzero(np.diff(np.sort(bucket))) + 1
        full: list[np.ndarray] = []
        carry = np.empty(0, dtype=order.dtype)
        for part in np.split(order, bounds):
            part = np.concatenate([carry, part])
            cut = len(part) - len(part) % size
            full += [part[i : i + size] for i in range(0, cut, size)]
            carry = part[cut:]
        if self.shuffle:
            full = [full[i] for i in rng.permutation(len(full))]
        return full + ([carry] if len(carry) else [])

    def _sorted(self, order: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
        """Sorted by length (longest first) inside chunks of ~50 global batches, then shuffled."""
        size = self.batch_size * self.ranks
        chunk = size * 50
        for lo in range(0, len(order), chunk):
            part = order[lo : lo + chunk]
            order[lo : lo + chunk] = part[np.argsort(-self.lengths[part], kind="stable")]
        batches = [order[i : i + size] for i in range(0, len(order), size)]
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        epoch, self.epoch = self.epoch, self.epoch + 1
        for batch in self.batches(epoch):
            yield batch.tolist()


class FeatureDataset(torch.utils.data.Dataset):
    """Indices only: the collator slices the (read-only) feature arrays per batch."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


class Collator:
    """Pad a batch to its longest window (rounded up to a multiple), or to max length."""

    def __init__(self, features: Features, dynamic: bool, multiple: int, labels: bool) -> None:
        self.f = features
        self.dynamic = dynamic
        self.multiple = max(1, multiple)
        self.labels = labels

    def __call__(self, indices: Sequence[int]) -> dict[str, torch.Tensor]:
        idx = np.sort(np.asarray(indices))  # sorted reads are kinder to a memory map
        f, L = self.f, self.f.input_ids.shape[1]
        lengths = np.asarray(f.lengths[idx])
        width = L
        if self.dynamic:
            width = min(L, -(-int(lengths.max()) // self.multiple) * self.multiple)
        batch = {
            "input_ids": torch.from_numpy(np.asarray(f.input_ids[idx, :width], dtype=np.int64)),
            "attention_mask": torch.from_numpy(
                (np.arange(width)[None, :] < lengths[:, None]).astype(np.int64)
            ),
            "feature_index": torch.from_numpy(idx.astype(np.int64)),
        }
        if f.token_type_ids is not None:
            batch["token_type_ids"] = torch.from_numpy(
                np.asarray(f.token_type_ids[idx, :width], dtype=np.int64)
            )
        if self.labels:
            batch["start_positions"] = torch.from_numpy(f.start_positions[idx].astype(np.int64))
            batch["end_positions"] = torch.from_numpy(f.end_positions[idx].astype(np.int64))
        return batch


def training_batches(
    features: Features, batch_size: int, *, batching: str, multiple: int, seed: int, ranks: int = 1
) -> tuple[FeatureBatchSampler, Collator]:
    """How training batches windows (the trial and the benchmarks): `multiple` rounds each batch's
    width up and is the bucket width; `padded` pads every window to max_seq_length."""
    sampler = FeatureBatchSampler(
        features.lengths, batch_size, shuffle=True, batching=batching, seed=seed, ranks=ranks,
        bucket_width=multiple,
    )  # fmt: skip
    return sampler, Collator(features, batching != "padded", multiple, labels=True)


def forward_params(model: torch.nn.Module) -> frozenset[str]:
    """What the model's forward takes (DistilBERT-like models take no token_type_ids)."""
    return frozenset(inspect.signature(model.forward).parameters)


def model_inputs(batch: dict[str, torch.Tensor], accepted: frozenset[str]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in batch.items() if k in accepted and k != "feature_index"}


def evaluation_batches(
    features: Features, batch_size: int, pad_to_multiple_of: int
) -> tuple[FeatureBatchSampler, Collator]:
    """How evaluation batches windows; predict.py uses the same, so its logits equal the trial's."""
    sampler = FeatureBatchSampler(features.lengths, batch_size, shuffle=False, batching="sorted", seed=0)
    return sampler, Collator(features, True, pad_to_multiple_of, labels=False)


def assemble_logits(
    parts: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]], features: Features
) -> tuple[np.ndarray, np.ndarray]:
    """[F, L] start/end logits in feature order from (index, start, end) batch parts."""
    F, L = features.input_ids.shape
    start = np.full((F, L), -np.inf, dtype=np.float32)
    end = np.full((F, L), -np.inf, dtype=np.float32)
    seen = np.zeros(F, dtype=np.int64)
    for index, s, e in parts:
        start[index, : s.shape[1]] = s
        end[index, : e.shape[1]] = e
        np.add.at(seen, index, 1)
    if not (seen == 1).all():
        raise RuntimeError(
            f"distributed evaluation scored {int((seen == 0).sum())} windows zero times and "
            f"{int((seen > 1).sum())} more than once; every window must be scored once."
        )
    return start, end
