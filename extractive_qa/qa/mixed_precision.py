"""The arithmetic the QA model's forward pass runs in -- `precision` (auto, fp32, bf16, fp16) to
autocast, the QA head kept in fp32, CUDA's math switches -- one implementation for training,
evaluation and predict.py, so that a checkpoint answers as its run validated.
"""

from __future__ import annotations

from pathlib import Path

import torch

from extractive_qa.io import reading

AUTOCAST_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}  # fp32: no autocast
# The CPU's bf16 matrix units, as torch's CPU kernels detect them (name, torch.cpu probe, the
# /proc/cpuinfo flag where torch has no probe: torch 2.3). Both run bf16 matmuls 2-6x faster than
# fp32 (docs/results.md, "bf16 on the CPU"); without them bf16 autocast is slower than fp32.
CPU_BF16_UNITS = (
    ("AMX tiles", "_is_amx_tile_supported", "amx_tile"),
    ("AVX512-BF16", "_is_avx512_bf16_supported", "avx512_bf16"),
)


CPUINFO = Path("/proc/cpuinfo")


def cpu_bf16_units() -> list[str]:
    """The bf16 matrix units this machine's CPU has (empty: none)."""
    try:
        flags = set(reading.read_text(CPUINFO, reading.SYSTEM).split())
    except reading.UnreadableFile:
        flags = set()
    found = []
    for name, probe, flag in CPU_BF16_UNITS:
        check = getattr(torch.cpu, probe, None)
        if check() if check is not None else flag in flags:
            found.append(name)
    return found


def local_device() -> str:
    """The device a local run trains on (Determined's local Trainer: the GPU when there is one)."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_precision(requested: str, device_type: str) -> tuple[str, str]:
    """(precision, why) for `requested` (hyperparameters.precision, predict.py --precision) on a
    device: `auto` becomes fp32 on CUDA (with TF32: the GPU recipe, docs/gpu.md), bf16 on a CPU with
    bf16 matrix units, fp32 on any other CPU. An explicit choice is kept."""
    if requested != "auto":
        return requested, "set explicitly"
    if device_type == "cuda":
        return "fp32", "auto: fp32 with TF32 matmuls on CUDA"
    units = cpu_bf16_units()
    if units:
        return "bf16", f"auto: this CPU has {' and '.join(units)}"
    return "fp32", "auto: this CPU has no bf16 matrix units (AMX, AVX512-BF16)"


def autocast(device_type: str, precision: str) -> torch.autocast:
    """The forward pass's mixed precision: training, evaluation and predict.py use this one."""
    dtype = AUTOCAST_DTYPES.get(precision)
    return torch.autocast(device_type, dtype=dtype, enabled=dtype is not None)


def fp32_logits(model: torch.nn.Module) -> None:
    """Run the QA head (hidden -> start/end logits) in fp32 under autocast, in place. bf16 logits
    keep 8 bits of mantissa: span scores (start + end) and no-answer differences would round to
    ~1 %, ties and thresholds would move; the loss would be taken on rounded logits. The head is
    2 x hidden multiply-adds per token, nothing beside the encoder's bf16 matmuls. Parameters and
    saved files are untouched (only the module's forward is wrapped)."""
    head = getattr(model, "qa_outputs", None)  # every family's name but ModernBERT's
    if head is None:
        head = getattr(model, "classifier", None)
    if not isinstance(head, torch.nn.Linear) or getattr(head, "_fp32_logits", False):
        return
    linear = head.forward

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        with torch.autocast(hidden.device.type, enabled=False):
            return linear(hidden.float())

    head.forward = forward
    head._fp32_logits = True


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
