"""The generated blocks of README.md and docs/*.md: each renders figures from results files.

A block is called by name from a page (`<!-- generated: NAME ARGS -->`); `python3 -m bench.docs`
writes and checks them. Every table row names the machine and date of the file its figures come
from (`results_files.measured_on`), and verdict words ("no difference shown", "within the ±1.5
rule") are computed here from the same numbers. The study modules' own reports render the
studies, so a page shows what `python3 -m bench.NAME report` prints.

One idea: a results file rendered as a page shows it. Every renderer is a few lines on the same
helpers (`Results`, `caption`, `measured_on`, `num`, `table`, `verdict`); the sections follow the
pages that call them -- the embedded default, the studies, speed, the README's table, the scaling
model, one GPU -- so a page's blocks are read in one place.
"""

from __future__ import annotations

import functools
import re
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import batching, cpu_precision, flops, gpu_step, lr_scaling, squad2, study
from bench.results_files import Results, measured_on, num, table
from extractive_qa import dry_run, scaling_report
from extractive_qa.config import experiment, run_plan
from extractive_qa.config.settings import Hyperparameters
from extractive_qa.io import reading
from extractive_qa.io.files import ROOT, drawn_from

BLOCKS: dict[str, Callable[..., str]] = {}


def block(name: str) -> Callable[[Callable[..., str]], Callable[..., str]]:
    def register(render: Callable[..., str]) -> Callable[..., str]:
        BLOCKS[name] = render
        return render

    return register


def caption(results: Results, section: dict[str, Any] | None = None) -> str:
    """Where a block's figures come from: the file's provenance, or a section's that names its own."""
    prov = results.provenance(section)
    shown = results.name if "/" in results.name else f"bench/results/{results.name}"
    return f"Measured on {prov.label}, {prov.date}: `{prov.command}` (`{shown}`)."


def verdict(diff: dict[str, Any] | None) -> str:
    """What a paired interval says, in the project's words, with bench.study's rule: a setting
    may change when the interval does not reach below -1.5."""
    if diff is None:
        return "-"
    if diff["lo"] > 0:
        said = "above zero"
    elif diff["hi"] < 0:
        said = "below zero"
    else:
        said = "no difference shown"
    rule = "passes" if study.passes_rule(diff) else "fails"
    return f"{said}; {rule} the ±{study.BOUND:g} rule"


# --- the embedded default -----------------------------------------------------------------


def first_command_rows(name: str) -> list[tuple[Results, dict[str, Any]]]:
    results = Results(name)
    return [(results, row) for row in results["rows"]]


@block("first-command")
def first_command(name: str) -> str:
    """One line: what the README's first command printed, where, and how long it took."""
    results, row = first_command_rows(name)[0]
    return (
        f"EM {num(row['exact_match'])} / F1 {num(row['f1'])} in {picked(row)} after "
        f"{num(row['train_s'], 0)} s of training, "
        f"{num(row['total_s'] / 60, 1)} min in all from a fresh clone ({measured_on(results, row)})"
    )


def picked(row: dict[str, Any]) -> str:
    """The precision a run trained in: what `auto` picked, or what `--set` fixed; and kernels
    limited to a narrower instruction set (ATEN_CPU_CAPABILITY: what an older CPU runs)."""
    how = f"{row['precision']}" + (" (set)" if row.get("set") else "")
    limit = (row.get("kernels") or {}).get("ATEN_CPU_CAPABILITY")
    return how + (f", {limit.upper()} kernels only" if limit else "")


@block("first-command-table")
def first_command_table(*names: str) -> str:
    rows = []
    for name in names:
        for results, row in first_command_rows(name):
            rows.append(
                [
                    measured_on(results, row),
                    picked(row),
                    f"EM {num(row['exact_match'])} / F1 {num(row['f1'])}",
                    f"{num(row['train_s'], 0)} s",
                    f"{num(row['run_s'], 0)} s",
                    f"{num(row['install_s'], 0)} s ({row['pip_cache']} pip cache)",
                    f"{num(row['total_s'] / 60, 1)} min",
                ]
            )
    head = ["machine, date", "precision", "EM / F1", "training", "the run", "install", "in all"]
    return table(head, rows)


