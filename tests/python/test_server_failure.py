"""Failures mid-call: a clear flce.FlceError carrying the gRPC code, and no gradient
applied anywhere (the server session's grad_W, the local tensors' .grad)."""
from __future__ import annotations

import threading
import time
import uuid

import grpc
import pytest
import torch

import flce
from conftest import RealServer

V, H = 16000, 256
BIG = 32768  # tokens: ~0.8 TFLOP of CPU engine work, still running when the failure lands


@pytest.fixture
def server(real_server_bin):
    srv = RealServer(real_server_bin)
    yield srv
    srv.stop()


def _head(client):
    g = torch.Generator().manual_seed(0)
    head = flce.RemoteLMHead(client, f"fail-{uuid.uuid4().hex[:6]}")
    lin = torch.nn.Linear(H, V, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(V, H, generator=g) / H ** 0.5)
    head.load_from_module(lin, dtype=torch.bfloat16)
    return head, g


def _batch(g, n):
    return (torch.randn(n, H, generator=g).to(torch.bfloat16).requires_grad_(True),
            torch.randint(0, V, (n,), generator=g))


def _kill_after(proc, seconds):
    timer = threading.Timer(seconds, proc.kill)
    timer.start()
    return timer


@pytest.mark.parametrize("plan", ["fused", "per_token"])
def test_server_killed_mid_call_raises_flce_error(server, plan):
    with flce.Client(server.target) as client:
        head, g = _head(client)
        x, y = _batch(g, BIG)
        lm_weight = torch.nn.Parameter(torch.zeros(V, H))
        timer = _kill_after(server.proc, 0.5)
        t0 = time.monotonic()
        with pytest.raises(flce.FlceError) as info:
            if plan == "fused":
                head(x, y).backward()
            else:
                out = head(x, y, return_logprob=True)
                out.logprob.sum().backward()
        timer.join()
        assert time.monotonic() - t0 < 60
    err = info.value
    assert err.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED,
                        grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), err
    assert err.method == "Compute" and err.code.name in str(err)
    assert x.grad is None and lm_weight.grad is None


def test_call_cancelled_mid_stream_leaves_grad_w_untouched(server):
    with flce.Client(server.target, timeout=60) as client:
        head, g = _head(client)
        x, y = _batch(g, 256)
        head(x, y).backward()  # one committed contribution
        before = head.fetch_grad()
        assert before.header.contributions == 1
        x, y = _batch(g, BIG)
        hurried = flce.Client(server.target, session_id=client.session_id, timeout=0.3)
        head_hurried = flce.RemoteLMHead(hurried, head.head_id)
        with pytest.raises(flce.FlceError) as info:
            head_hurried(x, y).backward()
        assert info.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        hurried.close()
        time.sleep(1.0)  # let the server notice the cancellation
        after = head.fetch_grad()
        assert after.header.contributions == 1
        assert torch.equal(after.weight, before.weight)
        assert x.grad is None
