"""How many training windows a config's data makes, before launch: from the feature cache when it
holds them (exact, instant), else by windowing the file here (exact, timed), else an estimate
marked as one (the file or tokenizer is not on this machine). The dry run turns the count into
batches and optimizer steps."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from extractive_qa.settings import DataSettings

# Measured windows of the official training files (BERT's uncased WordPiece, max_seq_length 384,
# doc_stride 128, max_query_length 64: docs/scaling.md), for a dry run that cannot see the file.
OFFICIAL_WINDOWS = {("train-v1.1.json", 384, 128, 64): 88_600}
OFFICIAL_QUESTIONS = {"train-v1.1.json": 87_599, "train-v2.0.json": 130_319}


@dataclass(frozen=True)
class WindowCount:
    windows: int | None
    how: str  # "feature cache", "counted", "estimate" or "unknown"
    note: str = ""
    questions: int | None = None  # the training questions they come from (when read here)


def count_training_windows(data: DataSettings, root: Path) -> WindowCount:
    """The training windows the run will train on, and how that number was obtained."""
    from extractive_qa.feature_cache import cache_damage, features_fingerprint, load_features
    from extractive_qa.features import WindowSpec, build_features, load_tokenizer
    from extractive_qa.squad_json import load_squad
    from extractive_qa.squad_sources import OFFICIAL_SHA256, DataError, cache_name, default_download_dir

    spec = WindowSpec(data.max_seq_length, data.doc_stride, data.max_query_length)
    source = str(data.train_file)
    name = source.rstrip("/").rsplit("/", 1)[-1]
    if source.startswith(("http://", "https://")):
        local = default_download_dir() / cache_name(source, name, OFFICIAL_SHA256.get(name))
    else:
        local = Path(source) if Path(source).is_absolute() else root / source
    estimate = OFFICIAL_WINDOWS.get((name, spec.max_seq_length, spec.doc_stride, spec.max_query_length))

    def fallback(why: str) -> WindowCount:
        if estimate is not None:
            note = f"{why}; the count measured on the official file"
            return WindowCount(estimate, "estimate", note, OFFICIAL_QUESTIONS.get(name))
        return WindowCount(None, "unknown", f"{why}; the run reports its windows when it starts")

    if not local.is_file():
        return fallback(f"{source} is not on this machine yet")
    try:
        tokenizer = load_tokenizer(data.pretrained_model, local_only=True)
        squad = load_squad(local, training=True)
    except (DataError, OSError, ValueError) as err:
        return fallback(f"cannot window it here ({str(err).splitlines()[0][:120]})")
    cache_dir = Path(data.cache_dir or default_download_dir() / "features")
    if not cache_dir.is_absolute():
        cache_dir = root / cache_dir
    fingerprint = features_fingerprint(squad, data.pretrained_model, tokenizer, spec, "train")
    cached = cache_dir / f"train-{fingerprint}"
    if cached.is_dir() and cache_damage(cached) is None:
        return WindowCount(len(load_features(cached)), "feature cache", str(cached), len(squad.examples))
    started = time.perf_counter()
    windows = len(build_features(squad.examples, tokenizer, spec, labels=True, offsets=False))
    seconds = time.perf_counter() - started
    note = f"windowed {len(squad.examples)} questions in {seconds:.1f} s"
    return WindowCount(windows, "counted", note, len(squad.examples))