@block("command-time")
def command_time(name: str, word: str) -> str:
    """How long a documented command (bench.first_command --command) took from a fresh clone: the
    row whose command holds `word` (`torchrun`, `scaling.py`), with its EM/F1 where it prints them."""
    results = Results(name)
    row = next((r for r in results["rows"] if word in r["run"].split()), None)
    assert row is not None, f"{name}: no row runs {word!r}"
    scores = f"EM {num(row['exact_match'])} / F1 {num(row['f1'])} in {picked(row)}, " if row.get("f1") else ""
    return (
        f"{scores}{num(row['run_s'], 0)} s for the command, {num(row['total_s'] / 60, 1)} min in all "
        f"from a fresh clone ({measured_on(results, row)})"
    )


@block("ci-time")
def ci_time(name: str) -> str:
    """How long `.ci/run` took from a fresh clone: a text file whose first lines, up to the first
    blank one, are `key: value` (command, commit, date, machine, versions, result); its log follows."""
    from bench.results_files import RESULTS, machine_label
    from extractive_qa.io import reading

    header = reading.read_text(RESULTS / name, reading.RECORD).split("\n\n", 1)[0]
    fields = dict(line.split(": ", 1) for line in header.splitlines() if ": " in line)
    result = dict(part.split("=") for part in fields["result"].split())
    failed = f", exit {result['rc']}: failed" if result["rc"] != "0" else ""
    minutes = float(result["seconds"]) / 60
    return f"{num(minutes, 1)} min ({machine_label(fields['machine'])}, {fields['date']}{failed})"


CI_BUDGET_S = 900  # a fresh clone's .ci/run on the fastest CPU class seen; the slowest gets 1,200


@block("ci-files")
def ci_files(name: str, shown: str = "12") -> str:
    """The CI run's budget line and its slowest test files, from the same file as ci-time: each
    suite's seconds per file (the `seconds per test file` lines pytest prints), the main suite's
    and the compat suite's side by side."""
    from bench.results_files import RESULTS, ci_seconds_per_file, machine_label
    from extractive_qa.io import reading

    text = reading.read_text(RESULTS / name, reading.RECORD)
    header = text.partition("\n\n")[0]
    fields = dict(line.split(": ", 1) for line in header.splitlines() if ": " in line)
    seconds = float(dict(part.split("=") for part in fields["result"].split())["seconds"])
    suites = ci_seconds_per_file(text)
    main, compat = suites[0], (suites[1] if len(suites) > 1 else {})
    slowest = sorted(main, key=lambda f: -(main[f] + compat.get(f, 0.0)))[: int(shown)]
    rows = [[f"`{f}`", num(main[f], 1), num(compat[f], 1) if f in compat else "-"] for f in slowest]
    verdict = "within" if seconds <= CI_BUDGET_S else "over"
    startup = re.search(
        r"^start-up: ([\d,]+) Python processes .*? lived ([\d,]+) s in all; [\d,]+ s of it \((\d+) %\)",
        text.partition("\n== .ci/compat")[0], re.M,
    )  # fmt: skip
    spent = (
        f"; the {startup[1]} Python processes the main suite started spent {startup[3]} % of their "
        f"{startup[2]} s starting (the interpreter, and the first import of torch, transformers and "
        "determined)"
        if startup
        else ""
    )
    line = (
        f"{num(seconds, 0)} s in all, {verdict} the {CI_BUDGET_S:,} s budget "
        f"({machine_label(fields['machine'])}, {fields['date']}){spent}; the slowest test files:"
    )
    return line + "\n\n" + table(["test file", "main suite, s", "compat suite, s"], rows)


def study_diff(name: str, factor: str, first: str, second: str) -> dict[str, Any]:
    rows = cpu_precision.normalized(Results(name)["rows"])
    diff = study.paired(study.by_seed(rows, {factor: first}), study.by_seed(rows, {factor: second}))
    assert diff is not None, f"{name}: no seeds shared by {factor} {first} and {second}"
    return diff


def ratio_text(name: str, factor: str, first: str, second: str) -> str:
    """Training time first / second over a study's shared seeds: `0.559x (0.544-0.577 over 5 seeds)`."""
    results = Results(name)
    rows = cpu_precision.normalized(results["rows"])
    a = study.by_seed(rows, {factor: first}, "train_seconds")
    b = study.by_seed(rows, {factor: second}, "train_seconds")
    ratios = [(a[s]) / b[s] for s in sorted(set(a) & set(b))]
    low, high = num(min(ratios), 3), num(max(ratios), 3)
    return f"{num(statistics.mean(ratios), 3)}x ({low}-{high} over {len(ratios)} seeds)"


@block("paired")
def paired(name: str, factor: str, first: str, second: str) -> str:
    """One paired F1 difference of a study, inline, with its verdict and machine."""
    diff = study_diff(name, factor, first, second)
    return f"{study.fmt_diff(diff)}, n = {diff['n']}, {verdict(diff)} ({measured_on(Results(name))})"


