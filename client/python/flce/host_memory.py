"""glibc's malloc, told once per process to keep the buffers it frees instead of handing
them back to the kernel.

Every message of a bulk call costs gRPC and Python a few MiB of fresh memory (the 4 MiB
chunks of hidden going up and of grad_input coming down); by default glibc returns such
memory to the kernel (munmap, or trimming an arena) as soon as it is freed. In a process
that has a CUDA context, as a trainer does, that return is expensive: on the H200 machine a
seed-shape Compute in messages took 185-192 ms with CUDA initialised in the client against
139-152 ms without, and 138-145 ms with the thresholds below (docs/perf/python.md,
"Messages on one host"). The cost shows up as grad_input read more slowly, the server
waiting for the client.

What changes: allocations below 32 MiB (glibc's largest mmap threshold) come from malloc's
arenas, and up to 256 MiB free at the top of an arena stays with the process. A trainer
holding gigabytes of tensors does not notice either; `flce.Client(malloc_tuning=False)`
leaves malloc alone.
"""
from __future__ import annotations

import ctypes
import threading

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
TRIM_THRESHOLD = 256 << 20
MMAP_THRESHOLD = 32 << 20  # glibc refuses more on 64-bit hosts

_lock = threading.Lock()
_applied = None  # None = not tried; else whether malloc took the thresholds


def _mallopt():
    try:
        return ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None  # not glibc


def keep_freed_memory(mallopt=None) -> bool:
    """Sets the thresholds once per process; True when malloc took them (glibc), False
    where there is no such malloc. `mallopt` replaces libc's (tests)."""
    global _applied
    with _lock:
        if _applied is None:
            call = mallopt or _mallopt()
            _applied = bool(call is not None
                            and call(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
                            and call(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
        return _applied
