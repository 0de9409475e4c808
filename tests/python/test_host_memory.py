"""flce.host_memory: glibc's malloc told once per process to keep message-sized buffers,
before the first call that carries tensors in messages, unless the client says not to."""
from __future__ import annotations

import ctypes.util
import uuid

import pytest
import torch

import flce
from flce import host_memory


class Recorder:
    def __init__(self, answer: int = 1):
        self.calls = []
        self.answer = answer

    def __call__(self, param, value):
        self.calls.append((param, value))
        return self.answer


@pytest.fixture
def fresh(monkeypatch):
    """host_memory as in a process that has not set the thresholds, with libc's mallopt
    replaced by a recorder."""
    recorder = Recorder()
    monkeypatch.setattr(host_memory, "_applied", None)
    monkeypatch.setattr(host_memory, "_mallopt", lambda: recorder)
    return recorder


def test_sets_both_thresholds_once(fresh):
    assert host_memory.keep_freed_memory()
    assert host_memory.keep_freed_memory()
    assert fresh.calls == [(host_memory.M_TRIM_THRESHOLD, 256 << 20),
                           (host_memory.M_MMAP_THRESHOLD, 32 << 20)]


def test_a_malloc_that_refuses_is_reported(monkeypatch):
    monkeypatch.setattr(host_memory, "_applied", None)
    assert not host_memory.keep_freed_memory(mallopt=Recorder(answer=0))
    monkeypatch.setattr(host_memory, "_applied", None)
    monkeypatch.setattr(host_memory, "_mallopt", lambda: None)  # not glibc
    assert not host_memory.keep_freed_memory()


@pytest.mark.skipif(ctypes.util.find_library("c") is None or
                    not hasattr(ctypes.CDLL(None), "mallopt"), reason="no mallopt (not glibc)")
def test_this_glibc_takes_them(monkeypatch):
    monkeypatch.setattr(host_memory, "_applied", None)
    assert host_memory.keep_freed_memory()


@pytest.mark.parametrize("tuning", [True, False])
def test_a_compute_in_messages_applies_them_unless_told_not_to(real_target, fresh, tuning):
    with flce.Client(real_target, timeout=60, transport="grpc", malloc_tuning=tuning) as c:
        g = torch.Generator().manual_seed(3)
        head = f"mem-{uuid.uuid4().hex[:8]}"
        c.upload_head(head, torch.randn(17, 8, generator=g))
        c.compute(head, torch.randn(5, 8, generator=g), torch.randint(0, 17, (5,), generator=g))
    assert bool(fresh.calls) == tuning