@block("time-ratio")
def time_ratio(name: str, factor: str, first: str, second: str) -> str:
    return f"{ratio_text(name, factor, first, second)} ({measured_on(Results(name))})"


# --- studies ------------------------------------------------------------------------------------


def lr_report(data: dict[str, Any]) -> str:
    return lr_scaling.report(data, None, tuple(int(seed) for seed in lr_scaling.SEEDS.split(",")))


def aggregation_report(data: dict[str, Any]) -> str:
    from bench import aggregation_accuracy

    rows = data["rows"]
    frequencies = sorted({r["aggregation_frequency"] for r in rows})
    optimizers = list(dict.fromkeys(r["optimizer"] for r in rows))
    return aggregation_accuracy.table(rows, frequencies, optimizers)


# A study's block is its module's report of the file, under the file's caption.
REPORTS: dict[str, Callable[[dict[str, Any]], str]] = {
    "cpu-study": cpu_precision.report,
    "lr-scaling": lr_report,
    "batching": batching.report,
    "squad2": squad2.report,
    "squad2-recipes": lambda data: squad2.recipes_report(data["rows"]),
    "aggregation-accuracy": aggregation_report,
    "gpu-step": lambda data: gpu_step.table(data["rows"]),
}


def reported(report: Callable[[dict[str, Any]], str]) -> Callable[[str], str]:
    def render(name: str) -> str:
        results = Results(name)
        return f"{caption(results)}\n\n{report(results.data)}"

    return render


for study_name, study_report in REPORTS.items():
    BLOCKS[study_name] = reported(study_report)


@block("squad2-overhead")
def squad2_overhead(name: str) -> str:
    results = Results(name)
    return f"{caption(results, results['overhead'])}\n\n{squad2.overhead_report(results['overhead'])}"


@block("aggregation")
def aggregation(name: str) -> str:
    results = Results(name)
    rows = [
        [
            str(r["aggregation_frequency"]),
            num(r["allreduce_calls_per_step"], 2),
            num(r["allreduce_calls_per_batch"], 2),
            num(r["allreduce_mb_per_step"], 1),
        ]
        for r in results["rows"]
    ]
    head = ["aggregation", "all-reduces per optimizer step", "per batch", "MB per step"]
    return f"{caption(results)}\n\n{table(head, rows)}"


@block("cluster-path")
def cluster_path(*names: str) -> str:
    rows = []
    for name in names:
        results = Results(name)
        arms = [k for k in results["wall_seconds"]]
        ratio_key = f"{arms[0]}_over_{arms[1]}"
        same = all(a["f1"] == b["f1"] for a, b in zip(*(results["scores"][arm] for arm in arms), strict=True))
        rows.append(
            [
                measured_on(results),
                f"`{results.provenance().command}`",
                f"{arms[0]} / {arms[1]}: {num((results[ratio_key]), 3)}",
                "identical" if same else "differ",
            ]
        )
    return table(["machine, date", "command", "wall time, medians", "EM / F1"], rows)


@block("resume-rewrite")
def resume_rewrite(name: str) -> str:
    results = Results(name)
    rows = []
    for r in results["rows"]:
        load, rewrite = r["load"], r["rewrite"]
        rows.append(
            [
                f"{r['model']}, {num(r['state_mb'], 0)} MB",
                f"{num(load['seconds'])} s, peak RSS {num(load['peak_rss_mb'], 0)} MB",
                f"{num(rewrite['seconds'])} s, peak RSS {num(rewrite['peak_rss_mb'], 0)} MB",
                f"{num(rewrite['seconds'] / load['seconds'])}x",
            ]
        )
    head = ["checkpoint", "restore (`torch.load`)", "decode, check, write", "ratio"]
    return f"{caption(results)}\n\n{table(head, rows)}"


