"""Every difference between the two dependency sets this trial runs on, in one place.

- local runs and tests (requirements.txt): Python >= 3.11, torch 2.13, NumPy 2, transformers 5;
- Determined's default image (requirements-cluster.txt): Python 3.10, torch 2.3, NumPy 1.26,
  transformers 4.57.

Each function says what differs; the rest of the code calls these and never checks versions.
`bash .ci/compat` runs the trial's tests on the second set.
"""

from __future__ import annotations

from typing import Any


def allow_determined_checkpoints() -> bool:
    """Let torch.load(weights_only=True) read the NumPy RNG state in Determined's checkpoints.

    torch >= 2.6 loads with weights_only=True by default, and Determined's controller calls plain
    torch.load on its own checkpoints, whose RNG state holds NumPy objects: we allow exactly
    those instead of turning weights_only off. torch 2.3 loads them unrestricted and has no
    add_safe_globals: there this returns False (weights_only=True cannot read them). NumPy moved
    `_reconstruct` from numpy.core to numpy._core in 2.0; the pickle protocol names it, so we
    take it from there.
    """
    import numpy as np
    import torch

    add_safe_globals = getattr(torch.serialization, "add_safe_globals", None)
    if add_safe_globals is None:
        return False
    reconstruct = np.ndarray((0,)).__reduce__()[0]
    add_safe_globals([reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))])
    return True


def enable_activation_checkpointing(model: Any, context_fn: Any = None) -> None:
    """Recompute activations in backward, without torch's reentrant variant (which DDP and frozen
    inputs trip over); `context_fn` is torch.utils.checkpoint's (the contexts of the forward pass and
    of its recomputation). transformers 5 names it activation_checkpointing_enable (the 4.x name is
    deprecated there); the cluster image's 4.57 has only gradient_checkpointing_enable."""
    kwargs: dict[str, Any] = {"use_reentrant": False}
    if context_fn is not None:
        kwargs["context_fn"] = context_fn
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def fused_adamw(device_type: str) -> bool:
    """Whether torch's fused AdamW kernel (each parameter's update in one pass) runs on this device:
    CUDA on both stacks; the CPU from torch 2.4 on -- torch 2.3's AdamW refuses `fused=True` for CPU
    tensors. Where it does not run, the trial takes the foreach implementation (the same update)."""
    import torch

    if device_type == "cuda":
        return True
    major, minor = (int(part) for part in torch.__version__.split(".")[:2])
    return device_type == "cpu" and (major, minor) >= (2, 4)


def cpu_autocast_dtype() -> Any:
    """The dtype CPU autocast computes in, or None where it is off. torch >= 2.4 asks by device
    (`is_autocast_enabled("cpu")`); torch 2.3 has only the CPU-named functions
    (`is_autocast_cpu_enabled`), which later versions deprecate."""
    import torch

    if hasattr(torch, "get_autocast_dtype"):
        return torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None
    return torch.get_autocast_cpu_dtype() if torch.is_autocast_cpu_enabled() else None
