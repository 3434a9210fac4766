"""SQuAD scoring, equal to the official evaluate-v1.1.py / evaluate-v2.0.py.

Answers are normalised (lower case, punctuation removed, articles a/an/the dropped, whitespace
collapsed); EM and F1 take the best over the reference answers. v2.0: an unanswerable question's
only reference is "" and it scores 1 only for an empty prediction.

CLI, a drop-in for the official scripts:
    python3 -m extractive_qa.qa.squad_metric DATA.json PREDICTIONS.json [--na-prob-file NULL_ODDS.json]
prints one JSON object (v1.1: exact_match, f1; v2.0: exact, f1, total, HasAns_*, NoAns_*, and with
--na-prob-file best_exact, best_exact_thresh, best_f1, best_f1_thresh).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import re
import string
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from extractive_qa import cli
from extractive_qa.data.squad_files import Example, load_squad
from extractive_qa.errors import DataError
from extractive_qa.io import reading

_PUNCTUATION = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(text: str) -> str:
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _tokens(text: str) -> list[str]:
    return normalize_answer(text).split() if text else []


def exact_score(prediction: str, truth: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(truth))


def f1_score(prediction: str, truth: str, version: str = "1.1") -> float:
    pred, gold = _tokens(prediction), _tokens(truth)
    if version == "2.0" and (not pred or not gold):
        return float(pred == gold)  # v2.0 rule: both empty is a match, one empty is not
    common = collections.Counter(pred) & collections.Counter(gold)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(gold)
    return 2 * precision * recall / (precision + recall)


def references(example: Example, version: str) -> list[str]:
    texts = [a["text"] for a in example.answers]
    if version == "2.0":
        # The v2.0 script drops references that normalise to nothing; none left means "".
        texts = [t for t in texts if normalize_answer(t)]
        return texts or [""]
    return texts


def raw_scores(
    examples: Iterable[Example], predictions: Mapping[str, str], version: str
) -> tuple[dict[str, float], dict[str, float]]:
    """Per question id with a prediction: EM and F1 (0/1 and 0..1), best over its references."""
    exact: dict[str, float] = {}
    f1: dict[str, float] = {}
    for ex in examples:
        if ex.id in predictions:
            pred, refs = predictions[ex.id], references(ex, version)
            exact[ex.id] = max(exact_score(pred, r) for r in refs)
            f1[ex.id] = max(f1_score(pred, r, version) for r in refs)
    return exact, f1


def apply_null_threshold(
    scores: Mapping[str, float], examples: Iterable[Example], null_odds: Mapping[str, float], threshold: float
) -> dict[str, float]:
    """The v2.0 script's rule: a question whose null odds exceed the threshold is answered "",
    which scores 1 where it has no answer and 0 where it has one."""
    has_answer = {ex.id: bool(ex.answers) for ex in examples}
    out = {}
    for qid, value in scores.items():
        out[qid] = float(not has_answer[qid]) if null_odds.get(qid, 0.0) > threshold else value
    return out


def score(
    examples: Iterable[Example],
    predictions: Mapping[str, str],
    version: str,
    null_odds: Mapping[str, float] | None = None,
    null_threshold: float = 1.0,
) -> dict[str, float]:
    """EM / F1 (in percent) as the official script of `version` reports them. v2.0 with
    `null_odds` (the script's --na-prob-file) also applies `null_threshold` (its --na-prob-thresh)
    and reports best_exact / best_f1 and the thresholds that reach them."""
    examples = list(examples)
    exact, f1 = raw_scores(examples, predictions, version)
    if version == "1.1":
        n = len(examples)  # v1.1 counts a missing prediction as wrong
        return {"exact_match": 100.0 * sum(exact.values()) / n, "f1": 100.0 * sum(f1.values()) / n}
    raw_exact, raw_f1 = exact, f1
    if null_odds is not None:
        exact = apply_null_threshold(exact, examples, null_odds, null_threshold)
        f1 = apply_null_threshold(f1, examples, null_odds, null_threshold)

    def block(ids: list[str], prefix: str) -> dict[str, float]:
        if not ids:
            return {}
        return {
            f"{prefix}exact": 100.0 * sum(exact.get(i, 0.0) for i in ids) / len(ids),
            f"{prefix}f1": 100.0 * sum(f1.get(i, 0.0) for i in ids) / len(ids),
            f"{prefix}total": len(ids),
        }

    # As in the v2.0 script: the overall total counts answered ids (it skips, and warns about,
    # missing predictions); HasAns / NoAns go by whether the question lists any answer.
    answered = [ex.id for ex in examples if ex.id in exact]
    has_ans = [ex.id for ex in examples if ex.answers]
    no_ans = [ex.id for ex in examples if not ex.answers]
    out = {**block(answered, ""), **block(has_ans, "HasAns_"), **block(no_ans, "NoAns_")}
    if null_odds is not None:
        out.update(best_thresholds(examples, predictions, null_odds, raw_exact, raw_f1))
    return out


def best_thresholds(
    examples: Sequence[Example],
    predictions: Mapping[str, str],
    null_odds: Mapping[str, float],
    raw_exact: Mapping[str, float] | None = None,
    raw_f1: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """best_exact, best_exact_thresh, best_f1, best_f1_thresh: the official v2.0 script's search.

    Questions are switched from "" to their predicted answer in order of rising null odds; the
    score after each switch is kept if it is the best so far, with that question's odds as the
    threshold (ties in the odds go in `null_odds`' order, as the script's sort leaves them). Pass
    each question's best span as `predictions` (evaluation's `Answers.span_text`): the search
    decides which of them to blank. Tuned and scored on the same questions, this is optimistic.
    """
    if raw_exact is None or raw_f1 is None:
        raw_exact, raw_f1 = raw_scores(examples, predictions, "2.0")
    out = {}
    for name, scores in (("exact", raw_exact), ("f1", raw_f1)):
        best, threshold, _ = _threshold_search(examples, predictions, null_odds, scores)
        out[f"best_{name}"] = best
        out[f"best_{name}_thresh"] = threshold
    return out


def tuned_null_threshold(
    examples: Sequence[Example], predictions: Mapping[str, str], null_odds: Mapping[str, float]
) -> float:
    """The threshold with the best F1 when applied as `odds > threshold -> ""`.

    The official search (best_f1_thresh) can peak inside a run of equal odds, which no threshold
    reproduces, and reports 0.0 where answering nothing is best, which need not blank anything.
    This searches only thresholds that can be applied: each distinct odds value, and one below
    them all (answer nothing). Without ties in the odds it reaches best_f1."""
    _, raw_f1 = raw_scores(examples, predictions, "2.0")
    has_answer = {ex.id: bool(ex.answers) for ex in examples}
    ranked = sorted((float(null_odds[q]), q) for q in raw_f1 if q in null_odds)
    if not ranked:
        return 0.0
    current = best = float(sum(not has_answer[q] for q in raw_f1))
    threshold = ranked[0][0] - 1.0  # below every odds value: every question answered ""
    for i, (odds, qid) in enumerate(ranked):
        current += raw_f1[qid] if has_answer[qid] else -float(bool(predictions[qid]))
        last_of_its_value = i + 1 == len(ranked) or ranked[i + 1][0] != odds
        if last_of_its_value and current > best:
            best, threshold = current, odds
    return threshold


def _threshold_search(
    examples: Sequence[Example],
    predictions: Mapping[str, str],
    null_odds: Mapping[str, float],
    scores: Mapping[str, float],
) -> tuple[float, float, bool]:
    """The v2.0 script's find_best_thresh: (best score in percent, its threshold, whether any
    question was switched to its answer to reach it)."""
    has_answer = {ex.id: bool(ex.answers) for ex in examples}
    current = best = float(sum(not v for v in has_answer.values()))
    threshold, switched = 0.0, False
    for qid in sorted(null_odds, key=lambda k: null_odds[k]):
        if qid not in scores:
            continue
        if has_answer[qid]:
            current += scores[qid]
        elif predictions[qid]:
            current -= 1
        if current > best:
            best, threshold, switched = current, float(null_odds[qid]), True
    return (100.0 * best / len(scores) if scores else 0.0), threshold, switched


def _read_json_object(path: str, what: str, value_type: type | tuple[type, ...]) -> dict:
    try:
        content = reading.read_json(path, reading.DATA, what=what)
    except reading.UnreadableFile as err:
        raise DataError(f"cannot read {what}: {err}") from None
    if not isinstance(content, dict) or not all(
        isinstance(v, value_type) and not isinstance(v, bool) for v in content.values()
    ):
        kind = "answer text" if value_type is str else "number"
        raise DataError(f"{path}: {what} must be a JSON object of question id -> {kind}.")
    return content


def read_null_odds(args: argparse.Namespace, squad: Any, predictions: dict[str, str]) -> dict[str, float]:
    """--na-prob-file: finite odds for every predicted question of a v2.0 file."""
    if squad.version != "2.0":
        raise DataError(
            f"--na-prob-file: {args.data_file} is SQuAD v1.1, which has no unanswerable "
            "questions; no-answer odds apply to v2.0 only."
        )
    null_odds = _read_json_object(args.na_prob_file, "no-answer odds", (int, float))
    odd = [qid for qid, odds in null_odds.items() if not math.isfinite(odds)]
    if odd:  # NaN or infinity would make the report itself not JSON
        raise DataError(
            f"{args.na_prob_file}: {len(odd)} odds are not finite numbers (e.g. {odd[0]}: "
            f"{null_odds[odd[0]]}); write it again from predict.py."
        )
    lacking = [ex.id for ex in squad.examples if ex.id in predictions and ex.id not in null_odds]
    if lacking:
        raise DataError(
            f"{args.na_prob_file}: no odds for {len(lacking)} predicted question(s), "
            f"e.g. {lacking[:3]}; write it from the same run as {args.pred_file}."
        )
    return null_odds


@cli.boundary
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m extractive_qa.qa.squad_metric",
        description="EM/F1 of a predictions file, as the official SQuAD v1.1 / v2.0 scripts score it.",
    )
    parser.add_argument("data_file", help="SQuAD JSON (v1.1 or v2.0)")
    parser.add_argument("pred_file", help="JSON object: question id -> answer text")
    parser.add_argument(
        "--na-prob-file", "-n", help="v2.0: JSON object id -> no-answer odds (predict.py's null_odds.json)"
    )
    parser.add_argument(
        "--na-prob-thresh", "-t", type=float, default=1.0,
        help='v2.0: predict "" where the odds exceed this (default 1.0, as the official script)',
    )  # fmt: skip
    args = parser.parse_args(argv)
    squad = load_squad(args.data_file, training=False)  # a refused file: cli.boundary's one line
    predictions = _read_json_object(args.pred_file, "predictions", str)
    null_odds = read_null_odds(args, squad, predictions) if args.na_prob_file else None
    ids = [ex.id for ex in squad.examples]
    missing = [i for i in ids if i not in predictions]
    if len(missing) == len(ids):
        print(
            f"error: {args.pred_file}: none of its {len(predictions)} ids is a question of "
            f"{args.data_file} ({len(ids)} questions): predictions of another data set?",
            file=sys.stderr,
        )
        return 2
    for qid in missing:  # as the official scripts warn, one line per question
        print(f"Missing prediction for {qid}", file=sys.stderr)
    extra = len(set(predictions) - set(ids))
    if missing or extra:
        subset = (
            "the v2.0 figures are over the answered questions only"
            if squad.version == "2.0"
            else ("v1.1 counts each missing one as wrong")
        )
        print(
            f"warning: {len(missing)} of {len(ids)} questions have no prediction ({subset}); "
            f"{extra} prediction(s) match no question.",
            file=sys.stderr,
        )
    print(json.dumps(score(squad.examples, predictions, squad.version, null_odds, args.na_prob_thresh)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
