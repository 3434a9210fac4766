"""The README's first command as a new user types it, in a fresh clone: how long it takes (the
install and the run), what it prints (EM/F1) and which precision `auto` picked on this CPU.

    python3 -m bench.first_command [--pip-cache cold|warm] [--config YAML] [--set KEY=VALUE] [--json FILE]
    python3 -m bench.first_command --command "python3 scaling.py local ..." [--json FILE]

`--pip-cache cold` installs with pip's cache off (everything fetched or unpacked anew), `warm` with
it as it is. ATEN_CPU_CAPABILITY / ONEDNN_MAX_CPU_ISA in the environment (e.g. avx2 / AVX2: the
kernels an AVX2-only CPU runs) reach the run and are recorded in the row. `--set` is passed to
train.py (e.g. hyperparameters.precision=fp32: what a CPU without bf16 units runs). The clone is
of this repository's HEAD, with ../shared beside it, in a temporary directory removed afterwards.
`--command` times another training command the documents show, typed as they show it (`python3`
and `torchrun` run from the clone's venv); its EM/F1 are recorded where its last line has them.
Results append to --json (one row per run), each with its machine and versions.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import provenance
from extractive_qa import cli
from extractive_qa.io.files import ROOT

SETUP = "python3 -m venv .venv && .venv/bin/pip install -r requirements.txt"
RUN = ".venv/bin/python train.py"
KERNEL_LIMITS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")  # torch's and oneDNN's ISA caps


def timed(command: str, cwd: Path, env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    done = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{command!r} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return time.perf_counter() - start, done


def venv_line(command: str) -> str:
    """A documented command as the clone's venv runs it: `python3`/`torchrun` from .venv/bin."""
    words = command.split()
    if not words or words[0] not in ("python3", "torchrun"):
        raise SystemExit(f"--command {command!r}: start it with python3 or torchrun, as the documents do")
    return " ".join([f".venv/bin/{words[0]}", *words[1:]])


def first_command(
    pip_cache: str, overrides: list[str], config: str | None = None, command: str | None = None
) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH"))}
    if pip_cache == "cold":
        env["PIP_NO_CACHE_DIR"] = "1"
    with tempfile.TemporaryDirectory() as tmp:
        clone = Path(tmp) / "project"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        if (ROOT.parent / "shared").is_dir():
            os.symlink(ROOT.parent / "shared", Path(tmp) / "shared")
        install_s, _ = timed(SETUP, clone, env)
        run = RUN + (f" --config {config}" if config else "") + "".join(f" --set {o}" for o in overrides)
        run_s, done = timed(venv_line(command) if command else run, clone, env)
    lines = done.stdout.strip().splitlines()
    result = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}
    model_line = next(
        (line for line in done.stderr.splitlines() if " precision " in line and "model " in line), ""
    )
    picked = re.search(r"precision (\w+) \(([^)]*)\)", model_line)
    return {
        "pip_cache": pip_cache,
        "config": config,
        "run": command or run,
        "set": overrides,
        "kernels": {k: os.environ[k] for k in KERNEL_LIMITS if os.environ.get(k)},
        "install_s": install_s,
        "run_s": run_s,
        "total_s": install_s + run_s,
        "train_s": result.get("train_seconds"),
        "precision": picked.group(1) if picked else None,
        "precision_why": picked.group(2) if picked else None,
        "exact_match": result.get("exact_match"),
        "f1": result.get("f1"),
        "steps_completed": result.get("steps_completed"),
    }


@cli.boundary
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pip-cache", choices=["cold", "warm"], default="warm")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--config", help="a shipped YAML to run instead of the default (local_v2.yaml)")
    parser.add_argument("--command", help="time this documented command instead (python3/torchrun ...)")
    parser.add_argument("--json", type=Path, help="append the row to this file's rows")
    args = parser.parse_args(argv)
    if args.command and (args.config or args.overrides):
        parser.error("--command is typed whole: give its --config/--set inside it")
    measured = first_command(args.pip_cache, args.overrides, args.config, args.command)
    row = {**provenance("bench.first_command", sys.argv[1:]), **measured}
    print(json.dumps(row))
    if args.json:
        record = json.loads(args.json.read_text()) if args.json.is_file() else {"rows": []}
        record["rows"].append(row)
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