@block("data-speed")
def data_speed() -> str:
    """Feature preparation, answer extraction, a full-size train set, the cache's check."""
    features, extraction = Results("features-epyc-zen5.json"), Results("extraction-epyc-zen5.json")
    full, cache = Results("full-size-epyc-zen5.json"), Results("cache-check-epyc-zen5.json")
    rows = [
        [
            "feature preparation against the transformers QA examples' tokenization",
            f"{num(features['speedup'], 2)}x on {features['examples']:,} examples; features identical: "
            f"{'yes' if features['identical_features'] else 'no'}",
            measured_on(features),
        ],
        *(
            [
                f"answer extraction against the QA examples' post-processing, {kind} logits",
                f"{num(extraction[key]['speedup'], 1)}x on {extraction['examples']:,} examples; "
                f"the same answers as the reference loop: "
                f"{'yes' if extraction[key]['identical_to_reference_loop'] else 'no'}",
                measured_on(extraction),
            ]
            for key, kind in (("random", "random"), ("trained_shaped", "trained-shaped"))
        ),
        [
            f"a full-SQuAD-sized train set, {full['examples']:,} questions",
            f"{full['features']:,} features in {num(full['build_seconds'], 1)} s, peak RSS "
            f"{full['build_peak_rss_mb']:,} MB; a cache hit in {num(full['cache_hit_cli_seconds'], 2)} s",
            measured_on(full),
        ],
        [
            f"reading a cache entry, checked as it is read, {cache['windows']:,} windows, "
            f"{num(cache['bytes'] / 1e6, 0)} MB",
            f"{num(cache['warm_check_s'], 3)} s from the page cache, {num(cache['cold_check_s'], 3)} s cold",
            measured_on(cache),
        ],
    ]
    return table(["what", "result", "machine, date"], rows)


@block("memory")
def memory(name: str) -> str:
    results = Results(name)
    runs = {(r["model"], r["batch"], r["checkpointing"]): r for r in results["rows"]}
    rows = []
    for model, batch, on in runs:
        if on:
            off = runs[(model, batch, False)]
            here = runs[(model, batch, True)]
            rows.append(
                [
                    f"BERT-{model}",
                    str(batch),
                    f"{num(off['peak_gib'])} GiB",
                    f"{num(here['peak_gib'])} GiB",
                    f"{num(here['peak_gib'] / off['peak_gib'])}x",
                    f"{num(here['step_s'] / off['step_s'])}x",
                ]
            )
    head = ["model", "batch", "peak, off", "peak, on", "on / off", "step time on / off"]
    return f"{caption(results)}\n\n{table(head, rows)}"


# --- speed ----------------------------------------------------------------------------------------


@block("ladder")
def ladder(*names: str) -> str:
    """The throughput ladder, rung by rung, for each machine: sequences/s and x the first rung."""
    rows = []
    for name in names:
        results = Results(name)
        rungs_here = [r for r in results["rows"] if not is_harness(r)]
        first = rungs_here[0]["sequences_per_s"]
        for r in rungs_here:
            mfu = f", MFU {num(100 * r['mfu'], 1)} %" if r.get("mfu") else ""
            rows.append(
                [
                    measured_on(results),
                    f"{results['batch_size']} x {results['max_seq_length']}",
                    r["name"],
                    f"{num(r['sequences_per_s'], 1)} ({num(r['sequences_per_s'] / first)}x){mfu}",
                ]
            )
    return table(["machine, date", "batch x max tokens", "rung", "sequences/s (x the first rung)"], rows)


@block("cpu-step")
def cpu_step_profile(name: str) -> str:
    """Where a CPU training step's time goes, grouped, and the step against its own matrix
    products timed alone (bench.cpu_step)."""
    results = Results(name)
    measured = results["precisions"]
    groups = list(dict.fromkeys(g for m in measured for g in m["ms_per_step_by_group"]))
    header = ["where", *(f"{m['precision']}: ms per step (share)" for m in measured)]
    rows = []
    for group in groups:
        cells = []
        for m in measured:
            ms = m["ms_per_step_by_group"].get(group, 0.0)
            cells.append(f"{num(ms, 0)} ({num(100 * ms / m['profiled_ms_per_step'], 0)} %)")
        rows.append([group, *cells])
    rows.append(["**step, profiled**", *(num(m["profiled_ms_per_step"], 0) for m in measured)])
    rows.append(["step, unprofiled", *(num(m["ms_per_step"], 0) for m in measured)])
    bounds = [f"{num(m['gemm_bound_ms_per_step'], 0)} ({num(m['gemm_gflop_per_step'], 0)})" for m in measured]
    rows.append(["its matrix products alone (GFLOP per step)", *bounds])
    rows.append(["**step / bound**", *(f"{num(m['step_over_bound'])}x" for m in measured)])
    return f"{caption(results)}\n\n{table(header, rows)}"


