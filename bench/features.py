"""Feature preparation: our paragraph-once path vs the standard fast-tokenizer recipe.

The standard recipe (the transformers QA examples' method, tests/support/reference_features.py): batched
tokenizer calls over (question, context) pairs, 1,000 examples per call as `datasets.map` runs
it, with overflow windows and offset mappings, padded to max length, then a Python loop that
labels start/end tokens. Both run side by side on the same ~40k real examples
(the v1.1 train excerpt repeated with fresh ids, each copy's contexts given a distinct tail so no
copy shares a paragraph with another), features are compared for identity, and the ratio printed.

    python3 -m bench.features [--copies 150] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from bench.common import provenance
from extractive_qa import cli
from extractive_qa.config.model_family import EMBEDDED_MODEL
from extractive_qa.config.settings import WindowSpec
from extractive_qa.data import squad_files
from extractive_qa.data.features import build_features, load_tokenizer
from extractive_qa.io.files import ROOT
from tests.support.reference_features import compare, standard_recipe


def replicate(examples, copies: int) -> list[squad_files.Example]:
    """Copies of the excerpt with fresh ids; each copy's contexts get a distinct tail."""
    out = []
    for c in range(copies):
        tail = f" (copy {c})"
        for ex in examples:
            out.append(squad_files.Example(f"{ex.id}-{c}", ex.question, ex.context + tail, ex.answers))
    return out


@cli.boundary
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--copies", type=int, default=150, help="150 copies = ~40k examples")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    squad = squad_files.load_squad(ROOT / "squad_data/train-v1.1-excerpt.json", training=True)
    tokenizer = load_tokenizer(EMBEDDED_MODEL)
    examples = replicate(squad.examples, args.copies)
    spec = WindowSpec()

    t0 = time.perf_counter()
    standard = standard_recipe(examples, tokenizer, spec)
    t_standard = time.perf_counter() - t0
    t0 = time.perf_counter()
    ours = build_features(examples, tokenizer, spec, labels=True, offsets=False)
    t_ours = time.perf_counter() - t0
    differ = compare(ours, standard)
    result = {
        "examples": len(examples),
        "features": len(ours),
        "standard_examples_per_s": round(len(examples) / t_standard, 1),
        "ours_examples_per_s": round(len(examples) / t_ours, 1),
        "speedup": round(t_standard / t_ours, 2),
        "identical_features": not differ,
        "differing_arrays": differ,
        **provenance("bench.features", sys.argv[1:]),
    }
    print(f"{'path':<28}{'examples/s':>12}")
    print(f"{'standard recipe':<28}{result['standard_examples_per_s']:>12}")
    print(f"{'ours (paragraph once)':<28}{result['ours_examples_per_s']:>12}")
    print(f"speedup {result['speedup']}x, identical features: {result['identical_features']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
