"""What checking a feature cache on open costs, at the full SQuAD v1.1 size.

Every rank reads a cache entry through its check (feature_cache.read_entry): each array file
read once, its shape, dtype and byte count checked against meta.json and its SHA-256 against the
one recorded, the arrays then views of those bytes. This times that read, and the hashing alone,
on a synthetic entry of the official train file's size (88,600 windows at 384 tokens, the arrays a
training cache holds) in a temporary directory, from the page cache (a cache just built or
just read) and after dropping it where allowed (root: a cold read).

    python3 -m bench.cache_check [--windows 88600] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import provenance
from extractive_qa import cli
from extractive_qa.data import feature_cache
from extractive_qa.data.features import Features


def synthetic(windows: int, length: int) -> Features:
    rng = np.random.default_rng(0)
    return Features(
        input_ids=rng.integers(0, 30522, size=(windows, length), dtype=np.int32),
        lengths=np.full(windows, length, dtype=np.int32),
        example_index=np.arange(windows, dtype=np.int32),
        token_type_ids=rng.integers(0, 2, size=(windows, length), dtype=np.int8),
        start_positions=rng.integers(0, length, size=windows, dtype=np.int32),
        end_positions=rng.integers(0, length, size=windows, dtype=np.int32),
    )


def drop_page_cache() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def seconds(work: Any) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def check(directory: Path) -> None:
    feature_cache.read_entry(directory)  # raises CacheDamage: the entry was just written whole


@cli.boundary
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=88_600)
    parser.add_argument("--length", type=int, default=384)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "train-bench"
        feature_cache._save_features(synthetic(args.windows, args.length), directory, {"split": "train"})
        size = sum(p.stat().st_size for p in directory.glob("*.npy"))
        rows: dict[str, Any] = {"windows": args.windows, "length": args.length, "bytes": size}
        files = sorted(directory.glob("*.npy"))
        for read in ("warm", "cold"):
            if read == "cold" and not drop_page_cache():
                continue
            rows[f"{read}_check_s"] = seconds(lambda: check(directory))  # read, checked, usable
        rows["warm_sha256_alone_s"] = seconds(lambda: [feature_cache.file_sha256(f) for f in files])
        rows["sha256_gb_per_s"] = size / 1e9 / rows["warm_sha256_alone_s"]
    rows = {**provenance("bench.cache_check", sys.argv[1:]), **rows}
    print(json.dumps(rows, indent=1))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