@block("allocator")
def allocator(name: str) -> str:
    """glibc's default malloc against the trial's setting on the CPU, in fresh processes."""
    results = Results(name)
    found = results["allocator"]["best"]
    rows = [
        [setting, num(r["ms_per_step"], 0), f"{num(r['minor_faults_per_step'], 0)}"]
        for setting, r in found.items()
    ]
    rows.append(["**kept / default**", f"{num(results['allocator']['keep_over_default'], 3)}x", ""])
    header = ["malloc", "ms per step (best of each process)", "minor page faults per step"]
    return f"{caption(results)}\n\n{table(header, rows)}"


@block("step-bound")
def step_bound(*names: str) -> str:
    """The ladder's fast path against its matrix products alone, per machine."""
    rows = []
    for name in names:
        results = Results(name)
        bound = results.data.get("fast_path_step_over_bound")
        if bound is not None:
            rows.append([measured_on(results), f"{num(bound)}x"])
    return table(["machine, date", "fast path step / its matrix products alone"], rows)


@block("harness")
def harness(*names: str) -> str:
    rows = []
    for name in names:
        results = Results(name)
        by_name = {r["name"]: r["sequences_per_s"] for r in results["rows"]}
        bare = next(v for k, v in by_name.items() if k.startswith("bare loop"))
        trial = next(v for k, v in by_name.items() if k.startswith("trial via"))
        overhead = results["harness_overhead"]  # as bench.throughput computed it
        rows.append([measured_on(results), num(trial, 1), num(bare, 1), num(overhead, 3)])
    return table(["machine, date", "trial, seq/s", "bare loop, seq/s", "harness overhead"], rows)


@block("runtimes")
def runtimes(name: str) -> str:
    results = Results(name)
    rows = []
    base: dict[str, dict[str, Any]] = {}
    for r in results["runtimes"]:
        first = base.setdefault(r["model"], r)
        batched, single = r["batched"], r["single"]
        speed = {
            kind: r[kind]["questions_per_s"] / first[kind]["questions_per_s"]
            for kind in ("batched", "single")
        }
        score = f"{num(r['exact_match'])} / {num(r['f1'])}" if r.get("f1") is not None else "(speed only)"
        rows.append(
            [
                r["model"],
                r["runtime"],
                f"{num(batched['questions_per_s'], 1)} ({num(speed['batched'])}x)",
                f"{num(single['questions_per_s'], 1)} ({num(speed['single'])}x)",
                f"{num(single['ms_p50'], 1)} / {num(single['ms_p99'], 1)}",
                score,
            ]
        )
    head = [
        "model",
        "runtime",
        "questions/s, calls of 32",
        "questions/s, one per call",
        "ms p50 / p99, one per call",
        "EM / F1",
    ]
    return f"{caption(results)}\n\n{table(head, rows)}"


@block("end-to-end")
def end_to_end(*names: str) -> str:
    rows = []
    for name in names:
        results = Results(name)
        e2e = results["end_to_end"]
        batch, single = e2e["batch"], e2e.get("single") or {}
        rows.append(
            [
                measured_on(results),
                f"{num(batch['questions_per_s'], 1)}",
                f"{num(single['ms_median'], 1)}" if "ms_median" in single else "-",
            ]
        )
    return table(["machine, date", "questions/s, calls of 32", "one question, median ms"], rows)


# --- the README's results table ---------------------------------------------------------------


def paired_text(diff: dict[str, Any] | None) -> str:
    return f"{study.fmt_diff(diff)} ({verdict(diff)})" if diff else "-"


def paired_row(what: str, name: str, factor: str, level: str, baseline: str) -> list[str]:
    """A paired-seed study's row: `level` against `baseline` of `factor`, F1 and training time."""
    return [
        f"{what}, paired F1; training time",
        f"{paired_text(study_diff(name, factor, level, baseline))}; training time "
        f"{ratio_text(name, factor, level, baseline)}",
        measured_on(Results(name)),
        "[below](#bf16-on-the-cpu)",
    ]


def step_row() -> list[str]:
    results = Results("cpu-step-epyc-zen5.json")
    measured = results["precisions"][0]
    ladder = Results("throughput-cpu-epyc.json")
    return [
        f"the CPU training step ({measured['precision']}) against its matrix products alone; against the "
        "standard recipe with its bf16",
        f"{num(measured['step_over_bound'])}x the bound; {num(ladder['speedup_over_standard_bf16'])}x the "
        "standard recipe's sequences/s",
        measured_on(results),
        "[below](#the-training-step-against-its-bound)",
    ]


