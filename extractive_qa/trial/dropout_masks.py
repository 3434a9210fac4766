"""Dropout on the CPU with masks drawn many at a time (hyperparameters.dropout_masks: fast).

Why: torch's CPU dropout draws its Bernoulli mask one element after another from its Mersenne
Twister (`bernoulli_`, ~5-7 ns per element), and a training step of the embedded default draws
tens of millions of them -- mostly attention-probability dropout over batch x heads x width^2.
Here each mask comes from 16-bit draws of numpy's SFC64 (four draws per 64-bit word), compared
with the threshold by numpy into one byte per element, the two halves of a large mask drawn on two
threads at once (numpy releases the GIL); each mask is seeded from torch's default generator.
Applying a mask is one multiply by those bytes (a vectorised kernel: comparisons to bool and
`where` are not, on the CPU), in forward and backward alike.

Attention with dropout is one autograd function: the scores are scaled and masked in one pass
(an additive mask built once per call), softmax runs in the inputs' dtype (bf16 under autocast;
torch's CPU softmax accumulates in fp32), the mask multiplies the probabilities and dropout's
1 / (1 - p) scales the values instead (width x head dim, not width^2), and the backward pass is
written out: no pass over width^2 elements is repeated to undo a cast or a `where`.

What stays the same: dropout's maths -- each element is kept with probability 1 - p (p rounded to
a multiple of 2^-16) and scaled by 1 / (1 - p), independently; a run is reproducible from its seed,
and resumes exactly, because every mask's seed is one draw of torch's generator, whose state
every checkpoint keeps per rank (callbacks.RankRandomState) and torch.utils.checkpoint restores
when it recomputes. The halves of a mask are two fixed streams of that seed, whichever thread
draws them, so the masks do not depend on the number of threads. What changes: the random
stream, so a seed's masks -- and its run's exact digits -- are not those of torch's dropout
(`dropout_masks: torch` keeps them).

How: a TorchFunctionMode, active around the forward pass of a CPU training step (and around its
recomputation under activation checkpointing), answers the two places a model asks for dropout --
`torch.nn.functional.dropout` (every nn.Dropout) and `scaled_dot_product_attention` with
`dropout_p > 0` (SDPA attention in training) -- and passes every other call through untouched.
Evaluation, CUDA, torch.compile and p = 0 never reach it.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode

from extractive_qa import compat

RANGE = "dropout masks"  # the profiler label bench.cpu_step groups this module's time by
BITS = 16  # per draw: p is rounded to a multiple of 2^-16
SPLIT = 1 << 16  # a mask of at least this many elements draws its two halves on two threads
_helper: list[ThreadPoolExecutor] = []  # the second thread, started on first use


def _draw(seed: int, half: int, threshold: int, one: int, out: np.ndarray) -> None:
    """Fill `out` with keep decisions from stream `half` of `seed`: `one` (the bits of 1 in the
    mask's dtype) where a 16-bit draw is at or above `threshold` (counted from the lowest draw),
    else 0."""
    words = np.random.Generator(np.random.SFC64([seed, half])).bit_generator.random_raw(-(-len(out) // 4))
    kept = np.greater_equal(words.view(np.int16)[: len(out)], threshold - 2 ** (BITS - 1))
    np.multiply(kept, out.dtype.type(one), out=out)


# A mask is made in the dtype it multiplies (as that dtype's bits: numpy has no bf16), so applying
# it is a plain vectorised multiply with no conversion pass.
_BITS_OF = {1: (np.uint8, torch.uint8), 2: (np.int16, torch.int16), 4: (np.int32, torch.int32),
            8: (np.int64, torch.int64)}  # fmt: skip


def keep_mask(
    shape: torch.Size | tuple[int, ...], p: float, dtype: torch.dtype = torch.uint8
) -> tuple[torch.Tensor, float]:
    """(mask of kept elements: 1 kept, 0 dropped, in `dtype`; the scale kept elements get) for
    dropout probability p."""
    threshold = min(round(p * 2**BITS), 2**BITS)  # dropped: a draw below it
    n = math.prod(shape)
    seed = int(torch.randint(0, 2**62, (), dtype=torch.int64))  # one draw of torch's generator
    one = torch.ones((), dtype=dtype)
    bits, torch_bits = _BITS_OF[one.element_size()]
    one_bits = int(one.view(torch_bits))
    keep = np.empty(n, dtype=bits)
    first, second = keep[: n // 2], keep[n // 2 :]
    if n >= SPLIT and torch.get_num_threads() > 1:
        if not _helper:
            _helper.append(ThreadPoolExecutor(1, thread_name_prefix="dropout-masks"))
        pending = _helper[0].submit(_draw, seed, 1, threshold, one_bits, second)
        _draw(seed, 0, threshold, one_bits, first)
        pending.result()
    else:
        _draw(seed, 0, threshold, one_bits, first)
        _draw(seed, 1, threshold, one_bits, second)
    kept = 2**BITS - threshold
    mask = torch.from_numpy(keep).view(dtype).view(shape)
    return mask, (2**BITS / kept if kept else 0.0)


class _Dropped(torch.autograd.Function):
    """x times a 0/1 mask (x's dtype) times the scale; the gradient gets the same."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, keep: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return torch.mul(x, keep).mul_(scale)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (keep,) = ctx.saved_tensors
        return torch.mul(grad, keep).mul_(ctx.scale), None, None


def dropout(x: torch.Tensor, p: float, inplace: bool = False) -> torch.Tensor:
    with torch.profiler.record_function(RANGE):  # drawing and applying the mask
        keep, scale = keep_mask(x.shape, p, x.dtype)
        if inplace:
            return x.mul_(keep).mul_(scale)
        return _Dropped.apply(x, keep, scale)


class _Attention(torch.autograd.Function):
    """softmax(q k^T * scale + bias) with dropout, times v: the forward and backward passes of the
    math kernel, with the dropout scale moved onto v."""

    @staticmethod
    def forward(
        ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        bias: torch.Tensor | None, p: float, scale: float,
    ) -> torch.Tensor:  # fmt: skip
        scores = torch.matmul(q, k.transpose(-2, -1))
        scores = torch.add(bias, scores, alpha=scale) if bias is not None else scores.mul_(scale)
        probs = torch.softmax(scores, -1)
        with torch.profiler.record_function(RANGE):
            keep, keep_scale = keep_mask(probs.shape, p, probs.dtype)
            dropped = torch.mul(probs, keep)
        v_scaled = v * keep_scale
        ctx.save_for_backward(q, k, v_scaled, probs, keep, dropped)
        ctx.scale, ctx.keep_scale = scale, keep_scale
        return torch.matmul(dropped, v_scaled)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v_scaled, probs, keep, dropped = ctx.saved_tensors
        grad_v = torch.matmul(dropped.transpose(-2, -1), grad).mul_(ctx.keep_scale)
        grad_probs = torch.matmul(grad, v_scaled.transpose(-2, -1)).mul_(keep)
        grad_scores = torch._softmax_backward_data(grad_probs, probs, -1, probs.dtype)
        grad_q = torch.matmul(grad_scores, k).mul_(ctx.scale)
        grad_k = torch.matmul(grad_scores.transpose(-2, -1), q).mul_(ctx.scale)
        return grad_q, grad_k, grad_v, None, None, None


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
    """scaled_dot_product_attention with this module's dropout, in the inputs' dtype (autocast's
    under autocast); softmax accumulates in fp32 inside torch's kernel."""
    bias = additive_mask(attn_mask, is_causal, compute_dtype(query), query.size(-2), key.size(-2))
    return _attend(query, key, value, bias, dropout_p, scale, enable_gqa)


def compute_dtype(query: torch.Tensor) -> torch.dtype:
    return compat.cpu_autocast_dtype() or query.dtype


def additive_mask(
    attn_mask: torch.Tensor | None, is_causal: bool, dtype: torch.dtype, length: int, width: int
) -> torch.Tensor | None:
    """SDPA's mask (bool: True attends; or added to the scores) and causality as one tensor added
    to the scores: 0 where a query attends, the dtype's lowest value where it does not."""
    lowest = torch.finfo(dtype).min
    bias = None
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            bias = torch.zeros(attn_mask.shape, dtype=dtype).masked_fill_(~attn_mask, lowest)
        else:
            bias = attn_mask.detach().to(dtype)
    if is_causal:
        above = torch.ones(length, width, dtype=torch.bool).triu(1)
        causal = torch.zeros(length, width, dtype=dtype).masked_fill_(above, lowest)
        bias = causal if bias is None else bias + causal
    return bias


def _attend(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bias: torch.Tensor | None,
    dropout_p: float, scale: float | None, enable_gqa: bool,
) -> torch.Tensor:  # fmt: skip
    if enable_gqa and key.size(-3) != query.size(-3):
        key = key.repeat_interleave(query.size(-3) // key.size(-3), -3)
        value = value.repeat_interleave(query.size(-3) // value.size(-3), -3)
    dtype = compute_dtype(query)
    scale = 1 / math.sqrt(query.size(-1)) if scale is None else scale
    with torch.autocast("cpu", enabled=False):
        # contiguous once: each product would otherwise copy a head-strided view again
        q, k, v = (t.to(dtype).contiguous() for t in (query, key, value))
        if dropout_p == 0:
            scores = torch.matmul(q, k.transpose(-2, -1))
            scores = scores * scale if bias is None else torch.add(bias, scores, alpha=scale)
            return torch.matmul(torch.softmax(scores, -1), v)
        return _Attention.apply(q, k, v, bias, dropout_p, scale)


_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


class _FastMasks(TorchFunctionMode):
    """Active for one forward pass (or its recomputation): a model hands every layer the same
    mask, so its additive form is built once here."""

    def __init__(self) -> None:
        super().__init__()
        self.mask_seen: tuple[Any, ...] = ()

    def bias(self, bound: dict[str, Any]) -> torch.Tensor | None:
        mask, causal = bound.get("attn_mask"), bound.get("is_causal", False)
        dtype, shape = compute_dtype(bound["query"]), (bound["query"].size(-2), bound["key"].size(-2))
        seen = self.mask_seen
        if not (seen and seen[0] is mask and seen[1:4] == (causal, dtype, shape)):
            self.mask_seen = (mask, causal, dtype, shape, additive_mask(mask, causal, dtype, *shape))
        return self.mask_seen[4]

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
                return _attend(
                    bound["query"],
                    bound["key"],
                    bound["value"],
                    self.bias(bound),
                    bound["dropout_p"],
                    bound.get("scale"),
                    bound.get("enable_gqa", False),
                )
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
