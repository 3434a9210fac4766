"""Inference speed: questions/s and ms per question through predict.py's own path.

Two parts, one run:

1. End to end (`Predictor`: windowing, batched forward, answer extraction) on the real
   dev-v1.1 excerpt -- batch mode (all questions at once, time split into features / model /
   extraction) and single mode (one question per call, the latency a user of
   `predict.py --question` sees). Default model: the embedded MiniLM BERT exported like a
   checkpoint's hf/ (untrained QA head: speed does not depend on the weights); or --checkpoint.
2. Model shapes: forward-only sequences/s at a fixed length for BERT-base (random weights) and
   the checkpoint's model, per precision and batch size -- the numbers to compare with NVIDIA's
   published 119 sequences/s for BERT-base SQuAD inference on one V100.

    python3 -m bench.inference [--checkpoint DIR] [--questions 810] [--single 60] [--json FILE]
    python3 -m bench.inference --device cuda --shapes-only          # on a GPU

3. With --runtimes (bench/runtimes.py), instead: the CPU serving runtimes side by side -- PyTorch
   fp32 / bf16, ONNX Runtime fp32 / int8 -- for the checkpoint (EM/F1 per row) and a random-init
   BERT-base (speed only, --bert-base-questions of them):

    python3 -m bench.inference --runtimes --checkpoint DIR [--questions 810] [--single 60] \
        [--call-questions 32] [--bert-base-questions 100] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench.common import BERT_BASE, machine_text, provenance, sync
from extractive_qa import cli
from extractive_qa.config import experiment, run_plan
from extractive_qa.config.model_family import resolve_pretrained
from extractive_qa.data import squad_files
from extractive_qa.data.features import load_tokenizer
from extractive_qa.errors import ConfigError, DataError
from extractive_qa.io.files import ROOT, write_text_atomic
from extractive_qa.qa import mixed_precision, qa_settings
from extractive_qa.serve.predictor import Predictor
from extractive_qa.trial import model_io

NVIDIA_V100_SEQ_PER_S = 119.0


def export_embedded(target: Path, conf_path: Path) -> Path:
    """A checkpoint-like hf/ export of the embedded default model, with local.yaml's settings."""
    conf = experiment.load_yaml(conf_path)
    plan = run_plan.run_plan(conf, experiment.local_hparams(conf), 1)
    name = plan.data.pretrained_model
    model, _, _ = model_io.load_qa_model(resolve_pretrained(name))
    model.save_pretrained(target, safe_serialization=True)
    load_tokenizer(name).save_pretrained(target)
    eval_batch = plan.data.eval_batch_size_per_slot(plan.hparams.global_batch_size)  # one slot
    qa_settings.QASettings.from_run(plan.data, plan.hparams, eval_batch).save(target)
    return target


def end_to_end(predictor: Predictor, examples: list, single: int) -> dict[str, Any]:
    predictor.answer(examples[:4])  # warm-up: first-call allocations, thread pools

    t0 = time.perf_counter()
    features = predictor.features(examples)
    t1 = time.perf_counter()
    start, end = predictor.logits(features)
    sync(predictor.device)
    t2 = time.perf_counter()
    predictor.settings.extract_answers(examples, features, start, end, predictor.null_threshold)
    t3 = time.perf_counter()
    total = t3 - t0
    batch = {
        "questions": len(examples),
        "windows": len(features),
        "batch_size": predictor.batch_size,
        "seconds": round(total, 3),
        "questions_per_s": round(len(examples) / total, 1),
        "ms_per_question": round(1000 * total / len(examples), 2),
        "windows_per_s_model": round(len(features) / (t2 - t1), 1),
        "share_features": round((t1 - t0) / total, 3),
        "share_model": round((t2 - t1) / total, 3),
        "share_extraction": round((t3 - t2) / total, 3),
    }

    latencies = []
    for example in examples[:single]:
        t = time.perf_counter()
        predictor.answer([example])
        sync(predictor.device)
        latencies.append(1000 * (time.perf_counter() - t))
    latencies.sort()
    one = {
        "questions": len(latencies),
        "ms_median": round(statistics.median(latencies), 1),
        "ms_p90": round(latencies[int(0.9 * (len(latencies) - 1))], 1),
        "questions_per_s": round(1000 * len(latencies) / sum(latencies), 1),
    }
    return {"batch": batch, "single": one}


