"""A checkpoint as a directory to serve from: ONNX (fp32) and dynamically quantized int8 ONNX beside
the tokenizer, qa_settings.json and the model card, checked against PyTorch on real windows --
refused, with nothing written, when the fp32 model's logits differ from PyTorch's by more than
onnx_model.FP32_TOLERANCE. Needs requirements-export.txt.

An export carries no code: it takes from hf/ only the files its runtimes read, by name
(`KEPT`), and refuses a config that names code to run (`auto_map`, which a loader with
trust_remote_code=True would import). Its record (export.json) names the checkpoint it came from
-- as given, its UUID, the SHA-256 of its weights -- and every file it holds with its SHA-256;
every file gets the same mode. An --out that holds another checkpoint's export is refused unless
--overwrite says to replace it; the same checkpoint's is replaced, and the line says so.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

from extractive_qa.data import squad_files
from extractive_qa.data.features import TOKENIZER_FILES
from extractive_qa.errors import DataError
from extractive_qa.io import reading
from extractive_qa.io.files import ROOT, check_new_directory, check_outputs, copy_plain_file, shared_mode
from extractive_qa.qa import model_card, qa_settings
from extractive_qa.serve import onnx_model
from extractive_qa.serve.model_dir import find_hf_dir
from extractive_qa.serve.predictor import Predictor
from extractive_qa.storage.where import UUID

EXPORT_RECORD = "export.json"
WEIGHTS = "model.safetensors"  # the checkpoint's weights, whose digest names what was exported
# What an export takes from hf/: the files its runtimes and readers open, by name.
KEPT = frozenset({*TOKENIZER_FILES, "config.json", qa_settings.QA_SETTINGS, model_card.MODEL_CARD})
CODE_KEYS = ("auto_map",)  # a config key that names code for transformers to import
DEFAULT_CHECK = {version: ROOT / "squad_data" / f"dev-v{version}-excerpt.json" for version in ("1.1", "2.0")}


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with reading.open_regular(path, reading.WEIGHTS, follow_links=False) as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def code_named(hf: Path) -> str | None:
    """The file and key of hf/'s configs that names code to run, or None."""
    for name in ("config.json", "tokenizer_config.json"):
        if (hf / name).is_file():
            config = reading.read_json(hf / name, reading.MODEL_FILE)
            for key in CODE_KEYS:
                if isinstance(config, dict) and key in config:
                    return f"{name}'s {key} ({str(config[key])[:80]})"
    return None


def source_record(checkpoint: str, hf: Path) -> dict:
    """What the export came from: the checkpoint as given, its UUID, its weights' SHA-256."""
    named = checkpoint.rstrip("/").rsplit("/", 1)[-1]
    uuid = named if UUID.match(named) else (hf.parent.name if UUID.match(hf.parent.name) else None)
    return {"checkpoint": checkpoint, "uuid": uuid, "weights_sha256": sha256_of(hf / WEIGHTS)}


def check_replacing(out: Path, source: dict, overwrite: bool) -> None:
    """An --out that holds an export of another checkpoint is replaced only with --overwrite; of
    the same checkpoint (the same weights), it is replaced and the line says so."""
    record = out / EXPORT_RECORD
    if not record.is_file():
        return
    try:
        earlier = reading.read_json(record, reading.RECORD).get("source") or {}
    except (reading.UnreadableFile, AttributeError):
        earlier = {}
    if earlier.get("weights_sha256") == source["weights_sha256"]:
        print(f"--out {out}: replacing the export of the same checkpoint ({earlier.get('checkpoint')})",
              file=sys.stderr)  # fmt: skip
        return
    if not overwrite:
        what = (
            f"of another checkpoint ({earlier['checkpoint']})"
            if earlier.get("checkpoint")
            else ("that does not record its checkpoint")
        )
        raise DataError(
            f"--out {out}: holds an export {what}; give a new --out, or add --overwrite to replace it."
        )


def export(
    checkpoint: str, out: Path, squad: str | None, questions: int, int8: bool, overwrite: bool = False
) -> dict:
    onnx_model.require_onnx("export.py")
    hf = find_hf_dir(checkpoint)
    if code := code_named(hf):
        raise DataError(
            f"--checkpoint {checkpoint}: {code} names code to run; an export carries no code. Export a "
            "checkpoint train.py wrote."
        )
    # A new directory, or one an earlier export wrote (running the same command twice).
    own = {p.name for p in hf.iterdir() if p.name in KEPT}
    own |= {onnx_model.ONNX_FILE, onnx_model.INT8_FILE, EXPORT_RECORD}
    check_new_directory(out.resolve(), "--out", tuple(sorted(own)), marker=EXPORT_RECORD)
    source = source_record(checkpoint, hf)
    check_replacing(out, source, overwrite)
    inputs = {"--checkpoint": Path(checkpoint), "--checkpoint's hf/": hf}
    inputs["--squad"] = Path(squad) if squad else None
    check_outputs({"--out": out}, inputs)
    reference = Predictor(str(hf), "cpu", precision="fp32")
    check_file = squad or str(DEFAULT_CHECK[reference.settings.squad_version])
    examples = squad_files.load_squad(check_file, training=False).examples[:questions]
    batches = list(reference.batches(reference.features(examples)))
    sample = max(batches, key=lambda b: min(b["input_ids"].shape))  # an axis of 1 would be fixed
    if min(sample["input_ids"].shape) < 2:
        raise DataError(f"--squad {check_file}: too few windows to export with (need a batch of 2 or more).")
    out.mkdir(parents=True, exist_ok=True)
    record = _write_export(
        hf, out, batches, reference, int8, f"{Path(check_file).name}: first {len(examples)} questions", source
    )
    return {"out": str(out), "files": sorted(p.name for p in out.iterdir() if not p.name.startswith(".")),
            **record}  # fmt: skip


def _write_export(
    hf: Path, out: Path, batches: list, reference: Predictor, int8: bool, checked: str, source: dict
) -> dict:
    """The export into a staging directory inside `out`, checked against PyTorch, then each file
    moved into place whole; the record it wrote."""
    sample = max(batches, key=lambda b: min(b["input_ids"].shape))  # an axis of 1 would be fixed
    staging = Path(tempfile.mkdtemp(dir=out, prefix=".export-"))
    try:
        for item in sorted(hf.iterdir()):  # plain files only: a link in hf/ is refused, not followed
            if item.name in KEPT:
                copy_plain_file(item, staging / item.name)
        numpy_sample = {k: v.numpy() for k, v in sample.items() if k != "feature_index"}
        onnx_model.export_onnx(onnx_model.model_to_export(hf), numpy_sample, staging / onnx_model.ONNX_FILE)
        fp32 = onnx_model.OnnxLogits(staging / onnx_model.ONNX_FILE)
        windows = sum(len(b["input_ids"]) for b in batches)
        record = {"source": source, "checked_on": f"{checked}, {windows} windows", "opset": onnx_model.OPSET}
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
        card = staging / model_card.MODEL_CARD
        if card.is_file():  # the checkpoint's card, with the use of what this directory holds
            text = reading.read_text(card, reading.MODEL_FILE)
            names = [p.name for p in staging.iterdir()] + [EXPORT_RECORD]
            card.write_text(model_card.for_export(text, names))
        record["files"] = {p.name: sha256_of(p) for p in sorted(staging.iterdir())}
        (staging / EXPORT_RECORD).write_text(json.dumps(record, indent=1) + "\n")
        for item in sorted(staging.iterdir()):  # each file replaced whole, all with one mode
            shared_mode(item)
            item.replace(out / item.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return record
