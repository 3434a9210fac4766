"""A CPU training process keeps the memory it frees for its next step (glibc's malloc, on Linux).

Why: glibc serves a large block (above a threshold that adapts up to 32 MiB) with fresh pages
from mmap and returns them on free, and it trims the heap's top back to the system. A training
step's large temporaries -- attention scores of batch x heads x width^2, the embedding's
gradient of vocabulary x hidden -- are freed at the end of each step, so every step page-faulted
them in again: thousands of minor faults per step, each a zeroed page, on the step's critical
path (`python3 -m bench.cpu_step allocator` measures both settings side by side).

`mallopt(M_MMAP_MAX, 0)` serves every block from the heap and `M_TRIM_THRESHOLD` keeps freed
memory there, so after the first steps a step reuses what the step before freed. The peak is
what the run needed anyway; it is given back when the process ends instead of between steps.
Elsewhere (not glibc) nothing changes.
"""

from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD = -1  # glibc's malloc.h: free memory at the heap's top kept up to this size
M_MMAP_MAX = -4  # at most this many blocks served by mmap at once (0: none)
KEEP_UP_TO = 2**31 - 1  # mallopt takes a C int: up to 2 GiB of free memory at the top is kept


def keep_freed_memory() -> bool:
    """Set glibc's malloc to keep freed memory for reuse (once per process); whether it applied."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)  # the process's own C library
    except OSError:
        return False
    if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
        return False  # another C library: its malloc has other rules
    return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, KEEP_UP_TO))
