"""grad_input on a connection of its own (ComputeHeader.output_token, ComputeOutput): a
call that returns at least 8 MiB of grad_input in messages reads it from a second
connection while hidden goes up on the first, with results bit for bit those of one
connection; small calls, and clients told not to, keep one; a client killed mid-call
lands nothing."""
from __future__ import annotations

import re
import subprocess
import sys
import time
import uuid

import pytest
import torch

import flce
from conftest import REPO, RealServer, assert_nothing_landed

V, H = 61, 1024
N = 4200  # 4200 x 1024 bf16 = 8.4 MB of grad_input: above the client's 8 MiB


@pytest.fixture(scope="module")
def server(real_server_bin):
    srv = RealServer(real_server_bin)
    yield srv
    srv.stop()


def _head(client) -> str:
    g = torch.Generator().manual_seed(21)
    head_id = f"out-{uuid.uuid4().hex[:8]}"
    client.upload_head(head_id, (torch.randn(V, H, generator=g) * 0.05).to(torch.bfloat16))
    return head_id


def _batch(n: int):
    g = torch.Generator().manual_seed(22)
    y = torch.randint(0, V, (n,), generator=g)
    y[::7] = -100
    return torch.randn(n, H, generator=g).to(torch.bfloat16), y


def test_grad_input_comes_back_on_its_own_connection_bit_for_bit(server):
    with flce.Client(server.target, timeout=120) as two, \
            flce.Client(server.target, timeout=120, output_stream=False) as one:
        assert "output_stream" in two.server_info().capabilities
        head = _head(two)
        x, y = _batch(N)
        a = two.compute(head, x, y, session_id="two", deterministic=True, per_token_loss=True)
        assert two.last_output_stream and two.last_transport == "grpc"
        b = one.compute(head, x, y, session_id="one", deterministic=True, per_token_loss=True)
        assert not one.last_output_stream
        assert a.loss == b.loss
        assert torch.equal(a.grad_input.view(torch.int16), b.grad_input.view(torch.int16))
        assert torch.equal(a.token_outputs["loss"], b.token_outputs["loss"])
        assert torch.equal(two.fetch_grad(head, session_id="two").weight,
                           one.fetch_grad(head, session_id="one").weight)
        # the second call reused the output connection
        c = two.compute(head, x, y, session_id="two", deterministic=True)
        assert two.last_output_stream
        assert torch.equal(c.grad_input.view(torch.int16), b.grad_input.view(torch.int16))
    assert "rpc=ComputeOutput" in server.log_text()


def test_small_calls_and_forward_only_keep_one_connection(server):
    with flce.Client(server.target, timeout=60) as client:
        head = _head(client)
        x, y = _batch(64)
        client.compute(head, x, y, session_id="small")
        assert not client.last_output_stream
        x, y = _batch(N)
        client.compute(head, x, y, session_id="fwd", forward_only=True)
        assert not client.last_output_stream
        client.compute(head, x, y, session_id="fwd", grad_input=False)
        assert not client.last_output_stream


def test_a_failed_call_raises_the_compute_calls_error(server):
    with flce.Client(server.target, timeout=60) as client:
        head = _head(client)
        x, y = _batch(N)
        x[17, 3] = float("nan")
        with pytest.raises(flce.FlceError) as err:
            client.compute(head, x, y, session_id="bad")
        assert err.value.code.name == "INVALID_ARGUMENT"
        assert "NaN" in err.value.details
        assert_nothing_landed(client, head, "bad")
        # the client goes on: the next call works on both connections
        x[17, 3] = 0.0
        client.compute(head, x, y, session_id="bad")
        assert client.last_output_stream


_KILLED = """
import sys, time, torch
sys.path.insert(0, {pkg!r})
import flce
client = flce.Client({target!r})
g = torch.Generator().manual_seed(22)
x = torch.randn({n}, {h}, generator=g).to(torch.bfloat16)
y = torch.randint(0, {v}, ({n},), generator=g)
real = client._compute
def slow(requests, **kw):
    def paced():
        for i, m in enumerate(requests):
            if i == 3:
                print("sent", flush=True)
                time.sleep(3600)  # killed here, with both connections open
            yield m
    return real(paced(), **kw)
client._compute = slow
client.compute({head!r}, x, y, session_id="victim", chunk_tokens=0)
"""


def test_a_client_killed_mid_call_lands_nothing(server):
    with flce.Client(server.target, timeout=60) as client:
        head = _head(client)
        script = _KILLED.format(pkg=str(REPO / "client" / "python"), target=server.target,
                                head=head, n=N, h=H, v=V)
        child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                                 text=True)
        try:
            assert child.stdout.readline().strip() == "sent"
        finally:
            child.kill()
            child.wait()
        # the server saw the call end (not only: the client stopped) before we look
        deadline = time.monotonic() + 20
        ended = re.compile(r'rpc=Compute .*session="?victim.* code=(?!OK)')
        while not any(ended.search(line) for line in server.log_text().splitlines()):
            assert time.monotonic() < deadline, server.log_text()
            time.sleep(0.1)
        assert_nothing_landed(client, head, "victim")
        x, y = _batch(N)
        client.compute(head, x, y, session_id="after")
        assert client.last_output_stream


def test_a_second_connection_that_reaches_another_server_is_not_used(server, real_server_bin):
    other = RealServer(real_server_bin)
    try:
        with flce.Client(server.target, timeout=60) as client:
            head = _head(client)
            # where the bulk calls' second connection goes: as if a load balancer sent
            # it to another replica
            client.messages_target = other.target
            x, y = _batch(N)
            with pytest.warns(RuntimeWarning, match="another server"):
                a = client.compute(head, x, y, session_id="lb")
            assert not client.last_output_stream
            assert a.grad_input.shape == (N, H)
            client.compute(head, x, y, session_id="lb")  # asked once
            assert not client.last_output_stream
    finally:
        other.stop()
