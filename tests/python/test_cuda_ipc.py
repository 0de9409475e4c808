"""The CUDA IPC transport from Python (flce.cuda_ipc), against a server on the GPU with
--local-transports=shm,cuda_ipc: chosen by itself for hidden on the server's GPU, results bit
for bit those of messages, non-finite hidden found on the GPU, retries and refusals with their
reasons, and a client killed in the middle of a call leaves no gradient and no region behind.
Needs a CUDA device and the CUDA engine (the GPU machine); skips elsewhere."""
from __future__ import annotations

import uuid

import grpc
import pytest
import torch

import flce
from conftest import RealServer, assert_nothing_landed, kill_client_mid_call, probe_region
from flce._pb import pb

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA device and the CUDA engine (the GPU machine)")

V, H, N = 1031, 136, 301


@pytest.fixture(scope="module")
def ipc_target(real_server_bin):
    srv = RealServer(real_server_bin, "--device", "cuda", "--local-transports=shm,cuda_ipc")
    yield srv.target
    srv.stop()


def _head(client, dtype=torch.bfloat16) -> str:
    g = torch.Generator().manual_seed(5)
    head_id = f"ipc-{uuid.uuid4().hex[:8]}"
    client.upload_head(head_id, (torch.randn(V, H, generator=g) * 0.3).to(dtype))
    return head_id


def _batch(dtype=torch.bfloat16, seed=6, n=N):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, H, generator=g).to(dtype)
    y = torch.randint(0, V, (n,), generator=g)
    y[::7] = -100
    return x.cuda(), y.cuda()


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.cpu().view(torch.int32 if t.dtype == torch.float32 else torch.int16)


def test_the_server_offers_it_for_its_gpu(ipc_target):
    with flce.Client(ipc_target, timeout=60) as client:
        info = client.server_info()
        assert info.local_transports == ("shm", "cuda_ipc")
        assert info.device_uuid.startswith("GPU-")
        assert flce.cuda_ipc.same_gpu(torch.device("cuda", 0), info.device_uuid) or \
            torch.cuda.device_count() > 1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_auto_uses_gpu_memory_and_matches_messages_bit_for_bit(ipc_target, dtype):
    with flce.Client(ipc_target, timeout=60) as ipc, \
            flce.Client(ipc_target, timeout=60, transport="grpc") as plain:
        head = _head(plain, dtype)
        x, y = _batch(dtype)
        a = plain.compute(head, x, y, session_id="plain", deterministic=True, per_token_loss=True)
        b = ipc.compute(head, x, y, session_id="ipc", deterministic=True, per_token_loss=True)
        assert ipc.last_transport == "cuda_ipc" and plain.last_transport == "grpc"
        assert b.grad_input.is_cuda and b.grad_input.device == x.device
        assert b.loss == a.loss
        assert torch.equal(_bits(b.grad_input), _bits(a.grad_input))
        assert torch.equal(b.token_outputs["loss"], a.token_outputs["loss"])
        assert torch.equal(plain.fetch_grad(head, session_id="plain").weight,
                           plain.fetch_grad(head, session_id="ipc").weight)
        # a bigger call than the first region holds: the region grows
        x2, y2 = torch.cat([x] * 30), torch.cat([y] * 30)
        big = ipc.compute(head, x2, y2, session_id="ipc", deterministic=True)
        ref = plain.compute(head, x2, y2, session_id="plain", deterministic=True)
        assert ipc.last_transport == "cuda_ipc"
        assert big.loss == ref.loss and torch.equal(_bits(big.grad_input), _bits(ref.grad_input))
        # hidden on the CPU takes shared memory instead
        cpu = ipc.compute(head, x.cpu(), y.cpu(), session_id="ipc-cpu", deterministic=True)
        assert ipc.last_transport == "shm" and cpu.loss == a.loss


def test_targets_are_read_from_gpu_memory_after_the_event(ipc_target, monkeypatch):
    # SharedHidden.targets_offset: the server copies them off the region once the client's
    # event has fired; the client serializes none into the header
    with flce.Client(ipc_target, timeout=60) as ipc, \
            flce.Client(ipc_target, timeout=60, transport="grpc") as plain:
        head = _head(plain)
        assert ipc.device_transport(_batch()[0]) is not None

        def no_header_targets(t):
            raise AssertionError("targets serialized into the header")
        monkeypatch.setattr(flce.tensors, "to_bytes_int32", no_header_targets)
        for seed in (11, 12):  # the region's targets are rewritten for the second call
            x, y = _batch(seed=seed)
            got = ipc.compute(head, x, y, session_id="ipc", deterministic=True)
            assert ipc.last_transport == "cuda_ipc"
            monkeypatch.undo()
            ref = plain.compute(head, x, y, session_id="ref", deterministic=True)
            monkeypatch.setattr(flce.tensors, "to_bytes_int32", no_header_targets)
            assert got.loss == ref.loss and got.summary.n_valid == ref.summary.n_valid
            assert torch.equal(_bits(got.grad_input), _bits(ref.grad_input))