def forward_rate(
    model: torch.nn.Module, batch: int, length: int, dtype: str, device: torch.device, min_seconds: float
) -> float:
    """Sequences/s of the forward pass alone, full-length windows, under inference_mode."""
    ids = torch.randint(1000, 30000, (batch, length), device=device)
    inputs = {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "token_type_ids": torch.zeros_like(ids),
    }
    with torch.inference_mode(), mixed_precision.autocast(device.type, dtype):
        for _ in range(2):
            model(**inputs)
        sync(device)
        runs, t0 = 0, time.perf_counter()
        while True:
            model(**inputs)
            runs += 1
            sync(device)
            elapsed = time.perf_counter() - t0
            if elapsed >= min_seconds and runs >= 3:
                return runs * batch / elapsed


def shapes(models: dict[str, torch.nn.Module], args: argparse.Namespace, device: torch.device) -> list[dict]:
    # On a CPU, bf16 beside fp32 where the CPU has bf16 matrix units (what `precision: auto` picks).
    cpu = ["fp32", "bf16"] if mixed_precision.cpu_bf16_units() else ["fp32"]
    precisions = args.precisions or (["fp32", "fp16", "bf16"] if device.type == "cuda" else cpu)
    batches = args.shape_batches or ([1, 8, 32, 128] if device.type == "cuda" else [1, 8])
    rows = []
    for name, model in models.items():
        model.to(device).eval()
        for dtype in precisions:
            for batch in batches:
                rate = forward_rate(model, batch, args.length, dtype, device, args.min_seconds)
                row = {
                    "model": name,
                    "precision": dtype,
                    "batch": batch,
                    "length": args.length,
                    "sequences_per_s": round(rate, 1),
                    "ms_per_sequence": round(1000 / rate, 2),
                }
                if name == "bert-base":
                    row["vs_nvidia_v100"] = round(rate / NVIDIA_V100_SEQ_PER_S, 2)
                rows.append(row)
                print(
                    f"  {name:10s} {dtype:5s} batch {batch:4d} x {args.length}: {rate:9.1f} seq/s", flush=True
                )
        model.cpu()
    return rows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checkpoint", help="checkpoint dir or its hf/ (default: embedded model export)")
    parser.add_argument("--squad", default=str(ROOT / "squad_data" / "dev-v1.1-excerpt.json"))
    parser.add_argument("--questions", type=int, default=810, help="questions for batch mode")
    parser.add_argument("--single", type=int, default=60, help="questions timed one at a time")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--length", type=int, default=384, help="sequence length for the shape sweep")
    parser.add_argument("--precisions", nargs="*", choices=["fp32", "fp16", "bf16"])
    parser.add_argument("--shape-batches", nargs="*", type=int)
    parser.add_argument("--min-seconds", type=float, default=3.0, help="per shape measurement")
    parser.add_argument("--shapes-only", action="store_true")
    parser.add_argument("--no-shapes", action="store_true")
    parser.add_argument("--json", type=Path, help="write the numbers here")
    parser.add_argument("--runtimes", action="store_true", help="compare the CPU serving runtimes instead")
    parser.add_argument(
        "--call-questions", type=int, default=32, help="--runtimes: questions per batched call"
    )
    parser.add_argument(
        "--bert-base-questions", type=int, default=100, help="--runtimes: BERT-base's questions"
    )
    args = parser.parse_args(argv)
    if args.questions < 1 or args.single < 0 or args.length < 8:
        parser.error("--questions >= 1, --single >= 0, --length >= 8")
    if args.call_questions < 1 or args.bert_base_questions < 0:
        parser.error("--call-questions >= 1, --bert-base-questions >= 0")
    args.device = torch.device(args.device)
    if args.runtimes and args.device.type != "cpu":
        parser.error("--runtimes compares the CPU runtimes: use --device cpu")
    if args.device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    if "fp16" in (args.precisions or []) and args.device.type != "cuda":
        parser.error("--precisions fp16 needs --device cuda")
    return args


