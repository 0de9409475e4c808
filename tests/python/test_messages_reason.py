"""Each Compute call whose hidden travels in messages tells the server why
(ComputeHeader.messages_reason), and the server counts it in flce_compute_calls_total:
an operator sees which trainers could use a region and what keeps them from it."""
from __future__ import annotations

import errno
import os
import re
import urllib.request
import uuid

import pytest
import torch

import flce
from conftest import RealServer, free_port

V, H, N = 61, 24, 19


def _calls(metrics_port: int) -> dict:
    """{(transport, reason): calls} from the server's /metrics."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics",
                                  timeout=10).read().decode()
    calls = {}
    for line in text.splitlines():
        m = re.match(r'flce_compute_calls_total\{reason="(\w+)",transport="(\w+)"\} (\S+)$',
                     line)
        if m:
            calls[(m.group(2), m.group(1))] = float(m.group(3))
    return calls


def _step(client: flce.Client, head: str) -> None:
    g = torch.Generator().manual_seed(3)
    client.compute(head, torch.randn(N, H, generator=g), torch.randint(0, V, (N,), generator=g))


def _head(client: flce.Client) -> str:
    head = f"reason-{uuid.uuid4().hex[:8]}"
    client.upload_head(head, torch.randn(V, H, generator=torch.Generator().manual_seed(2)) * 0.2)
    return head


@pytest.fixture
def server(real_server_bin, request):
    """A server with /metrics served, its other flags from the test's parameter."""
    port = free_port()
    srv = RealServer(real_server_bin, "--metrics-port", str(port), *request.param)
    srv.metrics_port = port
    yield srv
    srv.stop()


@pytest.mark.parametrize("server", [["--local-transports=none"]], indirect=True)
def test_a_server_that_offers_no_region_hears_not_offered_or_asked(server):
    with flce.Client(server.target, timeout=60) as near, \
            flce.Client(server.target, timeout=60, unix_socket=False) as far, \
            flce.Client(server.target, timeout=60, transport="grpc") as asked:
        head = _head(far)
        for client in (near, far, asked):
            _step(client, head)
    calls = _calls(server.metrics_port)
    assert calls[("messages_unix_socket", "not_offered")] == 1
    assert calls[("messages_tcp", "not_offered")] == 1
    assert calls[("messages_unix_socket", "asked")] == 1
    assert sum(v for (t, r), v in calls.items() if r == "unspecified") == 0


@pytest.mark.parametrize("server", [["--local-transports=shm"]], indirect=True)
def test_a_full_dev_shm_is_told_as_no_room(server, monkeypatch):
    with flce.Client(server.target, timeout=60) as client:
        head = _head(client)
        _step(client, head)  # through shared memory
        assert client.last_transport == "shm"

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)
    with flce.Client(server.target, timeout=60) as client:
        with pytest.warns(RuntimeWarning, match="/dev/shm has no room"):
            _step(client, head)
        _step(client, head)  # still messages, for the same reason
        assert client.last_transport == "grpc"
    calls = _calls(server.metrics_port)
    assert calls[("shm", "region")] == 1
    assert calls[("messages_unix_socket", "no_room")] == 2
