"""The benchmarks are tools users run to check our numbers: these check that they still run and
report what they say. No behaviour test depends on a benchmark (instruments the tests need live
in tests/, and the benchmarks import them)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.support.project import bench_output, completed


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


def test_batching_stats_and_report(tmp_path: Path) -> None:
    """bench/batching.py stats on the bundled text (no training) and the paired table."""
    path = tmp_path / "batching.json"
    rows = [
        {"batching": b, "pad_to_multiple_of": m, "seed": s, "f1": f1 + d, "exact_match": f1 + d - 8}
        for (b, m, d) in (("random", 8, 0.0), ("buckets", 64, -0.5))
        for s, f1 in zip([42, 43, 44], [50.0, 52.0, 51.0], strict=True)
    ]
    path.write_text(json.dumps({"config": "local.yaml", "baseline": "random/8", "rows": rows}))
    out = bench_output("batching.py", "stats", "--json", str(path), "--seeds", "42,43")
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
    out = bench_output("batching.py", "report", "--json", str(path))
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
    out = bench_output("cpu_precision", "report", "--json", str(path))
    assert "fixed: recipe fast, masks torch" in out
    assert "| bf16 | 5 | 51.60 ± 1.58 | 43.60 ± 1.58 | 242.0 |" in out
    assert "training time bf16 / fp32, runs measured here, per seed: 42: 0.800, 43: 0.801" in out
    assert "- precision bf16 - fp32: paired F1 -0.40 [-0.40, -0.40], n = 5; rule" in out
    assert "PASS: auto may pick bf16" in out
    path.write_text(json.dumps({"config": "local.yaml", "rows": rows(3.0)}))
    assert "FAIL: keep fp32 as the default" in bench_output("cpu_precision", "report", "--json", str(path))
    # Two bf16 runs with the fast masks: their own arm, compared with nothing of the other masks'.
    fast = [{**r, "masks": "fast", "f1": 0.0} for r in rows(0.4) if r["seed"] in (42, 43)]
    path.write_text(json.dumps({"config": "local.yaml", "rows": rows(0.4) + fast}))
    out = bench_output("cpu_precision", "report", "--json", str(path))
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
    bench_output("cache_check", "--windows", "500", "--length", "64", "--json", str(out))
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
    out = bench_output("cpu_precision", "recipes-report", "--json", str(path))
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
    out = bench_output(
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


@pytest.mark.parametrize("optimizer", ["adamw", "radam"])
def test_master_weights_rebuild_the_trials_optimizer_over_fp32_copies(optimizer: str) -> None:
    """The ladder's master-weights rung: the trial's own optimizer, rebuilt over the fp32 copies
    with its class and options (torch's AdamW keeps an option among its defaults that its
    constructor does not take), steps those copies and rounds them into the bf16 model."""
    import torch

    from bench.common import MasterWeights
    from extractive_qa.config.settings import Hyperparameters
    from extractive_qa.trial import optimization

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    hp = Hyperparameters(optimizer=optimizer)
    built = optimization.build_optimizer(model, hp, 1e-2, torch.device("cpu"))
    masters = MasterWeights(model)
    rebuilt = masters.optimizer_over_masters(built)
    assert type(rebuilt) is type(built)
    assert [g["weight_decay"] for g in rebuilt.param_groups] == [hp.weight_decay, 0.0]
    before = [p.clone() for p in masters.fp32]
    loss = model(torch.ones(2, 4, dtype=torch.bfloat16)).float().square().sum()
    loss.backward()
    masters.take_gradients()
    rebuilt.step()
    masters.give_weights()
    assert any(not torch.equal(a, b) for a, b in zip(before, masters.fp32, strict=True))
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