def print_end_to_end(name: str, squad: str, report: dict[str, Any]) -> None:
    b, one = report["batch"], report["single"]
    print(f"end to end, {name}, {Path(squad).name}:")
    print(
        f"  batch  ({b['questions']} questions, {b['windows']} windows, batch {b['batch_size']}): "
        f"{b['questions_per_s']} questions/s, {b['ms_per_question']} ms/question "
        f"(features {b['share_features']:.0%}, model {b['share_model']:.0%}, "
        f"extraction {b['share_extraction']:.0%})"
    )
    print(
        f"  single ({one['questions']} calls): median {one['ms_median']} ms, p90 {one['ms_p90']} ms, "
        f"{one['questions_per_s']} questions/s"
    )


def shape_models(predictor: Predictor) -> dict[str, torch.nn.Module]:
    """The checkpoint's model and a random-init BERT-base (NVIDIA's reference shape)."""
    from transformers import BertConfig, BertForQuestionAnswering

    torch.manual_seed(0)
    bert_base = BertForQuestionAnswering(BertConfig(**BERT_BASE, attn_implementation="sdpa"))
    return {predictor.settings.pretrained_model: predictor.model, "bert-base": bert_base}


def compare_runtimes(
    args: argparse.Namespace, checkpoint: str, squad: Any, tmp: Path
) -> list[dict[str, Any]]:
    from bench import runtimes

    available = runtimes.runtimes_here()
    real = args.checkpoint is not None  # the embedded export's QA head is untrained: speed only
    print(f"serving runtimes on the CPU ({', '.join(available)}), {Path(args.squad).name}:")
    examples = squad.examples[: args.questions]
    rows = runtimes.compare(
        "checkpoint" if real else "embedded (untrained head)", checkpoint, real, examples, squad.version,
        available, args.single, args.call_questions, tmp,
    )  # fmt: skip
    if args.bert_base_questions:
        bert = str(runtimes.random_bert_base(tmp / "bert-base", ROOT / "const.yaml"))
        rows += runtimes.compare(
            "bert-base (random)", bert, False, squad.examples[: args.bert_base_questions], squad.version,
            available, min(args.single, args.bert_base_questions), args.call_questions, tmp,
        )  # fmt: skip
    return rows


@cli.boundary
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    machine = machine_text(args.device)
    result: dict[str, Any] = {
        **provenance("bench.inference", sys.argv[1:] if argv is None else argv, args.device),
        "device": machine,
        "torch": torch.__version__,
    }
    print(f"device: {machine}")
    with tempfile.TemporaryDirectory() as tmp:
        try:
            checkpoint = args.checkpoint or str(export_embedded(Path(tmp), ROOT / "local.yaml"))
            predictor = Predictor(checkpoint, str(args.device))
            squad = squad_files.load_squad(args.squad, training=False)
        except (DataError, ConfigError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        result["model"] = predictor.settings.pretrained_model
        if args.runtimes:
            result["runtimes"] = compare_runtimes(args, checkpoint, squad, Path(tmp))
        elif not args.shapes_only:
            result["end_to_end"] = end_to_end(predictor, squad.examples[: args.questions], args.single)
            print_end_to_end(result["model"], args.squad, result["end_to_end"])
        if not args.no_shapes and not args.runtimes:
            print(
                f"forward only, {args.length} tokens "
                f"(NVIDIA, BERT-base on one V100: {NVIDIA_V100_SEQ_PER_S} seq/s):"
            )
            result["shapes"] = shapes(shape_models(predictor), args, args.device)
    if args.json:
        write_text_atomic(args.json, json.dumps(result))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