def runtime_row() -> list[str]:
    results = Results("inference-runtimes-cpu.json")
    runs = {(r["model"], r["runtime"]): r for r in results["runtimes"]}
    torch_, int8 = runs[("checkpoint", "torch-fp32")], runs[("checkpoint", "onnx-int8")]
    speed = int8["single"]["questions_per_s"] / torch_["single"]["questions_per_s"]
    return [
        "ONNX Runtime int8 against PyTorch fp32 on a CPU, one question per call",
        f"{num(speed)}x the questions/s; F1 {num(int8['f1'] - torch_['f1'], 2, True)} (one model)",
        measured_on(results),
        "[below](#inference)",
    ]


def features_row() -> list[str]:
    results = Results("features-epyc-zen5.json")
    return [
        "feature preparation against the transformers QA examples, the same features",
        f"{num(results['speedup'])}x",
        measured_on(results),
        "[below](#data-and-extraction)",
    ]


@block("results-in-brief")
def results_in_brief() -> str:
    rows = [
        paired_row(
            "bf16 against fp32 on a CPU", "cpu-precision-epyc-fast-masks.json", "precision", "bf16", "fp32"
        ),
        paired_row(
            "the fast dropout masks against torch's, bf16 on a CPU",
            "cpu-masks-epyc-zen5.json",
            "masks",
            "fast",
            "torch",
        ),
        step_row(),
        runtime_row(),
        features_row(),
    ]
    return table(["what", "result", "machine, date", "details"], rows)


@block("value")
def value(name: str, key: str, decimals: str, unit: str = "") -> str:
    """One value of a results file inside a sentence, with its machine and date."""
    results = Results(name)
    figure = results.data
    for part in key.split("."):
        figure = figure[int(part)] if isinstance(figure, list) else figure[part]
    return f"{num(figure, int(decimals))}{' ' + unit if unit else ''} ({measured_on(results)})"


# --- what a YAML resolves to ---------------------------------------------------------------------


@functools.cache
def planned(config: str, overrides: tuple[str, ...]) -> dict[str, Any]:
    """train.py --dry-run's plan of a shipped YAML (as a master hands it), once per process."""
    return dry_run.dry_run(experiment.RunOptions(config=ROOT / config, overrides=overrides))


@block("dry-run")
def dry_run_value(config: str, field: str, *overrides: str) -> str:
    """A value the dry run derives from a YAML (the resolved learning rate, the optimizer steps),
    so a page's table of the YAMLs changes with them: `dry-run local.yaml learning_rate KEY=VALUE`."""
    value = planned(config, overrides)[field]
    if field.endswith("learning_rate"):
        return exponent_text(value)
    return f"{value:,}" if isinstance(value, int) else str(value)


def exponent_text(value: float) -> str:
    """A value as YAMLs write learning rates, 3 significant digits at most: 3.06e-5, 2e-4."""
    mantissa, exponent = f"{value:.2e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


@block("asha-rungs")
def asha_rungs(config: str) -> str:
    """The batches each rung of each ASHA bracket needs, as the dry run plans them."""
    brackets = planned(config, ())["asha_brackets"]
    return " and ".join("**" + ", ".join(f"{n:,}" for n in rungs) + "**" for rungs in brackets)


@block("lr-rule")
def lr_rule(learning_rate: str, reference_batch: str, samples_per_step: str, rule: str) -> str:
    """The learning rate the trial's rule (run_plan.resolved_learning_rate) gives a rate set at
    `reference_batch` samples per step when a step takes `samples_per_step`."""
    hp = Hyperparameters(
        learning_rate=float(learning_rate), lr_scaling=rule, reference_batch_size=int(reference_batch)
    )
    return exponent_text(run_plan.resolved_learning_rate(hp, int(samples_per_step)))


@block("training-flops")
def training_flops_text(width: str) -> str:
    """bench/flops.training_flops of one bert-base window (transformers' BertConfig defaults are
    bert-base's shape) of `width` tokens."""
    import torch
    from transformers import AutoModelForQuestionAnswering, BertConfig

    with torch.device("meta"):
        model = AutoModelForQuestionAnswering.from_config(BertConfig())
    return exponent_text(flops.training_flops(model, 1, int(width)))


# --- the scaling model ------------------------------------------------------------------------

# The write-up's figures (the Determined blog post on this job) and what it does not give, assumed.
WRITE_UP_HOURS, WRITE_UP_EPOCHS, SQUAD_WINDOWS = 7.0, 2, 88_600
BERT_BASE_PARAMETERS, PER_GPU_BATCH = 110e6, 12
K80_SETUPS = (  # (label, GPUs, the slowest link's bytes/s, the write-up's efficiency)
    ("8 K80, one machine, ~6 GB/s", 8, 6e9, "> 0.80"),
    ("16 K80, two machines, 10 Gbit/s", 16, 10e9 / 8, "0.83"),
    ("16 K80, two machines, 25 Gbit/s", 16, 25e9 / 8, ""),
)


