"""The shared-memory transport from Python (flce.shm): chosen by itself where the server
offers it, results bit for bit those of messages, refusals where it is not offered, and a
client killed in the middle of a call leaves no gradient and no region behind."""
from __future__ import annotations

import errno
import os
import time
import uuid

import grpc
import pytest
import torch

import flce
from conftest import RealServer, assert_nothing_landed, kill_client_mid_call, probe_region
from flce._pb import pb

V, H, N = 83, 40, 37


@pytest.fixture(scope="module")
def plain_target(real_server_bin):
    srv = RealServer(real_server_bin, "--local-transports=none")
    yield srv.target
    srv.stop()


def _head(client, dtype=torch.float32) -> str:
    g = torch.Generator().manual_seed(5)
    head_id = f"shm-{uuid.uuid4().hex[:8]}"
    client.upload_head(head_id, (torch.randn(V, H, generator=g) * 0.3).to(dtype))
    return head_id


def _batch(dtype=torch.float32, seed=6):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(N, H, generator=g).to(dtype), torch.randint(0, V, (N,), generator=g)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_auto_uses_shared_memory_and_matches_messages_bit_for_bit(shm_target, dtype):
    with flce.Client(shm_target, timeout=60) as shm, \
            flce.Client(shm_target, timeout=60, transport="grpc") as plain:
        head = _head(plain, dtype)
        x, y = _batch(dtype)
        a = plain.compute(head, x, y, session_id="plain", deterministic=True)
        b = shm.compute(head, x, y, session_id="shm", deterministic=True)
        assert shm.shared_transport() is not None and plain.shared_transport() is None
        assert b.loss == a.loss
        assert torch.equal(b.grad_input.view(torch.int16 if dtype != torch.float32
                                             else torch.int32),
                           a.grad_input.view(torch.int16 if dtype != torch.float32
                                             else torch.int32))
        ga = plain.fetch_grad(head, session_id="plain").weight
        gb = plain.fetch_grad(head, session_id="shm").weight
        assert torch.equal(ga, gb)
        # a bigger call than the first region holds: the region grows
        x2, y2 = torch.cat([x] * 40), torch.cat([y] * 40)
        big = shm.compute(head, x2, y2, session_id="shm", deterministic=True)
        ref = plain.compute(head, x2, y2, session_id="plain", deterministic=True)
        assert big.loss == ref.loss and torch.equal(big.grad_input, ref.grad_input)


def test_through_remote_lm_head_and_submit(shm_target):
    with flce.Client(shm_target, timeout=60) as client:
        head = flce.RemoteLMHead(client, _head(client))
        x, y = _batch()
        x1 = x.clone().requires_grad_(True)
        head(x1, y).backward()
        x2 = x.clone().requires_grad_(True)
        head.submit(x2, y).backward()
        assert torch.equal(x1.grad, x2.grad)
        assert client.shared_transport() is not None


def test_shm_is_refused_where_the_server_does_not_offer_it(plain_target):
    with flce.Client(plain_target, timeout=60, transport="shm") as client:
        head = _head(client)
        x, y = _batch()
        with pytest.raises(flce.FlceError) as err:
            client.compute(head, x, y)
        assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert "--local-transports=shm" in err.value.details
    with flce.Client(plain_target, timeout=60) as auto:  # auto: messages, quietly
        result = auto.compute(_head(auto), x, y)
        assert auto.shared_transport() is None and result.grad_input.shape == (N, H)
    with pytest.raises(ValueError, match="transport"):
        flce.Client(plain_target, transport="ipc")


def test_a_server_without_flags_offers_regions_to_its_own_user_on_its_socket_only(
        real_server_bin):
    # flce-server's defaults: a private Unix socket, --local-transports=auto
    srv = RealServer(real_server_bin)
    try:
        with flce.Client(srv.target, timeout=60) as near, \
                flce.Client(srv.target, timeout=60, unix_socket=False) as far, \
                flce.Client(srv.target, timeout=60, unix_socket=False,
                            transport="shm") as insisting:
            head = _head(far)
            x, y = _batch()
            a = near.compute(head, x, y, session_id="near", deterministic=True)
            b = far.compute(head, x, y, session_id="far", deterministic=True)
            assert near.last_transport == "shm" and near.messages_target.startswith("unix:")
            # TCP loopback does not say who is calling: messages
            assert far.last_transport == "grpc" and far.messages_target == srv.target
            assert far.server_info().local_transports == ()
            assert a.loss == b.loss and torch.equal(a.grad_input, b.grad_input)
            with pytest.raises(flce.FlceError) as err:
                insisting.compute(head, x, y)
            assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
            assert f"through {srv.target}" in err.value.details
    finally:
        srv.stop()


