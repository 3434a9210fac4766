"""CI from a fresh clone, timed: clone the project's commit, put `../shared` beside it, run
`bash .ci/run` there, and write its time with the test summaries and provenance.

    python3 -m bench.ci_fresh_clone --out bench/results/ci-fresh-clone-epyc.txt

The file's first lines, up to the first blank one, are `key: value` (command, commit, date,
machine, versions, result: the exit code and seconds); the README and docs quote its time
(`bench.doc_blocks`'s `ci-time`). After them: each suite's seconds per test file and its summary.
Run it alone: CI on 2 cores beside another heavy job takes longer and can run out of memory.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import provenance
from extractive_qa import cli
from extractive_qa.io.files import ROOT


def summaries(log: str) -> str:
    """Each pytest run's per-file seconds and its pass/fail line, and the compat venv's lines."""
    parts, lines = [], log.splitlines()
    compat = [line for line in dict.fromkeys(lines) if line.startswith("compat: ")]
    starts = [i for i, line in enumerate(lines) if "seconds per test file" in line]
    for n, start in enumerate(starts):
        end = next(
            (i for i in range(start, len(lines)) if re.match(r"^=*\s*\d+ (passed|failed)", lines[i])), None
        )
        title = "main suite (.venv/bin/python -m pytest -q tests)" if n == 0 else ".ci/compat"
        extra = compat if n == 1 else []
        parts.append("\n".join([f"== {title}", *extra, *lines[start : (end or start) + 1]]))
    return "\n\n".join(parts)


@cli.boundary
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="the results file to write")
    parser.add_argument("--log", type=Path, help="keep the whole CI log here as well")
    args = parser.parse_args(argv)
    shared = ROOT.parent / "shared"
    if not shared.is_dir():
        parser.error(f"{shared}: no shared folder beside the project (CI reads ../shared)")
    recorded = provenance("bench.ci_fresh_clone", sys.argv[1:] if argv is None else argv)
    with tempfile.TemporaryDirectory(prefix="ci-fresh-clone-") as tmp:
        clone = Path(tmp) / "project"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        (Path(tmp) / "shared").symlink_to(shared)
        started = time.monotonic()
        done = subprocess.run(["bash", ".ci/run"], cwd=clone, capture_output=True, text=True)
        seconds = time.monotonic() - started
    log = done.stdout + done.stderr
    if args.log:
        args.log.write_text(log)
    versions = ", ".join(f"{k} {v}" for k, v in recorded["versions"].items())
    compat = next(
        (line for line in log.splitlines() if line.startswith("compat: python")), "compat: not reached"
    )
    header = [
        f"command: {recorded['command']}",
        f"commit: {recorded['commit'].removesuffix('+changes')} (the clone's: committed work only)",
        f"date: {recorded['date']}",
        f"machine: {recorded['machine']}",
        f"versions: main venv {versions}; {compat}",
        f"result: rc={done.returncode} seconds={seconds:.0f}",
    ]
    args.out.write_text("\n".join(header) + "\n\n" + summaries(log) + "\n")
    print(f"CI from a fresh clone: exit {done.returncode} in {seconds:.0f} s; written to {args.out}")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
