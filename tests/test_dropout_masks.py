"""CPU dropout masks drawn in bulk (extractive_qa/trial/dropout_masks.py): dropout's maths, the
two places a model asks for it, reproducibility, activation checkpointing, and the trial's use."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F

from extractive_qa import compat
from extractive_qa.trial import dropout_masks
from tests.support.project import run_train, tiny_config, write_yaml

pytestmark = pytest.mark.cluster_stack  # torch's function modes, SDPA and generators differ across versions


def test_masks_keep_one_minus_p_and_scale_to_keep_the_mean() -> None:
    torch.manual_seed(0)
    x = torch.ones(1000, 1000)
    with dropout_masks.masks("fast", "cpu"):
        y = F.dropout(x, 0.1, training=True)
    kept = (y != 0).double().mean().item()
    sigma = math.sqrt(0.1 * 0.9 / x.numel())
    assert abs(kept - 0.9) < 5 * sigma
    assert y.unique().tolist() == pytest.approx([0.0, 2**16 / (2**16 - round(0.1 * 2**16))])
    assert y.mean().item() == pytest.approx(1.0, abs=5 * sigma / 0.9)
    # p = 1 drops everything; the dtype stays (bf16 activations stay bf16)
    with dropout_masks.masks("fast", "cpu"):
        assert not F.dropout(x, 1.0, training=True).any()
        assert F.dropout(x.bfloat16(), 0.5, training=True).dtype == torch.bfloat16


def test_masks_follow_torchs_generator() -> None:
    """One draw of torch's generator seeds each mask: the same seed gives the same masks (so a run
    is reproducible and resumes exactly), another seed other masks; masks are independent."""
    x = torch.ones(64, 256)
    layer = torch.nn.Dropout(0.3).train()

    def draw(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        torch.manual_seed(seed)
        with dropout_masks.masks("fast", "cpu"):
            return layer(x), layer(x)

    a1, a2 = draw(1)
    b1, b2 = draw(1)
    c1, _ = draw(2)
    assert torch.equal(a1, b1) and torch.equal(a2, b2)
    assert not torch.equal(a1, c1) and not torch.equal(a1, a2)
    # each draws exactly one value from the generator, nothing else
    torch.manual_seed(1)
    with dropout_masks.masks("fast", "cpu"):
        layer(x)
    after = torch.randint(0, 2**62, (), dtype=torch.int64)
    torch.manual_seed(1)
    torch.randint(0, 2**62, (), dtype=torch.int64)
    assert torch.equal(after, torch.randint(0, 2**62, (), dtype=torch.int64))


def test_only_training_dropout_on_the_cpu_is_answered() -> None:
    """Evaluation, p = 0, `dropout_masks: torch`, CUDA and torch.compile leave torch's calls alone."""
    x = torch.randn(8, 16)
    with dropout_masks.masks("fast", "cpu"):
        assert torch.equal(F.dropout(x, 0.5, training=False), x)
        assert torch.equal(torch.nn.Dropout(0.5).eval()(x), x)
    for choice, device in (("torch", "cpu"), ("fast", "cuda")):
        torch.manual_seed(3)
        with dropout_masks.masks(choice, device):
            ours = F.dropout(x, 0.5, training=True)
        torch.manual_seed(3)
        assert torch.equal(ours, F.dropout(x, 0.5, training=True)), (choice, device)
    assert dropout_masks.recompute_context("torch", "cpu") is None
    assert dropout_masks.recompute_context("fast", "cuda") is None
    # under torch.compile the compiled graph draws its own masks
    assert not dropout_masks.active("fast", "cpu", compiled=True)
    assert dropout_masks.active("fast", "cpu") and dropout_masks.recompute_context("fast", "cpu") is not None


@pytest.mark.parametrize("mask_kind", ["bool", "additive"])
def test_attention_is_sdpa_with_these_masks(mask_kind: str) -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 7, 8) for _ in range(3))
    allowed = torch.rand(2, 1, 7, 7) > 0.3
    allowed[..., 0] = True
    mask = allowed if mask_kind == "bool" else torch.where(allowed, 0.0, torch.finfo(torch.float32).min)
    # no dropout: what torch computes (and under the mode, torch's own kernel, untouched)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.allclose(dropout_masks.attention(q, k, v, attn_mask=mask), expected, atol=1e-6)
    with dropout_masks.masks("fast", "cpu"):
        assert torch.equal(F.scaled_dot_product_attention(q, k, v, attn_mask=mask), expected)
    # dropout 0.2: softmax, then this module's mask on the probabilities, then the product
    torch.manual_seed(9)
    with dropout_masks.masks("fast", "cpu"):
        got = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.2)
    torch.manual_seed(9)
    keep, scale = dropout_masks.keep_mask((2, 4, 7, 7), 0.2)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(8)
    scores = scores.masked_fill(~allowed, torch.finfo(torch.float32).min)
    probs = torch.where(keep.bool(), scores.softmax(-1) * scale, 0.0)
    assert torch.allclose(got, probs @ v, atol=1e-5)


