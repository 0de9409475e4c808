"""Messages through the server's Unix-domain socket: a client on the server's host that
reached it over TCP sends its tensor-carrying calls through the socket the server names
(GetServerInfo.unix_socket), with results bit for bit those of TCP; it checks that the
socket leads to the same server, and keeps TCP when it does not or when told not to."""
from __future__ import annotations

import os
import uuid
import warnings

import pytest
import torch

import flce
from conftest import RealServer

V, H, N = 61, 24, 45


def _accepted_connections(path: str) -> int:
    """Sockets bound to `path` in /proc/net/unix: the listener, plus one per connection
    the server accepted on it."""
    with open("/proc/net/unix") as f:
        return sum(1 for line in f if line.rstrip().endswith(" " + path))


def _head(client) -> str:
    g = torch.Generator().manual_seed(11)
    head_id = f"uds-{uuid.uuid4().hex[:8]}"
    client.upload_head(head_id, torch.randn(V, H, generator=g) * 0.3)
    return head_id


def _batch():
    g = torch.Generator().manual_seed(12)
    return torch.randn(N, H, generator=g).to(torch.bfloat16), torch.randint(0, V, (N,),
                                                                             generator=g)


@pytest.fixture
def socket_server(real_server_bin, tmp_path):
    path = str(tmp_path / "flce.sock")
    srv = RealServer(real_server_bin, "--unix-socket", path)
    yield srv, path
    srv.stop()


def test_messages_go_through_the_socket_and_match_tcp_bit_for_bit(socket_server):
    srv, path = socket_server
    with flce.Client(srv.target, timeout=60, transport="grpc") as near, \
            flce.Client(srv.target, timeout=60, unix_socket=False) as far:
        assert near.server_info().unix_socket == path
        assert near.messages_target == srv.target  # nothing moved before a bulk call
        before = _accepted_connections(path)
        head = _head(near)
        assert near.messages_target == f"unix:{path}"
        assert _accepted_connections(path) > before
        x, y = _batch()
        a = near.compute(head, x, y, session_id="near", deterministic=True)
        b = far.compute(head, x, y, session_id="far", deterministic=True)
        assert far.messages_target == srv.target
        assert a.loss == b.loss
        assert torch.equal(a.grad_input.view(torch.int16), b.grad_input.view(torch.int16))
        ga = near.fetch_grad(head, session_id="near").weight
        gb = far.fetch_grad(head, session_id="far").weight
        assert torch.equal(ga, gb)
        assert near.last_transport == "grpc"


def test_a_socket_that_leads_to_another_server_is_not_used(real_server_bin, tmp_path):
    path = str(tmp_path / "flce.sock")
    first = RealServer(real_server_bin, "--unix-socket", path)
    try:
        # The second takes the path over: the first still names it, but it leads elsewhere.
        second = RealServer(real_server_bin, "--unix-socket", path)
        try:
            with flce.Client(first.target, timeout=60) as client:
                with pytest.warns(RuntimeWarning, match="another server"):
                    head = _head(client)
                assert client.messages_target == first.target
                x, y = _batch()
                assert client.compute(head, x, y).grad_input.shape == (N, H)
                assert head in [h.head_id for h in client.heads()]
        finally:
            second.stop()
    finally:
        first.stop()


def test_without_a_socket_messages_stay_on_tcp(real_server_bin):
    srv = RealServer(real_server_bin, "--unix-socket=none")
    try:
        with flce.Client(srv.target, timeout=60) as client:
            assert client.server_info().unix_socket == ""
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                head = _head(client)
                x, y = _batch()
                client.compute(head, x, y)
            assert client.messages_target == srv.target
    finally:
        srv.stop()


def test_a_server_without_flags_has_a_private_socket_its_clients_use(real_server_bin,
                                                                      tmp_path, monkeypatch):
    # flce-server's default (--unix-socket=auto): flce-<pid>.sock in a directory of
    # this user's, used by a client that knows only the TCP address; gone after the stop.
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    srv = RealServer(real_server_bin)
    path = f"{tmp_path}/flce/flce-{srv.proc.pid}.sock"
    try:
        with flce.Client(srv.target, timeout=60) as client:
            assert client.server_info().unix_socket == path
            assert (os.stat(f"{tmp_path}/flce").st_mode & 0o777) == 0o700
            head = _head(client)
            x, y = _batch()
            client.compute(head, x, y)
            assert client.messages_target == f"unix:{path}"
    finally:
        srv.stop()
    assert not os.path.exists(path)