@block("k80-model")
def k80_model() -> str:
    """docs/scaling.md's no-overlap efficiency E = T_compute / (T_compute + T_comm) per setup."""
    rate = WRITE_UP_EPOCHS * SQUAD_WINDOWS / (WRITE_UP_HOURS * 3600)  # windows/s on one K80
    batch_s = PER_GPU_BATCH / rate
    gradient_bytes = 4 * BERT_BASE_PARAMETERS
    rows = []
    for label, gpus, link, published in K80_SETUPS:
        comm = 2 * (gpus - 1) / gpus * gradient_bytes / link
        efficiency = [a * batch_s / (a * batch_s + comm) for a in (1, 2, 4, 8)]
        rows.append([label, f"{num(comm)} s", *(num(e) for e in efficiency), published])
    head = ["setup", "T_comm", "E at a = 1", "a = 2", "a = 4", "a = 8", "published"]
    return f"T_batch = {num(batch_s)} s (12 windows at {num(rate, 1)} windows/s).\n\n{table(head, rows)}"


@block("multi-machine")
def multi_machine(path: str) -> str:
    results = Results(path)
    rows = []
    links = ("10gbit", "1gbit", "100mbit")

    def order(r: dict[str, Any]) -> tuple[bool, int, int]:
        name = r["name"].split()
        return (r["name"].endswith("fp16"), links.index(name[1]) if name[1] in links else 9, r["aggregation"])

    for r in sorted((r for r in results["runs"] if "measured_over_model" in r), key=order):
        link = r["name"].split()[1] + (", fp16 compression" if r["name"].endswith("fp16") else "")
        rows.append(
            [
                link,
                str(r["aggregation"]),
                num(r["samples_per_s"]),
                num(r["speedup"]),
                num(r["efficiency"]),
                num(r["model_samples_per_s"]),
                num(r["measured_over_model"]),
            ]
        )
    head = [
        "link",
        "aggregation",
        "samples/s",
        "speedup",
        "per-slot efficiency",
        "model samples/s",
        "measured / model",
    ]
    return f"{caption(results)}\n\n{table(head, rows)}"


# --- one GPU --------------------------------------------------------------------------------------


@block("rungs")
def rungs(*names: str) -> str:
    """The ladder side by side: one column per results file (its batch, machine and date)."""
    files = [Results(name) for name in names]
    order = list(dict.fromkeys(r["name"] for f in files for r in f["rows"] if not is_harness(r)))
    head = ["rung"] + [f"{f['batch_size']} per GPU ({measured_on(f)})" for f in files]
    rows = []
    for rung in order:
        cells = []
        for f in files:
            found = [r for r in f["rows"] if r["name"] == rung]
            cells.append(num(found[0]["sequences_per_s"], 0) if found else "-")
        rows.append([rung, *cells])
    best = [max(r["sequences_per_s"] for r in f["rows"] if not is_harness(r)) for f in files]
    first = [next(r for r in f["rows"] if not is_harness(r))["sequences_per_s"] for f in files]
    rows.append(["best / the standard recipe", *(f"{num(b / s)}x" for b, s in zip(best, first, strict=True))])
    return "Sequences/s.\n\n" + table(head, rows)


def is_harness(row: dict[str, Any]) -> bool:
    return row["name"].startswith(("bare loop", "trial via"))


def graphs_cells(results: Results) -> dict[str, Any]:
    """The trial's eager step (the rung before width buckets), buckets, and CUDA graphs."""
    names = [r["name"] for r in results["rows"]]
    by = {r["name"]: r for r in results["rows"]}
    buckets = next((n for n in names if n.startswith("+ width buckets")), None)
    graphs = next((n for n in names if n.startswith("+ CUDA graphs")), None)
    eager = names[names.index(buckets) - 1] if buckets else names[-1]
    return {"eager": by[eager], "buckets": by.get(buckets or ""), "graphs": by.get(graphs or "")}


