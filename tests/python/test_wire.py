"""flce.wire's hand-encoded messages agree with the generated protobuf classes."""
from __future__ import annotations

import pytest

from flce import wire
from flce._pb import pb


@pytest.mark.parametrize("n", [0, 1, 127, 128, 300, 2 ** 31, 2 ** 63 - 1])
def test_varint_roundtrip(n):
    enc = wire.varint(n)
    assert wire._read_varint(memoryview(enc), 0) == (n, len(enc))


@pytest.mark.parametrize("offset,size", [(0, 0), (0, 10), (5, 1000), (70000, 300000)])
def test_hidden_chunk_parses_as_compute_request(offset, size):
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    msg = pb.ComputeRequest.FromString(wire.encode_hidden_chunk(offset, memoryview(data)))
    assert msg.WhichOneof("msg") == "hidden"
    assert msg.hidden.token_offset == offset and msg.hidden.data == data


def test_tensor_chunk_parses_as_upload_request():
    data = b"\x01\x02\x03" * 1000
    msg = pb.UploadHeadRequest.FromString(wire.encode_tensor_chunk(pb.TENSOR_BIAS, 4096, data))
    assert msg.WhichOneof("msg") == "chunk"
    assert (msg.chunk.role, msg.chunk.byte_offset, msg.chunk.data) == (pb.TENSOR_BIAS, 4096, data)


def test_grad_input_decodes_from_protobuf_bytes():
    raw = pb.ComputeResponse(grad_input=pb.GradInputChunk(
        token_offset=123456, num_tokens=7, data=b"abcdefg" * 100)).SerializeToString()
    number, payload = wire.split_oneof(raw)
    assert number == wire.COMPUTE_RESPONSE_GRAD_INPUT
    view = wire.decode_grad_input(payload)
    assert (view.token_offset, view.num_tokens, bytes(view.data)) == (123456, 7, b"abcdefg" * 100)


def test_grad_chunk_decodes_with_defaults_omitted():
    raw = pb.FetchGradResponse(chunk=pb.GradChunk(role=pb.TENSOR_WEIGHT, row_offset=0,
                                                  rows=3, data=b"x" * 12)).SerializeToString()
    number, payload = wire.split_oneof(raw)
    assert number == wire.FETCH_RESPONSE_CHUNK
    assert wire.decode_grad_chunk(payload) == (pb.TENSOR_WEIGHT, 0, 3, memoryview(b"x" * 12))


def test_negative_int64_and_unknown_fields_are_handled():
    raw = pb.GradInputChunk(token_offset=-2, num_tokens=1, data=b"z").SerializeToString()
    # fields a newer proto might add: fixed64 #15, fixed32 #16, varint #17
    raw += wire.varint(15 << 3 | 1) + b"\0" * 8 + wire.varint(16 << 3 | 5) + b"\0" * 4
    raw += wire.varint(17 << 3) + wire.varint(99)
    view = wire.decode_grad_input(memoryview(raw))
    assert (view.token_offset, view.num_tokens, bytes(view.data)) == (-2, 1, b"z")


def test_truncated_message_is_rejected():
    raw = wire.encode_hidden_chunk(1, b"0123456789")
    with pytest.raises((ValueError, IndexError)):
        wire.parse_fields(memoryview(raw[:-3]))
