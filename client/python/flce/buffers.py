"""A small pool of host buffers for large results (grad_input, grad_W).

Why: a fresh 128 MiB tensor costs its first-touch page faults, which on the development
VM took ~10x longer than copying the data into it (docs/perf/python.md). A result's memory
is reused only once nothing refers to it any more: torch.from_numpy keeps a reference to
the numpy array for as long as any tensor or view on that storage lives, so the array's
reference count says exactly when the caller has let go.
"""
from __future__ import annotations

import sys
import threading
from typing import List, Sequence

import numpy as np
import torch

# references to a pooled array while it is idle: the pool's list and getrefcount's argument
_IDLE_REFS = 2


class BufferPool:
    def __init__(self, max_buffers: int = 4, min_bytes: int = 1 << 20):
        self.max_buffers = max_buffers
        self.min_bytes = min_bytes
        self._arrays: List[np.ndarray] = []
        self._lock = threading.Lock()
        self.reused = 0

    def empty(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        """Like torch.empty(shape, dtype=dtype), from recycled memory when possible."""
        numel = 1
        for d in shape:
            numel *= d
        nbytes = numel * torch.empty(0, dtype=dtype).element_size()
        if nbytes < self.min_bytes or self.max_buffers <= 0:
            return torch.empty(tuple(shape), dtype=dtype)
        with self._lock:
            arr = self._take(nbytes)
        t = torch.from_numpy(arr[:nbytes])
        return (t if dtype == torch.uint8 else t.view(dtype)).reshape(tuple(shape))

    def _idle(self, i: int) -> bool:
        return sys.getrefcount(self._arrays[i]) == _IDLE_REFS

    def _take(self, nbytes: int) -> np.ndarray:
        for i in range(len(self._arrays)):
            # at most twice the size: a huge idle buffer must not pin memory for tiny results
            if nbytes <= self._arrays[i].nbytes <= 2 * nbytes and self._idle(i):
                self.reused += 1
                return self._arrays[i]
        self._arrays.append(np.empty(nbytes, dtype=np.uint8))
        if len(self._arrays) > self.max_buffers:
            self._evict()
        return self._arrays[-1]

    def _evict(self) -> None:
        for i in range(len(self._arrays) - 1):
            if self._idle(i):
                del self._arrays[i]
                return
        # everything is in use: forget the oldest; its users keep it alive as long as needed
        del self._arrays[0]
