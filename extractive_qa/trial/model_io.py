"""Model I/O: precision -> autocast, CUDA math, the QA settings saved beside every checkpoint's
hf/ (what predict.py needs to window and extract exactly as evaluation did), and the export.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from extractive_qa.qa.qa_settings import QASettings

# --------------------------------------------------------------------------------------------
# Precision and CUDA math.
# --------------------------------------------------------------------------------------------

AUTOCAST_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}  # fp32: no autocast


def autocast(device_type: str, precision: str) -> torch.autocast:
    """The forward pass's mixed precision: training, evaluation and predict.py use this one."""
    dtype = AUTOCAST_DTYPES.get(precision)
    return torch.autocast(device_type, dtype=dtype, enabled=dtype is not None)


def configure_cuda_math(tf32: bool) -> None:
    """Process-wide CUDA kernel choices for training (why, with the measurements: docs/gpu.md)."""
    # TF32 tensor-core matmuls for fp32 weights and activations: far faster than plain fp32.
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    # cuDNN's fused attention (picked first for bf16/fp16) builds a graph for every new sequence
    # width; dynamic padding makes up to max_seq_length / pad_to_multiple_of widths, each costing
    # a fraction of a second the first time, which dominated short bf16 runs. The flash and
    # memory-efficient kernels need no per-shape plan and are as fast once warm.
    torch.backends.cuda.enable_cudnn_sdp(False)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The Hugging Face model under torch.compile's and DDP's wrappers."""
    model = getattr(model, "_orig_mod", model)  # torch.compile
    return getattr(model, "module", model)  # DDP


# --------------------------------------------------------------------------------------------
# QA settings: what predict.py needs to window and extract exactly as evaluation did.
# --------------------------------------------------------------------------------------------


def export_hf(model: torch.nn.Module, tokenizer: Any, settings: QASettings, checkpoint_dir: Path) -> Path:
    """checkpoint_dir/hf: save_pretrained model + tokenizer + QA settings, loadable anywhere."""
    hf = checkpoint_dir / "hf"
    unwrap(model).save_pretrained(hf, safe_serialization=True)
    tokenizer.save_pretrained(hf)
    settings.save(hf)
    return hf
