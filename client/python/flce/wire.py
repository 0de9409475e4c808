"""Hand-encoded protobuf for the bulky messages (hidden and embedding gradient rows in,
grad_input, grad_W and embedding rows out).

Why not the generated classes: Python protobuf only accepts `bytes` for a bytes field, so
a 4 MiB chunk is copied into the message and again by SerializeToString, and reading
`.data` copies it once more. Here a request chunk is built with a single join (the one copy
gRPC's `bytes` interface forces), and a response's payload is a memoryview into the
received buffer, copied once, straight into the destination tensor. The encodings are the
standard wire format of flce.proto's messages; small messages still use the generated code.
"""
from __future__ import annotations

import math
import struct
from typing import Dict, NamedTuple, Union

_VARINT = 0
_FIXED64 = 1
_LEN = 2
_FIXED32 = 5

# Field numbers from proto/flce/v1/flce.proto.
COMPUTE_REQUEST_HEADER = 1          # ComputeRequest.header (ComputeHeader)
COMPUTE_REQUEST_HIDDEN = 2          # ComputeRequest.hidden (HiddenChunk)
COMPUTE_REQUEST_END = 3             # ComputeRequest.end (EndOfInput)
COMPUTE_HEADER_HIDDEN_SIZE = 18     # ComputeHeader.hidden_size (int64; 0 = not given)
COMMIT_REQUEST_SCALE = 4            # CommitRequest.scale (optional float; unset = 1.0)
UPLOAD_REQUEST_CHUNK = 2            # UploadHeadRequest.chunk (TensorChunk)
COMPUTE_RESPONSE_GRAD_INPUT = 1     # ComputeResponse.grad_input (GradInputChunk)
FETCH_RESPONSE_CHUNK = 2            # FetchGradResponse.chunk (GradChunk)
DOWNLOAD_RESPONSE_CHUNK = 2         # DownloadHeadResponse.chunk (GradChunk)
EMBED_RESPONSE_ROWS = 2             # EmbedResponse.rows (EmbedRows)
EMBED_GRAD_REQUEST_ROWS = 2         # EmbedGradRequest.rows (EmbedRows)
EMBED_GRAD_REQUEST_END = 3          # EmbedGradRequest.end (EndOfInput)


def varint(n: int) -> bytes:
    if n < 0:
        n &= (1 << 64) - 1  # int64 negatives take ten bytes, as protobuf writes them
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _key(field: int, wire_type: int) -> bytes:
    return varint((field << 3) | wire_type)


def _int_field(field: int, value: int) -> bytes:
    return _key(field, _VARINT) + varint(value) if value else b""


def _wrap(outer_field: int, inner_head: bytes, payload) -> bytes:
    """A length-delimited `outer_field` holding inner_head (the inner message's fields and
    its bytes field's key and length) followed by payload, which is copied exactly once."""
    n = len(inner_head) + len(payload)
    return b"".join((_key(outer_field, _LEN), varint(n), inner_head, payload))


def encode_hidden_chunk(token_offset: int, data) -> bytes:
    """ComputeRequest{hidden: HiddenChunk{token_offset, data}}; data: a bytes-like view."""
    head = _int_field(1, token_offset) + _key(2, _LEN) + varint(len(data))
    return _wrap(COMPUTE_REQUEST_HIDDEN, head, data)


def encode_end_of_input(num_tokens: int) -> bytes:
    """ComputeRequest{end: EndOfInput{num_tokens}}: the last message of every Compute call.
    A stream that ends without it (a cancel, a crash, a broken connection) lands nothing."""
    return _wrap(COMPUTE_REQUEST_END, _int_field(1, num_tokens), b"")


def encode_embed_grad_rows(token_offset: int, num_tokens: int, data) -> bytes:
    """EmbedGradRequest{rows: EmbedRows{token_offset, num_tokens, data}}: gradient rows
    [token_offset, token_offset + num_tokens); data: a bytes-like view."""
    head = (_int_field(1, token_offset) + _int_field(2, num_tokens) + _key(3, _LEN)
            + varint(len(data)))
    return _wrap(EMBED_GRAD_REQUEST_ROWS, head, data)


def encode_embed_grad_end(num_tokens: int) -> bytes:
    """EmbedGradRequest{end: EndOfInput{num_tokens}}: the last message of every EmbedGrad
    call; without it nothing lands."""
    return _wrap(EMBED_GRAD_REQUEST_END, _int_field(1, num_tokens), b"")


