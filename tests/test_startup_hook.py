"""startup-hook.sh as Determined's entrypoint runs it: sourced from the context dir under set -e.
(.ci/compat runs the install path itself, on torch 2.3.1 + NumPy 1.26.)"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

from conftest import ROOT


def source_hook(python: str) -> subprocess.CompletedProcess:
    script = 'set -e; source ./startup-hook.sh; echo "after the hook, leaked: ${reqs_file:-none}"'
    env = {**os.environ, "DET_PYTHON_EXECUTABLE": python}
    return subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True)


def test_hook_on_an_image_that_has_everything_does_nothing() -> None:
    out = source_hook(sys.executable)
    assert out.returncode == 0, out.stderr
    assert "-> requirements.txt" in out.stdout  # Python >= 3.11 and torch >= 2.6: the modern set
    assert "all pinned dependencies already present" in out.stdout
    assert "after the hook, leaked: none" in out.stdout


def test_hook_stops_the_container_with_a_message_on_an_image_without_torch(tmp_path: Path) -> None:
    venv.create(tmp_path / "bare", with_pip=False)
    out = source_hook(str(tmp_path / "bare" / "bin" / "python"))
    assert out.returncode != 0 and "after the hook" not in out.stdout
    assert "this image has no numpy" in out.stderr or "this image has no torch" in out.stderr
