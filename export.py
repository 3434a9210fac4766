"""Export a checkpoint for serving: ONNX (fp32) and dynamically quantized int8 ONNX, beside the
tokenizer, qa_settings.json and the model card, checked against PyTorch on real windows.

    python3 export.py --checkpoint DIR --out EXPORT_DIR
    python3 predict.py --checkpoint EXPORT_DIR --runtime onnx --squad dev.json --out predictions.json

DIR is what predict.py takes (a checkpoint directory, its hf/, or a Determined checkpoint UUID).
The fp32 model's start/end logits must match PyTorch's within onnx_model.FP32_TOLERANCE on the
windows of --squad's first --check-questions questions (default: the bundled dev excerpt of the
checkpoint's SQuAD version), or nothing is written; the int8 model's difference is reported. Needs
requirements-export.txt. The last stdout line is JSON (also written as EXPORT_DIR/export.json).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from extractive_qa import cli  # first: a Ctrl-C while the libraries load is one line
from extractive_qa.data import squad_files
from extractive_qa.errors import DataError
from extractive_qa.files import (
    ROOT,
    check_new_directory,
    check_outputs,
    command_error,
    copy_plain_file,
    shared_mode,
)
from predict import Predictor, find_hf_dir

EXPORT_RECORD = "export.json"
# What an export directory keeps from hf/: everything but the PyTorch weights.
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
DEFAULT_CHECK = {version: ROOT / "squad_data" / f"dev-v{version}-excerpt.json" for version in ("1.1", "2.0")}


def export(checkpoint: str, out: Path, squad: str | None, questions: int, int8: bool) -> dict:
    from extractive_qa.export import onnx_model

    onnx_model.require_onnx("export.py")
    hf = find_hf_dir(checkpoint)
    check_new_directory(out.resolve(), "--out")
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
        difference = onnx_model.max_logit_difference(batches, reference.forward, fp32)
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
                batches, reference.forward, quantized
            )
        (staging / EXPORT_RECORD).write_text(json.dumps(record, indent=1) + "\n")
        for item in sorted(staging.iterdir()):  # each file replaced whole; what we made gets the umask's mode
            if item.name not in copied:
                shared_mode(item)
            item.replace(out / item.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {"out": str(out), "files": sorted(p.name for p in out.iterdir() if not p.name.startswith(".")),
            **record}  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    if cli.refuse_undecodable(argv):
        return 2
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("--checkpoint", required=True, help="checkpoint dir, its hf/, or a UUID")
    parser.add_argument("--out", required=True, type=Path, help="the export directory (created)")
    parser.add_argument(
        "--squad", help="SQuAD file whose windows check the export (default: bundled excerpt)"
    )
    parser.add_argument("--check-questions", type=int, default=64, help="its first N questions (default 64)")
    parser.add_argument("--no-int8", action="store_true", help="skip the int8 model")
    args = parser.parse_args(argv)
    if args.check_questions < 2:
        parser.error("--check-questions must be 2 or more")
    try:
        result = export(args.checkpoint, args.out, args.squad, args.check_questions, not args.no_int8)
    except (DataError, OSError) as err:
        return command_error(err, args.out)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
