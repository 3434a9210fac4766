"""SQuAD 2.0 with the embedded default: what training on unanswerable questions buys, and what the
no-answer threshold is worth, on paired seeds.

    python3 -m bench.squad2 run [--seeds 42,43,44,45,46] [--jobs 2]   # resumable, a row per run
    python3 -m bench.squad2 report                                    # the table
    python3 -m bench.squad2 overhead [--repeats 5]                    # cost of best_* and outputs

Two models per seed, both `train.py --config local_v2.yaml` as a user runs it: "v2" trains on
local-train-v2.0.json (with its unanswerable questions); "v1.1-style" on the same articles without
them (local-train-v2.0-answerable.json). Each is then answered by predict.py (its windowing,
batching and extraction are evaluation's) on two articles no training question comes from:
Sky_(United_Kingdom) (local-tune-v2.0.json), on which the no-answer threshold is tuned, and
Victoria_(Australia) (local-dev-v2.0.json), on which it is scored. Per run: EM/F1/HasAns/NoAns
on Victoria at threshold 0 (the default), at the threshold tuned on Sky (honest), and best_f1 on
Victoria at its own best threshold (optimistic: tuned on the set it scores).

Precision: "v2" and "v1.1-style" run in fp32; "v2-bf16" is "v2" in bf16 autocast, paired with
"v2" seed by seed, and its checkpoints are also answered with an fp32 forward pass (the same
weights in both arithmetics). `--models v2-bf16` runs only those.

Recipes for local_v2.yaml (RECIPES: v2-3ep, v2-6ep, ...) are arms of the same runs, reported
against answering nothing and against the shipped 3-epoch recipe:
    python3 -m bench.squad2 run --models v2-3ep,v2-6ep --json bench/results/squad2-recipes-amx.json

One idea: the SQuAD 2.0 study of the embedded default -- every arm is trained, answered on the
two held-out articles and scored by the same functions here, so its tables stay comparable.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench import study
from bench.common import machine_text, provenance
from bench.results_files import num, table
from extractive_qa import cli
from extractive_qa.data.squad_files import load_squad
from extractive_qa.io.files import ROOT
from extractive_qa.qa import squad_metric
from tests.support.cli_result import last_json

DATA = ROOT / "squad_data"
CONFIG = "local_v2.yaml"
TUNE = DATA / "local-tune-v2.0.json"
EVALUATE = DATA / "local-dev-v2.0.json"
FP32, BF16 = study.FP32, "hyperparameters.precision=bf16"
# Every run draws torch's dropout masks: the study's rows were measured with them, and a seed
# pairs only with a run of the same masks (the fast masks are another random stream).
MASKS = study.TORCH_MASKS
MODELS = {
    "v2": (FP32, MASKS),
    "v1.1-style": ("data.train_file=squad_data/local-train-v2.0-answerable.json", FP32, MASKS),
    # The v2 model in bf16 autocast (what `precision: auto` picks on a CPU with bf16 units),
    # paired with "v2" in fp32; its checkpoint is also answered with an fp32 forward pass.
    "v2-bf16": (BF16, MASKS),
}
# Recipes for local_v2.yaml, each lever set explicitly (so an arm means the same runs whatever the
# YAML ships), in fp32 with the fast dropout masks local_v2.yaml trains with. v2-3ep is the recipe
# the file shipped before the study; the others change one or two levers of it.
RECIPES = {
    "v2-3ep": (FP32, "hyperparameters.train_length.val.epochs=3"),
    "v2-6ep": (FP32, "hyperparameters.train_length.val.epochs=6"),
    # Half of the steps on the answer-bearing windows first, then all windows at weight 1.
    "v2-6ep-answerable-first": (
        FP32,
        "hyperparameters.train_length.val.epochs=6",
        "hyperparameters.answerable_first=0.5",
    ),
    # 810 more answerable questions (Super_Bowl_50 from the v1.1 dev excerpt), 3 epochs.
    "v2-more-3ep": (
        FP32,
        "hyperparameters.train_length.val.epochs=3",
        "data.train_file=squad_data/local-train-v2.0-more.json",
    ),
    # No-answer windows at half the weight throughout.
    "v2-6ep-null-half": (
        FP32,
        "hyperparameters.train_length.val.epochs=6",
        "hyperparameters.no_answer_loss_weight=0.5",
    ),
    # 384-token windows (stride 128): most contexts fit one window, so fewer windows of an
    # answerable question are trained as "no answer" only because the answer lies in another.
    "v2-3ep-384": (
        FP32,
        "hyperparameters.train_length.val.epochs=3",
        "data.max_seq_length=384",
    ),
    # The learning rate 1.5x the shipped 2e-4, in the shipped 3 epochs (the same time).
    "v2-3ep-lr3e-4": (
        FP32,
        "hyperparameters.train_length.val.epochs=3",
        "hyperparameters.learning_rate=3e-4",
    ),
}
MODELS.update(RECIPES)
NEVER_NULL = "1e30"  # predict.py --null-threshold: every question gets its best span
SEEDS = "42,43,44,45,46"
# The measures bf16 must pass the F1 rule on before local_v2.yaml may train in it by default.
RULED = (("best_f1",), ("at_tuned", "f1"))


def scores_at(examples: list, spans: dict[str, str], odds: dict[str, float], threshold: float) -> dict:
    """EM/F1/HasAns/NoAns of the best spans blanked where the odds exceed `threshold`."""
    answers = {qid: "" if odds[qid] > threshold else text for qid, text in spans.items()}
    full = squad_metric.score(examples, answers, "2.0")
    keys = ("exact", "f1", "HasAns_exact", "HasAns_f1", "NoAns_exact", "NoAns_f1")
    return {k: full[k] for k in keys if k in full}


def answer(
    checkpoint: str, squad: Path, out_dir: Path, env: dict[str, str], precision: str | None = None
) -> tuple[dict, dict]:
    """predict.py's best span and null odds for every question of `squad` (at the checkpoint's
    precision, or `precision`)."""
    command = [sys.executable, "predict.py", "--checkpoint", checkpoint, "--squad", str(squad)]
    command += ["--out-dir", str(out_dir), "--null-threshold", NEVER_NULL]
    command += ["--precision", precision] if precision else []
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"predict.py on {squad.name} failed:\n{done.stderr[-3000:]}")
    spans = json.loads((out_dir / "predictions.json").read_text())
    odds = json.loads((out_dir / "null_odds.json").read_text())
    return spans, odds


def one_run(model: str, seed: int, workdir: Path, threads: int | None) -> dict[str, Any]:
    env = dict(os.environ)
    if threads:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    out = workdir / f"{model}-{seed}"
    command = [sys.executable, "train.py", "--config", CONFIG, "--checkpoint-dir", str(out / "ckpt")]
    for value in (*MODELS[model], f"reproducibility.experiment_seed={seed}"):
        command += ["--set", value]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{model} seed {seed}: train.py exited {done.returncode}:\n{done.stderr[-3000:]}")
    trained = last_json(done.stdout)
    tune_examples = load_squad(TUNE, training=False).examples
    eval_examples = load_squad(EVALUATE, training=False).examples
    tune_spans, tune_odds = answer(trained["checkpoint"], TUNE, out / "tune", env)
    spans, odds = answer(trained["checkpoint"], EVALUATE, out / "evaluate", env)
    tuned = squad_metric.tuned_null_threshold(tune_examples, tune_spans, tune_odds)
    best = squad_metric.best_thresholds(eval_examples, spans, odds)
    extra = {}
    if BF16 in MODELS[model]:  # the same weights through an fp32 forward pass
        spans32, odds32 = answer(trained["checkpoint"], EVALUATE, out / "evaluate-fp32", env, "fp32")
        extra["fp32_forward"] = {
            "at_zero": scores_at(eval_examples, spans32, odds32, 0.0),
            "at_tuned": scores_at(eval_examples, spans32, odds32, tuned),
            "best_f1": squad_metric.best_thresholds(eval_examples, spans32, odds32)["best_f1"],
        }
    return {
        "model": model,
        "seed": seed,
        "validation": {k: trained[k] for k in ("exact", "f1", "best_f1", "best_f1_thresh")},
        "at_zero": scores_at(eval_examples, spans, odds, 0.0),
        "tuned_threshold": tuned,
        "at_tuned": scores_at(eval_examples, spans, odds, tuned),
        "best_f1": best["best_f1"],
        "best_f1_thresh": best["best_f1_thresh"],
        "train_seconds": trained.get("train_seconds"),
        "wall_seconds": round(time.perf_counter() - started, 1),
        "machine": machine_text(torch.device("cuda" if torch.cuda.is_available() else "cpu")),
        **extra,
    }


def run(args: argparse.Namespace, result: dict[str, Any]) -> None:
    done = {(r["model"], r["seed"]) for r in result["rows"]}
    todo = [(m, s) for s in args.seeds for m in args.models if (m, s) not in done]
    print(f"{len(done)} runs in {args.json}; {len(todo)} to go", flush=True)
    study.run_parallel(
        todo, lambda item, workdir, threads: one_run(*item, workdir, threads), args.json, result, args.jobs
    )


def column(
    rows: list[dict], model: str, path: tuple[str, ...], seeds: set[int] | None = None
) -> dict[int, float]:
    """{seed: the value at `path`} of `model`'s rows (of `seeds` only, when given)."""
    out = {}
    for row in rows:
        if row["model"] == model and (seeds is None or row["seed"] in seeds):
            value: Any = row
            for key in path:
                value = value[key]
            out[row["seed"]] = float(value)
    return out


