"""Shared fixtures: tiny random-init models with the real MiniLM (bert-base-uncased) tokenizer."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

from extractive_qa.config.model_family import EMBEDDED_MODEL
from extractive_qa.data.features import load_tokenizer
from tests.support.project import run_train, tiny_config, write_yaml

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_configure(config: pytest.Config) -> None:
    """The run's first process (xdist's controller, or the only one with -n 0) sets up the
    start-up log that every process the tests start writes to (`_log_startup`); its workers
    inherit its environment. Each process that runs tests, and every process it starts, computes
    on its share of the cores: torch's OpenMP threads spin while they wait for work, so two
    workers each running as many threads as the machine has cores spin against each other
    (docs/development.md, Where CI's time goes). Set before any test module imports torch."""
    if hasattr(config, "workerinput"):
        workers = config.workerinput["workercount"]
    else:
        _log_startup()
        if config.getoption("numprocesses", None):
            return  # xdist's controller: it runs no test, and must not fix its workers' share
        workers = 1
    share = max(1, len(os.sched_getaffinity(0)) // workers)
    for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(variable, str(share))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest test files first, each by its seconds in the committed CI measurements
    (bench/results/ci-fresh-clone-*.txt; a file none of them names counts as the longest), each
    file's tests in their own order. `--dist loadfile --no-loadscope-reorder` hands the workers
    whole files in this order, so no long file starts while the other worker is running out of
    work (xdist's own order, by test count, left one worker alone for the last ~70 s)."""
    from bench.results_files import RESULTS, ci_seconds_per_file
    from extractive_qa.io import reading

    measured: dict[str, float] = {}
    for path in sorted(RESULTS.glob("ci-fresh-clone-*.txt")):
        for suite in ci_seconds_per_file(reading.read_text(path, reading.RECORD))[:1]:
            for name, seconds in suite.items():
                measured[name] = max(seconds, measured.get(name, 0.0))
    items.sort(key=lambda item: -measured.get(item.nodeid.split("::")[0], float("inf")))


@pytest.fixture(scope="session")
def tokenizer() -> Any:

    return load_tokenizer(EMBEDDED_MODEL)


def _tiny(kind: str, tokenizer: Any, path: Path) -> Path:
    import torch
    from transformers import (
        BertConfig,
        BertForQuestionAnswering,
        DistilBertConfig,
        DistilBertForQuestionAnswering,
    )

    torch.manual_seed(0)
    if kind == "bert":
        cfg = BertConfig(
            vocab_size=tokenizer.vocab_size,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=512,
        )
        model = BertForQuestionAnswering(cfg)
    else:
        cfg = DistilBertConfig(
            vocab_size=tokenizer.vocab_size,
            dim=32,
            n_layers=2,
            n_heads=2,
            hidden_dim=64,
        )
        model = DistilBertForQuestionAnswering(cfg)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_bert(tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tiny("bert", tokenizer, tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def tiny_distilbert(tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tiny("distilbert", tokenizer, tmp_path_factory.mktemp("tiny-distilbert"))


@pytest.fixture(scope="session")
def trained(tiny_bert: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A checkpoint of a 6-batch run of tiny_config, and that run's result."""
    tmp = tmp_path_factory.mktemp("trained")
    conf = tiny_config(tiny_bert, tmp)
    path = write_yaml(conf, tmp / "exp.yaml")
    code, result, err = run_train(
        ["--config", str(path), "--checkpoint-dir", str(tmp / "ckpt"), "--batches", "6"]
    )
    assert code == 0, err
    return Path(result["checkpoint"]), result


# --------------------------------------------------------------------------------------------
# Where the suite's time goes: seconds per test file, printed after --durations' slowest tests.
# --------------------------------------------------------------------------------------------

_SECONDS_PER_FILE: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = report.nodeid.split("::")[0]
    _SECONDS_PER_FILE[path] = _SECONDS_PER_FILE.get(path, 0.0) + report.duration


def _log_startup() -> None:
    """Every Python process the tests start logs its life and start-up at exit
    (tests/support/startup/sitecustomize.py, first on the inherited PYTHONPATH)."""
    handle, log = tempfile.mkstemp(prefix="suite-startup-", suffix=".jsonl")
    os.close(handle)
    os.environ["SUITE_STARTUP_LOG"] = log
    startup = str(Path(__file__).parent / "support" / "startup")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [startup, os.environ.get("PYTHONPATH")]))


def startup_share(log: Path) -> str:
    """One line: how many Python processes the tests started, how long they lived in all, and how
    much of that was start-up (the interpreter's own and the first import of torch, transformers
    and determined)."""
    records = []
    for line in log.read_text().splitlines():
        with contextlib.suppress(ValueError):
            records.append(json.loads(line))
    lived = sum(r["lived_s"] for r in records)
    startup = sum(r["startup_s"] for r in records)
    share = f"{100 * startup / lived:.0f} %" if lived else "-"
    return (
        f"start-up: {len(records)} Python processes the tests started lived {lived:,.0f} s in all; "
        f"{startup:,.0f} s of it ({share}) was start-up (the interpreter, and the first import of "
        "torch, transformers and determined)"
    )


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _SECONDS_PER_FILE:
        return
    terminalreporter.section("seconds per test file (setup + call + teardown)")
    ranked = sorted(_SECONDS_PER_FILE.items(), key=lambda item: -item[1])
    for path, seconds in ranked:
        terminalreporter.write_line(f"{seconds:8.1f}  {path}")
    terminalreporter.write_line(f"{sum(_SECONDS_PER_FILE.values()):8.1f}  in all")
    log = os.environ.get("SUITE_STARTUP_LOG")
    if log and Path(log).is_file():
        terminalreporter.write_line(startup_share(Path(log)))


def pytest_unconfigure(config: pytest.Config) -> None:
    log = os.environ.get("SUITE_STARTUP_LOG")
    if log and not hasattr(config, "workerinput"):
        Path(log).unlink(missing_ok=True)