def test_autograd_and_pipelined_submits(ipc_target):
    with flce.Client(ipc_target, timeout=60, max_in_flight=2) as client:
        head = flce.RemoteLMHead(client, _head(client))
        xs = [_batch(seed=s) for s in range(4)]
        grads = []
        for x, y in xs:
            x1 = x.clone().requires_grad_(True)
            head(x1, y).backward()
            grads.append(x1.grad)
        assert client.last_transport == "cuda_ipc"
        client.last_transport = ""
        pending = []
        for x, y in xs:
            x2 = x.clone().requires_grad_(True)
            pending.append((x2, head.submit(x2, y)))
        for (x2, loss), g in zip(pending, grads):
            loss.backward()
            assert torch.equal(x2.grad, g)
        # submitted calls read hidden on the GPU too (not through a host copy)
        assert client.last_transport == "cuda_ipc"


def test_non_finite_hidden_is_found_on_the_gpu_and_lands_nothing(ipc_target):
    with flce.Client(ipc_target, timeout=60) as client:
        head = _head(client)
        x, y = _batch()
        x[123, 45] = float("inf")
        with pytest.raises(flce.FlceError) as err:
            client.compute(head, x, y, session_id="bad")
        assert client.device_transport(x) is not None
        assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "hidden holds NaN or Inf at token 123 (element 45)" in err.value.details
        assert_nothing_landed(client, head, "bad")


def test_retries_replay_and_a_changed_transport_or_data_is_refused(ipc_target):
    with flce.Client(ipc_target, timeout=60) as ipc, \
            flce.Client(ipc_target, timeout=60, transport="grpc") as plain:
        head = _head(ipc)
        x, y = _batch()
        first = ipc.compute(head, x, y, session_id="r", request_id="once")
        again = ipc.compute(head, x, y, session_id="r", request_id="once")
        assert again.summary.replayed and again.loss == first.loss
        with pytest.raises(flce.FlceError) as other:
            ipc.compute(head, x * 2, y, session_id="r", request_id="once")
        assert other.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "other hidden states" in other.value.details
        with pytest.raises(flce.FlceError) as moved:
            plain.compute(head, x, y, session_id="r", request_id="once")
        assert moved.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert "cuda_ipc" in moved.value.details
        assert ipc.fetch_grad(head, session_id="r").header.contributions == 1


def test_cuda_ipc_is_refused_where_it_cannot_serve(real_server_bin):
    srv = RealServer(real_server_bin, "--device", "cuda", "--local-transports=shm")
    try:
        with flce.Client(srv.target, timeout=60, transport="cuda_ipc") as client:
            head = _head(client)
            x, y = _batch()
            with pytest.raises(ValueError, match="on a GPU"):
                client.compute(head, x.cpu(), y.cpu())
            with pytest.raises(flce.FlceError) as err:
                client.compute(head, x, y)
            assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
            assert "--local-transports=cuda_ipc" in err.value.details
        with flce.Client(srv.target, timeout=60) as auto:  # auto: shared memory, quietly
            auto.compute(_head(auto), x, y)
            assert auto.last_transport == "shm"
    finally:
        srv.stop()


def test_a_region_on_another_gpu_or_with_a_wrong_key_is_refused(ipc_target):
    with flce.Client(ipc_target, timeout=60) as client:
        from flce import cuda_ipc
        from flce.shm import RegionStream
        stream = RegionStream(client._regions, 60)
        region = cuda_ipc.DeviceRegion(torch.device("cuda", 0), 1 << 20)
        try:
            for uuid_, key, code in (("00000000000000000000000000000000", region.key,
                                      grpc.StatusCode.FAILED_PRECONDITION),
                                     (cuda_ipc.device_uuid(region.device), bytes(16),
                                      grpc.StatusCode.PERMISSION_DENIED)):
                with pytest.raises(flce.FlceError) as err:
                    stream.ask(pb.RegionRequest(register=pb.RegisterRegion(
                        bytes=region.nbytes, key=key,
                        cuda_ipc=pb.CudaIpcMemory(memory_handle=region.memory_handle,
                                                  event_handle=region.event_handle,
                                                  device_uuid=uuid_))))
                assert err.value.code == code, err.value.details
                stream = RegionStream(client._regions, 60)  # a refusal ends the stream
        finally:
            stream.close()
            region.close()
        # the server is unharmed
        head = _head(client)
        x, y = _batch()
        client.compute(head, x, y)
        assert client.last_transport == "cuda_ipc"


def test_a_client_killed_mid_call_leaves_no_gradient_and_no_region(ipc_target):
    with flce.Client(ipc_target, timeout=60, transport="grpc") as observer:
        head = _head(observer)
        region_id = kill_client_mid_call(ipc_target, head, N, H, on_gpu=True)
        code, details = probe_region(observer, head, region_id, N, H, pb.DTYPE_BF16)
        assert code == grpc.StatusCode.NOT_FOUND, details
        assert_nothing_landed(observer, head, "victim")
        # the server and its GPU are fine
        with flce.Client(ipc_target, timeout=60) as client:
            x, y = _batch()
            client.compute(head, x, y)
            assert client.last_transport == "cuda_ipc"
