"""The data plane (flce.data_plane, flce-server --data-port): a call's rows and grad_input
as raw bytes beside its gRPC stream give the messages' results bit for bit; a connection
that breaks fails the call and lands nothing; a server without a data plane, or one that
cannot be reached, leaves the client in messages (or fails it, with data_plane=True)."""
from __future__ import annotations

import socket
import uuid

import grpc
import pytest
import torch

import flce
from conftest import RealServer, free_port
from flce import data_plane

V, H, N = 71, 48, 3001


@pytest.fixture(scope="module")
def server(real_server_bin):
    srv = RealServer(real_server_bin, "--local-transports=none", "--data-port=0")
    yield srv
    srv.stop()


def test_a_server_started_without_flags_offers_it_and_clients_take_it(real_server_bin):
    srv = RealServer(real_server_bin, "--local-transports=none", data_port=None)
    try:
        with flce.Client(srv.target, timeout=60, transport="grpc") as client:
            assert client.server_info().data_plane_port > 0
            assert "data_plane" in client.server_info().capabilities
            head, x, y = _head(client, torch.float32)
            r = client.compute(head, x, y)
            assert client.last_transport == "data_plane"
            assert r.grad_input.shape == x.shape and torch.isfinite(r.grad_input).all()
    finally:
        srv.stop()


def _problem(dtype):
    g = torch.Generator().manual_seed(5)
    w = (torch.randn(V, H, generator=g) * 0.2).to(dtype)
    return w, torch.randn(N, H, generator=g).to(dtype), torch.randint(0, V, (N,), generator=g)


def _head(client, dtype):
    w, x, y = _problem(dtype)
    head = f"dp-{uuid.uuid4().hex[:8]}"
    client.upload_head(head, w)
    return head, x, y


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_data_plane_matches_messages_bit_for_bit(server, dtype):
    kw = dict(timeout=60, transport="grpc", chunk_bytes=32 << 10)
    with flce.Client(server.target, data_plane=False, **kw) as messages, \
            flce.Client(server.target, **kw) as data:
        assert data.server_info().data_plane_port > 0
        head, x, y = _head(messages, dtype)
        a = messages.compute(head, x, y, deterministic=True, session_id="m", logprob=True)
        b = data.compute(head, x, y, deterministic=True, session_id="d", logprob=True)
        assert (messages.last_transport, data.last_transport) == ("grpc", "data_plane")
        assert a.loss == b.loss
        assert torch.equal(a.grad_input, b.grad_input)
        assert torch.equal(a.token_outputs["logprob"], b.token_outputs["logprob"])
        assert torch.equal(messages.fetch_grad(head, session_id="m").weight,
                           data.fetch_grad(head, session_id="d").weight)
        # forward only: rows out, nothing back on the connection
        f = data.compute(head, x, y, forward_only=True, deterministic=True)
        assert f.grad_input is None and f.loss == a.loss


def test_a_call_whose_connection_breaks_lands_nothing(server, monkeypatch):
    with flce.Client(server.target, timeout=60, transport="grpc", chunk_bytes=32 << 10,
                     data_plane=True) as client:
        head, x, y = _head(client, torch.float32)

        def half_then_close(self, token, chunks, rows):
            self._sock.sendall(data_plane.MAGIC + token)
            row, piece = next(iter(chunks))
            self._sock.sendall(data_plane.FRAME.pack(row, len(piece)) + piece)
            self._sock.shutdown(socket.SHUT_RDWR)

        monkeypatch.setattr(data_plane.DataPlaneCall, "_send", half_then_close)
        with pytest.raises(flce.FlceError) as err:
            client.compute(head, x, y, session_id="broken")
        assert err.value.code == grpc.StatusCode.UNAVAILABLE
        assert "data plane" in err.value.details
        monkeypatch.undo()
        assert all(s.session_id != "broken" or s.contributions == 0
                   for s in client.sessions(head))
        ok = client.compute(head, x, y, session_id="after")
        assert client.last_transport == "data_plane" and ok.grad_input is not None


def test_hidden_that_cannot_be_read_fails_the_call_at_once(server, monkeypatch):
    with flce.Client(server.target, timeout=60, transport="grpc", chunk_bytes=32 << 10,
                     data_plane=True) as client:
        head, x, y = _head(client, torch.float32)
        real = flce.tensors.host_row_chunks

        def first_then_fail(t, chunk_bytes):
            yield next(real(t, chunk_bytes))
            raise RuntimeError("the copy to the host failed")

        monkeypatch.setattr(flce.tensors, "host_row_chunks", first_then_fail)
        with pytest.raises(flce.FlceError) as err:
            client.compute(head, x, y, session_id="unread")
        assert err.value.code == grpc.StatusCode.INTERNAL
        assert "reading hidden failed" in err.value.details
        assert "the copy to the host failed" in err.value.details
        assert all(s.session_id != "unread" or s.contributions == 0
                   for s in client.sessions(head))


def test_without_a_data_plane_the_client_stays_in_messages(real_server_bin):
    srv = RealServer(real_server_bin, "--local-transports=none")
    try:
        with flce.Client(srv.target, timeout=60, transport="grpc") as auto:
            head, x, y = _head(auto, torch.float32)
            auto.compute(head, x, y)
            assert auto.last_transport == "grpc"
        with flce.Client(srv.target, timeout=60, transport="grpc", data_plane=True) as strict:
            with pytest.raises(flce.FlceError) as err:
                strict.compute(head, x, y)
            assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
            assert "no data plane" in err.value.details
    finally:
        srv.stop()


def test_a_data_port_that_cannot_be_reached_falls_back_with_a_warning(server, monkeypatch):
    closed = free_port()  # nothing listens there
    real = flce.Client.server_info

    def elsewhere(self):
        info = real(self)
        return type(info)(**{**info.__dict__, "data_plane_port": closed})

    monkeypatch.setattr(flce.Client, "server_info", elsewhere)
    with flce.Client(server.target, timeout=60, transport="grpc") as client:
        head, x, y = _head(client, torch.float32)
        with pytest.warns(RuntimeWarning, match="not using the server's data plane"):
            client.compute(head, x, y)
        assert client.last_transport == "grpc"
        client.compute(head, x, y)  # not tried again
        assert client.last_transport == "grpc"


@pytest.mark.parametrize("target, host", [
    ("localhost:50051", "localhost"), ("[::1]:50051", "::1"),
    ("dns:///flce.example:50051", "flce.example"), ("ipv4:10.0.0.2:50051", "10.0.0.2"),
    ("unix:/run/flce.sock", None), ("ipv4:10.0.0.2:1,10.0.0.3:1", None)])
def test_tcp_host(target, host):
    assert data_plane.tcp_host(target) == host


def test_a_given_channel_keeps_to_messages_unless_asked(server):
    """`target` names the data plane's host only for a channel the client made itself."""
    channel = grpc.insecure_channel(server.target)
    with flce.Client(server.target, channel=channel, timeout=60, transport="grpc") as given:
        head, x, y = _head(given, torch.float32)
        given.compute(head, x, y)
        assert given.last_transport == "grpc"
    channel = grpc.insecure_channel(server.target)
    with flce.Client(server.target, channel=channel, timeout=60, transport="grpc",
                     data_plane=True) as asked:
        asked.compute(head, x, y)
        assert asked.last_transport == "data_plane"
