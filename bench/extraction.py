"""Answer extraction: vectorised (extract_answers) vs the standard post-processing.

The baseline is what users of the transformers QA examples run (tests/support/reference_extraction.py:
standard_postprocess). Both run on the same ~10k examples over real SQuAD windows (the v1.1 dev
excerpt repeated) with two kinds of logits: random, and shaped like a trained model's (low on
question, special and padding tokens -- the baseline then has more in-context candidates to
pair, as on real predictions). Answers are checked for identity against the per-pair reference
loop (same rule as ours) and for agreement with the baseline; the ratio is printed per kind.

    python3 -m bench.extraction [--examples 10000] [--repeats 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import provenance
from extractive_qa import cli
from extractive_qa.qa.answers import extract_answers
from tests.support.reference_extraction import loop_extract, setup, standard_postprocess, trained_shaped


def best_of(repeats: int, fn: Callable[..., Any], *args: Any) -> tuple[Any, float]:
    """The result and the fastest of `repeats` timed calls (the first also pays cold caches)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn(*args)
        times.append(time.perf_counter() - t0)
    return out, min(times)


@cli.boundary
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=10000)
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per path; the best counts")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    examples, features, start, end = setup(args.examples)
    result: dict = {"examples": len(examples), "features": len(features)}
    for kind in ("random", "trained_shaped"):
        if kind == "trained_shaped":
            start, end = trained_shaped(features, start), trained_shaped(features, end)
        ours, t_ours = best_of(args.repeats, extract_answers, examples, features, start, end)
        standard, t_standard = best_of(args.repeats, standard_postprocess, examples, features, start, end)
        agree = sum(ours.text[k] == v for k, v in standard.items()) / len(standard)
        result[kind] = {
            "standard_s": round(t_standard, 3),
            "vectorised_s": round(t_ours, 3),
            "speedup": round(t_standard / t_ours, 1),
            "identical_to_reference_loop": ours.text == loop_extract(examples, features, start, end),
            "agreement_with_standard": round(agree, 4),
        }
        r = result[kind]
        print(
            f"{kind:15s} standard post-processing {t_standard:.2f} s, vectorised {t_ours:.2f} s: "
            f"{r['speedup']}x; identical to the reference loop: {r['identical_to_reference_loop']}; "
            f"same answer as the standard: {agree:.2%}"
        )
    result.update(provenance("bench.extraction", sys.argv[1:]))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
