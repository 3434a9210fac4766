"""The model as the trial trains it: the pretrained encoder with its QA head (model_io), activation
checkpointing with the dropout masks' recompute rule, fp32 logits under autocast, wrapped for
Determined (DDP), compiled and its gradients compressed when the config asks; and the chief's one
line saying what was loaded and how it computes."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch

from extractive_qa import compat
from extractive_qa.config.model_family import load_model_kwargs, loadable_pretrained
from extractive_qa.config.run_plan import RunPlan
from extractive_qa.data.batching import forward_params
from extractive_qa.errors import ConfigError
from extractive_qa.qa import mixed_precision
from extractive_qa.trial import cpu_allocator, dropout_masks, model_io

logger = logging.getLogger("squad")


@dataclasses.dataclass
class PreparedModel:
    model: torch.nn.Module  # the Hugging Face model (the optimizer takes its parameters)
    wrapped: Any  # what the trial calls: Determined's wrap (DDP), compiled if asked
    scaler: Any  # fp16's GradScaler, wrapped; None otherwise
    accepted: set[str]  # the forward's parameter names (which batch keys it takes)


def prepare_model(context: Any, plan: RunPlan, precision: str, precision_why: str) -> PreparedModel:
    hp, model_name = plan.hparams, plan.data.pretrained_model
    if context.device.type == "cuda":
        mixed_precision.configure_cuda_math(hp.tf32)
    else:
        cpu_allocator.keep_freed_memory()  # a step reuses the memory the last one freed
    try:
        model, loaded, load_warnings = model_io.load_qa_model(
            loadable_pretrained(model_name), **load_model_kwargs(plan.attention)
        )
    except (OSError, ValueError) as err:
        raise ConfigError(
            f"data.pretrained_model {model_name!r}: cannot load ({str(err).splitlines()[0]})"
        ) from None
    masks = (hp.dropout_masks, context.device.type, hp.torch_compile)
    if hp.gradient_checkpointing:
        compat.enable_activation_checkpointing(model, dropout_masks.recompute_context(*masks))
    if precision in mixed_precision.AUTOCAST_DTYPES:
        mixed_precision.fp32_logits(model)
    if context.distributed.rank == 0:
        logger.info(
            "model %s (%s): %s; precision %s (%s), attention %s (%s), gradient checkpointing %s, "
            "dropout masks %s",
            model_name, type(model).__name__, loaded, precision, precision_why,
            model.config._attn_implementation, plan.attention_note,
            "on" if hp.gradient_checkpointing else "off",
            "fast" if dropout_masks.active(*masks) else "torch",
        )  # fmt: skip
        for warning in load_warnings:
            logger.warning("data.pretrained_model %r: %s", model_name, warning)
    scaler = context.wrap_scaler(torch.amp.GradScaler("cuda")) if precision == "fp16" else None
    accepted = forward_params(model)
    wrapped = context.wrap_model(model)
    if hp.torch_compile:
        wrapped = torch.compile(wrapped)
    if plan.gradient_compression and isinstance(wrapped, torch.nn.parallel.DistributedDataParallel):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        wrapped.register_comm_hook(None, default_hooks.fp16_compress_hook)
    return PreparedModel(model, wrapped, scaler, accepted)
