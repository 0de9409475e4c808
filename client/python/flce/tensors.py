"""Tensors to wire bytes and back, without per-element Python work.

A tensor's bytes are exposed as a uint8 numpy view of its own storage (bf16 included:
numpy has no bf16, bytes need none), sliced into chunks as memoryviews; incoming chunks
are copied once, by numpy, into a preallocated destination tensor.
"""
from __future__ import annotations

from typing import Iterator, Tuple

import numpy as np
import torch

from flce._pb import pb

TORCH_TO_WIRE = {
    torch.float32: pb.DTYPE_FP32,
    torch.float16: pb.DTYPE_FP16,
    torch.bfloat16: pb.DTYPE_BF16,
}
WIRE_TO_TORCH = {v: k for k, v in TORCH_TO_WIRE.items()}

DEFAULT_CHUNK_BYTES = 4 << 20  # NOTES: 256 KiB-4 MiB chunks saturate one connection


def wire_dtype(dtype: torch.dtype) -> int:
    try:
        return TORCH_TO_WIRE[dtype]
    except KeyError:
        raise TypeError(f"flce carries fp32, fp16 and bf16 tensors, not {dtype}") from None


def torch_dtype(wire: int) -> torch.dtype:
    try:
        return WIRE_TO_TORCH[wire]
    except KeyError:
        raise ValueError(f"unexpected wire dtype {wire}") from None


def host_contiguous(t: torch.Tensor) -> torch.Tensor:
    """The tensor on the CPU, row-major; no copy when it already is. A GPU tensor lands
    in pinned memory (torch caches pinned blocks): a pageable copy runs several times
    slower and on the calling thread."""
    t = t.detach()
    if t.is_cuda:
        out = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        out.copy_(t)
        return out
    return t.contiguous()


class PinnedPool:
    """Pool-like source of pinned host tensors, for results headed to a GPU."""

    @staticmethod
    def empty(shape, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(tuple(shape), dtype=dtype, pin_memory=True)


def byte_view(t: torch.Tensor) -> np.ndarray:
    """uint8 view of a CPU contiguous tensor's storage (writable: also a copy target)."""
    if t.device.type != "cpu" or not t.is_contiguous():
        raise ValueError("byte_view needs a contiguous CPU tensor")
    flat = t.reshape(-1)
    if flat.numel() == 0:
        return np.empty(0, dtype=np.uint8)
    if t.dtype in (torch.bfloat16, torch.float16):
        # numpy has no bf16: the int16 view shares the storage
        return flat.view(torch.int16).numpy().view(np.uint8)
    return flat.numpy().view(np.uint8)


def row_chunks(t: torch.Tensor, chunk_bytes: int = DEFAULT_CHUNK_BYTES
               ) -> Iterator[Tuple[int, memoryview]]:
    """(first row, bytes of whole rows) pieces of a 2-D tensor, each ≤ chunk_bytes when a
    row fits. Views only: nothing is copied here."""
    rows = t.shape[0]
    row_bytes = t[0].numel() * t.element_size() if rows else 0
    mv = memoryview(byte_view(t))
    step = max(1, chunk_bytes // row_bytes) if row_bytes else max(rows, 1)
    for r in range(0, rows, step):
        n = min(step, rows - r)
        yield r, mv[r * row_bytes:(r + n) * row_bytes]


def host_row_chunks(t: torch.Tensor, chunk_bytes: int = DEFAULT_CHUNK_BYTES
                    ) -> Iterator[Tuple[int, memoryview]]:
    """row_chunks of a 2-D tensor's bytes on the host, made as they are taken: a GPU
    tensor is copied into pinned memory one chunk at a time (on the stream current when
    this is called), so that the first chunk can go out before the last is copied."""
    t = t.detach()
    if not t.is_cuda:
        yield from row_chunks(t.contiguous(), chunk_bytes)
        return
    stream = torch.cuda.current_stream(t.device)
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    rows = t.shape[0]
    row_bytes = t[0].numel() * t.element_size() if rows else 0
    step = max(1, chunk_bytes // row_bytes) if row_bytes else max(rows, 1)
    mv = memoryview(byte_view(host))
    for r in range(0, rows, step):
        n = min(step, rows - r)
        with torch.cuda.stream(stream):
            host[r:r + n].copy_(t[r:r + n])
        yield r, mv[r * row_bytes:(r + n) * row_bytes]


def byte_chunks(t: torch.Tensor, chunk_bytes: int = DEFAULT_CHUNK_BYTES
                ) -> Iterator[Tuple[int, memoryview]]:
    """(byte offset, piece) of any contiguous tensor's bytes."""
    mv = memoryview(byte_view(t))
    for off in range(0, len(mv), chunk_bytes):
        yield off, mv[off:off + chunk_bytes]


class RowAssembler:
    """Fills a preallocated [rows, cols] tensor from chunks that name their first row.

    Every row must arrive exactly once: a chunk overlapping rows already filled is
    refused, so that `complete` (as many rows filled as the tensor has) also means that
    none is missing."""

    def __init__(self, rows: int, cols: int, dtype: torch.dtype, pool=None):
        self.tensor = (pool.empty((rows, cols), dtype) if pool is not None
                       else torch.empty((rows, cols), dtype=dtype))
        self._bytes = byte_view(self.tensor)
        self._row_bytes = cols * self.tensor.element_size()
        self._filled = np.zeros(rows, dtype=bool)
        self.rows_filled = 0

    def put(self, first_row: int, data) -> None:
        self.reserve(first_row, len(data))[:] = np.frombuffer(data, dtype=np.uint8)

    def reserve(self, first_row: int, n: int) -> np.ndarray:
        """The tensor's bytes for `n` bytes of whole rows from `first_row`, counted as
        filled: the caller writes them (a socket's recv_into, for one)."""
        start = first_row * self._row_bytes
        if n % self._row_bytes if self._row_bytes else n:
            raise ValueError(f"chunk of {n} bytes is not whole rows of {self._row_bytes} bytes")
        if start < 0 or start + n > len(self._bytes):
            raise ValueError(f"chunk at row {first_row} ({n} bytes) lies outside the tensor")
        rows = n // self._row_bytes if self._row_bytes else 0
        seen = self._filled[first_row:first_row + rows]
        if seen.any():
            raise ValueError(f"rows {first_row}..{first_row + rows - 1} arrived twice (row "
                             f"{first_row + int(seen.argmax())} was already filled)")
        seen[:] = True
        self.rows_filled += rows
        return self._bytes[start:start + n]

    @property
    def complete(self) -> bool:
        return self.rows_filled == self.tensor.shape[0]


def from_bytes(data, dtype: torch.dtype, shape) -> torch.Tensor:
    """A new tensor holding a copy of little-endian bytes (small per-token outputs)."""
    arr = np.frombuffer(data, dtype=np.uint8).copy()
    t = torch.from_numpy(arr)
    if dtype == torch.uint8:
        return t.reshape(shape)
    return t.view(dtype).reshape(shape)


def to_bytes_fp32(t: torch.Tensor) -> bytes:
    return byte_view(host_contiguous(t.to(torch.float32))).tobytes()


def to_bytes_int32(t: torch.Tensor) -> bytes:
    return byte_view(host_contiguous(t.to(torch.int32))).tobytes()
