"""Batches and model I/O shared by the trial, evaluation, predict.py and the benchmarks.

Torch, NumPy and transformers only -- no Determined -- so answering questions from a checkpoint
needs nothing of the training framework. One home each for: resumable training batches
(random, width-bucketed or sorted; dynamic padding), the evaluation batching that makes
predict.py's logits equal the trial's, what a model's forward accepts, reassembling distributed
logits, precision -> autocast dtype, CUDA math settings, and the QA settings saved beside every
checkpoint's hf/.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

import data

if TYPE_CHECKING:
    import config

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
        if batching not in ("padded", "random", "buckets", "sorted"):  # config.BATCHINGS
            raise ValueError(f"batching {batching!r}: see config.BATCHINGS")
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
    """Indices only: the collator slices the (memory-mapped) feature arrays per batch."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


class Collator:
    """Pad a batch to its longest window (rounded up to a multiple), or to max length."""

    def __init__(self, features: data.Features, dynamic: bool, multiple: int, labels: bool) -> None:
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
    features: data.Features, batch_size: int, *, batching: str, multiple: int, seed: int, ranks: int = 1
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
    features: data.Features, batch_size: int, pad_to_multiple_of: int
) -> tuple[FeatureBatchSampler, Collator]:
    """How evaluation batches windows; predict.py uses the same, so its logits equal the trial's."""
    sampler = FeatureBatchSampler(features.lengths, batch_size, shuffle=False, batching="sorted", seed=0)
    return sampler, Collator(features, True, pad_to_multiple_of, labels=False)


def assemble_logits(
    parts: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]], features: data.Features
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


# --------------------------------------------------------------------------------------------
# Precision and CUDA math.
# --------------------------------------------------------------------------------------------

AUTOCAST_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}  # fp32: no autocast


def autocast(device_type: str, precision: str) -> torch.autocast:
    """The forward pass's mixed precision: training, evaluation and predict.py use this one."""
    dtype = AUTOCAST_DTYPES.get(precision)
    return torch.autocast(device_type, dtype=dtype, enabled=dtype is not None)


def configure_cuda_math(tf32: bool) -> None:
    """Process-wide CUDA kernel choices for training (measured on an H100: docs/gpu.md)."""
    # TF32 tensor-core matmuls for fp32 weights and activations: 2.6x the fp32 rate on an H100.
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    # cuDNN's fused attention (picked first for bf16/fp16) builds a graph for every new sequence
    # width; dynamic padding makes up to max_seq_length / pad_to_multiple_of widths, each costing
    # ~0.5 s the first time (bf16 ran at 106 seq/s vs 1318 with it off). The flash and
    # memory-efficient kernels need no per-shape plan and are as fast once warm.
    torch.backends.cuda.enable_cudnn_sdp(False)


def training_flops(model: torch.nn.Module, batch: int, width: int) -> float:
    """Model FLOPs of one training step (forward + backward) on `batch` windows of `width` tokens.

    6 x (non-embedding parameters) per token -- 2 for the forward multiply-adds, 4 for the
    backward's two (Kaplan et al. 2020, "Scaling Laws", section 2.1) -- plus attention's scores
    and weighted sum, 2 x 2 x hidden x width per token and layer forward, x 3 with the backward:
    12 x layers x hidden x width (Chowdhery et al. 2022, PaLM, appendix B). Padding tokens count:
    they are computed. Embedding lookups are gathers, not FLOPs. MFU = this / time / peak.
    """
    cfg = unwrap(model).config
    params = sum(p.numel() for n, p in unwrap(model).named_parameters() if "embeddings" not in n)
    tokens = batch * width
    return tokens * (6.0 * params + 12.0 * cfg.num_hidden_layers * cfg.hidden_size * width)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The Hugging Face model under torch.compile's and DDP's wrappers."""
    model = getattr(model, "_orig_mod", model)  # torch.compile
    return getattr(model, "module", model)  # DDP


# --------------------------------------------------------------------------------------------
# QA settings: what predict.py needs to window and extract exactly as evaluation did.
# --------------------------------------------------------------------------------------------

QA_SETTINGS = "qa_settings.json"


@dataclasses.dataclass(frozen=True)
class QASettings:
    """Written next to hf/ in every checkpoint; read by predict.py."""

    squad_version: str
    max_seq_length: int
    doc_stride: int
    max_query_length: int
    n_best_size: int
    max_answer_length: int
    null_score_diff_threshold: float
    pretrained_model: str
    eval_batch_size: int  # predict.py batches like evaluation did, so its EM/F1 match exactly
    pad_to_multiple_of: int
    # The arithmetic evaluation ran with. Defaults: what exports written before these fields
    # existed ran with (fp32 on CPU; TF32 is on by default on CUDA).
    precision: str = "fp32"
    tf32: bool = True

    @classmethod
    def from_run(
        cls, settings: config.DataSettings, hp: config.Hyperparameters, eval_batch_size: int
    ) -> QASettings:
        """From a run's typed data settings and hyperparameters (config.run_plan's output)."""
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {
            **dataclasses.asdict(hp),
            **dataclasses.asdict(settings),
            "eval_batch_size": eval_batch_size,
        }
        return cls(**{k: v for k, v in values.items() if k in fields})

    @property
    def window_spec(self) -> data.WindowSpec:
        return data.WindowSpec(self.max_seq_length, self.doc_stride, self.max_query_length)

    def extract_answers(
        self, examples: Sequence[data.Example], features: data.Features, start: np.ndarray, end: np.ndarray
    ) -> data.Answers:
        """Answers from window logits with these settings: the trial's evaluation and predict.py."""
        return data.extract_answers(
            examples,
            features,
            start,
            end,
            n_best=self.n_best_size,
            max_answer_length=self.max_answer_length,
            version_2=self.squad_version == "2.0",
            null_score_diff_threshold=self.null_score_diff_threshold,
        )

    def save(self, hf_dir: Path) -> None:
        data.write_text_atomic(hf_dir / QA_SETTINGS, json.dumps(dataclasses.asdict(self), indent=1))

    @classmethod
    def load(cls, hf_dir: Path) -> QASettings:
        path = hf_dir / QA_SETTINGS
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise data.DataError(f"{path}: cannot read QA settings ({err}).") from None
        fields = dataclasses.fields(cls)
        required = {f.name for f in fields if f.default is dataclasses.MISSING}
        missing = sorted(required - set(raw))
        if missing:
            raise data.DataError(f"{path}: missing {', '.join(missing)}; re-export the checkpoint.")
        return cls(**{f.name: raw[f.name] for f in fields if f.name in raw})


def export_hf(model: torch.nn.Module, tokenizer: Any, settings: QASettings, checkpoint_dir: Path) -> Path:
    """checkpoint_dir/hf: save_pretrained model + tokenizer + QA settings, loadable anywhere."""
    hf = checkpoint_dir / "hf"
    unwrap(model).save_pretrained(hf, safe_serialization=True)
    tokenizer.save_pretrained(hf)
    settings.save(hf)
    return hf
