"""The project as the tests see it: its paths and bundled SQuAD excerpts, a small experiment
config, and its entry scripts run in this process or as a user runs them."""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from extractive_qa.io.files import ROOT
from tests.support.cli_result import last_json

DATA = ROOT / "squad_data"
TRAIN_V1 = DATA / "train-v1.1-excerpt.json"
DEV_V1 = DATA / "dev-v1.1-excerpt.json"
DEV_V2 = DATA / "dev-v2.0-excerpt.json"


def tiny_config(model: Path, tmp: Path, **data_overrides: Any) -> dict[str, Any]:
    """A fast experiment config: tiny model, the real excerpts, 128-token windows."""
    return {
        "name": "test",
        "entrypoint": "python3 train.py",
        "data": {
            "pretrained_model": str(model),
            "train_file": str(TRAIN_V1),
            "validation_file": str(DEV_V1),
            "squad_version": "1.1",
            "cache_dir": str(tmp / "cache"),
            "max_seq_length": 128,
            "doc_stride": 32,
            "max_query_length": 32,
            **data_overrides,
        },
        "hyperparameters": {
            "global_batch_size": 8,
            "learning_rate": 1e-3,
            "warmup_ratio": 0.0,
            "optimizer": "adamw",
            "precision": "fp32",
            "train_length": {"type": "const", "val": {"batches": 4}},
        },
        "searcher": {"name": "single", "metric": "f1", "smaller_is_better": False},
        "checkpoint_policy": "none",
        "scheduling_unit": 2,
        "reproducibility": {"experiment_seed": 7},
    }


def write_yaml(conf: dict[str, Any], path: Path) -> Path:
    path.write_text(yaml.safe_dump(conf))
    return path


def run_train(args: list[str]) -> tuple[int, dict[str, Any] | None, str]:
    """train.main in this process: (exit code, last stdout JSON, stderr)."""
    import train

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = train.main(args)
    lines = [line for line in out.getvalue().splitlines() if line.strip()]
    result = json.loads(lines[-1]) if code == 0 and lines else None
    return code, result, err.getvalue()


def run_main(args: list[str], cwd: Path | None = None) -> tuple[int, str, str]:
    """One of the project's CLIs -- `[script, *args]` or `["-m", module, *args]` -- called in this
    process as its `main`, with sys.argv as a user's command line would set it: (exit code, stdout,
    stderr). For what a command does with its arguments and files; where the process itself is
    the subject (exit on a signal, the environment, a fresh interpreter) tests use cli()."""
    import importlib
    import inspect
    import os

    module, rest = (args[1], args[2:]) if args[0] == "-m" else (Path(args[0]).stem, args[1:])
    main = importlib.import_module(module).main
    out, err = io.StringIO(), io.StringIO()
    argv, here = sys.argv, Path.cwd()
    sys.argv = [module, *rest]
    try:
        os.chdir(cwd or ROOT)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(rest)) if inspect.signature(main).parameters else main()
            except SystemExit as stop:  # argparse's usage errors and --help
                code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 2)
    finally:
        sys.argv = argv
        os.chdir(here)
    return int(code or 0), out.getvalue(), err.getvalue()


def completed(args: list[str], cwd: Path | None = None) -> Any:
    """run_main's result in subprocess.CompletedProcess's form (returncode, stdout, stderr)."""
    import subprocess

    code, out, err = run_main(args, cwd)
    return subprocess.CompletedProcess(args, code, out, err)


def bench_output(script: str, *args: str) -> str:
    """`python3 -m bench.SCRIPT ARGS` in-process, required to succeed: its stdout."""
    done = completed(["-m", f"bench.{script.removesuffix('.py')}", *args])
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def run_cli(args: list[str], cwd: Path | None = None) -> dict[str, Any]:
    """run_main, required to succeed: the command's last stdout line, parsed as JSON. A non-zero
    exit fails the test with the command's stderr."""
    code, out, err = run_main(args, cwd)
    assert code == 0, f"{args[0] if args[0] != '-m' else args[1]} exited {code}: {err[-3000:]}"
    return last_json(out)


def cli(*args: str) -> tuple[int, str, str]:
    """One of the project's scripts run as a user runs it, from the repository root: (exit code,
    stdout, stderr) -- for tests of what crosses the process boundary (exit codes, stderr)."""
    import subprocess

    done = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    return done.returncode, done.stdout, done.stderr


def trained_config(checkpoint: Path) -> Path:
    """The YAML the `trained` fixture's run used (its directory holds it)."""
    return checkpoint.parents[2] / "exp.yaml"


def one_process_scores(checkpoint: Path | str, squad_file: Path | str, tmp: Path) -> dict[str, Any]:
    """EM/F1 of a checkpoint evaluated by one process: predict.py, then squad_metric.py."""
    preds = tmp / "one-process-predictions.json"
    run_cli(["predict.py", "--checkpoint", str(checkpoint), "--squad", str(squad_file), "--out", str(preds)])
    return run_cli(["-m", "extractive_qa.qa.squad_metric", str(squad_file), str(preds)])


def run_identity(args: list[str]) -> dict:
    """What a train.py command line's checkpoints record of their run (experiment.json)."""
    import train
    from extractive_qa.config import experiment, run_plan
    from extractive_qa.resume.identity import run_identity

    parsed = train.run_options(train.parse_args(args))
    source = experiment.from_command_line(parsed, 1)
    plan = run_plan.run_plan(source.exp_conf, source.hparams, 1)
    return json.loads(json.dumps(run_identity(plan, source.exp_conf.get("name"))))
