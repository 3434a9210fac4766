"""export.py and predict.py --runtime onnx: a checkpoint of each tested family exports to ONNX
whose logits equal PyTorch's on real windows (shapes it was not exported with included), answers
the dev excerpt as the PyTorch path does, exports twice to the same files, and bad requests are
refused before any work."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from extractive_qa.data import squad_files
from extractive_qa.errors import DataError
from extractive_qa.serve import export_dir, onnx_model
from extractive_qa.serve.predictor import Predictor
from tests.support.families import build
from tests.support.project import DEV_V1, DEV_V2, ROOT, run_cli, run_train, tiny_config, write_yaml

EXPORT_FAMILIES = ("bert", "distilbert", "roberta", "deberta-v2")


def _checkpoint(model: Path, tmp: Path) -> Path:
    config = write_yaml(tiny_config(model, tmp), tmp / "exp.yaml")
    code, result, err = run_train(
        ["--config", str(config), "--checkpoint-dir", str(tmp / "ck"), "--batches", "3"]
    )
    assert code == 0, err[-2000:]
    return Path(result["checkpoint"])


def _scores(checkpoint: Path, runtime: str, tmp: Path) -> dict:
    preds = tmp / f"preds-{runtime}.json"
    run_cli(["predict.py", "--checkpoint", str(checkpoint), "--runtime", runtime, "--squad", str(DEV_V1),
             "--out", str(preds)])  # fmt: skip
    return run_cli(["-m", "extractive_qa.qa.squad_metric", str(DEV_V1), str(preds)])


def _agreement(first: Path, second: Path) -> float:
    a, b = json.loads(first.read_text()), json.loads(second.read_text())
    assert a.keys() == b.keys()
    return sum(a[k] == b[k] for k in a) / len(a)


@pytest.mark.parametrize("family", EXPORT_FAMILIES)
def test_export_matches_pytorch_and_answers_alike(family: str, tmp_path: Path) -> None:
    checkpoint = _checkpoint(build(family, tmp_path / family), tmp_path)
    out = tmp_path / "export"
    result = export_dir.export(str(checkpoint), out, None, 64, int8=True)
    assert result["onnx_max_abs_logit_difference"] <= onnx_model.FP32_TOLERANCE
    assert {"model.onnx", "model-int8.onnx", "tokenizer.json", "qa_settings.json", "README.md"} <= set(
        result["files"]
    )
    assert not (out / "model.safetensors").exists()
    # Windows of another file, in evaluation's batches: other batch sizes and widths than the export's.
    reference = Predictor(str(checkpoint), "cpu", precision="fp32")
    examples = squad_files.load_squad(DEV_V2, training=False).examples[:40]
    batches = list(reference.batches(reference.features(examples)))
    assert len({tuple(b["input_ids"].shape) for b in batches}) > 1
    onnx = onnx_model.OnnxLogits(out / "model.onnx")
    expected = [reference.forward(batch) for batch in batches]
    assert onnx_model.max_logit_difference(batches, expected, onnx) <= onnx_model.FP32_TOLERANCE
    torch_scores, onnx_scores = _scores(checkpoint, "torch", tmp_path), _scores(out, "onnx", tmp_path)
    # A logit difference of 1e-7..1e-5 can flip a near-tie between two spans, and these models'
    # random-init weights make many (DeBERTa-v2: 12 of 810 answers here): at most 3 % of the
    # answers may differ, F1 by at most 1 point. The trained MiniLM's export differs in none of
    # its 810 answers (docs/results.md, Inference).
    same = _agreement(tmp_path / "preds-torch.json", tmp_path / "preds-onnx.json")
    assert same >= 0.97 and abs(onnx_scores["f1"] - torch_scores["f1"]) <= 1.0, (family, same)
    # The int8 model: what export.json records is its logits' difference on the check windows
    # (the dev excerpt's first 64 questions), recomputed here; its F1 on a trained model: docs/results.md.
    check = reference.features(squad_files.load_squad(DEV_V1, training=False).examples[:64])
    int8 = onnx_model.OnnxLogits(out / "model-int8.onnx")
    check_batches = list(reference.batches(check))
    expected = [reference.forward(batch) for batch in check_batches]
    recomputed = onnx_model.max_logit_difference(check_batches, expected, int8)
    assert result["int8_max_abs_logit_difference"] == pytest.approx(recomputed, rel=1e-6, abs=1e-9)


def test_export_twice_gives_the_same_files(trained: tuple[Path, dict], tmp_path: Path) -> None:
    checkpoint, _ = trained
    first, second = tmp_path / "a", tmp_path / "b"
    export_dir.export(str(checkpoint), first, None, 16, int8=True)
    export_dir.export(str(checkpoint), second, None, 16, int8=True)
    names = sorted(p.name for p in first.iterdir())
    assert names == sorted(p.name for p in second.iterdir())
    for name in names:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    card, own = (first / "README.md").read_text(), (checkpoint / "hf" / "README.md").read_text()
    assert card.split("## Use")[0] == own.split("## Use")[0]  # the run's facts travel, with the export's use


def test_export_refusals(trained: tuple[Path, dict], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    checkpoint, _ = trained
    with pytest.raises(DataError, match="which this command reads .--checkpoint"):
        export_dir.export(str(checkpoint), checkpoint / "hf" / "onnx", None, 16, int8=False)
    with pytest.raises(DataError, match="has no model.onnx; write it with `python3 export.py"):
        Predictor(str(checkpoint), runtime="onnx")
    out = tmp_path / "x"
    export_dir.export(str(checkpoint), out, None, 16, int8=False)
    export_dir.export(str(checkpoint), out, None, 16, int8=False)  # the same command again: its own files
    (out / "notes.txt").write_text("mine")
    with pytest.raises(DataError, match=r"did not write \(notes.txt\)"):
        export_dir.export(str(checkpoint), out, None, 16, int8=False)
    (out / "notes.txt").unlink()
    with pytest.raises(DataError, match="has no model-int8.onnx"):
        Predictor(str(out), runtime="onnx-int8")
    with pytest.raises(DataError, match="an ONNX export .no PyTorch weights.; answer with --runtime onnx"):
        Predictor(str(out))
    with pytest.raises(DataError, match="--precision bf16: the ONNX models compute in fp32"):
        Predictor(str(out), precision="bf16", runtime="onnx")
    (out / "model.onnx").write_bytes((out / "model.onnx").read_bytes()[:1000])
    with pytest.raises(DataError, match="model.onnx: ONNX Runtime cannot load it"):
        Predictor(str(out), runtime="onnx")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # the export extra not installed
    with pytest.raises(
        DataError, match=r"export.py needs onnxruntime \(pip install -r requirements-export.txt\)"
    ):
        export_dir.export(str(checkpoint), tmp_path / "y", None, 16, int8=False)
    assert not (tmp_path / "y").exists()


def test_export_cli_prints_its_record(trained: tuple[Path, dict], tmp_path: Path) -> None:
    """... and no library progress bar (transformers' "Loading weights" on every model load)."""
    from transformers.utils import logging as hf_logging

    from tests.support.project import last_json, run_main

    checkpoint, _ = trained
    hf_logging.enable_progress_bar()  # as a fresh process has it
    code, out, err = run_main(["export.py", "--checkpoint", str(checkpoint), "--out", str(tmp_path / "e"),
                               "--no-int8", "--check-questions", "8"])  # fmt: skip
    assert code == 0 and "Loading weights" not in err and "it/s]" not in err, err[-2000:]
    result = last_json(out)
    written = sorted(p.name for p in (tmp_path / "e").iterdir())
    assert sorted(result["files"]) == [name for name in written if name != "export.json"], written
    assert "model-int8.onnx" not in result["files"] and result["checked_on"].endswith("windows")
    assert json.loads((tmp_path / "e" / "export.json").read_text())["opset"] == onnx_model.OPSET


def test_the_trial_never_imports_the_export_extra() -> None:
    code = "import sys, model_def, train, predict; print(sorted(m for m in sys.modules if m.split('.')[0] in "
    code += "('onnx', 'onnxruntime', 'onnxscript', 'onnx_ir')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"
    cluster = (ROOT / "requirements-cluster.txt").read_text() + (ROOT / "startup-hook.sh").read_text()
    assert "onnx" not in cluster


def test_an_export_that_answers_differently_is_refused_and_nothing_written(
    trained: tuple[Path, dict], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ONNX model's logits perturbed by 0.01 (ten times FP32_TOLERANCE): the export names the
    difference and writes no file."""
    checkpoint, _ = trained
    exact = onnx_model.OnnxLogits.__call__

    def perturbed(self: onnx_model.OnnxLogits, inputs: dict) -> tuple:
        start, end = exact(self, inputs)
        return start + 0.01, end

    monkeypatch.setattr(onnx_model.OnnxLogits, "__call__", perturbed)
    out = tmp_path / "export"
    with pytest.raises(DataError, match=r"differ from PyTorch's by 0\.01 \(> 0\.001\)"):
        export_dir.export(str(checkpoint), out, None, 16, int8=False)
    assert not out.exists() or not any(out.iterdir())


def test_an_export_carries_no_code_and_records_every_file_it_holds(trained, tmp_path: Path) -> None:
    """A checkpoint whose hf/ holds a module and a config naming it (auto_map: what a loader with
    trust_remote_code=True would import) is refused with nothing written; a stray module without
    one is not copied. The record names the checkpoint (as given, its UUID, its weights' SHA-256)
    and every file with its SHA-256; every file has the same mode."""
    import hashlib
    import shutil
    import stat

    checkpoint, _ = trained
    planted = tmp_path / "4b3d0a2c-7d11-4f7e-9d6c-0123456789ab"
    shutil.copytree(checkpoint, planted)
    (planted / "hf" / "evil.py").write_text("import os\nos.system('touch /tmp/ran')\n")
    export_dir.export(str(planted), tmp_path / "a", None, 16, int8=False)
    assert not (tmp_path / "a" / "evil.py").exists()
    record = json.loads((tmp_path / "a" / "export.json").read_text())
    weights = hashlib.sha256((planted / "hf" / "model.safetensors").read_bytes()).hexdigest()
    assert record["source"] == {"checkpoint": str(planted), "uuid": planted.name, "weights_sha256": weights}
    held = {p.name for p in (tmp_path / "a").iterdir()} - {"export.json"}
    assert set(record["files"]) == held
    for name, digest in record["files"].items():
        assert hashlib.sha256((tmp_path / "a" / name).read_bytes()).hexdigest() == digest, name
    assert len({stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "a").iterdir()}) == 1
    config = json.loads((planted / "hf" / "config.json").read_text())
    config["auto_map"] = {"AutoModelForQuestionAnswering": "evil.Model"}
    (planted / "hf" / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        DataError, match=r"config.json's auto_map .* names code to run; an export carries no code"
    ):
        export_dir.export(str(planted), tmp_path / "b", None, 16, int8=False)
    assert not (tmp_path / "b").exists()


def test_an_export_of_another_checkpoint_is_replaced_only_when_asked(trained, tmp_path: Path, capsys) -> None:
    """--out holding this checkpoint's export: replaced, and said; another checkpoint's: refused
    unless --overwrite (export.json names which checkpoint each came from)."""
    import shutil

    checkpoint, _ = trained
    out = tmp_path / "exported"
    export_dir.export(str(checkpoint), out, None, 16, int8=False)
    export_dir.export(str(checkpoint), out, None, 16, int8=False)
    assert "replacing the export of the same checkpoint" in capsys.readouterr().err
    other = tmp_path / "other"
    shutil.copytree(checkpoint, other)
    weights = other / "hf" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # another checkpoint's weights (a last bit of the last tensor)
    weights.write_bytes(bytes(data))
    with pytest.raises(
        DataError, match=rf"holds an export of another checkpoint \({checkpoint}\); .* --overwrite"
    ):
        export_dir.export(str(other), out, None, 16, int8=False)
    export_dir.export(str(other), out, None, 16, int8=False, overwrite=True)
    assert json.loads((out / "export.json").read_text())["source"]["checkpoint"] == str(other)
