"""Model I/O: precision -> autocast, CUDA math, the QA settings saved beside every checkpoint's
hf/ (what predict.py needs to window and extract exactly as evaluation did), and the export.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from extractive_qa.files import shared_mode, write_text_atomic
from extractive_qa.qa.qa_settings import QASettings

# --------------------------------------------------------------------------------------------
# Precision and CUDA math.
# --------------------------------------------------------------------------------------------

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
        flags = set(CPUINFO.read_text().split())
    except OSError:
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


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The Hugging Face model under torch.compile's and DDP's wrappers."""
    model = getattr(model, "_orig_mod", model)  # torch.compile
    return getattr(model, "module", model)  # DDP


# --------------------------------------------------------------------------------------------
# QA settings: what predict.py needs to window and extract exactly as evaluation did.
# --------------------------------------------------------------------------------------------


def export_hf(
    model: torch.nn.Module,
    tokenizer: Any,
    settings: QASettings,
    checkpoint_dir: Path,
    card: str | None = None,
) -> Path:
    """checkpoint_dir/hf: save_pretrained model + tokenizer + QA settings (+ the model card,
    README.md), loadable anywhere."""
    hf = checkpoint_dir / "hf"
    unwrap(model).save_pretrained(hf, safe_serialization=True)
    tokenizer.save_pretrained(hf)
    settings.save(hf)
    if card is not None:
        write_text_atomic(hf / "README.md", card)
    for item in hf.iterdir():  # safetensors writes its file 0600: every file gets the umask's mode
        if item.is_file() and not item.is_symlink():
            shared_mode(item)
    return hf


# --------------------------------------------------------------------------------------------
# Loading the pretrained encoder: one line about the new head instead of transformers' report.
# --------------------------------------------------------------------------------------------

# Weights a pretraining checkpoint holds that a QA model has no use for, by name prefix (BERT's
# pooler and MLM/NSP heads, RoBERTa's lm_head, ELECTRA's discriminator/generator heads,
# ALBERT's SOP classifier, DeBERTa's mask predictions).
UNUSED_PRETRAINING_HEADS = ("pooler.", "cls.", "lm_head.", "discriminator_predictions.",
                            "generator_predictions.", "generator_lm_head.", "sop_classifier.",
                            "mask_predictions.", "predictions.", "head.")  # fmt: skip
QA_HEAD = "qa_outputs."


def _own_name(key: str) -> str:
    """'bert.pooler.dense.weight' -> 'pooler.dense.weight': the key without the encoder's prefix."""
    first, _, rest = key.partition(".")
    return key if key.startswith((*UNUSED_PRETRAINING_HEADS, QA_HEAD)) or not rest else rest


def _listed(keys: list[str]) -> str:
    return ", ".join(keys[:5]) + (" ..." if len(keys) > 5 else "")


def load_qa_model(source: str, **kwargs: Any) -> tuple[torch.nn.Module, str, list[str]]:
    """AutoModelForQuestionAnswering.from_pretrained without transformers' load report (a table
    that calls the new QA head MISSING and asks to train it -- the point of fine-tuning). Returns
    (model, one-line summary, warnings): anything missing beyond the QA head, left over beyond
    pretraining heads, or of the wrong shape is a warning, since it means weights start random."""
    from transformers import AutoModelForQuestionAnswering
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        loaded = AutoModelForQuestionAnswering.from_pretrained(source, output_loading_info=True, **kwargs)
        model, info = loaded
    finally:
        hf_logging.set_verbosity(verbosity)
    missing_all = [_own_name(k) for k in info.get("missing_keys") or []]
    unexpected_all = [_own_name(k) for k in info.get("unexpected_keys") or []]
    missing = [k for k in missing_all if not k.startswith(QA_HEAD)]
    unused = [k for k in unexpected_all if not k.startswith(UNUSED_PRETRAINING_HEADS)]
    heads = sorted({k.split(".")[0] for k in unexpected_all if k.startswith(UNUSED_PRETRAINING_HEADS)})
    summary = "new QA head initialised" if len(missing) < len(missing_all) else "QA head from the checkpoint"
    if heads:
        summary += f", pretraining heads unused ({', '.join(heads)})"
    mismatched = [str(m[0] if isinstance(m, (tuple, list)) else m) for m in info.get("mismatched_keys") or []]
    problems = (
        (missing, "encoder weights not in the checkpoint start random"),
        (unused, "checkpoint weights match nothing in the model"),
        (mismatched, "weights of another shape here start random"),
    )
    return model, summary, [f"{len(keys)} {what}: {_listed(keys)}" for keys, what in problems if keys]
