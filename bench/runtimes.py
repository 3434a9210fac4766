"""Serving on the CPU, side by side in one run: PyTorch fp32, PyTorch bf16 (where the CPU has bf16
matrix units), ONNX Runtime fp32 and ONNX Runtime with int8 weights -- each through predict.py's
own path (windowing, batched forward, extraction), for a trained checkpoint (EM/F1 per row) and a
random-init BERT-base-shaped model (speed only). Run by `python3 -m bench.inference --runtimes`.

Per row: questions/s and the p50 / p90 / p99 latency of one question per call and of calls of
--call-questions questions.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import BERT_BASE
from extractive_qa.config import experiment, run_plan
from extractive_qa.config.model_family import EMBEDDED_MODEL
from extractive_qa.data.features import load_tokenizer
from extractive_qa.qa import mixed_precision, qa_settings, squad_metric
from extractive_qa.serve import export_dir
from extractive_qa.serve.predictor import Predictor


def runtimes_here() -> list[str]:
    """torch fp32 always; torch bf16 where `precision: auto` would pick it; both ONNX models."""
    return ["torch-fp32", *(["torch-bf16"] if mixed_precision.cpu_bf16_units() else []), "onnx", "onnx-int8"]


def random_bert_base(target: Path, conf_path: Path) -> Path:
    """An hf/-like directory holding a random-init BERT-base QA model with the uncased WordPiece
    tokenizer and `conf_path`'s windowing (const.yaml: 384 tokens, the BERT-base recipe)."""
    import torch
    from transformers import BertConfig, BertForQuestionAnswering

    conf = experiment.load_yaml(conf_path)
    plan = run_plan.run_plan(conf, experiment.local_hparams(conf), 1)
    torch.manual_seed(0)
    BertForQuestionAnswering(BertConfig(**BERT_BASE)).save_pretrained(target, safe_serialization=True)
    load_tokenizer(EMBEDDED_MODEL).save_pretrained(target)  # bert-base-uncased's vocabulary
    per_slot = plan.hparams.global_batch_size // max(
        1, int(conf.get("resources", {}).get("slots_per_trial", 1))
    )
    qa_settings.QASettings.from_run(
        plan.data, plan.hparams, plan.data.eval_batch_size_per_slot(per_slot)
    ).save(target)
    return target


def percentiles(ms: list[float]) -> dict[str, float]:
    p50, p90, p99 = np.percentile(np.asarray(ms), [50, 90, 99])
    return {"ms_p50": round(float(p50), 2), "ms_p90": round(float(p90), 2), "ms_p99": round(float(p99), 2)}


def measure(predictor: Predictor, examples: list, single: int, call_questions: int) -> dict[str, Any]:
    """Calls of `call_questions` questions over all of `examples` (their answers kept for EM/F1),
    then `single` calls of one question each."""
    predictor.answer(examples[:4])  # warm-up: first-call allocations, thread pools, ORT's arenas
    answers: dict[str, str] = {}
    calls = []
    for i in range(0, len(examples), call_questions):
        started = time.perf_counter()
        answers |= predictor.answer(examples[i : i + call_questions]).text
        calls.append(1000 * (time.perf_counter() - started))
    ones = []
    for example in examples[:single]:
        started = time.perf_counter()
        predictor.answer([example])
        ones.append(1000 * (time.perf_counter() - started))
    return {
        "batched": {"questions_per_call": call_questions, "calls": len(calls),
                    "questions_per_s": round(1000 * len(examples) / sum(calls), 1), **percentiles(calls)},
        "single": {"calls": len(ones), "questions_per_s": round(1000 * len(ones) / sum(ones), 1),
                   "ms_mean": round(statistics.mean(ones), 2), **percentiles(ones)},
        "answers": answers,
    }  # fmt: skip


def compare(
    name: str, checkpoint: str, real: bool, examples: list, version: str, runtimes: list[str], single: int,
    call_questions: int, tmp: Path,
) -> list[dict[str, Any]]:  # fmt: skip
    """One row per runtime for one model (`real`: trained weights, so EM/F1 mean something)."""
    exported = tmp / f"export-{name.replace('/', '-')}"
    record = export_dir.export(checkpoint, exported, None, 32, int8=True)
    files = {"onnx": "model.onnx", "onnx-int8": "model-int8.onnx"}
    differences = {"onnx": "onnx_max_abs_logit_difference", "onnx-int8": "int8_max_abs_logit_difference"}
    rows = []
    for runtime in runtimes:
        if runtime.startswith("torch"):
            predictor = Predictor(checkpoint, "cpu", precision=runtime.split("-")[1])
        else:
            predictor = Predictor(str(exported), runtime=runtime)
        measured = measure(predictor, examples, single, call_questions)
        answers = measured.pop("answers")
        row = {"model": name, "runtime": runtime, "questions": len(examples),
               "max_seq_length": predictor.settings.max_seq_length, **measured}  # fmt: skip
        if real:
            scores = squad_metric.score(examples, answers, version)
            row["exact_match"] = scores.get("exact_match", scores.get("exact"))
            row["f1"] = scores["f1"]
        if runtime in files:
            row["file_mb"] = round((exported / files[runtime]).stat().st_size / 1e6, 1)
            row["max_abs_logit_difference_vs_torch"] = record[differences[runtime]]
        rows.append(row)
        print_row(row)
    return rows


def print_row(row: dict[str, Any]) -> None:
    b, s = row["batched"], row["single"]
    scores = f"  EM {row['exact_match']:.2f} F1 {row['f1']:.2f}" if "f1" in row else ""
    print(
        f"  {row['model']:22s} {row['runtime']:10s} batched {b['questions_per_s']:7.1f} q/s "
        f"(p50/p90/p99 {b['ms_p50']}/{b['ms_p90']}/{b['ms_p99']} ms per {b['questions_per_call']})  "
        f"single {s['questions_per_s']:6.1f} q/s (p50/p90/p99 {s['ms_p50']}/{s['ms_p90']}/{s['ms_p99']} ms)"
        f"{scores}",
        flush=True,
    )
