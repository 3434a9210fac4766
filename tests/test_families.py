"""Any extractive-QA encoder, not only BERT: for each family (tests/support/families.py) the windows
equal Hugging Face's own tokenizer call id for id, every label maps back to its gold answer's
characters (accents, CJK and emoji included), no-answer labels sit at that tokenizer's CLS, and
the trial trains, validates, checkpoints, resumes, exports hf/ and answers through predict.py.
Attention that just works, layouts the windowing cannot serve refused, gradient checkpointing."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from extractive_qa import compat
from extractive_qa.config.settings import WindowSpec
from extractive_qa.data.features import build_features, load_tokenizer
from extractive_qa.data.squad_files import Example, load_squad
from tests.support.cli_result import last_json
from tests.support.families import FAMILIES, build
from tests.support.project import (
    DEV_V1,
    DEV_V2,
    TRAIN_V1,
    completed,
    run_cli,
    run_train,
    tiny_config,
    write_yaml,
)
from tests.support.reference_features import standard_recipe

pytestmark = pytest.mark.cluster_stack  # each family's model and tokenizer code is transformers'

# Long enough that no question is cut (the standard recipe never cuts one; tiny vocabularies
# make questions long), short enough that contexts overflow into several windows.
SPEC = WindowSpec(160, 48, 96)
CRAFTED_CONTEXT = (
    "The café in Zürich served crème brûlée to 北京大学 students 🙂 before the São Paulo trip. "
    "Naïve façades 東京 lined the street, and the rocket 🚀 launched at dawn. " * 3
)
CRAFTED = [
    Example(qid, question, CRAFTED_CONTEXT, [{"text": text, "answer_start": CRAFTED_CONTEXT.find(text)}])
    for qid, question, text in (
        ("c1", "What was served?", "crème brûlée"),
        ("c2", "Which students?", "北京大学"),
        ("c3", "What launched?", "the rocket 🚀"),
        ("c4", "Which city?", "São Paulo"),
    )
]


@pytest.fixture(scope="module", params=FAMILIES)
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    return request.param, build(request.param, tmp_path_factory.mktemp(request.param))


def examples() -> list[Example]:
    return [
        *load_squad(TRAIN_V1, training=True).examples[:120],
        *load_squad(DEV_V2, training=True).examples[:200],
        *CRAFTED,
    ]


def test_windows_equal_the_tokenizers_own_call(family: tuple[str, Path]) -> None:
    name, path = family
    tokenizer = load_tokenizer(str(path))
    batch = examples()
    ours = build_features(batch, tokenizer, SPEC, labels=True, offsets=False)
    standard = standard_recipe(batch, tokenizer, SPEC)
    for key in ("input_ids", "lengths", "example_index", "token_type_ids"):
        if key in standard or getattr(ours, key) is not None:
            assert np.array_equal(getattr(ours, key), standard[key]), (name, key)


def test_labels_map_back_to_the_gold_answer_and_no_answer_sits_at_cls(family: tuple[str, Path]) -> None:
    name, path = family
    tokenizer = load_tokenizer(str(path))
    batch = examples()
    features = build_features(batch, tokenizer, SPEC, labels=True, offsets=True)
    assert features.input_ids[0, features.cls_index] == tokenizer.cls_token_id, name
    labelled = 0
    for row in range(len(features)):
        ex = batch[features.example_index[row]]
        s, e = int(features.start_positions[row]), int(features.end_positions[row])
        if s == features.cls_index:
            assert e == s
            continue
        labelled += 1
        gold_start = ex.answers[0]["answer_start"]
        gold_end = gold_start + len(ex.answers[0]["text"])
        first, last = features.offsets[row, s], features.offsets[row, e]
        # the labelled tokens cover the answer, and the first and last of them are part of it
        assert first[0] <= gold_start and last[1] >= gold_end, (name, ex.id)
        assert first[1] > gold_start and last[0] < gold_end, (name, ex.id)
    assert labelled > 100
    by_id = {ex.id: i for i, ex in enumerate(batch)}
    for ex in CRAFTED:  # each crafted answer is labelled in some window, exactly its characters
        rows = np.flatnonzero(features.example_index == by_id[ex.id])
        spans = {
            ex.context[
                features.offsets[r, features.start_positions[r], 0] : features.offsets[
                    r, features.end_positions[r], 1
                ]
            ].strip()
            for r in rows
            if features.start_positions[r] != features.cls_index
        }
        assert ex.answers[0]["text"] in spans or any(ex.answers[0]["text"] in s for s in spans), (
            name,
            ex.id,
            spans,
        )
    impossible = [i for i, ex in enumerate(batch) if ex.is_impossible]
    assert impossible
    rows = np.isin(features.example_index, impossible)
    assert (features.start_positions[rows] == features.cls_index).all()


def test_each_family_trains_resumes_exports_and_answers(family: tuple[str, Path], tmp_path: Path) -> None:
    name, path = family
    conf = tiny_config(path, tmp_path)
    conf["checkpoint_policy"] = "all"
    config = write_yaml(conf, tmp_path / "exp.yaml")
    store = ["--config", str(config), "--checkpoint-dir", str(tmp_path / "ckpt")]
    code, first, err = run_train([*store, "--batches", "2"])
    assert code == 0, (name, err[-3000:])
    code, result, err = run_train([*store, "--resume", "latest", "--batches", "3"])
    assert code == 0, (name, err[-3000:])
    assert result["steps_completed"] == 3
    checkpoint = Path(result["checkpoint"])
    settings = json.loads((checkpoint / "hf" / "qa_settings.json").read_text())
    assert settings["pretrained_model"] == str(path)
    preds = tmp_path / "preds.json"
    run_cli(["predict.py", "--checkpoint", str(checkpoint), "--squad", str(DEV_V1), "--out", str(preds)])
    scored = run_cli(["-m", "extractive_qa.qa.squad_metric", str(DEV_V1), str(preds)])
    assert (scored["exact_match"], scored["f1"]) == (result["exact_match"], result["f1"]), name
    answer = run_cli(
        [
            "predict.py",
            "--checkpoint",
            str(checkpoint),
            "--question",
            "Who won?",
            "--context",
            "The Denver Broncos won Super Bowl 50.",
        ]
    )
    text = answer["answer"]
    assert text == text.strip()  # no space at the edges, whatever the tokenizer's offsets


def dry(config: Path, *extra: str) -> subprocess.CompletedProcess:
    return completed(["train.py", "--config", str(config), "--dry-run", *extra])


def test_attention_auto_picks_what_the_model_supports_and_refuses_what_it_lacks(tmp_path: Path) -> None:
    deberta = build("deberta-v2", tmp_path / "deberta")
    config = write_yaml(tiny_config(deberta, tmp_path), tmp_path / "exp.yaml")
    done = dry(config)
    assert done.returncode == 0, done.stderr
    assert last_json(done.stdout)["attention"].startswith("eager (auto")
    refused = dry(config, "--set", "hyperparameters.attn_implementation=sdpa")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    for needle in ("hyperparameters.attn_implementation", "DebertaV2ForQuestionAnswering", "supports eager"):
        assert needle in refused.stderr
    # the trial runs with it by default (SDPA was asked for before, and DeBERTa could not load)
    code, _, err = run_train(
        ["--config", str(config), "--checkpoint-dir", str(tmp_path / "c"), "--batches", "1"]
    )
    assert code == 0, err[-2000:]


@pytest.mark.parametrize("layout", ["left-padding", "cls-last"])
def test_layouts_the_windowing_cannot_serve_are_refused(layout: str, tmp_path: Path) -> None:
    path = build("bert", tmp_path / "model")
    settings = json.loads((path / "tokenizer_config.json").read_text())
    if layout == "left-padding":
        settings["padding_side"] = "left"
        (path / "tokenizer_config.json").write_text(json.dumps(settings))
    else:  # an XLNet-style template: A [SEP] B [SEP] [CLS], read as tokenizer.json says
        settings["tokenizer_class"] = "PreTrainedTokenizerFast"
        (path / "tokenizer_config.json").write_text(json.dumps(settings))
        raw = json.loads((path / "tokenizer.json").read_text())
        cls, sep = ["[CLS]", raw["model"]["vocab"]["[CLS]"]], ["[SEP]", raw["model"]["vocab"]["[SEP]"]]
        raw["post_processor"] = {
            "type": "TemplateProcessing",
            "single": [
                {"Sequence": {"id": "A", "type_id": 0}},
                {"SpecialToken": {"id": "[SEP]", "type_id": 0}},
                {"SpecialToken": {"id": "[CLS]", "type_id": 0}},
            ],
            "pair": [
                {"Sequence": {"id": "A", "type_id": 0}},
                {"SpecialToken": {"id": "[SEP]", "type_id": 0}},
                {"Sequence": {"id": "B", "type_id": 1}},
                {"SpecialToken": {"id": "[SEP]", "type_id": 1}},
                {"SpecialToken": {"id": "[CLS]", "type_id": 1}},
            ],
            "special_tokens": {name: {"id": name, "ids": [i], "tokens": [name]} for name, i in (cls, sep)},
        }
        (path / "tokenizer.json").write_text(json.dumps(raw))
    config = write_yaml(tiny_config(path, tmp_path), tmp_path / "exp.yaml")
    code, _, err = run_train(
        ["--config", str(config), "--checkpoint-dir", str(tmp_path / "c"), "--batches", "1"]
    )
    assert code == 2 and "Traceback" not in err, err[-2000:]
    assert ("pads on the left" if layout == "left-padding" else "CLS") in err
    assert not (tmp_path / "c" / "determined").exists()


def test_gradient_checkpointing_keeps_the_loss_and_gradients(tiny_bert: Path) -> None:
    import torch
    from transformers import AutoModelForQuestionAnswering

    tokenizer = load_tokenizer(str(tiny_bert))
    batch = load_squad(TRAIN_V1, training=True).examples[:8]
    features = build_features(batch, tokenizer, SPEC, labels=True, offsets=False)
    inputs = {
        "input_ids": torch.as_tensor(features.input_ids, dtype=torch.long),
        "attention_mask": torch.as_tensor(features.input_ids != tokenizer.pad_token_id, dtype=torch.long),
        "start_positions": torch.as_tensor(features.start_positions, dtype=torch.long),
        "end_positions": torch.as_tensor(features.end_positions, dtype=torch.long),
    }
    results = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = AutoModelForQuestionAnswering.from_pretrained(tiny_bert).train()
        if checkpointing:
            compat.enable_activation_checkpointing(model)
        loss = model(**inputs).loss
        loss.backward()
        results.append(
            (loss.item(), torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
        )
    (loss_off, grad_off), (loss_on, grad_on) = results
    assert loss_on == pytest.approx(loss_off, rel=1e-6)
    assert torch.allclose(grad_on, grad_off, atol=1e-6)


def test_gradient_checkpointing_reaches_the_model(tiny_bert: Path, tmp_path: Path, caplog) -> None:
    config = write_yaml(tiny_config(tiny_bert, tmp_path), tmp_path / "exp.yaml")
    caplog.set_level("INFO", logger="squad")
    code, _, err = run_train(
        [
            "--config",
            str(config),
            "--checkpoint-dir",
            str(tmp_path / "c"),
            "--batches",
            "1",
            "--set",
            "hyperparameters.gradient_checkpointing=true",
        ]
    )
    assert code == 0, err[-2000:]
    assert "gradient checkpointing on" in caplog.text
    plan = last_json(dry(config, "--set", "hyperparameters.gradient_checkpointing=true").stdout)
    assert plan["gradient_checkpointing"] is True
