"""The end message is the last one (docs/API.md, 0.10): a Compute stream that sends
anything after it fails and lands nothing. The fake server and the real one agree, so
client tests against the fake cannot pass on a protocol the server refuses."""
from __future__ import annotations

import uuid

import grpc
import pytest
import torch
from torch import nn

import flce
from flce import tensors, wire
from flce._pb import pb

V, H, N = 37, 16, 20


def _head(client):
    g = torch.Generator().manual_seed(3)
    lin = nn.Linear(H, V, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(V, H, generator=g))
    head = flce.RemoteLMHead(client, f"e-{uuid.uuid4().hex[:8]}",
                             session_id=f"s-{uuid.uuid4().hex[:8]}")
    head.load_from_module(lin, dtype=torch.float32)
    x = torch.randn(N, H, generator=g)
    y = torch.randint(0, V, (N,), generator=g)
    return head, x, y


def _contributions(client, head) -> int:
    if not any(s.session_id == head.session_id for s in client.sessions(head.head_id)):
        return 0
    return head.fetch_grad().header.contributions


def _messages(head, x, y, request_id, after):
    header = pb.ComputeHeader(head_id=head.head_id, session_id=head.session_id,
                              request_id=request_id, num_tokens=N,
                              hidden_dtype=pb.DTYPE_FP32, reduction=pb.REDUCTION_MEAN,
                              targets=tensors.to_bytes_int32(y))
    hidden = pb.ComputeRequest(hidden=pb.HiddenChunk(token_offset=0, data=x.numpy().tobytes()))
    end = pb.ComputeRequest(end=pb.EndOfInput(num_tokens=N))
    first = [pb.ComputeRequest(header=header).SerializeToString(), hidden.SerializeToString(),
             wire.encode_end_of_input(N)]
    return first + [m.SerializeToString() for m in after(header, hidden, end)]


@pytest.mark.parametrize("after", [
    lambda header, hidden, end: [end],
    lambda header, hidden, end: [hidden],
    lambda header, hidden, end: [pb.ComputeRequest(header=header)],
], ids=["second-end", "hidden-after-end", "header-after-end"])
def test_a_message_after_the_end_fails_and_lands_nothing(client, after):
    head, x, y = _head(client)
    request_id = f"after-end-{uuid.uuid4().hex[:8]}"
    call = client._channel.stream_stream("/flce.v1.Flce/Compute",
                                         request_serializer=lambda b: b,
                                         response_deserializer=lambda b: b)
    with pytest.raises(grpc.RpcError) as err:
        for _ in call(iter(_messages(head, x, y, request_id, after)), timeout=30):
            pass
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "a message after the end message" in err.value.details()
    assert _contributions(client, head) == 0
    # The request id was not used up: the same call, closed after its end, lands once.
    result = client.compute(head.head_id, x, y, session_id=head.session_id,
                            request_id=request_id)
    assert not result.summary.replayed
    assert _contributions(client, head) == 1
