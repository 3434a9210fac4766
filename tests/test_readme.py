"""The README's and docs' commands, run as a newcomer types them.

Every fenced `bash` line runs in bash, in a fresh copy of the project (its tracked files only: no
caches, checkpoints or outputs), after `. .venv/bin/activate` -- in the order the README gives
them, so the predict commands answer from the checkpoints the training commands wrote. The only
changes: training commands get `--batches` capped (2 batches past the newest checkpoint there),
the copy's validation files hold their first 40 questions, and `checkpoints/determined/UUID`
becomes that newest checkpoint (of the SQuAD version the command's data has); a dry run quoted
twice runs once. What cannot run here runs in its checking form:

- the setup (`python3 -m venv`, `pip install`) and the test and CI commands: the environment this
  test runs in is exactly what they make (.ci/run runs them from scratch);
- `det experiment create X .` (no master here): X's dry run;
- scaling.py launch/report (a master) and bench studies (hours): `--help`;
- torchrun over several processes or machines (GPUs, hosts): the trial's dry run
  (tests/test_interruption.py runs the two-process line, started twice around a SIGTERM;
  tests/test_without_master.py runs the two-machine line on two network namespaces);
- scaling.py local (a series of torchrun runs): `--help` (tests/test_scaling.py runs the study
  end to end on a tiny model).

A command naming a checkpoint in a bucket (s3://my-checkpoints/squad/UUID, gs://...) runs as
written against S3 and GCS on loopback (tests/support/object_stores.py), the newest matching
checkpoint uploaded there under its UUID.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support import object_stores
from tests.support.project import ROOT, run_identity

DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SETUP = ("python3 -m venv", ".venv/bin/pip install", "pip install", ". .venv/bin/activate")
CI = ("pytest", "ruff", "bash .ci/")
# The validation files the commands read, cut in the copy to their first questions: every command
# runs as typed on files of the same form, in a fraction of the time (810 questions take minutes).
VALIDATION_FILES = ("squad_data/dev-v1.1-excerpt.json", "squad_data/local-dev-v2.0.json")
VALIDATION_QUESTIONS = 40


def quoted_commands(path: Path) -> list[str]:
    """A document's fenced bash lines, comments stripped, `&&` chains split."""
    commands = []
    for block in re.findall(r"^```bash\n(.*?)^```", path.read_text(), flags=re.S | re.M):
        for line in block.splitlines():
            line = re.sub(r"(^|\s+)#.*$", "", line).strip()
            commands += [part.strip() for part in line.split("&&") if part.strip()]
    return commands


def checkpoints(work: Path) -> list[tuple[int, float, Path]]:
    found = []
    for meta in (work / "checkpoints" / "determined").glob("*/metadata.json"):
        found.append((json.loads(meta.read_text())["steps_completed"], meta.stat().st_mtime, meta.parent))
    return sorted(found, key=lambda c: c[1])


def recorded(checkpoint: Path) -> dict:
    return json.loads((checkpoint / "experiment.json").read_text())["identity"]


def squad_version(checkpoint: Path) -> str:
    return json.loads((checkpoint / "hf" / "qa_settings.json").read_text())["squad_version"]


