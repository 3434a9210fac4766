"""Bad data files, answers and exports: each named (file, line or field) with what to do, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.project import ROOT, run_main


def test_the_scoring_cli_warns_per_missing_id_and_refuses_foreign_predictions(tmp_path: Path) -> None:
    from extractive_qa.data.squad_files import load_squad
    from tests.support.project import DEV_V1, DEV_V2

    ids = [ex.id for ex in load_squad(DEV_V1, training=False).examples]
    foreign = tmp_path / "foreign.json"
    foreign.write_text(json.dumps({f"x{i}": "a" for i in range(810)}))
    code, out, err = run_main(["-m", "extractive_qa.qa.squad_metric", str(DEV_V1), str(foreign)])
    assert code == 2 and "none of its 810 ids" in err and out == ""
    half = tmp_path / "half.json"
    v2_ids = [ex.id for ex in load_squad(DEV_V2, training=False).examples]
    half.write_text(json.dumps({i: "" for i in v2_ids[: len(v2_ids) // 2]}))
    code, out, err = run_main(["-m", "extractive_qa.qa.squad_metric", str(DEV_V2), str(half)])
    assert code == 0 and err.count("Missing prediction for") == len(v2_ids) - len(v2_ids) // 2
    assert "over the answered questions only" in err
    some = tmp_path / "some.json"
    some.write_text(json.dumps({i: "" for i in ids[:10]}))
    code, _, err = run_main(["-m", "extractive_qa.qa.squad_metric", str(DEV_V1), str(some)])
    assert code == 0 and "counts each missing one as wrong" in err
    odds = tmp_path / "odds.json"  # NaN would make the printed report invalid JSON
    odds.write_text(json.dumps({i: (float("nan") if n == 0 else 0.5) for n, i in enumerate(v2_ids)}))
    metric = ["-m", "extractive_qa.qa.squad_metric"]
    code, out, err = run_main([*metric, str(DEV_V2), str(half), "--na-prob-file", str(odds)])
    assert code == 2 and "not a finite number" in err and out == ""


def test_predict_checks_its_inputs_and_outputs_before_any_work(trained, tmp_path: Path) -> None:
    import shutil

    import torch

    checkpoint, _ = trained
    question = ["--question", "Who won?", "--context", "Denver won."]
    code, _, err = run_main(
        [
            "predict.py",
            "--checkpoint",
            str(checkpoint),
            "--squad",
            "x.json",
            "--out",
            str(tmp_path / "no" / "p.json"),
        ]
    )
    assert code == 2 and "--out" in err and "does not exist" in err and "Traceback" not in err
    if not torch.cuda.is_available():
        cuda = ["--device", "cuda"]
        code, _, err = run_main(["predict.py", "--checkpoint", str(checkpoint), *question, *cuda])
        assert code == 2 and "--device cuda" in err and "Traceback" not in err
    damaged = tmp_path / "damaged"
    shutil.copytree(checkpoint, damaged)
    weights = damaged / "hf" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    code, _, err = run_main(["predict.py", "--checkpoint", str(damaged), *question])
    assert code == 2 and "cannot load the model" in err and "Traceback" not in err
    settings = damaged / "hf" / "qa_settings.json"
    shutil.copy(checkpoint / "hf" / "model.safetensors", weights)
    raw = json.loads(settings.read_text())
    settings.write_text(json.dumps({**raw, "max_seq_length": "long"}))
    code, _, err = run_main(["predict.py", "--checkpoint", str(damaged), *question])
    assert code == 2 and "max_seq_length" in err and "Traceback" not in err
    settings.write_text(json.dumps({**raw, "precision": "fp8"}))  # a string, but no precision
    code, _, err = run_main(["predict.py", "--checkpoint", str(damaged), *question])
    assert code == 2 and "precision is 'fp8'" in err and "Traceback" not in err


EXPORT_DAMAGE = {
    "no-tokenizer-json": "tokenizer.json is missing",
    "foreign-tokenizer": "not the tokenizer this model was trained with",
    "foreign-tokenizer-older-export": "not this model's",  # no vocabulary digest: the size check
    "n-best-zero": "n_best_size: must be >= 1",
    "windows": "doc_stride",
}


@pytest.mark.parametrize("damage", sorted(EXPORT_DAMAGE))
def test_a_damaged_export_is_refused_not_used(damage: str, trained, tmp_path: Path) -> None:
    """hf/ without its tokenizer.json, with another model's tokenizer, or with QA settings out of
    the ranges a config is held to: predict.py names the file (exit 2) instead of answering."""
    import shutil

    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    checkpoint, _ = trained
    damaged = tmp_path / "damaged"
    shutil.copytree(checkpoint, damaged)
    hf = damaged / "hf"
    settings = json.loads((hf / "qa_settings.json").read_text())
    if damage == "no-tokenizer-json":
        (hf / "tokenizer.json").unlink()
    elif damage.startswith("foreign-tokenizer"):
        vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])}
        foreign = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))  # a 5-token BERT tokenizer
        foreign.normalizer = normalizers.BertNormalizer()
        foreign.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        foreign.save(str(hf / "tokenizer.json"))
        if damage.endswith("older-export"):  # written before the vocabulary digest was recorded
            (hf / "qa_settings.json").write_text(json.dumps({**settings, "vocabulary_sha256": None}))
    elif damage == "n-best-zero":
        (hf / "qa_settings.json").write_text(json.dumps({**settings, "n_best_size": 0}))
    else:  # a stride as long as the window: no window would advance
        too_long = {**settings, "doc_stride": settings["max_seq_length"]}
        (hf / "qa_settings.json").write_text(json.dumps(too_long))
    question = ["--question", "Who won?", "--context", "Denver won."]
    code, _, err = run_main(["predict.py", "--checkpoint", str(damaged), *question])
    expected = EXPORT_DAMAGE[damage]
    assert code == 2 and expected in err and "Traceback" not in err, err[-2000:]


def test_contradictory_records_and_foreign_devices_are_named(trained, tmp_path: Path) -> None:
    from extractive_qa.data import squad_files
    from extractive_qa.errors import DataError
    from tests.support.project import DEV_V2

    raw = json.loads(DEV_V2.read_text())
    qa = next(q for p in raw["data"][0]["paragraphs"] for q in p["qas"] if q.get("is_impossible"))
    qa["answers"] = [{"text": "x", "answer_start": 0}]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(raw))
    with pytest.raises(DataError, match="is_impossible is true but it has 1 answer"):
        squad_files.load_squad(bad, training=False)
    question = ["--question", "Who won?", "--context", "Denver won."]
    code, _, err = run_main(["predict.py", "--checkpoint", str(trained[0]), *question, "--device", "meta"])
    assert code == 2 and "--device 'meta'" in err and "Traceback" not in err
    answer_v2 = ["--squad", str(DEV_V2), "--out", str(tmp_path / "p.json")]
    code, _, err = run_main(["predict.py", "--checkpoint", str(trained[0]), *answer_v2])
    assert code == 0 and "trained on v1.1" in err


def _one_question(tmp: Path, **change: object) -> Path:
    """A one-question SQuAD v1.1 file with `change` applied to its question (or its context)."""
    qa = {"id": "q1", "question": "Who won?", "answers": [{"text": "Denver", "answer_start": 4}]}
    paragraph = {"context": "Yes Denver won.", "qas": [qa]}
    for key, value in change.items():
        (paragraph if key == "context" else qa)[key] = value
    path = tmp / "one.json"
    path.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": [paragraph]}]}))
    return path


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"answers": [{"text": "Denver", "answer_start": 4.0}]}, "answer_start must be a whole number"),
        ({"id": 5}, "'id' must be a non-empty string, got 5"),
        ({"question": "Who \ud800 won?"}, "lone surrogate"),
        ({"context": "x" * 1_000_001}, "the limit is 1,000,000"),
    ],
    ids=["float-answer-start", "integer-id", "lone-surrogate", "giant-context"],
)
def test_records_are_named_by_what_is_wrong(change: dict, needle: str, tmp_path: Path) -> None:
    from extractive_qa.data.squad_files import load_squad
    from extractive_qa.errors import DataError

    with pytest.raises(DataError, match=needle):
        load_squad(_one_question(tmp_path, **change), training=True)


def test_text_that_is_not_utf8_on_the_command_line_is_named() -> None:
    """A byte that is not UTF-8 in argv (Python keeps it as a lone surrogate) is one line, exit 2,
    not a tokenizer's or JSON writer's traceback."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "predict.py", "--checkpoint", "x", "--question", b"caf\xe9", "--context", "y"],
        cwd=ROOT, capture_output=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and b"not valid UTF-8" in done.stderr and b"Traceback" not in done.stderr


