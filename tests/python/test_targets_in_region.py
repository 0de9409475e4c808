"""Targets in the region beside hidden (SharedHidden.targets_offset, 0.7.0): the client
stops serializing them into the header where the server takes them there, the results and
the call's fingerprint are those of targets in the header, and a bad range or a header
that also carries targets is refused with nothing landed."""
from __future__ import annotations

import uuid
from dataclasses import replace

import grpc
import pytest
import torch

import flce
from conftest import assert_nothing_landed
from flce import tensors, wire
from flce._pb import pb

V, H, N = 71, 24, 29


def _head(client) -> str:
    head_id = f"tr-{uuid.uuid4().hex[:8]}"
    weight = torch.randn(V, H, generator=torch.Generator().manual_seed(3)) * 0.3
    client.upload_head(head_id, weight)
    return head_id


def _batch(seed=4):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, V, (N,), generator=g)
    y[::5] = -100  # ignored tokens travel as negative int32 too
    return torch.randn(N, H, generator=g), y


def test_the_server_says_it_takes_targets_in_the_region(shm_target):
    with flce.Client(shm_target, timeout=60) as client:
        assert "targets_in_region" in client.server_info().capabilities


def test_targets_travel_in_the_region_with_the_results_of_messages(shm_target, monkeypatch):
    with flce.Client(shm_target, timeout=60) as shm, \
            flce.Client(shm_target, timeout=60, transport="grpc") as plain:
        head = _head(plain)
        x, y = _batch()
        want = plain.compute(head, x, y, session_id="plain", deterministic=True)
        assert shm.shared_transport() is not None

        def no_header_targets(t):
            raise AssertionError("targets serialized into the header")
        monkeypatch.setattr(tensors, "to_bytes_int32", no_header_targets)
        got = shm.compute(head, x, y, session_id="shm", deterministic=True)
        assert shm.last_transport == "shm"
        assert got.loss == want.loss and got.summary.n_valid == want.summary.n_valid
        assert torch.equal(got.grad_input, want.grad_input)
        monkeypatch.undo()
        assert torch.equal(plain.fetch_grad(head, session_id="shm").weight,
                           plain.fetch_grad(head, session_id="plain").weight)


def test_a_retry_with_header_targets_replays_the_call_whose_targets_were_in_the_region(
        shm_target):
    # the fingerprint covers the targets wherever they came from: same call, same id
    with flce.Client(shm_target, timeout=60) as shm, \
            flce.Client(shm_target, timeout=60) as header_targets:
        head = _head(shm)
        x, y = _batch()
        first = shm.compute(head, x, y, session_id="s", request_id="r-1")
        assert shm.last_transport == "shm" and not first.summary.replayed
        # a client that does not know the capability: its region call has header targets
        assert header_targets.shared_transport() is not None
        header_targets._local = replace(header_targets._local, capabilities=())
        sent = []
        serialize = tensors.to_bytes_int32

        def spy(t):
            sent.append(t)
            return serialize(t)
        tensors.to_bytes_int32 = spy
        try:
            again = header_targets.compute(head, x, y, session_id="s", request_id="r-1")
            assert sent and header_targets.last_transport == "shm"
            assert again.summary.replayed and again.loss == first.loss
            assert shm.fetch_grad(head, session_id="s").header.contributions == 1
            y2 = y.clone()
            y2[1] = (int(y2[1]) + 1) % V
            with pytest.raises(flce.FlceError) as err:
                header_targets.compute(head, x, y2, session_id="s", request_id="r-1")
            assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
        finally:
            tensors.to_bytes_int32 = serialize


def _raw_call(client, head_id, region, *, targets_offset, header_targets=b"",
              grad_input_offset=None):
    header = pb.ComputeHeader(
        request_id=uuid.uuid4().hex, head_id=head_id, session_id="refused", num_tokens=N,
        targets=header_targets, hidden_dtype=pb.DTYPE_FP32,
        outputs=pb.OutputSelection(grad_input=grad_input_offset is not None),
        shared=pb.SharedHidden(region_id=region.region_id, hidden_offset=0,
                               grad_input_offset=grad_input_offset or 0,
                               targets_offset=targets_offset))
    try:
        list(client._compute(iter([wire.encode_compute_header(header.SerializeToString(), H),
                                   wire.encode_end_of_input(N)])))
    except grpc.RpcError as err:
        return err.code(), err.details()
    return grpc.StatusCode.OK, ""


def test_bad_targets_in_the_region_are_refused_and_nothing_lands(shm_target):
    with flce.Client(shm_target, timeout=60) as client:
        head = _head(client)
        x, y = _batch()
        nbytes = N * H * 4
        region = client.shared_transport().acquire(2 * nbytes + 4 * N)
        try:
            region.tensor(0, (N, H), torch.float32).copy_(x)
            region.tensor(2 * nbytes, (N,), torch.int32).copy_(y)
            code, details = _raw_call(client, head, region, targets_offset=2 * nbytes,
                                      header_targets=tensors.to_bytes_int32(y))
            assert code == grpc.StatusCode.INVALID_ARGUMENT
            assert "ComputeHeader.targets must be empty" in details
            code, details = _raw_call(client, head, region, targets_offset=region.nbytes - 8)
            assert code == grpc.StatusCode.INVALID_ARGUMENT
            assert "shared.targets_offset" in details
            code, details = _raw_call(client, head, region, targets_offset=nbytes + 16,
                                      grad_input_offset=nbytes)
            assert code == grpc.StatusCode.INVALID_ARGUMENT
            assert "overlaps the targets" in details
            region.tensor(2 * nbytes, (N,), torch.int32)[3] = V  # not a token of the head
            code, details = _raw_call(client, head, region, targets_offset=2 * nbytes)
            assert code == grpc.StatusCode.INVALID_ARGUMENT
            assert f"targets[3] = {V}" in details
            assert_nothing_landed(client, head, "refused")
            # the same region with good targets computes
            region.tensor(2 * nbytes, (N,), torch.int32).copy_(y)
            code, details = _raw_call(client, head, region, targets_offset=2 * nbytes,
                                      grad_input_offset=nbytes)
            assert code == grpc.StatusCode.OK, details
        finally:
            client.shared_transport().give_back(region)
