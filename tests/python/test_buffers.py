"""flce.buffers reuses a result's memory only once nothing refers to it."""
from __future__ import annotations

import torch

from flce.buffers import BufferPool


def test_reuse_only_after_release():
    pool = BufferPool(max_buffers=2, min_bytes=16)
    a = pool.empty((4, 8), torch.bfloat16)
    a.fill_(1.0)
    view = a[1:2]
    ptr = a.data_ptr()
    del a
    b = pool.empty((4, 8), torch.bfloat16)  # a's memory is still seen through `view`
    assert b.data_ptr() != ptr and pool.reused == 0
    assert float(view.sum()) == 8.0
    del view
    c = pool.empty((4, 8), torch.bfloat16)
    assert c.data_ptr() == ptr and pool.reused == 1
    assert c.shape == (4, 8) and c.dtype == torch.bfloat16


def test_eviction_keeps_buffers_in_use_intact():
    pool = BufferPool(max_buffers=2, min_bytes=16)
    held = [pool.empty((64,), torch.float32) for _ in range(4)]
    for i, t in enumerate(held):
        t.fill_(float(i))
    assert len(pool._arrays) == 2
    assert [float(t[0]) for t in held] == [0.0, 1.0, 2.0, 3.0]


def test_small_and_mismatched_sizes_get_fresh_memory():
    pool = BufferPool(max_buffers=2, min_bytes=1024)
    assert pool.empty((4,), torch.float32).shape == (4,) and not pool._arrays
    big = pool.empty((4096,), torch.float32)
    ptr = big.data_ptr()
    del big
    small = pool.empty((300,), torch.float32)  # < half the idle buffer: not pinned by it
    assert small.data_ptr() != ptr
