"""SQuAD scoring, equal to the official evaluate-v1.1.py / evaluate-v2.0.py.

Answers are normalised (lower case, punctuation removed, articles a/an/the dropped, whitespace
collapsed); EM and F1 take the best over the reference answers. v2.0: an unanswerable question's
only reference is "" and it scores 1 only for an empty prediction.

CLI, a drop-in for the official scripts:
    python3 -m extractive_qa.squad_metric DATA.json PREDICTIONS.json
prints one JSON object (v1.1: exact_match, f1; v2.0: exact, f1, total, HasAns_*, NoAns_*).
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import string
import sys
from collections.abc import Iterable, Mapping

from extractive_qa.squad_json import Example, load_squad
from extractive_qa.squad_sources import DataError

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


def score(examples: Iterable[Example], predictions: Mapping[str, str], version: str) -> dict[str, float]:
    """EM / F1 (in percent) as the official script of `version` reports them."""
    examples = list(examples)
    exact: dict[str, float] = {}
    f1: dict[str, float] = {}
    for ex in examples:
        if ex.id not in predictions:
            if version == "1.1":
                exact[ex.id] = f1[ex.id] = 0.0  # v1.1 counts a missing prediction as wrong
            else:
                continue  # the v2.0 script skips (and warns about) missing predictions
            continue
        pred = predictions[ex.id]
        refs = references(ex, version)
        exact[ex.id] = max(exact_score(pred, r) for r in refs)
        f1[ex.id] = max(f1_score(pred, r, version) for r in refs)
    if version == "1.1":
        n = len(examples)
        return {"exact_match": 100.0 * sum(exact.values()) / n, "f1": 100.0 * sum(f1.values()) / n}

    def block(ids: list[str], prefix: str) -> dict[str, float]:
        if not ids:
            return {}
        return {
            f"{prefix}exact": 100.0 * sum(exact.get(i, 0.0) for i in ids) / len(ids),
            f"{prefix}f1": 100.0 * sum(f1.get(i, 0.0) for i in ids) / len(ids),
            f"{prefix}total": len(ids),
        }

    # As in the v2.0 script: the overall total counts answered ids; HasAns / NoAns go by whether
    # the question lists any answer.
    answered = [ex.id for ex in examples if ex.id in exact]
    has_ans = [ex.id for ex in examples if ex.answers]
    no_ans = [ex.id for ex in examples if not ex.answers]
    return {**block(answered, ""), **block(has_ans, "HasAns_"), **block(no_ans, "NoAns_")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m extractive_qa.squad_metric",
        description="EM/F1 of a predictions file, as the official SQuAD v1.1 / v2.0 scripts score it.",
    )
    parser.add_argument("data_file", help="SQuAD JSON (v1.1 or v2.0)")
    parser.add_argument("pred_file", help="JSON object: question id -> answer text")
    args = parser.parse_args(argv)
    data_file, pred_file = args.data_file, args.pred_file
    try:
        squad = load_squad(data_file, training=False)
        try:
            with open(pred_file, encoding="utf-8") as f:
                predictions = json.load(f)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise DataError(f"{pred_file}: cannot read predictions ({err}).") from None
        if not isinstance(predictions, dict) or not all(isinstance(v, str) for v in predictions.values()):
            raise DataError(f"{pred_file}: predictions must be a JSON object of id -> answer text.")
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(score(squad.examples, predictions, squad.version)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
