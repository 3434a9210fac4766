"""The benchmarks are tools users run to check our numbers: these check that they still run and
report what they say. No behaviour test depends on a benchmark (instruments the tests need live
in tests/, and the benchmarks import them)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT


def test_inference_benchmark_runs_predicts_path_and_reports(trained, tmp_path: Path) -> None:
    ckpt, _ = trained
    out_json = tmp_path / "inference.json"
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "inference.py"),
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
        ],
        capture_output=True,
        text=True,
        timeout=300,
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
