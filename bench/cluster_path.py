"""Wall time of the same 2-slot run: the emulated 0.38.1 cluster path vs local torchrun.

    python3 -m bench.cluster_path [--batches 20] [--repeats 2] [--json FILE]   # needs root
    python3 -m bench.cluster_path --batches 0 --repeats 1 ...   # local.yaml's whole run (3 epochs)
    python3 -m bench.cluster_path --profiling ...   # the cluster path, profiler off vs on

Both run the embedded default (local.yaml: MiniLM, the bundled SQuAD text) for --batches batches
(0: local.yaml's own training length) on 2 CPU processes (gloo) and end with the full validation
on the 810-question dev excerpt, from a warm feature cache. The cluster path starts the trial as
a 0.38.1 agent does (tests/support/det_cluster.py: a private mount namespace per container,
prep_container, exec.launch, determined.launch.torch_distributed, pid_server/pid_client,
wrap_rank) and the trial talks to a stand-in master over loopback; the local path is
`torchrun --standalone --nproc_per_node=2 train.py`. Runs alternate so drift on this shared VM
hits both. Prints one JSON object with the wall times, EM/F1 of each run and the ratio cluster /
local. With --profiling the two arms are the cluster path with `profiling: {enabled: false}` and
`{enabled: true}` (Determined's system metrics sampler: what the shipped cluster YAMLs turn
on), and the ratio is on / off.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import provenance
from extractive_qa import cli, scaling_runs
from extractive_qa.config import experiment
from extractive_qa.io.files import ROOT
from tests.support import det_cluster
from tests.support.cli_result import last_json


def config_for(batches: int, cache: Path) -> tuple[dict, dict]:
    conf = experiment.load_yaml(ROOT / "local.yaml")
    conf["data"]["cache_dir"] = str(cache)
    for key in ("train_file", "validation_file"):  # the very files both paths read
        conf["data"][key] = str(ROOT / conf["data"][key])
    conf["resources"]["slots_per_trial"] = 2
    if batches:
        conf["hyperparameters"]["train_length"] = {"type": "const", "val": {"batches": batches}}
    conf["entrypoint"] = "python3 -m determined.launch.torch_distributed python3 train.py"
    return conf, experiment.local_hparams(conf)


def local_run(conf: dict, tmp: Path) -> tuple[float, dict]:
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / "local.yaml"
    path.write_text(json.dumps(conf))
    program = [
        str(ROOT / "train.py"),
        "--config",
        str(path),
        "--checkpoint-dir",
        str(tmp / "ckpt"),
        "--restart",
    ]
    cmd, env = scaling_runs.torchrun(
        2, program, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false"
    )
    start = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    seconds = time.perf_counter() - start
    if out.returncode != 0:
        raise SystemExit(f"local run failed:\n{out.stderr[-3000:]}")
    result = last_json(out.stdout)
    return seconds, {k: result[k] for k in ("exact_match", "f1", "train_seconds") if k in result}


def cluster_run(conf: dict, hp: dict, tmp: Path) -> tuple[float, dict]:
    with det_cluster.emulated_cluster(tmp) as cluster:
        start = time.perf_counter()
        record = cluster.run_trial(conf, hp, slots_per_container=2, timeout=1200)
        seconds = time.perf_counter() - start
        if record.exit_codes != [0] or cluster.master.errors:
            raise SystemExit(f"cluster run failed: {cluster.master.errors}\n{record.logs[-1][-3000:]}")
        val = cluster.master.validations()[-1]["metrics"]
    return seconds, {k: val[k] for k in ("exact_match", "f1", "train_seconds") if k in val}


@cli.boundary
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=20, help="0: local.yaml's own length")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--profiling", action="store_true", help="compare profiler on vs off instead")
    args = parser.parse_args()
    if args.batches < 0:
        print(
            f"error: --batches {args.batches}: a number of batches, or 0 for local.yaml's own length",
            file=sys.stderr,
        )
        return 2
    why = det_cluster.supported()
    if why:
        print(f"error: cannot emulate cluster containers here: {why}", file=sys.stderr)
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        conf, hp = config_for(args.batches, tmp / "features")
        local_run(config_for(1, tmp / "features")[0], tmp / "warm")  # the feature cache both read
        arms = ("profiler-on", "profiler-off") if args.profiling else ("cluster", "local")
        times: dict[str, list[float]] = {arm: [] for arm in arms}
        scores: dict[str, list[dict]] = {arm: [] for arm in arms}
        for i in range(args.repeats):
            for name in arms if i % 2 == 0 else arms[::-1]:
                run_dir = tmp / f"{name}-{i}"
                run_dir.mkdir()
                if name == "local":
                    seconds, score = local_run(conf, run_dir)
                else:
                    profiled = {**conf, "profiling": {"enabled": name == "profiler-on"}}
                    seconds, score = cluster_run(profiled, hp, run_dir)
                times[name].append(round(seconds, 2))
                scores[name].append(score)
                print(f"{name} run {i + 1}: {seconds:.1f} s {score}", file=sys.stderr)
    report = {
        **provenance("bench.cluster_path", sys.argv[1:]),
        "batches": args.batches or "local.yaml's own length",
        "slots": 2,
        "wall_seconds": times,
        "scores": scores,
        f"{arms[0]}_over_{arms[1]}": round(
            statistics.median(times[arms[0]]) / statistics.median(times[arms[1]]), 3
        ),
    }
    print(json.dumps(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
