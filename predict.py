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
import math
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np

from extractive_qa import cli  # first: a Ctrl-C while the libraries load is one line
from extractive_qa.config.schema import model_position_limit
from extractive_qa.data import squad_files
from extractive_qa.data.batching import assemble_logits, evaluation_batches, forward_params, model_inputs
from extractive_qa.data.features import Features, build_features, load_tokenizer, vocabulary_sha256
from extractive_qa.errors import ConfigError, DataError
from extractive_qa.files import (
    check_new_directory,
    check_output_file,
    check_outputs,
    write_text_atomic,
)
from extractive_qa.qa import outputs, qa_settings
from extractive_qa.qa.answers import Answers
from extractive_qa.trial import model_io

Logits = tuple[np.ndarray, np.ndarray]
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def find_hf_dir(checkpoint: str) -> Path:
    """The hf/ export inside a checkpoint (downloading a UUID through the Determined SDK)."""
    path = Path(checkpoint)
    if not path.exists() and UUID.match(checkpoint):
        path = download_checkpoint(checkpoint)
    if not path.is_dir():
        raise DataError(f"--checkpoint {checkpoint}: no such directory (or reachable UUID).")
    for candidate in (path / "hf", path):
        if (candidate / "config.json").is_file() and (candidate / qa_settings.QA_SETTINGS).is_file():
            return candidate
    raise DataError(
        f"--checkpoint {checkpoint}: not a checkpoint of this project (no hf/config.json and "
        "hf/qa_settings.json); pass a directory train.py wrote."
    )


def download_checkpoint(uuid: str) -> Path:
    from determined.experimental import client

    master = os.environ.get("DET_MASTER")
    if not master:
        raise DataError(
            f"--checkpoint {uuid}: looks like a Determined checkpoint UUID, but DET_MASTER is not "
            "set; set it (and log in with `det user login`) or pass a directory."
        )
    try:
        client.login(master=master)
        target = Path(tempfile.mkdtemp(prefix=f"ckpt-{uuid[:8]}-"))
        client.get_checkpoint(uuid).download(str(target))
    except Exception as err:  # the SDK raises many kinds; all mean "could not fetch"
        raise DataError(f"--checkpoint {uuid}: cannot download from {master} ({err}).") from None
    return target