@block("graphs")
def graphs(*names: str) -> str:
    rows = []
    for name in names:
        results = Results(name)
        cells = graphs_cells(results)
        top = cells["graphs"] or cells["eager"]
        precision = "bf16" if "bf16" in top["name"] or "bf16" in name else "fp32 + TF32"
        rows.append(
            [
                f"{results['batch_size']}, {precision}",
                num(cells["eager"]["sequences_per_s"], 0),
                num(cells["buckets"]["sequences_per_s"], 0) if cells["buckets"] else "-",
                num(cells["graphs"]["sequences_per_s"], 0) if cells["graphs"] else "-",
                f"{num(100 * top['mfu'], 1)} %",
                f"{num(top['peak_memory_gb'], 1)} GB",
                measured_on(results),
            ]
        )
    head = [
        "per GPU, precision",
        "the trial's eager step",
        "+ buckets /64",
        "+ CUDA graphs",
        "MFU, fastest rung",
        "peak memory",
        "machine, date",
    ]
    return "Sequences/s.\n\n" + table(head, rows)


@block("gpu-goals")
def gpu_goals(small: str, large: str, largest: str) -> str:
    """The GPU goals: MFU at 64+ and at 12 per GPU, and 2 epochs of SQuAD v1.1 in 90 s."""
    lines = []
    for name, goal, what in ((large, 40, "64+ per GPU, bf16"), (small, 15, "12 per GPU")):
        results = Results(name)
        top = max(results["rows"], key=lambda r: r["mfu"])
        reached = "reached" if 100 * top["mfu"] >= goal else "not reached"
        lines.append(
            f"- MFU >= {goal} % at {what}: {reached}, {num(100 * top['mfu'], 1)} % "
            f"({top['name'].lstrip('+ ')}; {measured_on(results)})"
        )
    results = Results(largest)
    top = max(results["rows"], key=lambda r: r["sequences_per_s"])
    seconds = 2 * SQUAD_WINDOWS / top["sequences_per_s"]
    reached = "reached" if seconds <= 90 else "not reached"
    lines.append(
        f"- SQuAD v1.1 x 2 epochs in 90 s or less on one GPU: {reached}, {num(seconds, 1)} s projected at "
        f"{results['batch_size']} per GPU ({top['name'].lstrip('+ ')}; {measured_on(results)})"
    )
    return "\n".join(lines)


@block("cross-study")
def cross_study(first: str, second: str, factor: str, level: str) -> str:
    """One arm of two studies on different machines, paired by seed: first - second."""
    a, b = Results(first), Results(second)
    rows_a, rows_b = (cpu_precision.normalized(r["rows"]) for r in (a, b))
    diff = study.paired(study.by_seed(rows_a, {factor: level}), study.by_seed(rows_b, {factor: level}))
    assert diff is not None, f"{first} and {second} share no seeds for {factor} {level}"
    return (
        f"{study.fmt_diff(diff)}, n = {diff['n']}, {verdict(diff)} "
        f"({measured_on(a)} against {measured_on(b)})"
    )


@block("memory-fits")
def memory_fits(name: str) -> str:
    """bench.memory's estimate of the largest per-device batch per card size."""
    results = Results(name)
    summary = results["summary"]
    cards = list(summary[0]["largest_batch_estimate"])
    rows = [
        [
            f"BERT-{s['model']}",
            "on" if s["checkpointing"] else "off",
            f"{num(s['per_sample_gib'])} GiB",
            *(str(s["largest_batch_estimate"][card]) for card in cards),
        ]
        for s in summary
    ]
    head = ["model", "checkpointing", "activations per sample", *cards]
    prov = results.provenance()
    return f"Estimated from {prov.label}'s run ({prov.date}).\n\n{table(head, rows)}"


# --- plots: X.png drawn from the results file X.json beside it, named in its metadata ---------------


def draw_lr_scaling(source: Path, png: Path) -> None:
    data = reading.read_bytes(source, reading.RECORD)
    result = reading.parse_json(data, source)
    result["rows"] = lr_scaling.with_epochs(result["rows"])
    seeds = tuple(int(seed) for seed in lr_scaling.SEEDS.split(","))
    lr_scaling.report(result, png, seeds, drawn_from(source.name, data))


def draw_scaling_study(source: Path, png: Path) -> None:
    """scaling.py's speedup plot, or the multi-machine study's efficiency against the link."""
    from bench import multi_machine

    data = reading.read_bytes(source, reading.RECORD)
    report = reading.parse_json(data, source)
    draw = multi_machine.plot_links if "link_delay" in report else scaling_report.plot
    draw(report, png, drawn_from(source.name, data))


PLOTS = ((r"^lr-scaling-[\w-]+\.png$", draw_lr_scaling), (r"^report\.png$", draw_scaling_study))
