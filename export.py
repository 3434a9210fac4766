"""Export a checkpoint for serving: ONNX (fp32) and dynamically quantized int8 ONNX, beside the
tokenizer, qa_settings.json and the model card, checked against PyTorch on real windows.

    python3 export.py --checkpoint DIR --out EXPORT_DIR
    python3 predict.py --checkpoint EXPORT_DIR --runtime onnx --squad dev.json --out predictions.json

DIR is what predict.py takes (a checkpoint directory, its hf/, or a Determined checkpoint UUID);
EXPORT_DIR is created (or an empty directory; an earlier export of the same checkpoint is
replaced, another checkpoint's only with --overwrite). The fp32 model's start/end logits must match
PyTorch's within onnx_model.FP32_TOLERANCE on the windows of --squad's first --check-questions
questions (default: the bundled dev excerpt of the checkpoint's SQuAD version), or nothing is
written; the int8 model's difference is reported. Needs requirements-export.txt. The last stdout
line is JSON (also written as EXPORT_DIR/export.json). The work: extractive_qa/serve/export_dir.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from extractive_qa import cli  # first: a Ctrl-C while the libraries load is one line
from extractive_qa.errors import DataError
from extractive_qa.io.files import command_error
from extractive_qa.serve.export_dir import export


@cli.boundary
def main(argv: Sequence[str] | None = None) -> int:
    cli.hide_library_progress_bars()
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("--checkpoint", required=True, help="checkpoint dir, its hf/, or a UUID")
    parser.add_argument(
        "--out", required=True, type=Path,
        help="the export directory: created, or an empty one, or this checkpoint's earlier export (replaced)",
    )  # fmt: skip
    parser.add_argument(
        "--squad", help="SQuAD file whose windows check the export (default: bundled excerpt)"
    )
    parser.add_argument("--check-questions", type=int, default=64, help="its first N questions (default 64)")
    parser.add_argument("--no-int8", action="store_true", help="skip the int8 model")
    parser.add_argument(
        "--overwrite", action="store_true", help="replace an export of another checkpoint in --out"
    )
    args = parser.parse_args(argv)
    if args.check_questions < 2:
        parser.error("--check-questions must be 2 or more")
    try:
        result = export(
            args.checkpoint, args.out, args.squad, args.check_questions, not args.no_int8, args.overwrite
        )
    except (DataError, OSError) as err:
        return command_error(err, args.out)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
