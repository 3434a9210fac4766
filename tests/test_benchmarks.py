"""The benchmarks are tools users run to check our numbers: these check that they still run and
report what they say. No behaviour test depends on a benchmark (instruments the tests need live
in tests/, and the benchmarks import them)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.support.project import completed


def test_inference_benchmark_runs_predicts_path_and_reports(trained, tmp_path: Path) -> None:
    ckpt, _ = trained
    out_json = tmp_path / "inference.json"
    out = completed(
        [
            "-m",
            "bench.inference",
            "--checkpoint",
            str(ckpt),
            "--questions",
            "40",
            "--single",
            "3",
            "--length",
            "64",
            "--shape-batches",
            "2",
            "--min-seconds",
            "0.05",
            "--json",
            str(out_json),
        ]
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out_json.read_text())
    batch, single = report["end_to_end"]["batch"], report["end_to_end"]["single"]
    assert batch["questions"] == 40 and batch["windows"] >= 40 and single["questions"] == 3
    assert batch["questions_per_s"] > 0 and single["ms_median"] > 0
    shares = batch["share_features"] + batch["share_model"] + batch["share_extraction"]
    assert shares == pytest.approx(1, abs=0.01)
    assert {(r["model"], r["batch"], r["length"]) for r in report["shapes"]} == {
        (str(ckpt_model), 2, 64) for ckpt_model in (report["model"], "bert-base")
    }


def test_inference_runtimes_compare_torch_and_onnx_with_scores(trained, tmp_path: Path) -> None:
    ckpt, _ = trained
    out_json = tmp_path / "runtimes.json"
    args = ["--runtimes", "--checkpoint", str(ckpt), "--questions", "30", "--single", "4",
            "--call-questions", "8", "--bert-base-questions", "0", "--json", str(out_json)]  # fmt: skip
    out = completed(["-m", "bench.inference", *args])
    assert out.returncode == 0, out.stderr
    rows = {row["runtime"]: row for row in json.loads(out_json.read_text())["runtimes"]}
    assert {"torch-fp32", "onnx", "onnx-int8"} <= set(rows)
    for row in rows.values():
        batched, single = row["batched"], row["single"]
        assert batched["calls"] == 4 and single["calls"] == 4 and row["questions"] == 30
        assert batched["ms_p50"] <= batched["ms_p90"] <= batched["ms_p99"] and single["questions_per_s"] > 0
        assert 0 <= row["f1"] <= 100
    assert rows["onnx"]["max_abs_logit_difference_vs_torch"] < 1e-3 and rows["onnx-int8"]["file_mb"] > 0
    assert abs(rows["onnx"]["f1"] - rows["torch-fp32"]["f1"]) < 1e-6  # 30 questions: no near-tie flips


def _bench(script: str, *args: str) -> str:
    done = completed(["-m", f"bench.{script.removesuffix('.py')}", *args])
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_batching_stats_and_report(tmp_path: Path) -> None:
    """bench/batching.py stats on the bundled text (no training) and the paired table."""
    path = tmp_path / "batching.json"
    rows = [
        {"batching": b, "pad_to_multiple_of": m, "seed": s, "f1": f1 + d, "exact_match": f1 + d - 8}
        for (b, m, d) in (("random", 8, 0.0), ("buckets", 64, -0.5))
        for s, f1 in zip([42, 43, 44], [50.0, 52.0, 51.0], strict=True)
    ]
    path.write_text(json.dumps({"config": "local.yaml", "baseline": "random/8", "rows": rows}))
    out = _bench("batching.py", "stats", "--json", str(path), "--seeds", "42,43")
    stats = json.loads(path.read_text())["stats"]["arms"]
    assert stats["sorted/8"]["repeat_share"] > 5 * stats["buckets/64"]["repeat_share"]
    assert (
        stats["padded"]["padding_share"]
        > stats["buckets/64"]["padding_share"]
        > stats["sorted/8"]["padding_share"]
    )
    assert "| buckets/64 | 3 | 50.50 ± 1.00 | 42.50 ± 1.00 | -0.50 [-0.50, -0.50] |" in out
    assert json.loads(path.read_text())["stats"]["command"].startswith("python3 -m bench.batching stats")


def test_batching_report_applies_the_default_rule_to_each_machine_speed(tmp_path: Path) -> None:
    """The verdict of the rule for a new default (paired F1 mean within 1 of random batches, at
    least 2.5x padded's speed) is written by the report from the file, per timed machine."""
    path = tmp_path / "batching.json"
    rows = [
        {"batching": b, "pad_to_multiple_of": m, "seed": s, "f1": 50.0 + s + d, "exact_match": 40.0}
        for (b, m, d) in (("random", 8, 0.0), ("buckets", 64, -0.5), ("sorted", 8, -1.5))
        for s in (42, 43, 44)
    ]
    ratios = {"padded": 1.0, "random/8": 1.1, "buckets/64": 2.6, "sorted/8": 3.0}
    arms = {arm: {"samples_per_s": 3.0 * r, "vs_padded": r} for arm, r in ratios.items()}
    speed = {
        "CPU A": {"arms": arms},
        "CPU B": {"arms": {**arms, "buckets/64": {"samples_per_s": 7.0, "vs_padded": 2.4}}},
    }
    path.write_text(
        json.dumps({"config": "local.yaml", "baseline": "random/8", "rows": rows, "speed": speed})
    )
    out = _bench("batching.py", "report", "--json", str(path))
    a, b = out.split("on CPU A):")[1].split("on CPU B):")
    assert "- PASS buckets/64: F1 -0.50 (within), 2.60x padded (fast enough)" in a
    assert "- FAIL sorted/8: F1 -1.50 (outside), 3.00x padded (fast enough)" in a
    assert "- FAIL random/8: the baseline, 1.10x padded (too slow)" in a and "- fastest arm: sorted/8" in a
    assert "- FAIL buckets/64: F1 -0.50 (within), 2.40x padded (too slow)" in b
    assert "- FAIL padded:" not in a  # an arm without paired rows gets no verdict


def test_cpu_precision_report_pairs_seeds_and_applies_the_f1_rule(tmp_path: Path) -> None:
    """bench/cpu_precision.py report on recorded rows: F1 per precision, the paired difference,
    the training-time ratio per seed, and the rule for switching the default (the interval's lower
    end at least -1.5): bf16 0.4 below fp32 on every seed passes, 3 below fails. Rows recorded
    before the masks were a setting count as torch's masks, and never pair with the fast ones."""
    path = tmp_path / "cpu.json"

    def rows(shift: float) -> list[dict]:
        out = []
        for i, seed in enumerate((42, 43, 44, 45, 46)):
            for precision, f1, seconds in (("fp32", 50.0 + i, 300.0), ("bf16", 50.0 + i - shift, 240.0)):
                row = {"precision": precision, "seed": seed, "f1": f1, "exact_match": f1 - 8}
                out.append({**row, "train_seconds": seconds + i})
        return out

    path.write_text(json.dumps({"config": "local.yaml", "rows": rows(0.4)}))
    out = _bench("cpu_precision", "report", "--json", str(path))
    assert "fixed: recipe fast, masks torch" in out
    assert "| bf16 | 5 | 51.60 ± 1.58 | 43.60 ± 1.58 | 242.0 |" in out
    assert "training time bf16 / fp32, runs measured here, per seed: 42: 0.800, 43: 0.801" in out
    assert "- precision bf16 - fp32: paired F1 -0.40 [-0.40, -0.40], n = 5; rule" in out
    assert "PASS: auto may pick bf16" in out
    path.write_text(json.dumps({"config": "local.yaml", "rows": rows(3.0)}))
    assert "FAIL: keep fp32 as the default" in _bench("cpu_precision", "report", "--json", str(path))
    # Two bf16 runs with the fast masks: their own arm, compared with nothing of the other masks'.
    fast = [{**r, "masks": "fast", "f1": 0.0} for r in rows(0.4) if r["seed"] in (42, 43)]
    path.write_text(json.dumps({"config": "local.yaml", "rows": rows(0.4) + fast}))
    out = _bench("cpu_precision", "report", "--json", str(path))
    assert "- precision bf16 - fp32 (masks torch): paired F1 -0.40 [-0.40, -0.40], n = 5" in out
    assert "- precision bf16 - fp32 (masks fast): paired F1 +0.00 [+0.00, +0.00], n = 2" in out
    assert "- masks fast - torch (precision bf16): paired F1 -50.10" in out
    assert "FAIL: keep torch's masks as the default" in out


def test_cpu_precision_runs_pin_every_factor() -> None:
    """Each study run sets every factor it is identified by, seed by seed, the arms alternating."""
    from bench import cpu_precision

    levels = {"recipe": ("fast",), "precision": ("fp32", "bf16"), "masks": ("fast",)}
    runs = cpu_precision.runs([42, 43], levels, ("hyperparameters.tf32=false",))
    assert [(r.seed, r.cell["precision"]) for r in runs] == [
        (42, "fp32"), (42, "bf16"), (43, "fp32"), (43, "bf16"),
    ]  # fmt: skip
    assert runs[1].cell == {"recipe": "fast", "precision": "bf16", "masks": "fast"}
    assert runs[1].overrides == (
        "hyperparameters.precision=bf16", "hyperparameters.dropout_masks=fast", "hyperparameters.tf32=false",
    )  # fmt: skip
    standard = cpu_precision.runs([42], {**levels, "recipe": ("standard",)})[0]
    assert "hyperparameters.batching=padded" in standard.overrides
    assert "hyperparameters.attn_implementation=eager" in standard.overrides


def test_cache_check_benchmark_reports_the_check_and_the_hashing(tmp_path: Path) -> None:
    out = tmp_path / "cache.json"
    _bench("cache_check", "--windows", "500", "--length", "64", "--json", str(out))
    report = json.loads(out.read_text())
    assert report["windows"] == 500 and report["bytes"] > 500 * 64 * 5
    assert report["warm_check_s"] > 0 and report["sha256_gb_per_s"] > 0
    assert report["command"].startswith("python3 -m bench.cache_check --windows 500")
    assert report["commit"] and report["machine"]  # the file names what it measured on


def test_recipes_report_pairs_the_fast_path_with_the_standard_recipe(tmp_path: Path) -> None:
    """bench/cpu_precision.py recipes-report: F1 per (recipe, precision), the paired difference
    fast - standard per precision, bf16 - fp32 per recipe, and the fast / standard time ratio."""
    rows = []
    for i, seed in enumerate((42, 43, 44)):
        for recipe, shift, seconds in (("fast", 0.5, 100.0), ("standard", 0.0, 300.0)):
            for precision, p_shift in (("fp32", 0.0), ("bf16", -0.25)):
                f1 = 50.0 + i + shift + p_shift
                rows.append({"recipe": recipe, "precision": precision, "seed": seed, "f1": f1,
                             "exact_match": f1 - 8, "train_seconds": seconds})  # fmt: skip
    path = tmp_path / "recipes.json"
    path.write_text(json.dumps({"config": "local.yaml", "overrides": [], "rows": rows}))
    out = _bench("cpu_precision", "recipes-report", "--json", str(path))
    assert "| fast | fp32 | 3 | 51.50 ± 1.00 | 43.50 ± 1.00 | 100.0 |" in out
    assert "| standard | bf16 | 3 | 50.75 ± 1.00 | 42.75 ± 1.00 | 300.0 |" in out
    assert "- recipe fast - standard (precision fp32): paired F1 +0.50 [+0.50, +0.50], n = 3\n" in out
    assert "- precision bf16 - fp32 (recipe standard): paired F1 -0.25 [-0.25, -0.25], n = 3;" in out
    assert "training time fast / standard, runs measured here, per seed: 42: 0.333" in out


def test_masks_report_pairs_fast_masks_with_torchs_and_borrows_the_baseline(tmp_path: Path) -> None:
    """masks-report: fast vs torch masks; seeds whose torch arm did not run here pair with the
    precision study's rows (torch's masks), and the report says so; times only where both ran."""
    here = [{"precision": "fp32", "masks": "fast", "seed": s, "f1": 51.0 + s - 42, "exact_match": 43.0,
             "train_seconds": 80.0} for s in (42, 43, 44)]  # fmt: skip
    here.append({"precision": "fp32", "masks": "torch", "seed": 42, "f1": 50.0, "exact_match": 42.0,
                 "train_seconds": 100.0})  # fmt: skip
    baseline = [{"precision": p, "seed": s, "f1": 50.0 + s - 42, "exact_match": 42.0,
                 "train_seconds": 120.0} for s in (42, 43, 44) for p in ("fp32", "bf16")]  # fmt: skip
    (tmp_path / "masks.json").write_text(json.dumps({"config": "local.yaml", "rows": here}))
    (tmp_path / "base.json").write_text(
        json.dumps({"config": "local.yaml", "cpu": {"cpu": "Other CPU"}, "rows": baseline})
    )
    out = _bench(
        "cpu_precision", "masks-report", "--json", str(tmp_path / "masks.json"),
        "--baseline", str(tmp_path / "base.json"),
    )  # fmt: skip
    assert "| fast | 3 | 52.00 ± 1.00 | 43.00 ± 0.00 | 80.0 |" in out
    assert "| torch | 3 | 51.00 ± 1.00 | 42.00 ± 0.00 | 100.0 |" in out
    assert "- masks fast - torch: paired F1 +1.00 [+1.00, +1.00], n = 3" in out
    borrowed = "recipe fast, precision fp32, masks torch, seeds 43, 44: the baseline study's rows (Other CPU)"
    assert borrowed in out
    assert "training time fast / torch, runs measured here, per seed: 42: 0.800; mean 0.800" in out
    assert "bf16" not in out  # the baseline's other arms are not this study's


def test_squad2_report_pairs_each_table_on_the_seeds_its_models_share(tmp_path: Path) -> None:
    """bench/squad2.py report: the v2 / v1.1-style table uses the seeds both ran, the precision
    table the seeds both precisions ran (v2 has more than either), each paired difference per
    seed; the F1 rule decides local_v2.yaml's default from best_f1 and F1 at the tuned threshold.
    A report writes nothing."""

    def row(model: str, seed: int, f1: float, best: float) -> dict:
        scores = {"exact": f1 - 1, "f1": f1, "HasAns_exact": 10.0, "HasAns_f1": 12.0,
                  "NoAns_exact": 80.0, "NoAns_f1": 80.0}  # fmt: skip
        out = {"model": model, "seed": seed, "at_zero": {**scores, "f1": f1 - 8}, "at_tuned": scores,
               "best_f1": best, "tuned_threshold": -2.0}  # fmt: skip
        if model == "v2-bf16":
            out["fp32_forward"] = {"at_zero": out["at_zero"], "at_tuned": scores, "best_f1": best}
        return out

    rows = [row("v2", s, 48.0 + i, 50.0) for i, s in enumerate((42, 43, 44, 45))]
    rows += [row("v1.1-style", s, 45.0 + i, 50.5) for i, s in enumerate((42, 43, 44))]
    rows += [
        row("v2-bf16", s, 48.0 + i - shift, 50.1)
        for i, (s, shift) in enumerate(((42, 0.5), (43, 3.0), (44, 0.0), (45, 0.5)))
    ]  # noqa: E501
    path = tmp_path / "squad2.json"
    path.write_text(json.dumps({"config": "local_v2.yaml", "rows": rows}))
    before = path.read_text()
    out = _bench("squad2", "report", "--json", str(path))
    assert path.read_text() == before
    assert "seeds both models ran: 42, 43, 44\n" in out
    row = "| F1 at the threshold tuned on Sky | 49.00 ± 1.00 (n=3) | 46.00 ± 1.00 (n=3) |"
    assert f"{row} +3.00 [+3.00, +3.00] |" in out
    assert "seeds both precisions ran: 42, 43, 44, 45\n" in out
    assert "| -1.00 [-3.15, +1.15] | -0.50, -3.00, +0.00, -0.50 |" in out
    assert (
        "best_f1 on Victoria (the run's own validation set): PASS; F1 at the threshold tuned on Sky: FAIL"
        in out
    )  # noqa: E501
    assert "-> keep fp32 as its default" in out
    # Without seed 43 (and bf16 0.01 higher at the tuned threshold) the interval passes.
    nudged = {"v2-bf16": 0.01}
    rows = [{**r, "at_tuned": {**r["at_tuned"], "f1": r["at_tuned"]["f1"] + nudged.get(r["model"], 0.0)}}
            for r in rows if r["seed"] != 43]  # fmt: skip
    path.write_text(json.dumps({"config": "local_v2.yaml", "rows": rows}))
    assert "-> precision: auto may pick bf16" in _bench("squad2", "report", "--json", str(path))


def test_squad2_recipes_report_against_abstaining_and_the_three_epoch_recipe(tmp_path: Path) -> None:
    """bench/squad2.py report on recipe arms: F1 at the Sky-tuned threshold against answering
    nothing (49.80 on Victoria: its 123 of 247 unanswerable questions) and against v2-3ep, paired
    seed by seed; training time as the mean per-seed ratio to v2-3ep's."""

    def row(model: str, seed: int, f1: float, seconds: float) -> dict:
        scores = {"exact": f1 - 1, "f1": f1, "HasAns_exact": 20.0, "HasAns_f1": 25.0,
                  "NoAns_exact": 80.0, "NoAns_f1": 80.0}  # fmt: skip
        return {"model": model, "seed": seed, "at_zero": {**scores, "f1": f1 - 8}, "at_tuned": scores,
                "best_f1": f1 + 2, "tuned_threshold": -2.0, "train_seconds": seconds}  # fmt: skip

    rows = [row("v2-3ep", 42, 44.0, 100.0), row("v2-3ep", 43, 46.0, 110.0)]
    rows += [row("v2-6ep", 42, 54.0, 200.0), row("v2-6ep", 43, 58.0, 231.0)]
    path = tmp_path / "squad2.json"
    path.write_text(json.dumps({"config": "local_v2.yaml", "rows": rows}))
    out = _bench("squad2", "report", "--json", str(path))
    assert "answering nothing scores F1 49.80 on Victoria_(Australia); the goal: 54.80" in out
    assert "| v2-3ep | 2 | 45.00 ± 1.41 | -4.80 [-17.50, +7.91] |" in out
    # 6ep - abstaining: +4.20 and +8.20; 6ep - 3ep: +10 and +12; time ratios 2.00 and 2.10.
    assert "| v2-6ep | 2 | 56.00 ± 2.83 | +6.20 [-19.21, +31.61] | 25.00 ± 0.00 | 80.00 ± 0.00 " in out
    assert "| 58.00 ± 2.83 | +11.00 [-1.71, +23.71] | 216 | 2.05 |" in out


def test_squad2_overhead_names_its_own_provenance_and_keeps_the_file_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """bench.squad2 overhead records its command, commit, date and machine in its own section and
    leaves the file's -- the run that trained its rows -- as they were; its report gives each
    step's extra time as a share of the forward passes."""
    from bench import squad2

    path = tmp_path / "squad2.json"
    trained = {"command": "python3 -m bench.squad2 run --seeds 42", "commit": "abc", "date": "2026-01-01",
               "machine": "AMD EPYC", "config": "local_v2.yaml", "rows": []}  # fmt: skip
    path.write_text(json.dumps(trained))
    timings = {"repeats": 5, "questions": 100, "windows": 120, "forward_s": 10.0,
               "postprocess_s": {"before": 0.5, "after": 0.75, "after + files": 1.0},
               "validation_after_vs_before": 1.02, "validation_with_files_vs_before": 1.05}  # fmt: skip
    monkeypatch.setattr(squad2, "overhead", lambda args: timings)  # the timing itself trains a model
    monkeypatch.setattr(sys, "argv", ["squad2", "overhead", "--json", str(path)])
    assert squad2.main() == 0
    data = json.loads(path.read_text())
    assert {k: data[k] for k in trained} == trained
    section = data["overhead"]
    assert section["command"] == f"python3 -m bench.squad2 overhead --json {path}"
    assert section["machine"] and section["date"] and section["commit"]
    out = capsys.readouterr().out
    assert "| + best_* and the tuned threshold | 0.750 | 0.250 | 2.50 % |" in out
    assert "| + the three output files | 1.000 | 0.500 | 5.00 % |" in out
    assert "1.020x its time before with best_* and the threshold, 1.050x with the output files too" in out


def test_throughput_refuses_a_stride_as_wide_as_the_window() -> None:
    """bench.throughput: --doc-stride not below --max-seq-length is a usage error naming both
    flags, before any model or data is loaded (not the run plan's traceback)."""
    done = completed(["-m", "bench.throughput", "--skip-trial", "--max-seq-length", "64"])
    assert done.returncode == 2, done.stderr[-2000:]
    assert "--doc-stride 128 must be smaller than --max-seq-length 64" in done.stderr
    assert "Traceback" not in done.stderr


def test_cluster_path_runs_local_yamls_own_length_or_the_batches_asked(tmp_path: Path) -> None:
    """`bench.cluster_path --batches 0` compares whole runs (local.yaml's own training length);
    any other count cuts both paths' runs to that many batches."""
    from bench import cluster_path
    from extractive_qa.config import experiment
    from extractive_qa.io.files import ROOT

    own = experiment.load_yaml(ROOT / "local.yaml")["hyperparameters"]["train_length"]
    whole, _ = cluster_path.config_for(0, tmp_path)
    short, _ = cluster_path.config_for(20, tmp_path)
    assert whole["hyperparameters"]["train_length"] == own
    assert short["hyperparameters"]["train_length"] == {"type": "const", "val": {"batches": 20}}
    assert whole["resources"]["slots_per_trial"] == short["resources"]["slots_per_trial"] == 2


def test_cluster_path_refuses_a_negative_batch_count_before_any_work() -> None:
    done = completed(["-m", "bench.cluster_path", "--batches", "-3"])
    assert done.returncode == 2 and "--batches -3" in done.stderr, done.stderr


def test_ci_fresh_clone_keeps_each_suites_seconds_and_summary() -> None:
    from bench.ci_fresh_clone import summaries

    log = "\n".join(
        [
            "CI: both venvs ready after 90 s",
            "compat: venv ready in 100 s",
            "===== seconds per test file (setup + call + teardown) =====",
            "   12.0  tests/test_a.py",
            "3 passed, 1 skipped in 12.00s",
            "compat: python 3.10.13 torch 2.3.1",
            "===== seconds per test file (setup + call + teardown) =====",
            "    5.0  tests/test_a.py",
            "1 failed, 2 passed in 5.00s",
            "CI: done in 200 s",
        ]
    )
    main, compat = summaries(log).split("\n\n")
    assert main.splitlines()[0].startswith("== main suite") and main.endswith("3 passed, 1 skipped in 12.00s")
    assert "compat: venv ready in 100 s" in compat and compat.endswith("1 failed, 2 passed in 5.00s")


def test_attention_backends_removes_the_model_it_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU benchmark builds a bert-base in a directory of its own; that directory is gone once
    it returns, whatever the measuring did (here: stopped by Ctrl-C)."""
    from bench import attention_backends

    given: list[Path] = []

    def measure(args: object, device: object, tmp: Path) -> int:
        given.append(tmp)
        (tmp / "model.safetensors").write_bytes(b"0" * 1024)
        raise KeyboardInterrupt

    monkeypatch.setattr(attention_backends.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(attention_backends, "measure", measure)
    monkeypatch.setattr(sys, "argv", ["attention_backends"])
    with pytest.raises(KeyboardInterrupt):
        attention_backends.main()
    assert given and not given[0].exists()
