"""bench.cpu_step's bound: the matrix products a training step runs, captured with their layouts
and timed alone, are every product torch counts in that step."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from bench import cpu_step


def test_the_captured_products_are_the_steps_own() -> None:
    from transformers import BertConfig, BertForQuestionAnswering

    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=500, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        max_position_embeddings=64, attn_implementation="eager",
    )  # fmt: skip
    model = BertForQuestionAnswering(cfg)

    def step(batch: dict[str, torch.Tensor]) -> None:
        model(**batch).loss.backward()

    batch = {
        "input_ids": torch.randint(0, 500, (3, 40)),
        "start_positions": torch.zeros(3, dtype=torch.long),
        "end_positions": torch.ones(3, dtype=torch.long),
    }
    products = cpu_step.captured_products(SimpleNamespace(step=step), [batch, batch])
    with FlopCounterMode(display=False) as counter:
        step(batch)
    captured = sum(cpu_step.product_flops(key) * n for key, n in products.items())
    assert captured == pytest.approx(2 * counter.get_total_flops(), rel=1e-9)
    assert {name for name, _ in products} <= cpu_step.GEMMS and any(name == "bmm" for name, _ in products)
    # a transposed operand keeps its strides when timed alone (backward's products read weights
    # transposed), and each product gets a time
    assert any(
        spec[1] != tuple(torch.empty(spec[0]).stride())
        for _, specs in products
        for spec in specs
        if isinstance(spec, tuple) and len(spec) == 3
    )
    seconds = cpu_step.product_seconds(products, repeats=1)
    assert set(seconds) == set(products) and all(s > 0 for s in seconds.values())