class Predictor:
    """A checkpoint's model with evaluation's windowing, batching, arithmetic and extraction. The
    model runs in PyTorch (`runtime="torch"`) or, from a directory export.py wrote, in ONNX
    Runtime (`onnx`: fp32, `onnx-int8`: int8 weights); windowing and extraction are the same."""

    def __init__(
        self,
        checkpoint: str,
        device: str | None = None,
        batch_size: int | None = None,
        precision: str | None = None,
        runtime: str = "torch",
    ):
        hf = find_hf_dir(checkpoint)
        self.hf, self.runtime = hf, runtime
        self.settings = qa_settings.QASettings.load(hf)
        if not (hf / "tokenizer.json").is_file():  # without it transformers builds a stand-in
            raise DataError(
                f"--checkpoint {checkpoint}: {hf / 'tokenizer.json'} is missing (every export "
                "writes it); the checkpoint is incomplete: copy it again."
            )
        self.tokenizer = load_tokenizer(str(hf))
        saved = self.settings.vocabulary_sha256
        if saved is not None and vocabulary_sha256(self.tokenizer) != saved:
            raise DataError(
                f"--checkpoint {checkpoint}: {hf / 'tokenizer.json'} is not the tokenizer this model "
                f"was trained with (its vocabulary differs from the one {qa_settings.QA_SETTINGS} "
                "records); copy the checkpoint's hf/ again."
            )
        self.spec = self.settings.window_spec
        limit = model_position_limit(str(hf))
        if limit is not None and self.spec.max_seq_length > limit:
            raise DataError(
                f"{hf / qa_settings.QA_SETTINGS}: max_seq_length {self.spec.max_seq_length} is above "
                f"the model's {limit} positions; the file is damaged or edited: re-export the checkpoint."
            )
        self.batch_size = batch_size or self.settings.eval_batch_size
        self.null_threshold: float | None = None
        if runtime == "torch":
            self.forward = self._torch_model(checkpoint, hf, device, precision)
        else:
            self.forward = self._onnx_model(hf, device, precision)

    def _onnx_model(self, hf: Path, device: str | None, precision: str | None) -> Callable[[dict], Logits]:
        from extractive_qa.export import onnx_model

        path = hf / onnx_model.RUNTIME_FILES[self.runtime]
        if not path.is_file():
            raise DataError(
                f"--runtime {self.runtime}: {hf} has no {path.name}; write it with "
                "`python3 export.py --checkpoint CHECKPOINT --out DIR` and pass --checkpoint DIR."
            )
        if device not in (None, "cpu"):
            raise DataError(f"--runtime {self.runtime} runs on the CPU (ONNX Runtime's CPU provider).")
        if precision not in (None, "auto", "fp32"):
            raise DataError(
                f"--precision {precision}: the ONNX models compute in fp32 ({onnx_model.ONNX_FILE}) or "
                f"with int8 weights ({onnx_model.INT8_FILE}); use --runtime torch for {precision}."
            )
        onnx_model.require_onnx(f"--runtime {self.runtime}")
        self.device, self.precision = "cpu", "fp32"
        return onnx_model.OnnxLogits(path)

    def _torch_model(
        self, checkpoint: str, hf: Path, device: str | None, precision: str | None
    ) -> Callable[[dict], Logits]:
        import torch
        from transformers import AutoModelForQuestionAnswering

        try:
            self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        except RuntimeError:
            raise DataError(f"--device {device!r}: not a device; use cpu or cuda.") from None
        if self.device.type not in ("cpu", "cuda"):
            raise DataError(f"--device {device!r}: predict.py runs on cpu or cuda.")
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise DataError(
                "--device cuda: this torch has no usable CUDA GPU (a CPU build, or no GPU visible); "
                "use --device cpu."
            )
        # The precision evaluation ran with, so the logits -- and EM/F1 -- are the trial's; `auto`
        # picks for this device as a run does.
        self.precision, _ = model_io.resolve_precision(precision or self.settings.precision, self.device.type)
        if self.precision == "fp16" and self.device.type != "cuda":
            print("predict: fp16 autocast needs CUDA; computing in fp32 on the CPU.", file=sys.stderr)
            self.precision = "fp32"
        if self.device.type == "cuda":
            model_io.configure_cuda_math(self.settings.tf32)
        if (hf / "model.onnx").is_file() and not any(hf.glob("*.safetensors")) and not any(hf.glob("*.bin")):
            raise DataError(
                f"--checkpoint {checkpoint}: an ONNX export (no PyTorch weights); answer with "
                "--runtime onnx or --runtime onnx-int8."
            )
        if not any(hf.glob("*.safetensors")) and any(hf.glob("*.bin")):
            raise DataError(
                f"--checkpoint {checkpoint}: {hf} holds pickled weights (pytorch_model.bin) only; "
                "predict.py loads safetensors, which run no code. Re-save the model with "
                "save_pretrained(..., safe_serialization=True)."
            )
        try:
            model = AutoModelForQuestionAnswering.from_pretrained(hf, use_safetensors=True)
        except Exception as err:  # truncated or foreign weights: name the files, not a traceback
            reason = str(err).splitlines()[0][:300] if str(err) else type(err).__name__
            raise DataError(
                f"--checkpoint {checkpoint}: cannot load the model in {hf} ({reason}); the weights "
                "may be damaged or cut short: copy the checkpoint again."
            ) from None
        vocabulary, embeddings = len(self.tokenizer), model.get_input_embeddings().num_embeddings
        if not embeddings // 2 <= vocabulary <= embeddings:  # models may pad embeddings, not halve them
            raise DataError(
                f"--checkpoint {checkpoint}: its tokenizer has {vocabulary} tokens, its model "
                f"{embeddings} embeddings; the tokenizer files in {hf} are not this model's."
            )
        if self.precision in model_io.AUTOCAST_DTYPES:
            model_io.fp32_logits(model)
        self.model = model.to(self.device).eval()
        accepted = forward_params(self.model)

        def forward(batch: dict) -> Logits:
            inputs = model_inputs(batch, accepted)
            with torch.inference_mode(), model_io.autocast(self.device.type, self.precision):
                out = self.model(**{k: v.to(self.device) for k, v in inputs.items()})
            return out.start_logits.float().cpu().numpy(), out.end_logits.float().cpu().numpy()

        return forward

    def batches(self, features: Features) -> Iterator[dict]:
        """The windows in evaluation's batches (sorted by length, padded as it padded)."""
        sampler, collate = evaluation_batches(features, self.batch_size, self.settings.pad_to_multiple_of)
        for indices in sampler.batches(0):
            yield collate(indices.tolist())

    def logits(self, features: Features) -> tuple[np.ndarray, np.ndarray]:
        """Start/end logits of every window, batched exactly like the trial's evaluation."""
        parts = []
        for batch in self.batches(features):
            start, end = self.forward(batch)
            parts.append((batch["feature_index"].numpy(), start, end))
        return assemble_logits(parts, features)

    def answer(self, examples: Sequence[squad_files.Example]) -> Answers:
        features = self.features(examples)
        start, end = self.logits(features)
        return self.extract(examples, features, start, end)

    def features(self, examples: Sequence[squad_files.Example]) -> Features:
        return build_features(examples, self.tokenizer, self.spec, labels=False, offsets=True)

    def extract(
        self, examples: Sequence[squad_files.Example], features: Features, start: np.ndarray, end: np.ndarray
    ) -> Answers:
        return self.settings.extract_answers(examples, features, start, end, self.null_threshold)

    def null_threshold_from(self, choice: str | None) -> None:
        """--null-threshold: `tuned` (the checkpoint's best_f1 threshold), a number, or (None) the
        run's data.null_score_diff_threshold."""
        self.null_threshold = None
        if choice is None:
            return
        if self.settings.squad_version != "2.0":
            raise DataError(
                "--null-threshold: this checkpoint answers SQuAD v1.1 (no unanswerable questions); "
                "the no-answer threshold applies to v2.0 models only."
            )
        if choice == "tuned":
            if self.settings.tuned_null_threshold is None:
                raise DataError(
                    "--null-threshold tuned: this checkpoint holds no tuned threshold (it was saved "
                    "before any SQuAD v2.0 validation); give a number instead."
                )
            self.null_threshold = float(self.settings.tuned_null_threshold)
            return
        try:
            value = float(choice)
        except ValueError:
            value = float("nan")
        if not math.isfinite(value):
            raise DataError(f"--null-threshold: expected `tuned` or a number, got {choice!r}.")
        self.null_threshold = value