@pytest.mark.parametrize("mask_kind", ["bool", "additive", "causal"])
def test_attentions_written_out_backward_is_autograds(mask_kind: str) -> None:
    """The attention function's own backward pass gives autograd's gradients of the same maths
    (softmax, the mask on the probabilities, the scale), for q, k and v, in float64."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 6, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    allowed = torch.rand(2, 1, 6, 6) > 0.3
    allowed[..., 0] = True
    mask = {"bool": allowed, "additive": torch.where(allowed, 0.0, -1e9).double(), "causal": None}[mask_kind]
    causal = mask_kind == "causal"
    torch.manual_seed(4)
    got = dropout_masks.attention(q, k, v, attn_mask=mask, dropout_p=0.3, is_causal=causal, scale=0.7)
    grads = torch.autograd.grad(got.square().sum(), (q, k, v))
    torch.manual_seed(4)
    keep, scale = dropout_masks.keep_mask((2, 3, 6, 6), 0.3)
    scores = q @ k.transpose(-2, -1) * 0.7
    if causal:
        scores = scores.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), -1e300)
    elif mask_kind == "bool":
        scores = scores.masked_fill(~allowed, -1e300)
    else:
        scores = scores + mask
    expected = (scores.softmax(-1) * keep * scale) @ v
    assert torch.allclose(got, expected, atol=1e-12)
    for ours, theirs in zip(grads, torch.autograd.grad(expected.square().sum(), (q, k, v)), strict=True):
        assert torch.allclose(ours, theirs, atol=1e-10)


def test_a_mask_does_not_depend_on_the_threads_that_drew_it() -> None:
    """A large mask's halves are fixed streams of its seed: one thread or two, the same mask; the
    halves differ from each other (two streams, not one repeated)."""
    shape = (4, 64, 512)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        torch.manual_seed(11)
        alone, scale = dropout_masks.keep_mask(shape, 0.1)
        torch.set_num_threads(2)
        torch.manual_seed(11)
        together, _ = dropout_masks.keep_mask(shape, 0.1)
    finally:
        torch.set_num_threads(threads)
    assert alone.dtype == torch.uint8 and torch.equal(alone, together)
    flat = alone.flatten()
    half = flat.numel() // 2
    assert not torch.equal(flat[:half], flat[half:])
    assert scale == 2**16 / (2**16 - round(0.1 * 2**16))


def _loss_and_grads(model_dir: Path, checkpointing: bool, choice: str) -> tuple[float, torch.Tensor]:
    from transformers import AutoModelForQuestionAnswering

    torch.manual_seed(0)
    model = AutoModelForQuestionAnswering.from_pretrained(model_dir, attn_implementation="sdpa").train()
    if checkpointing:
        compat.enable_activation_checkpointing(model, dropout_masks.recompute_context(choice, "cpu"))
    ids = torch.randint(5, 100, (4, 48))
    attention = torch.ones_like(ids)
    attention[0, 30:] = 0
    torch.manual_seed(5)
    with dropout_masks.masks(choice, "cpu"):
        out = model(
            input_ids=ids, attention_mask=attention,
            start_positions=torch.tensor([1, 2, 3, 4]), end_positions=torch.tensor([5, 6, 7, 8]),
        )  # fmt: skip
    out.loss.backward()
    return out.loss.item(), torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def test_activation_checkpointing_recomputes_the_same_masks(tiny_bert: Path) -> None:
    """The recomputation in backward draws the same masks: the same loss and gradients, bit for
    bit, with checkpointing on and off (without recompute_context torch refuses: the
    recomputation would run torch's dropout and save other tensors)."""
    loss_off, grad_off = _loss_and_grads(tiny_bert, False, "fast")
    loss_on, grad_on = _loss_and_grads(tiny_bert, True, "fast")
    assert loss_on == loss_off
    assert torch.equal(grad_on, grad_off)
    loss_torch, _ = _loss_and_grads(tiny_bert, False, "torch")
    assert loss_torch != loss_off  # the masks reached the model's dropout


def test_the_trial_uses_them_on_the_cpu_and_says_so(tiny_bert: Path, tmp_path: Path, caplog) -> None:
    """A CPU run's training step draws the fast masks (`dropout_masks: torch` gives another loss,
    each reproducible), and the model line names the choice."""
    caplog.set_level(logging.INFO)
    losses = {}
    for run, choice in enumerate(("fast", "torch", "fast")):
        conf = tiny_config(tiny_bert, tmp_path)
        conf["hyperparameters"]["dropout_masks"] = choice
        config = write_yaml(conf, tmp_path / f"{choice}.yaml")
        code, result, err = run_train(
            ["--config", str(config), "--checkpoint-dir", str(tmp_path / f"ck{run}")]
        )
        assert code == 0, err
        losses.setdefault(choice, set()).add(result["last_train_loss"])
        said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("model ")]
        assert said and said[-1].endswith(f"dropout masks {choice}"), said[-1:]
    assert len(losses["fast"]) == 1  # the same seed, the same run
    assert losses["fast"] != losses["torch"]
