"""SQuAD data for a run: the files of the config's `data:` section, checked and windowed.

The work is in extractive_qa/data/, read in this order: squad_files (where a file comes from:
local path or official URL, verified; parsing and checks), features (the tokenizer; questions and
contexts -> fixed-length windows), feature_cache (memory-mapped NumPy caches), batching; then
extractive_qa/qa/answers (model logits -> answer strings). Evaluation (model_def.py) and inference
(predict.py) both use `build_features` and `extract_answers`: one implementation of windowing and
extraction.

CLI (preprocess ahead of time so cluster ranks map a ready cache):
    python3 data.py --squad PATH_OR_URL --tokenizer NAME_OR_DIR --split train|validation
        [--max-seq-length 384 --doc-stride 128 --max-query-length 64] --cache-dir DIR [--no-cache]

Convert between SQuAD's nested JSON and the flat squad schema (the format from --out's suffix:
.json, .jsonl or .parquet; every question checked, none dropped):
    python3 data.py --convert IN --out OUT
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from extractive_qa import cli  # first: a Ctrl-C while the libraries load is one line
from extractive_qa.config.settings import DataSettings, Hyperparameters, WindowSpec
from extractive_qa.data.batching import FeatureDataset, evaluation_batches, training_batches
from extractive_qa.data.feature_cache import prepare_features
from extractive_qa.data.features import Features, load_tokenizer
from extractive_qa.data.squad_files import (
    SquadSet,
    check_version,
    default_download_dir,
    first_examples,
    load_squad,
)
from extractive_qa.data.squad_formats import write_squad
from extractive_qa.errors import DataError
from extractive_qa.io.files import check_output_file, check_outputs, command_error

logger = logging.getLogger("squad")


@dataclass
class RunData:
    """What a run trains and validates on: the tokenizer, both SQuAD sets and their windows."""

    tokenizer: Any
    train_set: SquadSet
    val_set: SquadSet
    train_features: Features
    val_features: Features
    cache_dir: Path
    train_cache: str  # how each set's features were obtained: built, loaded, ...
    val_cache: str


def load_run_data(settings: DataSettings, spec: WindowSpec, rank: int) -> RunData:
    """The `data:` section's files, checked against its squad_version, windowed with `spec`
    (from the feature cache when it holds them; rank `rank` reports skipped questions)."""
    model_name = settings.pretrained_model
    tokenizer = load_tokenizer(model_name)
    cache_dir = Path(settings.cache_dir or default_download_dir() / "features")
    train_set = first_examples(load_squad(settings.train_file, training=True), settings.max_train_examples)
    val_set = first_examples(load_squad(settings.validation_file, training=False), settings.max_eval_examples)
    for name, squad in (("train_file", train_set), ("validation_file", val_set)):
        check_version(squad, settings.squad_version, f"data.{name}")
    if train_set.misplaced and rank == 0:
        logger.warning("data.train_file: %s", train_set.misplaced_note(10))
    train_features, train_cache = prepare_features(train_set, tokenizer, model_name, spec, "train", cache_dir)
    val_features, val_cache = prepare_features(val_set, tokenizer, model_name, spec, "validation", cache_dir)
    return RunData(
        tokenizer, train_set, val_set, train_features, val_features, cache_dir, train_cache, val_cache
    )


def training_loader(
    features: Features, per_slot_batch: int, hp: Hyperparameters, seed: int, ranks: int, num_workers: int
) -> Any:
    """The trial's training batches (extractive_qa.data.batching: dynamic padding, length-sorted
    or bucketed, each rank its share) as Determined's DataLoader."""
    from determined import pytorch

    sampler, collate = training_batches(
        features, per_slot_batch, batching=hp.batching, multiple=hp.pad_to_multiple_of, seed=seed, ranks=ranks
    )
    return pytorch.DataLoader(
        FeatureDataset(len(features)), batch_sampler=sampler, collate_fn=collate, num_workers=num_workers
    )


def validation_loader(features: Features, batch_size: int, multiple: int, num_workers: int) -> Any:
    """Evaluation's batches: sorted by length, padded as predict.py pads them."""
    from determined import pytorch

    sampler, collate = evaluation_batches(features, batch_size, multiple)
    return pytorch.DataLoader(
        FeatureDataset(len(features)), batch_sampler=sampler, collate_fn=collate, num_workers=num_workers
    )


# --------------------------------------------------------------------------------------------
# CLI: preprocess ahead of time.
# --------------------------------------------------------------------------------------------


@cli.boundary
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("--convert", metavar="IN", help="a SQuAD file (any format) to convert; needs --out")
    parser.add_argument("--out", type=Path, help="with --convert: OUT.json, OUT.jsonl or OUT.parquet")
    parser.add_argument("--squad", help="SQuAD file (JSON, JSON Lines, Parquet), datasets: source or URL")
    parser.add_argument("--tokenizer", help="hub name or local model directory")
    parser.add_argument("--split", choices=["train", "validation"])
    parser.add_argument("--max-seq-length", type=int, default=WindowSpec.max_seq_length)
    parser.add_argument("--doc-stride", type=int, default=WindowSpec.doc_stride)
    parser.add_argument("--max-query-length", type=int, default=WindowSpec.max_query_length)
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument("--no-cache", action="store_true", help="build in memory, write nothing")
    args = parser.parse_args(argv)
    if args.convert or args.out:
        if not (args.convert and args.out) or args.squad:
            parser.error("--convert IN goes with --out OUT (and nothing else)")
        return convert(args.convert, args.out)
    if not (args.squad and args.tokenizer and args.split):
        parser.error("give --squad, --tokenizer and --split (or --convert IN --out OUT)")
    if args.cache_dir is None and not args.no_cache:
        parser.error("give --cache-dir DIR (or --no-cache to only measure)")
    spec = WindowSpec(args.max_seq_length, args.doc_stride, args.max_query_length)
    t0 = time.perf_counter()
    squad = load_squad(args.squad, training=args.split == "train")
    tokenizer = load_tokenizer(args.tokenizer)
    cache = None if args.no_cache else args.cache_dir
    features, state = prepare_features(
        squad, tokenizer, args.tokenizer, spec, args.split, cache, progress=True
    )
    seconds = time.perf_counter() - t0
    if squad.misplaced:
        print(f"warning: {squad.misplaced_note(5)}", file=sys.stderr)
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


def convert(source: str, out: Path) -> int:
    """--convert: one SQuAD file rewritten in another format, whole or not at all."""
    try:
        if out.suffix not in (".json", ".jsonl", ".parquet"):
            raise DataError(f"--out {out}: name it .json (nested SQuAD), .jsonl or .parquet.")
        check_output_file(out.resolve(), "--out")
        check_outputs({"--out": out}, {"--convert": Path(source)})
        squad = load_squad(source, training=False)
        write_squad(squad.examples, squad.version, out)
    except (DataError, OSError) as err:
        return command_error(err, out)
    if squad.misplaced:  # converted as they are (an evaluation keeps them); named so they can be fixed
        print(f"warning: {squad.misplaced_note(5)}", file=sys.stderr)
    out_record = {"questions": len(squad.examples), "version": squad.version, "out": str(out)}
    print(json.dumps({**out_record, "misplaced_answers": len(squad.misplaced)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