def shared_seeds(rows: list[dict], *models: str) -> set[int]:
    """The seeds every one of `models` ran: the pairs each table's columns and differences use."""
    return set.intersection(*({r["seed"] for r in rows if r["model"] == m} for m in models))


def abstain_f1() -> float:
    """F1 on Victoria_(Australia) of answering "" to every question: its share of unanswerable ones."""
    examples = load_squad(EVALUATE, training=False).examples
    return 100.0 * sum(not ex.answers for ex in examples) / len(examples)


def recipes_report(rows: list[dict]) -> str:
    """Each recipe arm at the threshold tuned on Sky: against answering nothing (the goal: mean F1
    5 above it, the paired interval above 0, HasAns F1 >= 20) and against local_v2.yaml's
    3-epoch recipe, paired seed by seed; training time as a ratio to that recipe's."""
    arms = [m for m in RECIPES if column(rows, m, ("best_f1",))]
    abstain = abstain_f1()
    baseline = column(rows, "v2-3ep", ("train_seconds",))
    lines = [
        f"answering nothing scores F1 {abstain:.2f} on Victoria_(Australia); the goal: {abstain + 5:.2f}",
        "",
        "| arm | n | F1 at Sky-tuned threshold | - abstaining, paired [95 % CI] | HasAns F1 | NoAns F1 "
        "| F1 at 0 | best_f1 (optimistic) | - v2-3ep, paired | train s | / v2-3ep's |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm in arms:
        f1 = column(rows, arm, ("at_tuned", "f1"))
        cells = []
        for path in (
            ("at_tuned", "f1"),
            ("at_tuned", "HasAns_f1"),
            ("at_tuned", "NoAns_f1"),
            ("at_zero", "f1"),
            ("best_f1",),
        ):
            mean, std = study.mean_std(list(column(rows, arm, path).values()))
            cells.append(f"{mean:.2f} ± {std:.2f}")
        versus_abstain = study.paired(f1, dict.fromkeys(f1, abstain))
        versus_today = study.paired(f1, column(rows, "v2-3ep", ("at_tuned", "f1")))
        seconds = column(rows, arm, ("train_seconds",))
        ratios = [seconds[s] / baseline[s] for s in seconds if s in baseline]
        ratio = f"{sum(ratios) / len(ratios):.2f}" if ratios else "-"
        mean_s = sum(seconds.values()) / len(seconds)
        lines.append(
            f"| {arm} | {len(f1)} | {cells[0]} | {study.fmt_diff(versus_abstain)} | {cells[1]} | {cells[2]} "
            f"| {cells[3]} | {cells[4]} | {study.fmt_diff(versus_today) if arm != 'v2-3ep' else '-'} "
            f"| {mean_s:.0f} | {ratio} |"
        )
    return "\n".join(lines)


def report(result: dict[str, Any]) -> str:
    rows = result["rows"]
    if any(r["model"] in RECIPES for r in rows):
        return recipes_report(rows)
    seeds = shared_seeds(rows, "v2", "v1.1-style")
    measures = [
        ("F1 at threshold 0", ("at_zero", "f1")),
        ("EM at threshold 0", ("at_zero", "exact")),
        ("HasAns F1 at 0", ("at_zero", "HasAns_f1")),
        ("NoAns F1 at 0", ("at_zero", "NoAns_f1")),
        ("F1 at the threshold tuned on Sky", ("at_tuned", "f1")),
        ("EM at the tuned threshold", ("at_tuned", "exact")),
        ("HasAns F1 at tuned", ("at_tuned", "HasAns_f1")),
        ("NoAns F1 at tuned", ("at_tuned", "NoAns_f1")),
        ("best_f1 on Victoria (optimistic)", ("best_f1",)),
        ("the tuned threshold", ("tuned_threshold",)),
    ]
    lines = [
        f"seeds both models ran: {', '.join(map(str, sorted(seeds)))}",
        "",
        "| measure (Victoria_(Australia), 247 questions) | v2 | v1.1-style "
        "| v2 - v1.1-style, paired [95 % CI] |",
        "|---|---|---|---|",
    ]
    for label, path in measures:
        cells = []
        for model in ("v2", "v1.1-style"):
            values = column(rows, model, path, seeds)
            if values:
                mean, std = study.mean_std(list(values.values()))
                cells.append(f"{mean:.2f} ± {std:.2f} (n={len(values)})")
            else:
                cells.append("-")
        diff = study.paired(column(rows, "v2", path, seeds), column(rows, "v1.1-style", path, seeds))
        lines.append(f"| {label} | {cells[0]} | {cells[1]} | {study.fmt_diff(diff)} |")
    tuned_gain = study.paired(
        column(rows, "v2", ("at_tuned", "f1"), seeds), column(rows, "v2", ("at_zero", "f1"), seeds)
    )
    lines.append("")
    lines.append(f"v2: F1 at the tuned threshold - F1 at 0, paired: {study.fmt_diff(tuned_gain)}")
    lines.append(f"answering nothing scores F1 {abstain_f1():.2f} on Victoria_(Australia)")
    if column(rows, "v2-bf16", ("best_f1",)):
        lines += ["", *precision_report(rows)]
    return "\n".join(lines)


def precision_report(rows: list[dict]) -> list[str]:
    """v2 trained in bf16 autocast against v2 in fp32 (paired seeds), and the bf16 checkpoints'
    answers through an fp32 forward pass against their own bf16 answers."""
    measures = [
        ("best_f1 on Victoria (the run's own validation set)", ("best_f1",)),
        ("F1 at threshold 0", ("at_zero", "f1")),
        ("F1 at the threshold tuned on Sky", ("at_tuned", "f1")),
    ]
    seeds = shared_seeds(rows, "v2", "v2-bf16")
    verdicts: list[str] = []
    lines = [
        f"seeds both precisions ran: {', '.join(map(str, sorted(seeds)))}",
        "",
        "| measure | v2 fp32 | v2 bf16 | bf16 - fp32, paired [95 % CI] | per seed bf16 - fp32 |",
        "|---|---|---|---|---|",
    ]
    for label, path in measures:
        cells = []
        for model in ("v2", "v2-bf16"):
            mean, std = study.mean_std(list(column(rows, model, path, seeds).values()))
            cells.append(f"{mean:.2f} ± {std:.2f}")
        bf16, fp32 = column(rows, "v2-bf16", path, seeds), column(rows, "v2", path, seeds)
        per_seed = ", ".join(f"{bf16[s] - fp32[s]:+.2f}" for s in sorted(seeds))
        diff = study.paired(bf16, fp32)
        lines.append(f"| {label} | {cells[0]} | {cells[1]} | {study.fmt_diff(diff)} | {per_seed} |")
        if path in RULED and diff is not None:
            verdicts.append(f"{label}: {'PASS' if study.passes_rule(diff) else 'FAIL'}")
    if verdicts:
        everywhere = all(v.endswith("PASS") for v in verdicts)
        default = "precision: auto may pick bf16" if everywhere else "keep fp32 as its default"
        lines += ["", f"{CONFIG}, rule ({study.RULE}): {'; '.join(verdicts)} -> {default}"]
    lines += ["", "the bf16 checkpoints answered with an fp32 forward pass (fp32 - bf16 forward, paired):"]
    for label, path in measures:
        diff = study.paired(column(rows, "v2-bf16", ("fp32_forward", *path)), column(rows, "v2-bf16", path))
        lines.append(f"- {label}: {study.fmt_diff(diff)}")
    return lines


def overhead(args: argparse.Namespace) -> dict[str, Any]:
    """The v2 validation before (extraction + EM/F1) and after (+ best_* and the tuned threshold;
    + the three output files when data.save_predictions is on), side by side on one checkpoint's
    logits, against the whole validation (forward passes included)."""
    from extractive_qa.qa import outputs
    from extractive_qa.serve.predictor import Predictor

    with tempfile.TemporaryDirectory(prefix="squad2-overhead-") as tmp:
        command = [sys.executable, "train.py", "--config", CONFIG, "--batches", "4"]
        command += ["--checkpoint-dir", str(Path(tmp) / "ckpt")]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(done.stderr[-3000:])
        predictor = Predictor(last_json(done.stdout)["checkpoint"])
        examples = load_squad(EVALUATE, training=False).examples
        features = predictor.features(examples)
        started = time.perf_counter()
        start, end = predictor.logits(features)
        forward = time.perf_counter() - started
        settings = predictor.settings

        def before() -> None:
            answers = settings.extract_answers(examples, features, start, end)
            squad_metric.score(examples, answers.text, "2.0")

        def after(files: bool) -> None:
            answers = settings.extract_answers(examples, features, start, end)
            squad_metric.score(examples, answers.text, "2.0")
            odds = outputs.null_odds(examples, answers)
            squad_metric.best_thresholds(examples, answers.span_text, odds)
            squad_metric.tuned_null_threshold(examples, answers.span_text, odds)
            if files:
                nbest = settings.nbest(examples, features, start, end)
                outputs.write_outputs(Path(tmp) / "out", examples, answers, nbest)

        arms = {"before": before, "after": lambda: after(False), "after + files": lambda: after(True)}
        best = {name: float("inf") for name in arms}
        for _ in range(args.repeats):  # interleaved: drift hits every arm alike; best of the repeats
            for name, fn in arms.items():
                t0 = time.perf_counter()
                fn()
                best[name] = min(best[name], time.perf_counter() - t0)
    validation = {name: forward + seconds for name, seconds in best.items()}
    return {
        "repeats": args.repeats,
        "questions": len(examples),
        "windows": len(features),
        "forward_s": round(forward, 3),
        "postprocess_s": {name: round(s, 4) for name, s in best.items()},
        "validation_after_vs_before": round(validation["after"] / validation["before"], 4),
        "validation_with_files_vs_before": round(validation["after + files"] / validation["before"], 4),
    }


def overhead_report(section: dict[str, Any]) -> str:
    """What the extra validation work costs, in seconds and as a share of the forward passes."""
    post, forward = section["postprocess_s"], section["forward_s"]
    rows = [["forward passes", num(forward), "", ""]]
    for name, label in (
        ("before", "extraction + EM/F1"),
        ("after", "+ best_* and the tuned threshold"),
        ("after + files", "+ the three output files"),
    ):
        extra = post[name] - post["before"]
        shown = ["", ""] if name == "before" else [num(extra, 3), f"{num(100 * extra / forward, 1)} %"]
        rows.append([label, num(post[name], 3), *shown])
    head = ["validation step", "seconds", "extra over extraction + EM/F1", "extra / forward passes"]
    return (
        f"{section['questions']} questions, {section['windows']} windows; post-processing best of "
        f"{section['repeats']} interleaved repeats.\n\n{table(head, rows)}\n\nThe whole validation "
        f"takes {num(section['validation_after_vs_before'], 3)}x its time before with best_* and the "
        f"threshold, {num(section['validation_with_files_vs_before'], 3)}x with the output files too."
    )


@cli.boundary
def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("what", choices=["run", "report", "overhead"])
    parser.add_argument("--seeds", default=SEEDS, help="comma-separated experiment seeds (paired)")
    parser.add_argument("--jobs", type=int, default=1, help="run: runs side by side")
    parser.add_argument(
        "--models", default=",".join(MODELS), help=f"run: comma-separated, of {', '.join(MODELS)}"
    )
    parser.add_argument("--repeats", type=int, default=5, help="overhead: interleaved repeats (best of)")
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "squad2-cpu.json")
    args = parser.parse_args()
    try:
        args.seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        parser.error(f"--seeds: expected comma-separated integers, got {args.seeds!r}")
    args.models = args.models.split(",")
    if not set(args.models) <= set(MODELS):
        parser.error(f"--models: choose from {', '.join(MODELS)}")
    if args.jobs < 1 or args.repeats < 1:
        parser.error("--jobs and --repeats must be >= 1")
    result = study.load(args.json, {"config": CONFIG})
    if args.what == "report":  # reads the study; writes nothing
        if not result["rows"]:
            raise SystemExit(f"{args.json}: no runs recorded yet; `python3 -m bench.squad2 run` runs them")
        print(report(result))
        return 0
    prov = provenance("bench.squad2", sys.argv[1:])
    if args.what == "run":  # the file's provenance is its rows'
        result["train_device"] = study.device_name()
        result.update(prov)
        run(args, result)
    else:  # a section with its own: the file's still names the run that trained the rows
        named = {key: prov[key] for key in ("command", "commit", "date", "machine")}
        result["overhead"] = {**named, **overhead(args)}
        if "command" not in result:  # a file of this run alone: its provenance is the file's
            result.update(prov)
    study.save(args.json, result)
    print(report(result) if args.what == "run" else overhead_report(result["overhead"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
