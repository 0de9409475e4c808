"""A Compute call's hidden over several connections (flce.pieces, Client(connections=N)):
results bit for bit those of one connection, the pieces really on the wire, and a server
that does not take pieces served over one connection."""
from __future__ import annotations

import time
import uuid
from pathlib import Path

import grpc
import pytest
import torch

import flce
import fake_server
from conftest import RealServer

V, H, N = 71, 48, 3001


@pytest.fixture(scope="module")
def server(real_server_bin):
    srv = RealServer(real_server_bin, "--local-transports=none")
    yield srv
    srv.stop()


def _pieces_served(server) -> int:
    """ComputePiece calls in the server's whole request log."""
    return Path(server.log.name).read_text(errors="replace").count("rpc=ComputePiece")


def _problem(dtype):
    g = torch.Generator().manual_seed(11)
    w = (torch.randn(V, H, generator=g) * 0.2).to(dtype)
    return w, torch.randn(N, H, generator=g).to(dtype), torch.randint(0, V, (N,), generator=g)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("unix_socket", [False, True])
def test_several_connections_match_one_bit_for_bit(server, dtype, unix_socket):
    w, x, y = _problem(dtype)
    head = f"pieces-{uuid.uuid4().hex[:8]}"
    kw = dict(timeout=60, transport="grpc", unix_socket=unix_socket, chunk_bytes=32 << 10)
    before = _pieces_served(server)
    with flce.Client(server.target, **kw) as one, \
            flce.Client(server.target, connections=4, **kw) as four:
        one.upload_head(head, w)
        a = one.compute(head, x, y, deterministic=True, session_id="one", per_token_loss=True)
        b = four.compute(head, x, y, deterministic=True, session_id="four", per_token_loss=True)
        assert a.loss == b.loss
        assert torch.equal(a.grad_input, b.grad_input)
        assert torch.equal(a.token_outputs["loss"], b.token_outputs["loss"])
        assert torch.equal(one.fetch_grad(head, session_id="one").weight,
                           four.fetch_grad(head, session_id="four").weight)
        assert four.messages_target.startswith("unix:") == unix_socket
    # three ComputePiece calls served (the request log names each)
    assert _pieces_served(server) - before == 3


def test_a_call_smaller_than_its_connections_uses_fewer(server):
    w, x, y = _problem(torch.float32)
    head = f"pieces-{uuid.uuid4().hex[:8]}"
    with flce.Client(server.target, timeout=60, transport="grpc", connections=9,
                     chunk_bytes=H * 4 * 1000) as client:
        client.upload_head(head, w)
        before = _pieces_served(server)
        assert client.compute(head, x, y).grad_input.shape == (N, H)  # 4 chunks: 3 pieces
        assert _pieces_served(server) - before == 3
        client.compute(head, x[:10], y[:10])  # one chunk: no piece
        assert _pieces_served(server) - before == 3


def test_a_server_without_pieces_gets_one_connection():
    srv, port = fake_server.start()
    try:
        w, x, y = _problem(torch.float32)
        with flce.Client(f"127.0.0.1:{port}", timeout=60, connections=4,
                         chunk_bytes=32 << 10) as client:
            client.upload_head("h", w)
            assert client.compute("h", x, y).grad_input.shape == (N, H)
            assert client._piece_stubs == []
    finally:
        srv.stop(None)


def test_a_piece_that_cannot_reach_the_server_fails_the_call_at_once(server, monkeypatch):
    w, x, y = _problem(torch.float32)
    head = f"pieces-{uuid.uuid4().hex[:8]}"
    with flce.Client(server.target, timeout=60, transport="grpc", connections=2,
                     chunk_bytes=32 << 10) as client:
        client.upload_head(head, w)
        client.compute(head, x, y)  # makes the piece's channel
        # its connection now goes nowhere (a port nothing listens on)
        unreachable = grpc.insecure_channel("127.0.0.1:1")
        client._piece_stubs[0] = unreachable.stream_unary("/flce.v1.Flce/ComputePiece")
        started = time.monotonic()
        with pytest.raises(flce.FlceError) as err:
            client.compute(head, x, y, session_id="unreached")
        # at once, not after the server's wait for the piece to join (10 s)
        assert time.monotonic() - started < 8
        assert err.value.code == grpc.StatusCode.UNAVAILABLE
        assert "ComputePiece" in err.value.details
        assert err.value.request_id
        assert client.sessions(head) == [] or all(
            s.session_id != "unreached" or s.contributions == 0 for s in client.sessions(head))


def test_connections_are_checked():
    for bad in (0, 10):
        with pytest.raises(ValueError, match="connections"):
            flce.Client("127.0.0.1:1", connections=bad)
