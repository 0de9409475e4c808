"""flce.safetensors reads what it writes, and reads a file built by hand from the spec."""
from __future__ import annotations

import json
import struct

import pytest
import torch

from flce import safetensors


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16,
                                   torch.float64, torch.int64])
def test_roundtrip(tmp_path, dtype):
    w = (torch.randn(7, 5) * 10).to(dtype)
    b = torch.arange(7).to(dtype)
    path = tmp_path / "m.safetensors"
    safetensors.save({"lm_head.weight": w, "lm_head.bias": b}, path, {"format": "pt"})
    assert set(safetensors.read_header(path)) == {"lm_head.weight", "lm_head.bias"}
    assert torch.equal(safetensors.load_tensor(path, "lm_head.weight"), w)
    assert torch.equal(safetensors.load_tensor(path, "lm_head.bias"), b)


def test_reads_a_hand_built_file(tmp_path):
    data = struct.pack("<4f", 1.0, 2.0, 3.0, 4.0) + struct.pack("<2e", 0.5, -1.0)
    header = json.dumps({"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
                         "b": {"dtype": "F16", "shape": [2], "data_offsets": [16, 20]},
                         "__metadata__": {"k": "v"}}).encode()
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    assert safetensors.load_tensor(path, "a").tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert safetensors.load_tensor(path, "b").tolist() == [0.5, -1.0]
    with pytest.raises(KeyError):
        safetensors.load_tensor(path, "c")


def test_truncated_file_is_an_error(tmp_path):
    path = tmp_path / "t.safetensors"
    safetensors.save({"w": torch.randn(10, 10)}, path)
    path.write_bytes(path.read_bytes()[:-8])
    with pytest.raises(ValueError):
        safetensors.load_tensor(path, "w")
