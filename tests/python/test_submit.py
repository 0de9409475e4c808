"""Asynchronous calls (flce.RemoteLMHead.submit, flce.pipeline): the same gradients as the
autograd path, calls that really run behind the trainer's back, and no gradient step that
silently misses a micro-batch."""
from __future__ import annotations

import asyncio
import threading
import uuid

import grpc
import pytest
import torch
from torch import nn

import flce

V, H, N, MICRO = 61, 24, 10, 3


def _model(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    body = nn.Linear(H, H)
    lm_head = nn.Linear(H, V, bias=False)
    with torch.no_grad():
        body.weight.copy_(torch.randn(H, H, generator=g) * 0.3)
        body.bias.copy_(torch.randn(H, generator=g) * 0.1)
        lm_head.weight.copy_(torch.randn(V, H, generator=g) * 0.3)
    return body, lm_head


def _micro_batches(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(N, H, generator=g), torch.randint(0, V, (N,), generator=g))
            for _ in range(MICRO)]


def _head(client, lm_head) -> flce.RemoteLMHead:
    head = flce.RemoteLMHead(client, f"sub-{uuid.uuid4().hex[:8]}",
                             session_id=f"s-{uuid.uuid4().hex[:8]}")
    head.load_from_module(lm_head)
    return head


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def test_pipelined_micro_batches_give_the_autograd_paths_gradients(client):
    body_sync, lm_head = _model()
    body_async, _ = _model()
    sync_head, async_head = _head(client, lm_head), _head(client, lm_head)
    batches = _micro_batches()

    sync_losses = []
    for x, y in batches:
        loss = sync_head(body_sync(x), y) / MICRO
        loss.backward()
        sync_losses.append(float(loss) * MICRO)

    pending, async_losses = [], []
    for x, y in batches:
        pending.append(async_head.submit(body_async(x), y, scale=1 / MICRO))
        if len(pending) == 2:
            async_losses.append(float(pending.pop(0).backward()))
    async_losses += [float(p.backward()) for p in pending]

    assert async_losses == pytest.approx(sync_losses, rel=1e-6)
    for p_sync, p_async in zip(body_sync.parameters(), body_async.parameters()):
        assert _rel(p_async.grad, p_sync.grad) <= 1e-6
    g_sync, g_async = sync_head.fetch_grad(), async_head.fetch_grad()
    assert g_async.header.contributions == MICRO
    assert _rel(g_async.weight, g_sync.weight) <= 1e-6


def test_submit_returns_before_the_call_finishes(client):
    _, lm_head = _model()
    head = _head(client, lm_head)
    release = threading.Event()
    real_compute = client.compute

    def held_compute(*args, **kw):
        assert release.wait(30), "the test never released the call"
        return real_compute(*args, **kw)

    client.compute = held_compute
    try:
        x, y = _micro_batches()[0]
        pending = head.submit(x.requires_grad_(True), y)
        assert not pending.done()  # the trainer is free while the call waits
        assert len(head._in_flight) == 1
    finally:
        release.set()
    loss = pending.backward()
    assert torch.isfinite(loss)
    assert x.grad is not None and x.grad.shape == x.shape
    assert len(head._in_flight) == 0
    with pytest.raises(RuntimeError, match="already backpropagated"):
        pending.backward()


def test_a_failed_call_nobody_looked_at_is_raised_by_drain_once(client):
    _, lm_head = _model()
    head = _head(client, lm_head)
    x, _ = _micro_batches()[0]
    bad = torch.full((N,), V + 5, dtype=torch.long)  # every target out of range
    head.submit(x, bad)
    with pytest.raises(flce.FlceError) as err:
        head.fetch_grad()  # drains first
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    head.drain()  # reported once
    # a failure its PendingLoss already showed is not raised again
    seen = head.submit(x, bad)
    with pytest.raises(flce.FlceError):
        seen.result()
    head.drain()


def test_submit_in_asyncio(client):
    _, lm_head = _model()
    head = _head(client, lm_head)
    batches = _micro_batches()
    expected = [float(head.client.compute(head.head_id, x, y, session_id="other",
                                          grad_input=False).loss) for x, y in batches]

    async def main():
        pending = [head.submit(x, y) for x, y in batches]
        return [(await p).loss for p in pending]

    assert asyncio.run(main()) == pytest.approx(expected, rel=1e-6)


def test_submit_refuses_what_it_cannot_do(client):
    _, lm_head = _model()
    head = _head(client, lm_head)
    x, y = _micro_batches()[0]
    with pytest.raises(ValueError, match="mean or sum"):
        head.submit(x, y, reduction="none")
    with pytest.raises(ValueError, match="does not match"):
        head.submit(x, y[:-1])
    with pytest.raises(TypeError, match="unknown loss options"):
        head.submit(x, y, lable_smoothing=0.1)
    with pytest.raises(ValueError, match="max_in_flight"):
        flce.Client("127.0.0.1:1", max_in_flight=0)


def test_optimizer_step_drains_the_calls_in_flight(real_server_bin):
    from conftest import RealServer
    srv = RealServer(real_server_bin)
    try:
        with flce.Client(srv.target, timeout=60) as client:
            _, lm_head = _model()
            head = _head(client, lm_head)
            opt = head.optimizer("sgd", lr=0.1)
            version = head.info().version
            for x, y in _micro_batches():
                head.submit(x, y, scale=1 / MICRO)  # no backward: nothing waits for them
            opt.step()
            assert opt.last_step.outcome == flce.StepOutcome.APPLIED
            assert opt.last_step.contributions == MICRO
            assert opt.head_version == version + 1
    finally:
        srv.stop()


def test_the_pipelining_example_runs_both_modes_to_the_same_gradients(real_server_bin):
    """The example's timings are for reading, not asserting; its exit code says that the
    sequential and pipelined accumulation gave the body the same gradient."""
    import json
    import subprocess
    import sys
    from conftest import REPO, RealServer
    srv = RealServer(real_server_bin)
    try:
        run = subprocess.run(
            [sys.executable, str(REPO / "client/python/examples/pipelined_micro_batches.py"),
             "--target", srv.target, "--vocab", "500", "--hidden", "32", "--tokens", "64",
             "--micro-batches", "4", "--steps", "2", "--device", "cpu"],
            capture_output=True, text=True, timeout=300)
    finally:
        srv.stop()
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["micro_batches"] == 4 and report["body"] == "sleep"
    assert report["sequential_ms"] > 0 and report["pipelined_ms"] > 0
    assert report["body_grad_rel_diff"] <= 1e-5
