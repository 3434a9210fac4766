"""Reference answer extraction the tests compare answers.extract_answers against (benchmarks time it).

`loop_extract`: the per-pair loop over context-only candidates -- the same rule as
answers.extract_answers, written the slow, obvious way. `standard_postprocess`: the recipe of the
transformers QA examples, as users run it -- per example, per window, the n_best highest start
and end logits (not masked: candidates outside the context are skipped in the pair loop), every
valid pair kept with its offsets, the n_best best per example softmaxed, the best taken.
"""

from __future__ import annotations

import numpy as np

from extractive_qa.config.model_family import EMBEDDED_MODEL
from extractive_qa.config.settings import WindowSpec
from extractive_qa.data import squad_files
from extractive_qa.data.features import Features, build_features, load_tokenizer
from extractive_qa.io.files import ROOT


def windows_by_example(features: Features) -> dict[int, list[int]]:
    """Example index -> its window rows, in feature order."""
    by_example: dict[int, list[int]] = {}
    for row, e in enumerate(features.example_index):
        by_example.setdefault(int(e), []).append(row)
    return by_example


def loop_extract(examples, features, start_logits, end_logits, n_best=20, max_answer_length=30):
    """The per-pair loop: every window, every (start, end) of its n_best candidates."""
    by_example = windows_by_example(features)
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
    squad = squad_files.load_squad(ROOT / "squad_data/dev-v1.1-excerpt.json", training=False)
    tokenizer = load_tokenizer(EMBEDDED_MODEL)
    copies = -(-n_examples // len(squad.examples))
    examples = [
        squad_files.Example(f"{ex.id}-{c}", ex.question, ex.context, ex.answers)
        for c in range(copies)
        for ex in squad.examples
    ][:n_examples]
    features = build_features(examples, tokenizer, WindowSpec(), labels=False, offsets=True)
    rng = np.random.default_rng(seed)
    shape = features.input_ids.shape
    return (
        examples,
        features,
        rng.normal(size=shape).astype(np.float32),
        rng.normal(size=shape).astype(np.float32),
    )


def trained_shaped(features: Features, logits: np.ndarray) -> np.ndarray:
    """Logits shaped like a trained model's: question, special and padding tokens pushed down."""
    in_context = np.asarray(features.offsets)[:, :, 0] >= 0
    return np.where(in_context, logits, logits - 10.0).astype(np.float32)


def standard_postprocess(examples, features, start_logits, end_logits, n_best=20, max_answer_length=30):
    """The transformers QA examples' post-processing (v1.1), returning id -> answer text."""
    by_example = windows_by_example(features)
    answers = {}
    for e, ex in enumerate(examples):
        candidates = []
        for row in by_example.get(e, []):
            offsets = features.offsets[row]
            starts = np.argsort(start_logits[row])[-1 : -n_best - 1 : -1].tolist()
            ends = np.argsort(end_logits[row])[-1 : -n_best - 1 : -1].tolist()
            for s in starts:
                for t in ends:
                    if offsets[s][0] < 0 or offsets[t][0] < 0 or t < s or t - s + 1 > max_answer_length:
                        continue
                    candidates.append(
                        {
                            "offsets": (int(offsets[s][0]), int(offsets[t][1])),
                            "score": float(start_logits[row][s] + end_logits[row][t]),
                        }
                    )
        candidates = sorted(candidates, key=lambda c: c["score"], reverse=True)[:n_best]
        for c in candidates:
            c["text"] = ex.context[c["offsets"][0] : c["offsets"][1]]
        if not candidates:
            candidates = [{"text": "", "score": 0.0}]
        scores = np.array([c["score"] for c in candidates])
        probs = np.exp(scores - scores.max())
        probs /= probs.sum()
        for c, p in zip(candidates, probs, strict=True):
            c["probability"] = float(p)
        answers[ex.id] = candidates[0]["text"]
    return answers
