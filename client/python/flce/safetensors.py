"""Reads (and writes) the safetensors format directly: Debian 12 has no python3-safetensors.

Format: an 8-byte little-endian header length N, N bytes of JSON
{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, then the
data; offsets are relative to the end of the header.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Dict, Optional, Union

import numpy as np
import torch

from flce.tensors import byte_view

_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
}
_NAMES = {v: k for k, v in _DTYPES.items()}
_MAX_HEADER = 100 << 20


def read_header(path: Union[str, Path]) -> Dict[str, dict]:
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError(f"{path}: not a safetensors file (too short)")
        (n,) = struct.unpack("<Q", raw)
        if n > _MAX_HEADER:
            raise ValueError(f"{path}: header of {n} bytes is implausible")
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header


def load_tensor(path: Union[str, Path], name: str) -> torch.Tensor:
    """One tensor from a safetensors file, read with a single file read."""
    header = read_header(path)
    if name not in header:
        raise KeyError(f"{path} has no tensor {name!r}; it has {sorted(header)}")
    info = header[name]
    dtype = _DTYPES.get(info["dtype"])
    if dtype is None:
        raise TypeError(f"{path}:{name}: unsupported dtype {info['dtype']}")
    begin, end = info["data_offsets"]
    shape = tuple(info["shape"])
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        f.seek(8 + n + begin)
        data = np.fromfile(f, dtype=np.uint8, count=end - begin)
    if len(data) != end - begin:
        raise ValueError(f"{path}:{name}: file truncated")
    t = torch.from_numpy(data)
    if dtype != torch.uint8:
        t = t.view(dtype)
    return t.reshape(shape)


def save(tensors: Dict[str, torch.Tensor], path: Union[str, Path],
         metadata: Optional[Dict[str, str]] = None) -> None:
    """Writes CPU tensors as a safetensors file (tests and small exports)."""
    header: Dict[str, object] = {}
    blobs = []
    offset = 0
    for name, t in tensors.items():
        t = t.detach().to("cpu").contiguous()
        raw = byte_view(t.to(torch.uint8) if t.dtype == torch.bool else t)
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + raw.nbytes]}
        blobs.append(raw)
        offset += raw.nbytes
    if metadata:
        header["__metadata__"] = metadata
    js = json.dumps(header, separators=(",", ":")).encode()
    js += b" " * (-len(js) % 8)  # the format aligns the data to 8 bytes
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(js)))
        f.write(js)
        for raw in blobs:
            f.write(memoryview(raw))
