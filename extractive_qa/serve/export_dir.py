"""A checkpoint as a directory to serve from: ONNX (fp32) and dynamically quantized int8 ONNX beside
the tokenizer, qa_settings.json and the model card, checked against PyTorch on real windows --
refused, with nothing written, when the fp32 model's logits differ from PyTorch's by more than
onnx_model.FP32_TOLERANCE. Needs requirements-export.txt.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from extractive_qa import reading
from extractive_qa.data import squad_files
from extractive_qa.errors import DataError
from extractive_qa.files import ROOT, check_new_directory, check_outputs, copy_plain_file, shared_mode
from extractive_qa.qa import model_card
from extractive_qa.serve import onnx_model
from extractive_qa.serve.model_dir import find_hf_dir
from extractive_qa.serve.predictor import Predictor

EXPORT_RECORD = "export.json"
# What an export directory keeps from hf/: everything but the PyTorch weights.
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
DEFAULT_CHECK = {version: ROOT / "squad_data" / f"dev-v{version}-excerpt.json" for version in ("1.1", "2.0")}


def export(checkpoint: str, out: Path, squad: str | None, questions: int, int8: bool) -> dict:
    onnx_model.require_onnx("export.py")
    hf = find_hf_dir(checkpoint)
    # A new directory, or one an earlier export of it wrote (running the same command twice).
    own = {p.name for p in hf.iterdir() if p.name not in WEIGHT_FILES}
    own |= {onnx_model.ONNX_FILE, onnx_model.INT8_FILE, EXPORT_RECORD}
    check_new_directory(out.resolve(), "--out", tuple(sorted(own)), marker=EXPORT_RECORD)
    inputs = {"--checkpoint": Path(checkpoint), "--checkpoint's hf/": hf}
    inputs["--squad"] = Path(squad) if squad else None
    check_outputs({"--out": out}, inputs)
    reference = Predictor(str(hf), "cpu", precision="fp32")
    source = squad or str(DEFAULT_CHECK[reference.settings.squad_version])
    examples = squad_files.load_squad(source, training=False).examples[:questions]
    batches = list(reference.batches(reference.features(examples)))
    sample = max(batches, key=lambda b: min(b["input_ids"].shape))  # an axis of 1 would be fixed
    if min(sample["input_ids"].shape) < 2:
        raise DataError(f"--squad {source}: too few windows to export with (need a batch of 2 or more).")
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out, prefix=".export-"))
    try:
        copied = set()
        for item in sorted(hf.iterdir()):  # plain files only: a link in hf/ is refused, not followed
            if item.name not in WEIGHT_FILES and not item.is_dir():
                copy_plain_file(item, staging / item.name)  # its mode narrowed, never widened
                copied.add(item.name)
        numpy_sample = {k: v.numpy() for k, v in sample.items() if k != "feature_index"}
        onnx_model.export_onnx(onnx_model.model_to_export(hf), numpy_sample, staging / onnx_model.ONNX_FILE)
        fp32 = onnx_model.OnnxLogits(staging / onnx_model.ONNX_FILE)
        windows = sum(len(b["input_ids"]) for b in batches)
        record = {"checked_on": f"{Path(source).name}: first {len(examples)} questions, {windows} windows",
                  "opset": onnx_model.OPSET}  # fmt: skip
        expected = [reference.forward(batch) for batch in batches]  # PyTorch's, once for both models
        difference = onnx_model.max_logit_difference(batches, expected, fp32)
        record["onnx_max_abs_logit_difference"] = difference
        if difference > onnx_model.FP32_TOLERANCE:
            raise DataError(
                f"{hf}: the exported model's logits differ from PyTorch's by {difference:.3g} "
                f"(> {onnx_model.FP32_TOLERANCE}); not writing an export that would answer differently."
            )
        if int8:
            onnx_model.quantize_int8(staging / onnx_model.ONNX_FILE, staging / onnx_model.INT8_FILE)
            quantized = onnx_model.OnnxLogits(staging / onnx_model.INT8_FILE)
            record["int8_max_abs_logit_difference"] = onnx_model.max_logit_difference(
                batches, expected, quantized
            )
        (staging / EXPORT_RECORD).write_text(json.dumps(record, indent=1) + "\n")
        card = staging / model_card.MODEL_CARD
        if card.is_file():  # the checkpoint's card, with the use of what this directory holds
            text = reading.read_text(card, reading.MODEL_FILE)
            card.write_text(model_card.for_export(text, [p.name for p in staging.iterdir()]))
        for item in sorted(staging.iterdir()):  # each file replaced whole; what we made gets the umask's mode
            if item.name not in copied:
                shared_mode(item)
            item.replace(out / item.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {"out": str(out), "files": sorted(p.name for p in out.iterdir() if not p.name.startswith(".")),
            **record}  # fmt: skip
