"""SQuAD 2.0 all the way: best_* and the tuned threshold as the official v2.0 script computes them,
predict.py's three output files, the threshold saved with the checkpoint, the scoring CLI's
--na-prob-file, and the v2 metrics from the chief of an emulated 2-slot cluster run."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from extractive_qa.data.squad_files import load_squad
from extractive_qa.qa import squad_metric
from tests.support.cli_result import last_json
from tests.support.project import DEV_V1, DEV_V2, completed, run_cli, run_train, tiny_config, write_yaml


def official_script(version: str) -> Path | None:
    """The official evaluate-v1.1.py / evaluate-v2.0.py as shipped in `nlp` 0.4.0 (dev dependency)."""
    spec = importlib.util.find_spec("nlp")
    if spec is None or spec.origin is None:
        return None
    folder = "squad_v2" if version == "2.0" else "squad"
    for script in sorted((Path(spec.origin).parent / "metrics" / folder).glob("*/evaluate.py")):
        if "Official evaluation script" in script.read_text():
            return script
    return None


OFFICIAL_V2 = official_script("2.0")
needs_official = pytest.mark.skipif(
    OFFICIAL_V2 is None, reason="nlp==0.4.0 (requirements-dev.txt) not installed"
)


def official(data: Path, preds: Path, odds: Path | None = None, thresh: float | None = None) -> dict:
    command = [sys.executable, str(OFFICIAL_V2), str(data), str(preds)]
    command += ["-n", str(odds)] if odds else []
    command += ["-t", str(thresh)] if thresh is not None else []
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def ours(data: Path, preds: Path, odds: Path | None = None, thresh: float | None = None) -> dict:
    command = ["-m", "extractive_qa.qa.squad_metric", str(data), str(preds)]
    command += ["--na-prob-file", str(odds)] if odds else []
    command += ["--na-prob-thresh", str(thresh)] if thresh is not None else []
    return run_cli(command)


def assert_equal_key_for_key(a: dict, b: dict) -> None:
    assert set(a) == set(b), (sorted(a), sorted(b))
    for key in a:
        assert a[key] == pytest.approx(b[key], abs=1e-9), key


# Six questions of one paragraph: three answerable, three not.
CONTEXT = "Denver Broncos beat the Carolina Panthers in Santa Clara in February 2016."
QUESTIONS = [
    ("a1", "Who won?", [{"text": "Denver Broncos", "answer_start": 0}]),
    ("a2", "Who lost?", [{"text": "Carolina Panthers", "answer_start": 24}]),
    ("a3", "Where?", [{"text": "Santa Clara", "answer_start": 45}]),
    ("n1", "Who sang?", []),
    ("n2", "Who scored first?", []),
    ("n3", "How many came?", []),
]
SPANS = {"a1": "Denver Broncos", "a2": "the Panthers", "a3": "Clara", "n1": "Denver", "n2": "2016", "n3": ""}


def crafted_set(tmp: Path) -> Path:
    qas = [{"id": i, "question": q, "answers": a, "is_impossible": not a} for i, q, a in QUESTIONS]
    data = {"version": "v2.0", "data": [{"title": "t", "paragraphs": [{"context": CONTEXT, "qas": qas}]}]}
    path = tmp / "crafted-v2.json"
    path.write_text(json.dumps(data))
    return path


CASES = {
    "spread": {"a1": -3.0, "a2": 0.5, "a3": -1.0, "n1": 2.0, "n2": -0.5, "n3": 1.0},
    "ties": {"a1": 0.0, "a2": 0.0, "n1": 0.0, "a3": 1.0, "n2": 1.0, "n3": 0.0},
    "answers-last": {"a1": 5.0, "a2": 6.0, "a3": 7.0, "n1": -1.0, "n2": -2.0, "n3": -3.0},
    "no-null-best": {"a1": -5.0, "a2": -6.0, "a3": -7.0, "n1": 5.0, "n2": 6.0, "n3": 7.0},
    "edges": {"a1": 1.0, "a2": 1.0, "a3": 1.0, "n1": 1.0, "n2": 1.0, "n3": 1.0},
}


@needs_official
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("thresh", [None, 0.0, 1.0, -7.0])
def test_best_thresholds_equal_the_official_v2_script(
    case: str, thresh: float | None, tmp_path: Path
) -> None:
    data = crafted_set(tmp_path)
    (tmp_path / "p.json").write_text(json.dumps(SPANS))
    (tmp_path / "n.json").write_text(json.dumps(CASES[case]))
    expected = official(data, tmp_path / "p.json", tmp_path / "n.json", thresh)
    assert_equal_key_for_key(ours(data, tmp_path / "p.json", tmp_path / "n.json", thresh), expected)
    assert {"best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh"} <= set(expected)


def test_the_tuned_threshold_is_the_best_that_can_be_applied(tmp_path: Path) -> None:
    """Applied as `odds > threshold -> ""`, the tuned threshold scores the best F1 of any threshold
    (checked against every candidate); without ties in the odds that is the official best_f1 --
    also where answering nothing is best, for which the official script reports 0.0. With ties
    the official search can peak inside a tie, which no threshold reproduces."""
    examples = load_squad(crafted_set(tmp_path), training=False).examples

    def applied_f1(odds: dict[str, float], threshold: float) -> float:
        answers = {qid: "" if odds[qid] > threshold else text for qid, text in SPANS.items()}
        return squad_metric.score(examples, answers, "2.0")["f1"]

    for case, odds in CASES.items():
        best = squad_metric.best_thresholds(examples, SPANS, odds)
        tuned = squad_metric.tuned_null_threshold(examples, SPANS, odds)
        candidates = [*odds.values(), min(odds.values()) - 1.0, max(odds.values()) + 1.0]
        reachable = max(applied_f1(odds, t) for t in candidates)
        assert applied_f1(odds, tuned) == pytest.approx(reachable), case
        assert reachable <= best["best_f1"] + 1e-9, case
        if len(set(odds.values())) == len(odds):
            assert reachable == pytest.approx(best["best_f1"]), case
    # Every span wrong: answering nothing is best; the official threshold (0.0) would answer the
    # questions whose odds are below 0, the tuned one answers none.
    wrong = {qid: "nothing like it" for qid in SPANS}
    odds = CASES["spread"]
    all_null = squad_metric.best_thresholds(examples, wrong, odds)
    assert all_null["best_f1_thresh"] == 0.0 and all_null["best_f1"] == 50.0
    tuned = squad_metric.tuned_null_threshold(examples, wrong, odds)
    assert all(value > tuned for value in odds.values())


@pytest.fixture(scope="module")
def trained_v2(tiny_bert: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, Path]:
    """A tiny model trained 6 batches on the v2.0 excerpt, validated on it; its checkpoint and result."""
    tmp = tmp_path_factory.mktemp("trained-v2")
    conf = tiny_config(
        tiny_bert, tmp, train_file=str(DEV_V2), validation_file=str(DEV_V2), squad_version="2.0"
    )
    conf["data"]["save_predictions"] = True
    path = write_yaml(conf, tmp / "exp.yaml")
    args = ["--config", str(path), "--checkpoint-dir", str(tmp / "ckpt"), "--batches", "6"]
    code, result, err = run_train(args)
    assert code == 0, err
    return Path(result["checkpoint"]), result, tmp


def predict(*args: str) -> subprocess.CompletedProcess:
    return completed(["predict.py", *args])


def test_v2_validation_reports_best_scores_and_saves_the_tuned_threshold(trained_v2) -> None:
    ckpt, result, _ = trained_v2
    expected = ("exact", "f1", "HasAns_f1", "NoAns_f1", "best_exact", "best_exact_thresh", "best_f1")
    for key in (*expected, "best_f1_thresh"):
        assert key in result, key
    saved = json.loads((ckpt / "hf" / "qa_settings.json").read_text())
    assert isinstance(saved["tuned_null_threshold"], float)
    # The latest validation's outputs travel with the checkpoint (data.save_predictions).
    assert {p.name for p in (ckpt / "predictions").iterdir()} == {
        "predictions.json", "null_odds.json", "nbest_predictions.json"
    }  # fmt: skip


def test_predict_writes_the_three_files_and_they_score_as_the_official_script(trained_v2) -> None:
    ckpt, result, tmp = trained_v2
    out = tmp / "out"
    done = predict("--checkpoint", str(ckpt), "--squad", str(DEV_V2), "--out-dir", str(out))
    assert done.returncode == 0, done.stderr
    preds = json.loads((out / "predictions.json").read_text())
    odds = json.loads((out / "null_odds.json").read_text())
    nbest = json.loads((out / "nbest_predictions.json").read_text())
    examples = load_squad(DEV_V2, training=False).examples
    assert set(preds) == set(odds) == set(nbest) == {ex.id for ex in examples}
    for qid, spans in nbest.items():
        assert sum(s["probability"] for s in spans) == pytest.approx(1.0, abs=1e-6), qid
        assert any(s["text"] == "" and s["start"] == -1 for s in spans), qid  # v2.0: the null is listed
        assert [s["probability"] for s in spans] == sorted((s["probability"] for s in spans), reverse=True)
    # At the run's threshold (0) predict.py answers as the validation did.
    scored = ours(DEV_V2, out / "predictions.json")
    assert scored["exact"] == pytest.approx(result["exact"]) and scored["f1"] == pytest.approx(result["f1"])
    if OFFICIAL_V2 is not None:
        assert_equal_key_for_key(
            ours(DEV_V2, out / "predictions.json", out / "null_odds.json"),
            official(DEV_V2, out / "predictions.json", out / "null_odds.json"),
        )
    # The validation's best_* are the official script's on each question's best span.
    spans_out = tmp / "spans"
    done = predict("--checkpoint", str(ckpt), "--squad", str(DEV_V2), "--out-dir", str(spans_out),
                   "--null-threshold", "1e30")  # fmt: skip
    assert done.returncode == 0, done.stderr
    if OFFICIAL_V2 is not None:
        reference = official(DEV_V2, spans_out / "predictions.json", spans_out / "null_odds.json")
        for key in ("best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh"):
            assert result[key] == pytest.approx(reference[key], abs=1e-6), key


def test_the_tuned_threshold_from_the_checkpoint_changes_the_answers_as_it_should(trained_v2) -> None:
    ckpt, _, tmp = trained_v2
    tuned = json.loads((ckpt / "hf" / "qa_settings.json").read_text())["tuned_null_threshold"]
    spans_dir, tuned_dir = tmp / "t-spans", tmp / "t-tuned"
    for out, threshold in ((spans_dir, "1e30"), (tuned_dir, "tuned")):
        done = predict("--checkpoint", str(ckpt), "--squad", str(DEV_V2), "--out-dir", str(out),
                       "--null-threshold", threshold)  # fmt: skip
        assert done.returncode == 0, done.stderr
    assert last_json(done.stdout)["null_threshold"] == tuned
    spans = json.loads((spans_dir / "predictions.json").read_text())
    odds = json.loads((spans_dir / "null_odds.json").read_text())
    expected = {qid: "" if odds[qid] > tuned else text for qid, text in spans.items()}
    assert json.loads((tuned_dir / "predictions.json").read_text()) == expected


def _bad(command: list[str]) -> subprocess.CompletedProcess:
    done = completed(command[1:] if command[0] == sys.executable else command)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    return done


def test_bad_inputs_name_the_file_or_field(trained_v2, trained, tmp_path: Path) -> None:
    ckpt, _, _ = trained_v2
    metric = [sys.executable, "-m", "extractive_qa.qa.squad_metric"]
    preds = tmp_path / "p.json"
    preds.write_text(json.dumps({ex.id: "x" for ex in load_squad(DEV_V1, training=False).examples}))
    odds = tmp_path / "n.json"
    odds.write_text(json.dumps({ex.id: 0.0 for ex in load_squad(DEV_V1, training=False).examples}))
    assert "v1.1" in _bad([*metric, str(DEV_V1), str(preds), "--na-prob-file", str(odds)]).stderr
    v2_preds = tmp_path / "p2.json"
    v2_ids = [ex.id for ex in load_squad(DEV_V2, training=False).examples]
    v2_preds.write_text(json.dumps({i: "" for i in v2_ids}))
    partial = tmp_path / "n2.json"
    partial.write_text(json.dumps({i: 0.0 for i in v2_ids[:10]}))
    assert str(partial) in _bad([*metric, str(DEV_V2), str(v2_preds), "--na-prob-file", str(partial)]).stderr
    words = tmp_path / "n3.json"
    words.write_text(json.dumps({i: "high" for i in v2_ids}))
    assert "number" in _bad([*metric, str(DEV_V2), str(v2_preds), "--na-prob-file", str(words)]).stderr
    assert "--na-prob-thresh" in _bad([*metric, str(DEV_V2), str(v2_preds), "--na-prob-thresh", "x"]).stderr
    question = ["--question", "Who won?", "--context", "Denver won."]
    command = [sys.executable, "predict.py", *question, "--null-threshold"]
    bad_threshold = _bad([*command, "x", "--checkpoint", str(ckpt)])
    assert "--null-threshold" in bad_threshold.stderr
    v1_ckpt, _ = trained
    assert "v1.1" in _bad([*command, "tuned", "--checkpoint", str(v1_ckpt)]).stderr


def test_v2_on_two_slots_reports_best_scores_once_from_the_chief(tiny_bert: Path, tmp_path: Path) -> None:
    from test_cluster import shaped_like, trial_run

    from tests.support import det_cluster

    if (why := det_cluster.supported()) is not None:
        pytest.skip(f"emulated cluster: {why}")
    conf, hp = shaped_like("distributed.yaml", tiny_bert, tmp_path, batches=4, slots=2)
    conf["data"].update(train_file=str(DEV_V2), validation_file=str(DEV_V2), squad_version="2.0")
    cluster, record = trial_run(tmp_path, conf, hp, slots=2)
    assert record.exit_codes == [0], record.failures()
    validations = cluster.master.validations()
    assert len(validations) == 1  # one report per validation: the chief's
    metrics: dict[str, Any] = validations[0]["metrics"]
    assert {"best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh"} <= set(metrics)
    assert metrics["best_f1"] >= metrics["f1"] - 1e-9  # threshold 0 is one of the searched cuts
