"""Loaded at start-up by every Python process the test suite starts (tests/conftest.py puts this
folder first on PYTHONPATH): where SUITE_STARTUP_LOG names a file, the process appends one JSON line
to it at exit -- how long it lived and how much of that was start-up: the interpreter's own start
and the first import of torch, transformers and determined (the suite's start-up share,
printed after each run). Anything that goes wrong here is ignored: measuring must never change
what a test sees."""

from __future__ import annotations

import os

LOG = os.environ.get("SUITE_STARTUP_LOG")
HEAVY = frozenset({"torch", "transformers", "determined"})


def _install(log: str) -> None:
    import atexit
    import builtins
    import json
    import sys
    import time

    ticks = os.sysconf("SC_CLK_TCK")
    with open("/proc/self/stat") as stat:  # field 22: the start time, in ticks after boot
        started_after_boot = int(stat.read().rsplit(")", 1)[1].split()[19]) / ticks
    with open("/proc/uptime") as uptime:
        now_after_boot = float(uptime.read().split()[0])
    interpreter = max(0.0, now_after_boot - started_after_boot)  # ~10 ms resolution
    born = time.monotonic() - interpreter
    spent = [interpreter]
    plain_import = builtins.__import__
    depth = [0]

    def timed_import(name: str, *args: object, **kwargs: object) -> object:
        top = name.partition(".")[0]
        if depth[0] or top not in HEAVY or top in sys.modules:
            return plain_import(name, *args, **kwargs)
        depth[0] += 1
        began = time.monotonic()
        try:
            return plain_import(name, *args, **kwargs)
        finally:
            depth[0] -= 1
            spent[0] += time.monotonic() - began

    def write() -> None:
        if "_pytest" in sys.modules:  # the suite itself (a pytest worker), not a process it started
            return
        try:
            record = {"argv": sys.argv[:3], "lived_s": time.monotonic() - born, "startup_s": spent[0]}
            with open(log, "a") as out:  # one short line in append mode: whole even when many write
                out.write(json.dumps(record) + "\n")
        except Exception:  # noqa: BLE001, S110 -- never a process's outcome
            pass

    builtins.__import__ = timed_import
    atexit.register(write)


if LOG:
    try:
        _install(LOG)
    except Exception:  # noqa: BLE001, S110 -- never a process's outcome
        pass
