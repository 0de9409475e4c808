"""flce.wire's hand-encoded messages agree with the generated protobuf classes."""
from __future__ import annotations

import math
import struct

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


@pytest.mark.parametrize("offset,rows", [(0, 0), (0, 3), (70000, 5)])
def test_embed_grad_rows_and_end_parse_as_embed_grad_requests(offset, rows):
    data = bytes(range(256)) * rows
    msg = pb.EmbedGradRequest.FromString(
        wire.encode_embed_grad_rows(offset, rows, memoryview(data)))
    assert msg.WhichOneof("msg") == "rows"
    assert (msg.rows.token_offset, msg.rows.num_tokens, msg.rows.data) == (offset, rows, data)
    end = pb.EmbedGradRequest.FromString(wire.encode_embed_grad_end(12345))
    assert end.WhichOneof("msg") == "end" and end.end.num_tokens == 12345


def test_embed_rows_decode_from_protobuf_bytes():
    raw = pb.EmbedResponse(rows=pb.EmbedRows(token_offset=99, num_tokens=2,
                                             data=b"r" * 64)).SerializeToString()
    number, payload = wire.split_oneof(raw)
    assert number == wire.EMBED_RESPONSE_ROWS
    assert wire.decode_embed_rows(payload) == (99, 2, memoryview(b"r" * 64))
    header = pb.EmbedResponse(header=pb.EmbedHeader(num_tokens=2)).SerializeToString()
    assert wire.split_oneof(header)[0] != wire.EMBED_RESPONSE_ROWS


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


def _header_has(name: str) -> bool:
    return name in pb.ComputeHeader.DESCRIPTOR.fields_by_name


HEADER = dict(request_id="r-1", head_id="lm", session_id="s", num_tokens=3,
              targets=b"\x01\0\0\0\x02\0\0\0\x03\0\0\0", hidden_dtype=pb.DTYPE_BF16,
              commit=pb.COMMIT_DEFERRED, chunk_tokens=4096)


@pytest.mark.parametrize("hidden_size", [1, 127, 128, 1024, 8192, 2 ** 40])
def test_compute_header_carries_hidden_size(hidden_size):
    raw = wire.encode_compute_header(pb.ComputeHeader(**HEADER).SerializeToString(), hidden_size)
    number, payload = wire.split_oneof(raw)
    assert number == wire.COMPUTE_REQUEST_HEADER
    assert wire.parse_fields(payload)[18] == hidden_size  # int64 varint, field 18
    msg = pb.ComputeRequest.FromString(raw)  # the other fields survive intact
    assert msg.WhichOneof("msg") == "header"
    for name, value in HEADER.items():
        assert getattr(msg.header, name) == value, name


@pytest.mark.skipif(not _header_has("hidden_size"),
                    reason="the generated ComputeHeader has no hidden_size (field 18) yet: "
                           "proto/flce/v1/flce.proto predates it")
@pytest.mark.parametrize("hidden_size", [1, 1024, 2 ** 40])
def test_compute_header_hidden_size_parses_with_the_generated_class(hidden_size):
    raw = wire.encode_compute_header(pb.ComputeHeader(**HEADER).SerializeToString(), hidden_size)
    header = pb.ComputeHeader.FromString(bytes(wire.split_oneof(raw)[1]))
    assert header.hidden_size == hidden_size
    assert header.request_id == "r-1" and header.chunk_tokens == 4096
    assert pb.ComputeHeader(hidden_size=hidden_size, **HEADER).SerializeToString() == \
        bytes(wire.split_oneof(raw)[1]), "not the encoding protobuf itself writes"


def test_compute_header_refuses_a_hidden_size_that_means_not_given():
    with pytest.raises(ValueError):
        wire.encode_compute_header(b"", 0)


@pytest.mark.parametrize("scale", [0.0, 1.0, 0.5, -2.0, 65536.0, 1e-30])
def test_commit_carries_scale_explicitly(scale):
    rest = pb.CommitRequest(head_id="lm", session_id="s", request_id="r-1").SerializeToString()
    raw = wire.encode_commit(rest, scale)
    assert bytes(wire.parse_fields(memoryview(raw))[4]) == struct.pack("<f", scale)
    msg = pb.CommitRequest.FromString(raw)
    assert msg.scale == struct.unpack("<f", struct.pack("<f", scale))[0]
    assert (msg.head_id, msg.session_id, msg.request_id, msg.discard) == ("lm", "s", "r-1", False)
    if msg.DESCRIPTOR.fields_by_name["scale"].has_presence:
        assert msg.HasField("scale"), "scale 0 must be present: unset means 1.0"


def test_float32_out_of_range_becomes_infinity():
    assert wire.float32_bytes(1e39) == struct.pack("<f", math.inf)
    assert wire.float32_bytes(-1e39) == struct.pack("<f", -math.inf)