def how_to_run(command: str, work: Path, stores: list[Any] = ()) -> tuple[str, str] | None:
    """(the bash line to run, how) or None where it is a setup or CI command."""
    if command.startswith(SETUP) or any(word in command for word in CI):
        return None
    words = shlex.split(command)
    if words[:3] == ["det", "experiment", "create"]:
        return f"python3 train.py --config {words[3]} --dry-run", "dry run (no master)"
    if words[:2] == ["python3", "scaling.py"] and words[2] in ("launch", "report", "local"):
        return f"python3 scaling.py {words[2]} --help", "--help (a master, or a series of runs)"
    if words[:2] == ["python3", "-m"] and words[2].startswith("bench."):
        return f"python3 -m {words[2]} --help", "--help (a study)"
    script = next((i for i, w in enumerate(words) if w.endswith(".py")), None)
    if words[0] == "torchrun":
        processes = int(next((w.split("=")[1] for w in words if w.startswith("--nproc_per_node=")), "1"))
        if processes > 1 or any(w.startswith("--nnodes") for w in words):
            return shlex.join(["python3", *words[script:], "--dry-run"]), "dry run (processes or machines)"
    line = command
    if "UUID" in command:  # a resume takes a checkpoint of its own run; predict one of its version
        version = "2.0" if "v2.0" in command else "1.1"
        mine = [path for _, _, path in checkpoints(work) if squad_version(path) == version]
        if words[script] == "train.py":
            identity = run_identity(words[script + 1 :])
            mine = [path for path in mine if recorded(path) == identity]
        assert mine, f"{command!r}: no matching checkpoint written by an earlier command"
        line = line.replace("checkpoints/determined/UUID", str(mine[-1].relative_to(work)))
        for store in stores:  # a cluster's checkpoint in a bucket: the newest one, uploaded there
            if store.url("UUID") in line:
                store.upload(mine[-1], mine[-1].name)
                line = line.replace(store.url("UUID"), store.url(mine[-1].name))
    trains = (
        script is not None
        and words[script] in ("train.py", "scaling.py")
        and not any(flag in words for flag in ("--dry-run", "--settings", "--help", "--checkpoints"))
    )
    if trains:
        steps = max([steps for steps, _, _ in checkpoints(work)], default=0) if "--resume" in words else 0
        line = re.sub(r"\s--batches[= ]\d+", "", line) + f" --batches {steps + 2}"
        return line, "as written, --batches capped"
    return line, "as written"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh copy of the project as a clone has it, with this test's venv as its .venv."""
    work = tmp_path_factory.mktemp("clone")
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, work / name)
    (work / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    for name in VALIDATION_FILES:
        first_questions(work / name, VALIDATION_QUESTIONS)
    return work


def first_questions(path: Path, count: int) -> None:
    """A nested SQuAD file cut to its first `count` questions, in place."""
    doc = json.loads(path.read_text())
    kept, left = [], count
    for article in doc["data"]:
        paragraphs = []
        for paragraph in article["paragraphs"]:
            if left > 0:
                paragraphs.append({**paragraph, "qas": paragraph["qas"][:left]})
                left -= len(paragraphs[-1]["qas"])
        if paragraphs:
            kept.append({**article, "paragraphs": paragraphs})
    path.write_text(json.dumps({**doc, "data": kept}))


def test_the_documents_quote_the_first_two_commands_and_the_activation() -> None:
    readme = quoted_commands(ROOT / "README.md")
    setup = ["python3 -m venv .venv", ".venv/bin/pip install -r requirements.txt"]
    first = [*setup, ".venv/bin/python train.py"]
    start = readme.index(setup[1]) - 1
    assert readme[start : start + 3] == first
    assert all(c.startswith(SETUP) for c in readme[:start])  # before it only setup (torch's CPU wheel)
    assert ". .venv/bin/activate" in readme
    assert any(c.startswith("det experiment create") for c in readme)


def test_every_recipe_in_train_help_is_a_command_the_documents_quote() -> None:
    """train.py --help's recipes are lines the README or docs quote, so the test below runs each
    as typed: its two-process recipe once lacked the --checkpoint-dir the README's line had, and
    after the first command it continued that finished run instead of training."""
    import train

    quoted = {
        " ".join(c.replace(".venv/bin/python ", "python3 ").split())
        for d in DOCUMENTS
        for c in quoted_commands(d)
    }
    text = re.sub(r"\s*\\\n\s*", " ", train.RECIPES)  # continuation lines joined
    recipes = [
        " ".join(m.split()) for m in re.findall(r"^  ((?:python3|torchrun) .*?)(?:\s{2,}.*)?$", text, re.M)
    ]
    assert len(recipes) >= 6 and [r for r in recipes if r not in quoted] == []


def independent(line: str) -> bool:
    """Whether a line only reads the project: a dry run, a settings table or a --help, none with
    --resume (which looks for the checkpoints the other commands write)."""
    return "--resume" not in line and any(flag in line for flag in ("--dry-run", "--settings", "--help"))


@pytest.fixture(scope="module")
def stores() -> Any:
    """The README's bucket, my-checkpoints, with the prefix squad, in S3, GCS and Azure on loopback."""
    with contextlib.ExitStack() as stack:
        found = [
            stack.enter_context(object_stores.object_store(kind, "my-checkpoints"))
            for kind in (*object_stores.KINDS, "azure")
        ]
        for store in found:
            store.prefix = "squad" if store.kind != "azure" else ""
        yield found


def test_every_command_runs_as_typed_in_a_fresh_copy(workspace: Path, stores: list[Any]) -> None:
    """The commands that write (training, predict, export, data) run one after another in the
    documents' order; those that only read (dry runs, settings, --help: a process start and the
    libraries' import each) run beside them on the other core."""
    failures, ran, seen = [], [], set()

    env = {**os.environ, **{k: v for store in stores for k, v in store.env.items()}}

    def run(line: str) -> subprocess.CompletedProcess:
        started = time.monotonic()
        done = subprocess.run(
            ["bash", "-c", f". .venv/bin/activate && {line}"],
            cwd=workspace, capture_output=True, text=True, timeout=900, env=env,
        )  # fmt: skip
        print(f"{time.monotonic() - started:6.1f} s  {line[:140]}")  # where the test's time goes (-s)
        return done

    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as beside:
        started = []
        for document in DOCUMENTS:
            for command in quoted_commands(document):
                plan = how_to_run(command, workspace, stores)
                if plan is None or (plan[0] in seen and "train.py" in plan[0] and "--dry-run" in plan[0]):
                    continue  # a dry run quoted twice plans the same run twice
                seen.add(plan[0])
                line, how = plan
                ran.append(f"{document.name}: {command} [{how}]")
                done = beside.submit(run, line) if independent(line) else run(line)
                started.append((f"{document.name}: {command!r} ran as {line!r} ({how})", line, done))
        for name, line, done in started:
            done = done if isinstance(done, subprocess.CompletedProcess) else done.result()
            if done.returncode != 0 or "Traceback" in done.stderr:
                failures.append(f"{name}: exit {done.returncode}\n{done.stderr[-1500:]}")
            if "--help" in line and "train.py" in line:
                assert "--resume auto" in done.stdout and "local_v2.yaml" in done.stdout
            if "--settings" in line:
                config = line.split("--config ")[1].split()[0]
                assert done.stdout.splitlines()[0].split()[:3] == ["setting", "default", config]
    assert not failures, "\n\n".join(failures)
    assert len(ran) >= 20, ran
    assert_checkpoint_size_as_quoted(checkpoints(workspace)[0][2])


def assert_checkpoint_size_as_quoted(checkpoint: Path) -> None:
    """The checkpoint size rule docs/local.md states, against the first command's checkpoint
    (MiniLM, AdamW): 16 bytes a parameter -- Determined's state holds the weights and AdamW's two
    moments in fp32, `hf/` the weights again."""
    quoted = re.search(
        r"16 bytes a parameter, for MiniLM's ([\d.]+) M parameters",
        " ".join((ROOT / "docs" / "local.md").read_text().split()),
    )
    assert quoted, "docs/local.md no longer states the checkpoint's size"
    weights = (checkpoint / "hf" / "model.safetensors").stat().st_size
    parameters = weights / 4  # fp32: 4 bytes a parameter
    assert round(parameters / 1e6, 1) == float(quoted[1])
    stored = (checkpoint / "state_dict.pth").stat().st_size + weights
    assert abs(stored - 16 * parameters) < 0.01 * 16 * parameters, stored