def encode_compute_header(header: bytes, hidden_size: int) -> bytes:
    """ComputeRequest{header: ComputeHeader{..., hidden_size}}: `header` is a serialized
    ComputeHeader without hidden_size (a generated class that predates the field cannot
    set it), to which field 18 is appended; appended scalar fields win, so this is right
    whatever the generated class knows. hidden_size must be > 0 (0 means "not given")."""
    if hidden_size <= 0:
        raise ValueError(f"hidden_size must be positive, got {hidden_size}")
    return _wrap(COMPUTE_REQUEST_HEADER, b"",
                 bytes(header) + _key(COMPUTE_HEADER_HIDDEN_SIZE, _VARINT) + varint(hidden_size))


def float32_bytes(value: float) -> bytes:
    """A proto `float` (fixed32, little-endian); out of float32's range it is ±inf."""
    try:
        return struct.pack("<f", value)
    except OverflowError:
        return struct.pack("<f", math.copysign(math.inf, value))


def encode_commit(request: bytes, scale: float) -> bytes:
    """CommitRequest with `scale` always present (`optional float`: unset means 1.0, so a
    scale of 0.0 must be on the wire); `request` is the other fields, serialized."""
    return bytes(request) + _key(COMMIT_REQUEST_SCALE, _FIXED32) + float32_bytes(scale)


def encode_tensor_chunk(role: int, byte_offset: int, data) -> bytes:
    """UploadHeadRequest{chunk: TensorChunk{role, byte_offset, data}}."""
    head = _int_field(1, role) + _int_field(2, byte_offset) + _key(3, _LEN) + varint(len(data))
    return _wrap(UPLOAD_REQUEST_CHUNK, head, data)


def _read_varint(buf: memoryview, pos: int):
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise ValueError("malformed varint")


Field = Union[int, memoryview]


def parse_fields(buf: memoryview) -> Dict[int, Field]:
    """Top-level fields of one message: varints as int, length-delimited as views (last wins)."""
    fields: Dict[int, Field] = {}
    pos, end = 0, len(buf)
    while pos < end:
        key, pos = _read_varint(buf, pos)
        field, wire_type = key >> 3, key & 7
        if wire_type == _VARINT:
            fields[field], pos = _read_varint(buf, pos)
        elif wire_type == _LEN:
            n, pos = _read_varint(buf, pos)
            if pos + n > end:
                raise ValueError("truncated message")
            fields[field] = buf[pos:pos + n]
            pos += n
        elif wire_type == _FIXED64:
            fields[field] = buf[pos:pos + 8]
            pos += 8
        elif wire_type == _FIXED32:
            fields[field] = buf[pos:pos + 4]
            pos += 4
        else:
            raise ValueError(f"unsupported wire type {wire_type}")
    return fields


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= (1 << 63) else v


class GradInputView(NamedTuple):
    """A GradInputChunk whose data still lives in the received buffer."""
    token_offset: int
    num_tokens: int
    data: memoryview


class EmbedRowsView(NamedTuple):
    """An EmbedRows whose data still lives in the received buffer."""
    token_offset: int
    num_tokens: int
    data: memoryview


class GradChunkView(NamedTuple):
    """A GradChunk whose data still lives in the received buffer."""
    role: int
    row_offset: int
    rows: int
    data: memoryview


_EMPTY = memoryview(b"")


def decode_grad_input(buf: memoryview) -> GradInputView:
    f = parse_fields(buf)
    return GradInputView(_signed(f.get(1, 0)), _signed(f.get(2, 0)), f.get(3, _EMPTY))


def decode_embed_rows(buf: memoryview) -> EmbedRowsView:
    f = parse_fields(buf)
    return EmbedRowsView(_signed(f.get(1, 0)), _signed(f.get(2, 0)), f.get(3, _EMPTY))


def decode_grad_chunk(buf: memoryview) -> GradChunkView:
    f = parse_fields(buf)
    return GradChunkView(f.get(1, 0), _signed(f.get(2, 0)), _signed(f.get(3, 0)),
                         f.get(4, _EMPTY))


def split_oneof(raw: bytes):
    """(field number, view of its payload) of a message that is a single oneof."""
    f = parse_fields(memoryview(raw))
    if len(f) != 1:
        raise ValueError(f"expected one oneof member, got fields {sorted(f)}")
    return next(iter(f.items()))
