"""squad_metric.py against hand-computed cases of the official scripts' rules."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from extractive_qa.data import squad_files
from extractive_qa.qa import squad_metric
from tests.support.cli_result import last_json
from tests.support.project import DEV_V1, DEV_V2, ROOT


@pytest.mark.parametrize(
    "text, normal",
    [
        ("The  Quick, brown fox!", "quick brown fox"),
        ("an apple a day", "apple day"),
        ("Theater", "theater"),  # 'the' only as a word
        ("A.B.C.", "abc"),
        ("  \tDenver\nBroncos ", "denver broncos"),
        ("the", ""),
    ],
)
def test_normalize(text: str, normal: str) -> None:
    assert squad_metric.normalize_answer(text) == normal


def test_f1_and_em_by_hand() -> None:
    assert squad_metric.exact_score("the Denver Broncos", "Denver Broncos!") == 1.0
    # pred {denver, broncos, team}, gold {broncos}: p=1/3 r=1 -> 0.5
    assert squad_metric.f1_score("Denver Broncos team", "Broncos") == pytest.approx(0.5)
    assert squad_metric.f1_score("x b b", "b b c") == pytest.approx(2 / 3)  # counts matter
    assert squad_metric.f1_score("a b b", "b b c") == pytest.approx(0.8)  # "a" is dropped
    assert squad_metric.f1_score("", "Broncos") == 0.0


def test_empty_answer_rules_differ_by_version() -> None:
    assert squad_metric.f1_score("", "", "2.0") == 1.0  # v2.0: both empty match
    assert squad_metric.f1_score("x", "", "2.0") == 0.0
    assert squad_metric.f1_score("", "the", "1.1") == 0.0  # v1.1 has no such rule


def _ex(qid: str, answers: list[str]) -> squad_files.Example:
    gold = [{"text": t, "answer_start": 0} for t in answers]
    return squad_files.Example(qid, "q", "ctx", gold, not answers)


def test_v1_max_over_references_and_missing_prediction() -> None:
    examples = [_ex("1", ["Denver Broncos", "Broncos"]), _ex("2", ["Santa Clara"])]
    scores = squad_metric.score(examples, {"1": "Broncos"}, "1.1")
    assert scores == {"exact_match": 50.0, "f1": 50.0}  # missing "2" counts as 0


def test_v2_breakdown() -> None:
    examples = [_ex("1", ["Normandy"]), _ex("2", []), _ex("3", [])]
    scores = squad_metric.score(examples, {"1": "Normandy region", "2": "", "3": "France"}, "2.0")
    assert scores["HasAns_total"] == 1 and scores["NoAns_total"] == 2 and scores["total"] == 3
    assert scores["HasAns_f1"] == pytest.approx(100 * 2 / 3)
    assert scores["NoAns_exact"] == 50.0
    assert scores["exact"] == pytest.approx(100 / 3)
    assert scores["f1"] == pytest.approx(100 * (2 / 3 + 1) / 3)


@pytest.mark.parametrize("path, version", [(DEV_V1, "1.1"), (DEV_V2, "2.0")])
def test_cli_round_trip(path: Path, version: str, tmp_path: Path) -> None:
    squad = squad_files.load_squad(path, training=False)
    # Perfect predictions score 100; dropping every other one halves v1.1 EM.
    perfect = {e.id: (e.answers[0]["text"] if e.answers else "") for e in squad.examples}
    preds = tmp_path / "p.json"
    preds.write_text(json.dumps(perfect))
    out = subprocess.run(
        [sys.executable, "-m", "extractive_qa.qa.squad_metric", str(path), str(preds)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    result = last_json(out.stdout)
    key = "exact_match" if version == "1.1" else "exact"
    assert result[key] == 100.0 and result["f1"] == 100.0
    if version == "2.0":
        assert result["HasAns_total"] == 705 and result["NoAns_total"] == 702
    wrong = {k: ("no idea" if i % 2 else v) for i, (k, v) in enumerate(perfect.items())}
    assert squad_metric.score(squad.examples, wrong, version)[key] < 60


def test_cli_bad_predictions(tmp_path: Path) -> None:
    preds = tmp_path / "p.json"
    preds.write_text("[1, 2]")
    out = subprocess.run(
        [sys.executable, "-m", "extractive_qa.qa.squad_metric", str(DEV_V1), str(preds)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and "id -> answer" in out.stderr and "Traceback" not in out.stderr
