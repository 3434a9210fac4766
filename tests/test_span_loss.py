"""The no-answer weight of the span loss (hyperparameters.no_answer_loss_weight and
answerable_first): the model's own loss at weight 1, the answer-bearing windows alone at weight
0, and a run that trains on no-answer windows only from the step the schedule says."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from transformers import AutoModelForQuestionAnswering

from extractive_qa.config.settings import WindowSpec
from extractive_qa.data.batching import Collator, forward_params, model_inputs
from extractive_qa.data.features import build_features
from extractive_qa.data.squad_files import load_squad
from extractive_qa.trial.span_loss import no_answer_weight, weighted_span_loss
from tests.support.project import DEV_V2, run_train, tiny_config, write_yaml


@pytest.fixture(scope="module")
def mixed_batch(tiny_bert: Path, tokenizer: Any) -> tuple[torch.nn.Module, dict[str, torch.Tensor], int]:
    """The tiny model and 8 v2.0 windows: 4 labelled with an answer, 4 labelled no answer."""
    examples = load_squad(DEV_V2, training=True).examples[:60]
    f = build_features(examples, tokenizer, WindowSpec(128, 32, 32), labels=True, offsets=False)
    null = np.flatnonzero(f.start_positions == f.cls_index)
    answer = np.flatnonzero(f.start_positions != f.cls_index)
    assert len(null) >= 4 and len(answer) >= 4
    batch = Collator(f, True, 8, labels=True)(np.concatenate([answer[:4], null[:4]]).tolist())
    torch.manual_seed(0)
    model = AutoModelForQuestionAnswering.from_pretrained(tiny_bert).eval()  # no dropout: exact
    return model, batch, f.cls_index


def test_weight_one_is_the_models_own_loss(mixed_batch) -> None:
    model, batch, cls = mixed_batch
    inputs = model_inputs(batch, forward_params(model))
    with torch.no_grad():
        own = model(**inputs).loss
        out = model(**{k: v for k, v in inputs.items() if not k.endswith("_positions")})
    ours = weighted_span_loss(
        out.start_logits, out.end_logits, batch["start_positions"], batch["end_positions"], cls, 1.0
    )
    torch.testing.assert_close(ours, own, rtol=1e-6, atol=1e-7)


def test_weight_zero_trains_on_the_answer_bearing_windows_only(mixed_batch) -> None:
    model, batch, cls = mixed_batch
    inputs = model_inputs(batch, forward_params(model))
    inputs = {k: v for k, v in inputs.items() if not k.endswith("_positions")}
    starts, ends = batch["start_positions"], batch["end_positions"]
    model.zero_grad()
    out = model(**inputs)
    weighted_span_loss(out.start_logits, out.end_logits, starts, ends, cls, 0.0).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    # The same gradient as the model's own loss on the four answer-bearing windows, times 4/8.
    model.zero_grad()
    answer = starts != cls
    assert answer.sum() == 4
    inside = {k: v[answer] for k, v in inputs.items()}
    (model(**inside, start_positions=starts[answer], end_positions=ends[answer]).loss * 0.5).backward()
    for name, param in model.named_parameters():
        if name in grads:
            torch.testing.assert_close(grads[name], param.grad, rtol=1e-4, atol=1e-6, msg=name)
    # A batch of no-answer windows alone gives a zero loss and no division by zero.
    null = ~answer
    logits = out.start_logits[null], out.end_logits[null]
    zero = weighted_span_loss(*logits, starts[null], ends[null], cls, 0.0)
    assert zero.item() == 0.0


def test_the_schedule_weighs_no_answer_windows_zero_for_the_first_share_of_steps() -> None:
    assert [no_answer_weight(s, 3, 0.5) for s in range(5)] == [0.0, 0.0, 0.0, 0.5, 0.5]
    assert [no_answer_weight(s, 0, 1.0) for s in range(2)] == [1.0, 1.0]


def test_a_run_learns_no_answer_only_after_answerable_first(tiny_bert: Path, tmp_path: Path) -> None:
    """Trained on unanswerable questions only, with answerable_first 0.5 over 4 batches: the first
    two batches' loss is exactly 0, the last two's is not."""
    squad = json.loads(DEV_V2.read_text())
    for article in squad["data"]:
        for para in article["paragraphs"]:
            para["qas"] = [qa for qa in para["qas"] if qa["is_impossible"]]
    unanswerable = tmp_path / "unanswerable.json"
    unanswerable.write_text(json.dumps(squad))
    conf = tiny_config(
        tiny_bert, tmp_path, train_file=str(unanswerable), validation_file=str(DEV_V2), squad_version="2.0",
        max_eval_examples=8,
    )  # fmt: skip
    conf["hyperparameters"]["answerable_first"] = 0.5
    conf["scheduling_unit"] = 1
    metrics = tmp_path / "metrics.json"
    args = ["--config", str(write_yaml(conf, tmp_path / "exp.yaml")), "--checkpoint-dir", str(tmp_path / "c")]
    code, _, err = run_train([*args, "--metrics-out", str(metrics)])
    assert code == 0, err
    losses = [r["metrics"]["loss"] for r in json.loads(metrics.read_text())["training"]]
    assert len(losses) == 4 and losses[:2] == [0.0, 0.0] and min(losses[2:]) > 0, losses


def test_a_resume_names_a_changed_no_answer_weighting() -> None:
    """The weighting is part of what a checkpoint's run is: a resume with another weight is
    named as changed; the standard recipe records nothing, so older checkpoints still match."""
    from extractive_qa.resume.identity import identity_changes
    from tests.support.project import run_identity

    standard = run_identity(["--config", "local_v2.yaml"])
    assert not any("no_answer" in key or "answerable_first" in key for key in standard)
    weighted = run_identity(
        ["--config", "local_v2.yaml", "--set", "hyperparameters.no_answer_loss_weight=0.5"]
    )
    assert identity_changes(standard, weighted) == ["hyperparameters.no_answer_loss_weight: None -> 0.5"]
    first = run_identity(["--config", "local_v2.yaml", "--set", "hyperparameters.answerable_first=0.25"])
    assert identity_changes(standard, first) == ["hyperparameters.answerable_first: None -> 0.25"]