@pytest.mark.parametrize("inherited", ["default", "ignored"])
def test_ctrl_c_while_the_libraries_load_is_one_line(inherited: str) -> None:
    """A terminal's foreground process has SIGINT's default disposition; one started in the
    background by a script inherits it ignored, and Python kept it so: a Ctrl-C or `kill -INT`
    during start-up was swallowed (the command went on and exited 0), although training answers
    it. Both now stop with one line."""
    import signal
    import subprocess
    import sys
    import time

    disposition = signal.SIG_DFL if inherited == "default" else signal.SIG_IGN
    started = subprocess.Popen(
        [sys.executable, "train.py", "--dry-run"], cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, disposition),
    )  # fmt: skip
    time.sleep(0.8)  # inside torch's / transformers' imports (seconds)
    started.send_signal(signal.SIGINT)
    _, err = started.communicate(timeout=60)
    assert started.returncode in (130, -signal.SIGINT) and b"Traceback" not in err, err[-2000:]


@pytest.mark.parametrize("damage", ["pickled-weights-only", "same-size-vocabulary", "beyond-positions"])
def test_an_export_that_does_not_fit_its_model_is_refused(damage: str, trained, tmp_path: Path) -> None:
    import shutil

    checkpoint = tmp_path / "ck"
    shutil.copytree(trained[0], checkpoint)
    hf = checkpoint / "hf"
    if damage == "pickled-weights-only":
        import torch
        from safetensors.torch import load_file

        torch.save(load_file(hf / "model.safetensors"), hf / "pytorch_model.bin")
        (hf / "model.safetensors").unlink()
        needle = "pickled weights"
    elif damage == "same-size-vocabulary":
        tokenizer = json.loads((hf / "tokenizer.json").read_text())
        vocab = tokenizer["model"]["vocab"]
        first, second = sorted(vocab, key=vocab.get)[1000:1002]
        vocab[first], vocab[second] = vocab[second], vocab[first]  # same size, two ids swapped
        (hf / "tokenizer.json").write_text(json.dumps(tokenizer))
        needle = "not the tokenizer this model was trained with"
    else:
        settings = json.loads((hf / "qa_settings.json").read_text())
        (hf / "qa_settings.json").write_text(json.dumps({**settings, "max_seq_length": 1024}))
        needle = "above the model's 512 positions"
    question = ["--question", "Who?", "--context", "Me."]
    code, _, err = run_main(["predict.py", "--checkpoint", str(checkpoint), *question])
    assert code == 2 and needle in err and "Traceback" not in err, err[-2000:]


