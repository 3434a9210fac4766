"""A CPU training process keeps the memory it frees for its next step
(extractive_qa/trial/cpu_allocator.py): a block freed and asked for again costs no new pages."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest

from extractive_qa.io.files import ROOT

PROBE = """
import resource, sys, torch
from extractive_qa.trial import cpu_allocator

def faults_per_step():
    for _ in range(12):  # the first steps' pages are new either way, until the heap settles
        torch.empty(48 << 20, dtype=torch.uint8).fill_(1)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(4):
        torch.empty(48 << 20, dtype=torch.uint8).fill_(1)  # 48 MiB: the embedding gradient's size
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) // 4

default = faults_per_step()
applied = cpu_allocator.keep_freed_memory() if sys.argv[1] == "keep" else False
print(default, faults_per_step(), applied)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc: Linux only")
def test_a_freed_block_is_reused_without_new_pages() -> None:
    """glibc maps a block above 32 MiB afresh each time (12,288 page faults for 48 MiB, MiniLM's
    embedding gradient); once the trial's setting applies, the same request settles on reusing
    the freed pages."""

    def probe(mode: str) -> tuple[int, int, str]:
        done = subprocess.run(
            [sys.executable, "-c", PROBE, mode], cwd=ROOT, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        before, after, applied = done.stdout.split()
        return int(before), int(after), applied

    before, after, applied = probe("keep")
    assert applied == "True"
    assert before > 10_000  # 48 MiB is 12,288 pages: mapped anew each time
    assert after < 100
    before, after, _ = probe("default")
    assert after > 10_000  # without the setting nothing changes


def test_the_trial_sets_it_on_the_cpu_only(monkeypatch) -> None:
    from extractive_qa.trial import model_setup

    calls = []
    monkeypatch.setattr(model_setup.cpu_allocator, "keep_freed_memory", lambda: calls.append(1) or True)
    monkeypatch.setattr(model_setup.mixed_precision, "configure_cuda_math", lambda tf32: None)

    class Stop(Exception):
        pass

    def stop(*args, **kwargs):
        raise Stop

    monkeypatch.setattr(model_setup.model_io, "load_qa_model", stop)
    monkeypatch.setattr(model_setup, "loadable_pretrained", lambda name: name)
    for device, expected in (("cuda", 0), ("cpu", 1)):
        context = SimpleNamespace(device=SimpleNamespace(type=device))
        plan = SimpleNamespace(
            hparams=SimpleNamespace(tf32=True), data=SimpleNamespace(pretrained_model="m"), attention="sdpa"
        )
        with pytest.raises(Stop):
            model_setup.prepare_model(context, plan, "fp32", "set")
        assert len(calls) == expected
