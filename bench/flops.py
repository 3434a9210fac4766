"""The FLOPs of a training step, for throughput and MFU figures."""

from __future__ import annotations

import torch

from extractive_qa.trial.model_io import unwrap


def training_flops(model: torch.nn.Module, batch: int, width: int) -> float:
    """Model FLOPs of one training step (forward + backward) on `batch` windows of `width` tokens.

    6 x (non-embedding parameters) per token -- 2 for the forward multiply-adds, 4 for the
    backward's two (Kaplan et al. 2020, "Scaling Laws", section 2.1) -- plus attention's scores
    and weighted sum, 2 x 2 x hidden x width per token and layer forward, x 3 with the backward:
    12 x layers x hidden x width (Chowdhery et al. 2022, PaLM, appendix B). Padding tokens count:
    they are computed. Embedding lookups are gathers, not FLOPs. MFU = this / time / peak.
    """
    cfg = unwrap(model).config
    attention = 12.0 * cfg.num_hidden_layers * cfg.hidden_size * width * batch * width
    return parameter_flops(model, batch, width) + attention


def parameter_flops(model: torch.nn.Module, batch: int, width: int) -> float:
    """The weights' share of training_flops: 6 x non-embedding parameters per token computed --
    what the Linear layers' matrix products do, apart from attention's scores and weighted sum."""
    params = sum(p.numel() for n, p in unwrap(model).named_parameters() if "embeddings" not in n)
    return 6.0 * params * batch * width
