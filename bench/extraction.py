"""Answer extraction: vectorised (data.extract_answers) vs the per-pair Python loop.

Both run on the same ~10k examples of random logits over real SQuAD windows (the v1.1 dev
excerpt repeated), answers are compared for identity, and the ratio printed.

    python3 bench/extraction.py [--examples 10000] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import data  # noqa: E402


def loop_extract(examples, features, start_logits, end_logits, n_best=20, max_answer_length=30):
    """The per-pair loop: every window, every (start, end) of its n_best candidates."""
    by_example: dict[int, list[int]] = {}
    for row, e in enumerate(features.example_index):
        by_example.setdefault(int(e), []).append(row)
    answers = {}
    for e, ex in enumerate(examples):
        best, best_span = -np.inf, None
        for row in by_example.get(e, []):
            offsets = features.offsets[row]
            s_logits = np.where(offsets[:, 0] >= 0, start_logits[row], -np.inf)
            e_logits = np.where(offsets[:, 0] >= 0, end_logits[row], -np.inf)
            starts = np.argsort(-s_logits, kind="stable")[:n_best]
            ends = np.argsort(-e_logits, kind="stable")[:n_best]
            for s in starts:
                for t in ends:
                    if offsets[s, 0] < 0 or offsets[t, 0] < 0 or t < s or t - s + 1 > max_answer_length:
                        continue
                    score = s_logits[s] + e_logits[t]
                    if score > best:
                        best, best_span = score, (offsets[s, 0], offsets[t, 1])
        answers[ex.id] = "" if best_span is None else ex.context[best_span[0] : best_span[1]]
    return answers


def setup(n_examples: int, seed: int = 0):
    squad = data.load_squad(ROOT / "squad_data/dev-v1.1-excerpt.json", training=False)
    tokenizer = data.load_tokenizer(data.EMBEDDED_MODEL)
    copies = -(-n_examples // len(squad.examples))
    examples = [
        data.Example(f"{ex.id}-{c}", ex.question, ex.context, ex.answers)
        for c in range(copies)
        for ex in squad.examples
    ][:n_examples]
    features = data.build_features(examples, tokenizer, data.WindowSpec(), labels=False, offsets=True)
    rng = np.random.default_rng(seed)
    shape = features.input_ids.shape
    return (
        examples,
        features,
        rng.normal(size=shape).astype(np.float32),
        rng.normal(size=shape).astype(np.float32),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=10000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    examples, features, start, end = setup(args.examples)
    t0 = time.perf_counter()
    ours = data.extract_answers(examples, features, start, end)
    t_ours = time.perf_counter() - t0
    t0 = time.perf_counter()
    ref = loop_extract(examples, features, start, end)
    t_loop = time.perf_counter() - t0
    result = {
        "examples": len(examples),
        "features": len(features),
        "loop_s": round(t_loop, 3),
        "vectorised_s": round(t_ours, 3),
        "speedup": round(t_loop / t_ours, 1),
        "identical_answers": ours.text == ref,
    }
    print(
        f"per-pair loop {t_loop:.2f} s, vectorised {t_ours:.2f} s: {result['speedup']}x, "
        f"identical answers: {result['identical_answers']}"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
