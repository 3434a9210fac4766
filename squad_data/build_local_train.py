"""Build local-train-v1.1.json: every answerable real SQuAD question bundled here, as v1.1.

The v1.1 train excerpt (University_of_Notre_Dame) plus the answerable questions of the v2.0 dev
excerpt (Normans, Computational_complexity_theory, Southern_California, Sky_(United_Kingdom),
Victoria_(Australia)): none of these articles is Super_Bowl_50, the local validation article.
Unanswerable questions and v2.0-only fields are dropped; text, ids and answers are unchanged.

    python3 squad_data/build_local_train.py
"""

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    train = json.loads((HERE / "train-v1.1-excerpt.json").read_text(encoding="utf-8"))
    v2 = json.loads((HERE / "dev-v2.0-excerpt.json").read_text(encoding="utf-8"))
    articles = list(train["data"])
    for article in v2["data"]:
        paragraphs = []
        for para in article["paragraphs"]:
            qas = [
                {"id": qa["id"], "question": qa["question"], "answers": qa["answers"][:1]}
                for qa in para["qas"]
                if not qa.get("is_impossible") and qa["answers"]
            ]
            if qas:
                paragraphs.append({"context": para["context"], "qas": qas})
        articles.append({"title": article["title"], "paragraphs": paragraphs})
    out = {"version": "1.1", "data": articles}
    text = json.dumps(out, ensure_ascii=False)
    (HERE / "local-train-v1.1.json").write_text(text, encoding="utf-8")
    n = sum(len(p["qas"]) for a in articles for p in a["paragraphs"])
    print(f"wrote local-train-v1.1.json: {len(articles)} articles, {n} questions")


if __name__ == "__main__":
    main()