def test_an_onnx_model_with_other_inputs_or_outputs_is_refused(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    import onnx
    from onnx import TensorProto, helper

    from extractive_qa.errors import DataError
    from extractive_qa.serve.onnx_model import OnnxLogits

    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "s"])
    logits = helper.make_tensor_value_info("logits", TensorProto.INT64, ["b", "s"])
    node = helper.make_node("Identity", ["input_ids"], ["logits"])
    graph = helper.make_graph([node], "g", [ids], [logits])
    path = tmp_path / "renamed.onnx"
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, path)
    with pytest.raises(DataError, match="its outputs are \\['logits'\\]"):
        OnnxLogits(path)


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ("no-qa-head", "lacks 2 of the model's tensors, e.g. qa_outputs.bias"),
        ("one-unrelated", "holds 1 tensor(s) the model has not"),
        ("int32-head", "tensor qa_outputs.weight is I32"),
        ("wrong-shape", "tensor qa_outputs.weight is F32 (3,"),
        ("nan-head", "tensor 'qa_outputs.weight' holds NaN or infinite values"),
        ("inf-embedding", "holds NaN or infinite values"),
    ],
)
def test_predict_refuses_weights_that_are_not_the_models(
    change: str, needle: str, trained, tmp_path: Path
) -> None:
    """model.safetensors is checked against the model before anything loads: a file without the
    QA head, with a tensor the model has not, or with the head as integers or of another shape
    would have left from_pretrained a random head (predict.py then answered with noise, exit 0);
    one holding a NaN or an infinity answered "" everywhere."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    checkpoint, _ = trained
    planted = tmp_path / "planted"
    shutil.copytree(checkpoint, planted)
    weights = planted / "hf" / "model.safetensors"
    state = load_file(weights)
    if change == "no-qa-head":
        state = {k: v for k, v in state.items() if not k.startswith("qa_outputs.")}
    elif change == "one-unrelated":
        state["extra.weight"] = torch.zeros(2)
    elif change == "int32-head":
        state["qa_outputs.weight"] = state["qa_outputs.weight"].to(torch.int32)
    elif change == "nan-head":  # a diverged run's head: "" answered everywhere, exit 0, before
        state["qa_outputs.weight"][0, 0] = float("nan")
    elif change == "inf-embedding":
        name = next(k for k in state if "embeddings" in k and state[k].is_floating_point())
        state[name].view(-1)[0] = float("inf")
    else:
        state["qa_outputs.weight"] = torch.zeros(3, state["qa_outputs.weight"].shape[1])
    save_file(state, weights)
    code, out, err = run_main(["predict.py", "--checkpoint", str(planted), "--question", "Who won?",
                               "--context", "Denver won."])  # fmt: skip
    assert code == 2 and needle in err and out == "" and "Traceback" not in err, err


def test_null_threshold_tuned_without_a_tuned_threshold_is_refused_before_the_model_loads(
    trained, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A v2.0 checkpoint saved before any validation has no tuned threshold: said at once, not
    after the tokenizer and weights load (seconds to a minute)."""
    import shutil

    from extractive_qa.io import model_files
    from extractive_qa.serve import model_dir

    checkpoint, _ = trained
    planted = tmp_path / "v2"
    shutil.copytree(checkpoint, planted)
    settings = planted / "hf" / "qa_settings.json"
    raw = json.loads(settings.read_text())
    settings.write_text(json.dumps({**raw, "squad_version": "2.0", "tuned_null_threshold": None}))

    def loaded(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model or tokenizer was loaded before the check")

    monkeypatch.setattr(model_dir, "directory_tokenizer", loaded)
    monkeypatch.setattr(model_files, "load_qa_model", loaded)
    code, out, err = run_main(["predict.py", "--checkpoint", str(planted), "--question", "Who won?",
                               "--context", "Denver won.", "--null-threshold", "tuned"])  # fmt: skip
    assert code == 2 and "holds no tuned threshold" in err and out == "", err


def test_a_nan_logit_difference_fails_the_export_check() -> None:
    """max(0.0, nan) is 0.0: a NaN difference read as a perfect match, so the 1e-3 check could
    never fail on such an export."""
    import numpy as np

    from extractive_qa.serve import onnx_model

    batch = {"attention_mask": np.ones((1, 4), dtype=np.int64)}
    fine = (np.zeros((1, 4), dtype=np.float32), np.zeros((1, 4), dtype=np.float32))
    broken = (np.full((1, 4), np.nan, dtype=np.float32), np.zeros((1, 4), dtype=np.float32))
    assert onnx_model.max_logit_difference([batch], [fine], lambda b: fine) == 0.0
    assert onnx_model.max_logit_difference([batch], [fine], lambda b: broken) == float("inf")
