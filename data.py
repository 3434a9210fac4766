"""SQuAD data: the one entry the trial, predict.py, the tests and benchmarks import.

Each job has its own module, read in this order: squad_sources.py (where a file comes from:
local path or official URL, verified), squad_json.py (parsing and checks), features.py (the
tokenizer; questions and contexts -> fixed-length windows), feature_cache.py (memory-mapped
NumPy caches), answers.py (model logits -> answer strings). Evaluation (model_def.py) and
inference (predict.py) both use `build_features` and `extract_answers`, so there is one
implementation of windowing and extraction.

CLI (preprocess ahead of time so cluster ranks map a ready cache):
    python3 data.py --squad PATH_OR_URL --tokenizer NAME_OR_DIR --split train|validation \
        [--max-seq-length 384 --doc-stride 128 --max-query-length 64] --cache-dir DIR [--no-cache]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

# The public names, where they have always been imported from (data.X).
from answers import Answers, extract_answers  # noqa: F401
from feature_cache import (  # noqa: F401
    FEATURES_VERSION,
    cache_damage,
    features_fingerprint,
    load_features,
    prepare_features,
)
from features import (  # noqa: F401
    EMBEDDED_MODEL,
    Features,
    WindowSpec,
    build_features,
    load_tokenizer,
    resolve_pretrained,
    tokenizer_fingerprint,
    window_starts,
)
from squad_json import Example, SquadSet, load_squad  # noqa: F401
from squad_sources import (  # noqa: F401
    OFFICIAL_BASE_URL,
    OFFICIAL_SHA256,
    DataError,
    default_download_dir,
    resolve_source,
    sha256_file,
    write_text_atomic,
)

# --------------------------------------------------------------------------------------------
# CLI: preprocess ahead of time.
# --------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--squad", required=True, help="SQuAD JSON path or URL")
    parser.add_argument("--tokenizer", required=True, help="hub name or local model directory")
    parser.add_argument("--split", required=True, choices=["train", "validation"])
    parser.add_argument("--max-seq-length", type=int, default=WindowSpec.max_seq_length)
    parser.add_argument("--doc-stride", type=int, default=WindowSpec.doc_stride)
    parser.add_argument("--max-query-length", type=int, default=WindowSpec.max_query_length)
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument("--no-cache", action="store_true", help="build in memory, write nothing")
    args = parser.parse_args(argv)
    if args.cache_dir is None and not args.no_cache:
        parser.error("give --cache-dir DIR (or --no-cache to only measure)")
    spec = WindowSpec(args.max_seq_length, args.doc_stride, args.max_query_length)
    try:
        t0 = time.perf_counter()
        squad = load_squad(args.squad, training=args.split == "train")
        tokenizer = load_tokenizer(args.tokenizer)
        cache = None if args.no_cache else args.cache_dir
        features, state = prepare_features(
            squad, tokenizer, args.tokenizer, spec, args.split, cache, progress=True
        )
        seconds = time.perf_counter() - t0
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if squad.skipped:
        print(
            f"skipped {len(squad.skipped)} training questions whose answer is not at its "
            f"answer_start (first: {squad.skipped[:5]})",
            file=sys.stderr,
        )
    print(
        json.dumps(
            {
                "examples": len(squad.examples),
                "features": len(features),
                "skipped": len(squad.skipped),
                "version": squad.version,
                "seconds": round(seconds, 3),
                "examples_per_s": round(len(squad.examples) / seconds, 1),
                "cache": state,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
