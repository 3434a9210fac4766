"""Dropout masks on the CPU drawn many at a time (hyperparameters.dropout_masks: fast).

Why: torch's CPU dropout draws its Bernoulli mask one element after another from its Mersenne
Twister (`bernoulli_`, ~5-7 ns per element), and a training step of the embedded default draws
tens of millions of them -- mostly attention-probability dropout over batch x heads x width^2.
Once bf16 has halved the matrix products, those draws are the largest item of a CPU step
(docs/results.md#bf16-on-the-cpu). Here each mask comes from 32-bit draws of numpy's SFC64,
generated in bulk (two draws per 64-bit word), seeded per mask from torch's default generator.

What stays the same: dropout's maths -- each element is kept with probability 1 - p (p rounded to
a multiple of 2^-32) and scaled by 1 / (1 - p), independently; a run is reproducible from its seed,
and resumes exactly, because every mask's seed is one draw of torch's generator, whose state
every checkpoint keeps per rank (callbacks.RankRandomState) and torch.utils.checkpoint restores
when it recomputes. What changes: the random stream, so a seed's masks -- and its run's exact
digits -- are not those of torch's dropout (`dropout_masks: torch` keeps them).

How: a TorchFunctionMode, active around the forward pass of a CPU training step (and around its
recomputation under activation checkpointing), answers the two places a model asks for dropout --
`torch.nn.functional.dropout` (every nn.Dropout) and `scaled_dot_product_attention` with
`dropout_p > 0` (SDPA attention in training, which then takes the math kernel's steps: scores,
softmax, the mask, the product) -- and passes every other call through untouched. Evaluation,
CUDA, torch.compile and p = 0 never reach it.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode

_LO, _HI = np.iinfo(np.int64).min, np.iinfo(np.int64).max
RANGE = "dropout masks"  # the profiler label bench.cpu_step groups this module's time by


def keep_mask(shape: torch.Size | tuple[int, ...], p: float) -> tuple[torch.Tensor, float]:
    """(mask of kept elements, the scale kept elements get) for dropout probability p."""
    threshold = min(round(p * 2**32), 2**32)  # dropped: a 32-bit draw below it
    n = math.prod(shape)
    seed = int(torch.randint(0, 2**62, (), dtype=torch.int64))  # one draw of torch's generator
    words = np.random.Generator(np.random.SFC64(seed)).integers(
        _LO, _HI, size=(n + 1) // 2, dtype=np.int64, endpoint=True
    )
    draws = torch.from_numpy(words.view(np.int32)[:n]).view(shape)  # uniform 32-bit, signed
    keep = draws >= threshold - 2**31
    kept = 2**32 - threshold
    return keep, (2**32 / kept if kept else 0.0)


def dropout(x: torch.Tensor, p: float, inplace: bool = False) -> torch.Tensor:
    with torch.profiler.record_function(RANGE):  # drawing and applying the mask
        keep, scale = keep_mask(x.shape, p)
        if inplace:
            return x.masked_fill_(~keep, 0).mul_(scale)
        return torch.where(keep, x * scale, x.new_zeros(()))


def attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """scaled_dot_product_attention with this module's dropout: the math kernel's steps (scores in
    the inputs' dtype -- bf16 under autocast --, softmax accumulating in fp32)."""
    if enable_gqa and key.size(-3) != query.size(-3):
        key = key.repeat_interleave(query.size(-3) // key.size(-3), -3)
        value = value.repeat_interleave(query.size(-3) // value.size(-3), -3)
    scale = 1 / math.sqrt(query.size(-1)) if scale is None else scale
    scores = torch.matmul(query, key.transpose(-2, -1)) * scale  # a new tensor: filled in place
    lowest = torch.finfo(scores.dtype).min
    if is_causal:
        length, width = scores.shape[-2:]
        causal = torch.ones(length, width, dtype=torch.bool, device=scores.device).tril()
        scores.masked_fill_(~causal, lowest)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores.masked_fill_(~attn_mask, lowest)
        else:
            scores = scores + attn_mask
    probs = dropout(scores.softmax(-1), dropout_p)
    return torch.matmul(probs.to(value.dtype), value)


_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


class _FastMasks(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is F.dropout:
            bound = dict(zip(("input", "p", "training", "inplace"), args, strict=False), **kwargs)
            x, p = bound["input"], bound.get("p", 0.5)
            if bound.get("training", True) and p > 0 and x.device.type == "cpu":
                return dropout(x, p, bound.get("inplace", False))
        elif func is F.scaled_dot_product_attention:
            bound = dict(zip(_SDPA_ARGS, args, strict=False), **kwargs)
            if bound.get("dropout_p", 0.0) > 0 and bound["query"].device.type == "cpu":
                return attention(**bound)
        return func(*args, **kwargs)


def active(choice: str, device_type: str, compiled: bool = False) -> bool:
    """`fast` masks on the CPU in eager mode. Under torch.compile the compiled graph draws its own
    masks (and this mode's seed draws would break the graph), so torch's dropout stays there."""
    return choice == "fast" and device_type == "cpu" and not compiled


def masks(choice: str, device_type: str, compiled: bool = False) -> contextlib.AbstractContextManager:
    """Around a training step's forward pass: `fast` masks where `active`, else torch's."""
    return _FastMasks() if active(choice, device_type, compiled) else contextlib.nullcontext()


def recompute_context(
    choice: str, device_type: str, compiled: bool = False
) -> Callable[[], tuple[Any, Any]] | None:
    """torch.utils.checkpoint's context_fn: activation checkpointing recomputes the forward pass
    inside backward, outside the step's `masks`; this puts the recomputation under the same masks
    (its seeds drawn again from the generator state checkpointing restores: the same masks)."""
    if not active(choice, device_type, compiled):
        return None
    return lambda: (contextlib.nullcontext(), _FastMasks())