def main(argv: Sequence[str] | None = None) -> int:
    if cli.refuse_undecodable(argv):
        return 2
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
    single = args.question is not None or args.context is not None
    if single == bool(args.squad):
        parser.error("give either --question and --context, or --squad FILE --out FILE")
    if args.squad and not (args.out or args.out_dir):
        parser.error("--squad needs --out FILE or --out-dir DIR")
    if single and args.out_dir:
        parser.error("--out-dir goes with --squad FILE")
    if single and (not (args.question or "").strip() or not (args.context or "").strip()):
        print("error: --question and --context must both be non-empty text.", file=sys.stderr)
        return 2
    for flag, text in (("--question", args.question), ("--context", args.context)) if single else ():
        if len(text) > squad_files.MAX_CONTEXT_CHARS:
            limit = f"the limit is {squad_files.MAX_CONTEXT_CHARS:,} (SQuAD's longest context: ~25,000)"
            print(f"error: {flag} is {len(text):,} characters; {limit}: split the text.", file=sys.stderr)
            return 2
    if args.batch_size is not None and args.batch_size < 1:
        parser.error("--batch-size must be positive")
    try:
        if args.out:
            check_output_file(args.out.resolve(), "--out")
        written = {"--out": args.out} if args.out else {}
        if args.out_dir:  # a new directory, or one holding only what predict.py writes there
            check_new_directory(args.out_dir.resolve(), "--out-dir", outputs.OUTPUT_FILES)
            written |= {f"--out-dir ({name})": args.out_dir / name for name in outputs.OUTPUT_FILES}
        read = {"--squad": Path(args.squad) if args.squad else None, "--checkpoint": Path(args.checkpoint)}
        check_outputs(written, read)
        predictor = Predictor(args.checkpoint, args.device, args.batch_size, args.precision, args.runtime)
        predictor.null_threshold_from(args.null_threshold)
        if single:
            example = squad_files.Example("question", args.question, args.context, [])
            answers = predictor.answer([example])
            start, end = int(answers.start[0]), int(answers.end[0])
            result = {
                "answer": answers.text["question"],
                "score": float(answers.score[0]),
                "start": max(start, 0),
                "end": max(end, 0),
            }
        else:
            squad = squad_files.load_squad(args.squad, training=False)
            if squad.version == "2.0" and predictor.settings.squad_version == "1.1":
                print(f"predict: warning: {args.squad} is SQuAD v2.0, but this checkpoint was trained "
                      "on v1.1: it never answers \"\" and unanswerable questions count as wrong.",
                      file=sys.stderr)  # fmt: skip
            features = predictor.features(squad.examples)
            start_logits, end_logits = predictor.logits(features)
            answers = predictor.extract(squad.examples, features, start_logits, end_logits)
            result = {"questions": len(answers.text), "null_threshold": predictor.null_threshold}
            if args.out:
                write_text_atomic(args.out, json.dumps(answers.text, ensure_ascii=False))
                result["predictions"] = str(args.out)
            if args.out_dir:
                nbest = predictor.settings.nbest(squad.examples, features, start_logits, end_logits)
                result |= outputs.write_outputs(args.out_dir, squad.examples, answers, nbest)
    except (DataError, ConfigError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a write failing after the work (a full disk): what, where, why
        where = err.filename or "the output"
        print(f"error: cannot write {where}: {err.strerror or err} (each output file is written "
              "whole or not at all).", file=sys.stderr)  # fmt: skip
        return 2
    print(json.dumps(result, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
