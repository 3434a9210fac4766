"""Build the SQuAD 2.0 files of local_v2.yaml and its study from the bundled excerpts.

The five articles of the v2.0 dev excerpt are split by article, so no question of a held-out
article is trained on:
- local-train-v2.0.json: the v1.1 train excerpt (University_of_Notre_Dame, all answerable) plus
  Normans, Computational_complexity_theory and Southern_California as published (with their
  unanswerable questions): what local_v2.yaml trains on;
- local-train-v2.0-answerable.json: the same without the unanswerable questions: the v1.1-style
  model the study compares against (same articles, no "no answer" examples);
- local-train-v2.0-more.json: local-train-v2.0.json plus the v1.1 dev excerpt's article
  Super_Bowl_50 (810 answerable questions; no held-out article's text): the study's arm that
  asks what more answerable questions buy;
- local-tune-v2.0.json: Sky_(United_Kingdom), held out from training, to tune the no-answer
  threshold on;
- local-dev-v2.0.json: Victoria_(Australia), held out from training and tuning: what
  local_v2.yaml validates on (247 questions, 123 unanswerable).
Text, ids and answers are unchanged; v1.1 questions get `is_impossible: false`.

    python3 squad_data/build_local_v2.py
"""

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRAIN = ("Normans", "Computational_complexity_theory", "Southern_California")
TUNE = "Sky_(United_Kingdom)"
DEV = "Victoria_(Australia)"


def write(name: str, articles: list) -> None:
    out = {"version": "v2.0", "data": articles}
    (HERE / name).write_text(json.dumps(out, ensure_ascii=False), encoding="utf-8")
    qas = [qa for a in articles for p in a["paragraphs"] for qa in p["qas"]]
    unanswerable = sum(qa["is_impossible"] for qa in qas)
    print(f"wrote {name}: {len(articles)} articles, {len(qas)} questions ({unanswerable} unanswerable)")


def answerable_only(article: dict) -> dict:
    paragraphs = []
    for para in article["paragraphs"]:
        qas = [qa for qa in para["qas"] if not qa["is_impossible"]]
        if qas:
            paragraphs.append({**para, "qas": qas})
    return {**article, "paragraphs": paragraphs}


def answerable(v1: dict) -> list:
    """A v1.1 file's articles with every question marked `is_impossible: false`."""
    return [
        {
            **article,
            "paragraphs": [
                {**para, "qas": [{**qa, "is_impossible": False} for qa in para["qas"]]}
                for para in article["paragraphs"]
            ],
        }
        for article in v1["data"]
    ]


def main() -> None:
    v1 = json.loads((HERE / "train-v1.1-excerpt.json").read_text(encoding="utf-8"))
    v2_dev = json.loads((HERE / "dev-v2.0-excerpt.json").read_text(encoding="utf-8"))
    v2 = {article["title"]: article for article in v2_dev["data"]}
    notre_dame = answerable(v1)
    train = notre_dame + [v2[title] for title in TRAIN]
    write("local-train-v2.0.json", train)
    v1_dev = json.loads((HERE / "dev-v1.1-excerpt.json").read_text(encoding="utf-8"))
    write("local-train-v2.0-more.json", notre_dame + answerable(v1_dev) + [v2[title] for title in TRAIN])
    write("local-train-v2.0-answerable.json", [answerable_only(a) for a in train])
    write("local-tune-v2.0.json", [v2[TUNE]])
    write("local-dev-v2.0.json", [v2[DEV]])


if __name__ == "__main__":
    main()
