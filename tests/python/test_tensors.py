"""Tensor ↔ bytes views and chunk assembly, for every wire dtype."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from flce import tensors

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
def test_byte_view_shares_storage(dtype):
    t = torch.randn(5, 3).to(dtype)
    view = tensors.byte_view(t)
    assert view.nbytes == t.numel() * t.element_size()
    view[:] = 0  # writes land in the tensor: no copy was made
    assert float(t.abs().sum()) == 0.0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,cols,chunk", [(37, 11, 100), (37, 11, 10), (1, 5, 1 << 20),
                                             (0, 4, 64), (64, 64, 64 * 64 * 4)])
def test_row_chunks_reassemble(dtype, rows, cols, chunk):
    t = torch.randn(rows, cols).to(dtype)
    pieces = list(tensors.row_chunks(t, chunk))
    row_bytes = cols * t.element_size()
    for _, piece in pieces:
        assert len(piece) % row_bytes == 0
        assert len(piece) <= max(chunk, row_bytes)
    asm = tensors.RowAssembler(rows, cols, dtype)
    for first, piece in reversed(pieces):  # any order
        asm.put(first, piece)
    assert asm.complete
    assert torch.equal(asm.tensor, t)


def test_bf16_bytes_are_the_raw_bits():
    t = torch.tensor([1.0, -2.0, 0.5], dtype=torch.bfloat16)
    raw = tensors.byte_view(t).tobytes()
    assert raw == np.array([0x3F80, 0xC000, 0x3F00], dtype="<u2").tobytes()


def test_assembler_rejects_partial_rows_and_out_of_range():
    asm = tensors.RowAssembler(4, 3, torch.float32)
    with pytest.raises(ValueError):
        asm.put(0, b"\0" * 5)
    with pytest.raises(ValueError):
        asm.put(3, b"\0" * 24)
    asm.put(0, b"\0" * 48)
    assert asm.complete


def test_assembler_refuses_a_row_sent_twice():
    """A duplicate and a missing row would add up to the right count: refused."""
    asm = tensors.RowAssembler(4, 2, torch.float32)
    asm.put(0, b"\0" * 16)  # rows 0, 1
    with pytest.raises(ValueError, match="arrived twice"):
        asm.put(1, b"\0" * 16)  # rows 1, 2: row 1 again
    assert asm.rows_filled == 2 and not asm.complete
    asm.put(2, b"\0" * 16)
    assert asm.complete


def test_non_contiguous_and_unsupported_dtypes():
    t = torch.randn(6, 4)[:, ::2]
    assert tensors.host_contiguous(t).is_contiguous()
    with pytest.raises(ValueError):
        tensors.byte_view(t)
    with pytest.raises(TypeError):
        tensors.wire_dtype(torch.float64)


def test_scalar_conversions():
    assert tensors.to_bytes_int32(torch.tensor([1, -100])) == \
        np.array([1, -100], dtype="<i4").tobytes()
    back = tensors.from_bytes(tensors.to_bytes_fp32(torch.tensor([0.25, 3.0])),
                              torch.float32, (2,))
    assert back.tolist() == [0.25, 3.0]
