"""Answer questions with a trained checkpoint.

    python3 predict.py --checkpoint DIR --question "Who won?" --context "..."
    python3 predict.py --checkpoint DIR --squad dev.json --out predictions.json
    python3 predict.py --checkpoint EXPORT_DIR --runtime onnx --squad dev.json --out predictions.json

DIR is a checkpoint directory written by train.py (or a cluster checkpoint), its hf/ folder, or a
Determined checkpoint UUID when a master is reachable (DET_MASTER); with --runtime onnx or
onnx-int8, a directory export.py wrote. Windowing, batching, precision and answer extraction are
the ones evaluation uses (extractive_qa's features, batching and answers, and the run's
hf/qa_settings.json), so `python3 -m extractive_qa.qa.squad_metric` on the written predictions
reproduces the trial's validation EM/F1. The last stdout line is JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from extractive_qa import cli  # first: a Ctrl-C while the libraries load is one line
from extractive_qa.data import squad_files
from extractive_qa.errors import DataError
from extractive_qa.io.files import check_new_directory, check_output_file, check_outputs, write_text_atomic
from extractive_qa.qa import outputs
from extractive_qa.serve.predictor import Predictor


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line, checked as far as it can be without the checkpoint."""
    parser = argparse.ArgumentParser(description="Answer questions with a SQuAD checkpoint.")
    parser.add_argument("--checkpoint", required=True, help="checkpoint dir, its hf/, or a UUID")
    parser.add_argument("--question")
    parser.add_argument("--context")
    parser.add_argument("--squad", help="SQuAD JSON to answer (with --out)")
    parser.add_argument("--out", type=Path, help="predictions.json (question id -> answer)")
    parser.add_argument(
        "--out-dir",
        type=Path,
        help="with --squad: write predictions.json, null_odds.json (the official v2.0 script's "
        "--na-prob-file) and nbest_predictions.json here",
    )
    parser.add_argument(
        "--null-threshold",
        metavar="tuned|NUMBER",
        help='v2.0: answer "" where the null score beats the best span\'s by more than this; `tuned` '
        "is the checkpoint's best_f1 threshold (default: the run's data.null_score_diff_threshold)",
    )
    parser.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--batch-size", type=int)
    parser.add_argument(
        "--runtime",
        choices=["torch", "onnx", "onnx-int8"],
        default="torch",
        help="torch (default), or ONNX Runtime on the CPU with the model.onnx / model-int8.onnx that "
        "export.py wrote (pass its output directory as --checkpoint; needs requirements-export.txt)",
    )
    parser.add_argument(
        "--precision",
        choices=["auto", "fp32", "bf16", "fp16"],
        help="autocast precision (default: the one evaluation used, from hf/qa_settings.json; auto: "
        "bf16 on a CPU with bf16 matrix units, else fp32)",
    )
    args = parser.parse_args(argv)
    args.single = args.question is not None or args.context is not None
    if args.single == bool(args.squad):
        parser.error("give either --question and --context, or --squad FILE --out FILE")
    if args.squad and not (args.out or args.out_dir):
        parser.error("--squad needs --out FILE or --out-dir DIR")
    if args.single and args.out_dir:
        parser.error("--out-dir goes with --squad FILE")
    if args.batch_size is not None and args.batch_size < 1:
        parser.error("--batch-size must be positive")
    return args


def check_question(args: argparse.Namespace) -> None:
    """--question and --context: non-empty text of at most squad_files.MAX_CONTEXT_CHARS."""
    if not (args.question or "").strip() or not (args.context or "").strip():
        raise DataError("--question and --context must both be non-empty text.")
    for flag, text in (("--question", args.question), ("--context", args.context)):
        if len(text) > squad_files.MAX_CONTEXT_CHARS:
            limit = f"the limit is {squad_files.MAX_CONTEXT_CHARS:,} (SQuAD's longest context: ~25,000)"
            raise DataError(f"{flag} is {len(text):,} characters; {limit}: split the text.")


def check_writes(args: argparse.Namespace) -> None:
    """Before any work: each output writable, none on an input (the data, the checkpoint)."""
    if args.out:
        check_output_file(args.out.resolve(), "--out")
    written = {"--out": args.out} if args.out else {}
    if args.out_dir:
        written |= {f"--out-dir ({name})": args.out_dir / name for name in outputs.OUTPUT_FILES}
    read = {"--squad": Path(args.squad) if args.squad else None, "--checkpoint": Path(args.checkpoint)}
    check_outputs(written, read)  # an input named as an output is said as such, first
    if args.out_dir:  # a new directory, or one predict.py filled (its record is there)
        check_new_directory(
            args.out_dir.resolve(), "--out-dir", outputs.OUTPUT_FILES, marker=outputs.OUTPUT_RECORD
        )


V11_ALWAYS_ANSWERS = (
    "predict: this checkpoint was trained on SQuAD v1.1, so it always answers, even where the context "
    "holds no answer; `score` is the answer's probability among the candidate spans it weighed, not "
    "a probability that the context answers the question"
)


def answers_of(
    predictor: Predictor, args: argparse.Namespace, squad: squad_files.SquadSet | None
) -> dict[str, Any]:
    """--question over --context: the answer, its score and its character span. --squad: every
    question, written to --out (id -> answer) and/or --out-dir (predictions, null odds, n-best)."""
    if squad is not None and squad.version == "2.0" and predictor.settings.squad_version == "1.1":
        print(f"predict: warning: {args.squad} is SQuAD v2.0, but this checkpoint was trained on v1.1: it "
              "never answers \"\" and unanswerable questions count as wrong.", file=sys.stderr)  # fmt: skip
    question = squad_files.Example("question", args.question, args.context, [])
    examples = squad.examples if squad is not None else [question]
    answers, nbest = predictor.answer_with_nbest(examples, nbest=args.out_dir is not None)
    if squad is None:
        if predictor.settings.squad_version == "1.1":
            print(V11_ALWAYS_ANSWERS, file=sys.stderr)
        start, end = int(answers.start[0]), int(answers.end[0])
        return {"answer": answers.text["question"], "score": float(answers.score[0]),
                "start": max(start, 0), "end": max(end, 0)}  # fmt: skip
    result: dict[str, Any] = {"questions": len(answers.text), "null_threshold": predictor.null_threshold}
    if args.out:
        write_text_atomic(args.out, json.dumps(answers.text, ensure_ascii=False))
        result["predictions"] = str(args.out)
    if args.out_dir:
        record = {"written_by": "predict.py", "checkpoint": str(args.checkpoint), "squad": str(args.squad)}
        result |= outputs.write_outputs(args.out_dir, examples, answers, nbest, record)
    return result


@cli.boundary
def main(argv: Sequence[str] | None = None) -> int:
    cli.hide_library_progress_bars()
    args = parse_args(argv)
    if args.single:
        check_question(args)
    check_writes(args)
    # What needs no model is checked first: the data, then (in Predictor, before the weights
    # load) the checkpoint's settings and --null-threshold. A refusal, or a write that fails (a
    # full disk: each output file is written whole or not at all), is cli.boundary's one line.
    squad = None if args.single else squad_files.load_squad(args.squad, training=False)
    predictor = Predictor(args.checkpoint, args.device, args.batch_size, args.precision, args.runtime,
                          null_threshold=args.null_threshold)  # fmt: skip
    print(json.dumps(answers_of(predictor, args, squad), ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