def test_a_full_dev_shm_falls_back_to_messages_with_the_reason(shm_target, monkeypatch):
    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)
    with flce.Client(shm_target, timeout=60) as client:
        head = _head(client)
        x, y = _batch()
        with pytest.warns(RuntimeWarning, match="/dev/shm has no room"):
            first = client.compute(head, x, y)
        assert client.last_transport == "grpc" and first.grad_input.shape == (N, H)
        client.compute(head, x, y)  # not tried again
        assert client.last_transport == "grpc"
    with flce.Client(shm_target, timeout=60, transport="shm") as strict:
        with pytest.raises(flce.FlceError) as err:
            strict.compute(_head(strict), x, y)
        assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "/dev/shm has no room" in err.value.details


def test_a_retry_goes_the_way_its_request_id_first_went(shm_target, monkeypatch):
    with flce.Client(shm_target, timeout=60) as client:
        head = _head(client)
        x, y = _batch()
        with pytest.raises(flce.FlceError) as err:
            client.compute("no-such-head", x, y)  # through shared memory, refused
        assert err.value.code == grpc.StatusCode.NOT_FOUND
        retry_id = err.value.request_id
        # shared memory lost before the retry: the region it needs (larger than the 1 MiB
        # the first call registered) no longer fits /dev/shm
        def full(fd, offset, length):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(os, "posix_fallocate", full)
        x2, y2 = torch.cat([x] * 400), torch.cat([y] * 400)
        with pytest.warns(RuntimeWarning, match="/dev/shm has no room"):
            with pytest.raises(flce.FlceError) as again:
                client.compute(head, x2, y2, request_id=retry_id)
        assert again.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert f"request_id {retry_id} was first sent through shm" in again.value.details
        assert client.compute(head, x2, y2).loss > 0  # a new id goes by messages
        assert client.last_transport == "grpc"


def test_a_client_killed_mid_call_leaves_no_gradient_and_no_region(shm_target):
    with flce.Client(shm_target, timeout=60, transport="grpc") as observer:
        head = _head(observer)
        region_id = kill_client_mid_call(shm_target, head, N, H, on_gpu=False)
        # the region went with the client's Regions stream: naming it finds nothing
        code, details = probe_region(observer, head, region_id, N, H, pb.DTYPE_FP32)
        assert code == grpc.StatusCode.NOT_FOUND
        assert "no region" in details
        assert_nothing_landed(observer, head, "victim")


def test_a_unix_socket_client_is_on_the_servers_host(real_server_bin, tmp_path):
    socket_path = tmp_path / "flce.sock"
    srv = RealServer(real_server_bin, "--local-transports=shm", "--unix-socket",
                     str(socket_path))
    try:
        with flce.Client(f"unix:{socket_path}", timeout=60) as client:
            info = client.server_info()
            assert info.local_transports == ("shm",)
            head = _head(client)
            x, y = _batch()
            assert client.compute(head, x, y).grad_input.shape == (N, H)
            assert client.shared_transport() is not None
    finally:
        srv.stop()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the GPU machine)")
def test_a_gpu_hidden_goes_through_a_page_locked_region_and_comes_back_on_the_gpu(shm_target):
    with flce.Client(shm_target, timeout=60) as shm, \
            flce.Client(shm_target, timeout=60, transport="grpc") as plain:
        head = _head(plain, torch.bfloat16)
        x, y = _batch(torch.bfloat16)
        a = plain.compute(head, x.cuda(), y.cuda(), session_id="plain", deterministic=True)
        b = shm.compute(head, x.cuda(), y.cuda(), session_id="shm", deterministic=True)
        assert shm.shared_transport() is not None
        assert b.grad_input.is_cuda and not a.grad_input.is_cuda
        assert b.loss == a.loss
        assert torch.equal(b.grad_input.cpu().view(torch.int16), a.grad_input.view(torch.int16))


def test_a_broken_regions_stream_is_replaced_not_reused(shm_target):
    """The server releases a stream's regions when it ends (a restart, a dropped
    connection): the client must not name them again."""
    with flce.Client(shm_target, timeout=60) as client:
        head = _head(client)
        x, y = _batch()
        first = client.compute(head, x, y, deterministic=True)
        transport = client.shared_transport()
        old = transport._stream
        old.close()  # as if the connection had dropped
        again = client.compute(head, x, y, deterministic=True)
        assert transport._stream is not old and not transport._stream.broken()
        assert again.loss == first.loss


def test_an_idle_client_keeps_its_region_through_short_leases(real_server_bin):
    # --region-lease-s=1: the client must renew within the first second after its
    # registration, not after the five seconds it waits before it knows the lease.
    srv = RealServer(real_server_bin, "--local-transports=shm", "--region-lease-s", "1")
    try:
        with flce.Client(srv.target, timeout=60) as client:
            head = _head(client)
            x, y = _batch()
            a = client.compute(head, x, y, deterministic=True)
            assert client.last_transport == "shm"
            regions = [r.region_id for r in client.shared_transport()._free]
            time.sleep(3)
            b = client.compute(head, x, y, deterministic=True)
            assert client.last_transport == "shm"
            assert [r.region_id for r in client.shared_transport()._free] == regions
            assert torch.equal(a.grad_input, b.grad_input)
    finally:
        srv.stop()
