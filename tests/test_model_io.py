"""The model's arithmetic settings on CUDA: TF32 as configured, cuDNN attention off."""

from __future__ import annotations

import torch

from extractive_qa.config import run_plan
from extractive_qa.trial import model_io


def test_cuda_math_settings() -> None:
    """TF32 follows hyperparameters.tf32; cuDNN attention stays off (per-width plans, docs/gpu.md)."""

    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cuda.cudnn_sdp_enabled())
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        model_io.configure_cuda_math(tf32=True)
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        model_io.configure_cuda_math(tf32=False)
        assert not torch.backends.cuda.matmul.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved[0]
        torch.backends.cuda.enable_cudnn_sdp(saved[1])
    conf = {"data": {"train_file": "a", "validation_file": "b"}}
    assert run_plan.run_plan(conf, {"train_length": {"epochs": 1}}, slots=1).hparams.tf32 is True
