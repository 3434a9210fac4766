"""Every command the README quotes stays runnable: each fenced `python3 ...` command runs in its
`--dry-run` form (train.py, which then checks the config without loading a model) or its `--help`
form (the other CLIs), and exits 0; the files and YAMLs the other commands name exist."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest

from tests.support.project import ROOT

README = ROOT / "README.md"


def quoted_commands() -> list[str]:
    """The README's fenced bash lines, comments stripped, `&&` chains split."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S):
        for line in block.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            commands += [part.strip() for part in line.split("&&") if part.strip()]
    return commands


def runnable_form(command: str) -> list[str] | None:
    """The argv that checks `command` without training, or None for a non-Python command."""
    words = shlex.split(command)
    if words[0] in (".venv/bin/python", ".venv/bin/pip"):
        words[0] = "python3" if words[0].endswith("python") else "pip"
    if words[0] == "torchrun":  # torchrun [options] train.py args: the trial's own check
        script = next(i for i, w in enumerate(words) if w.endswith(".py"))
        words = ["python3", *words[script:]]
    if words[0] != "python3" or words[1] == "-m" and words[2] in ("venv", "pytest", "pip"):
        return None
    args = words[1:]
    if args[0] == "train.py" and "--settings" not in args and "--resume" not in args:
        return [sys.executable, *args, "--dry-run"]
    head = args[:2] if args[0] == "-m" else args[:1]
    return [sys.executable, *head, "--help"]


def test_the_readme_quotes_commands() -> None:
    commands = quoted_commands()
    assert any(c.startswith("python3 train.py") for c in commands)
    assert any("det experiment create" in c for c in commands)


@pytest.mark.parametrize("command", [c for c in quoted_commands() if runnable_form(c)])
def test_each_python_command_runs_in_its_checking_form(command: str) -> None:
    argv = runnable_form(command)
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{command!r} as {argv[1:]}: {done.stderr[-2000:]}"
    assert "Traceback" not in done.stderr


def test_the_files_other_commands_name_exist() -> None:
    for command in quoted_commands():
        words = shlex.split(command)
        if words[:3] == ["det", "experiment", "create"]:
            conf = ROOT / words[3]
            assert conf.is_file(), command
            done = subprocess.run(
                [sys.executable, "train.py", "--config", str(conf), "--dry-run"],
                cwd=ROOT, capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr[-2000:]
        for word in words:
            if word.startswith(("requirements", ".ci/")):
                assert (ROOT / word).is_file(), command
