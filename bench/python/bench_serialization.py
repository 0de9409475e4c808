#!/usr/bin/python3
"""Client-side serialization cost at the seed shape, without a server.

Times the two halves of a step's Python work on the client:
  encode: hidden [BT, H] → the Compute request messages (header with targets, then
          hidden chunks), exactly as flce.Client.compute builds them;
  decode: the ComputeResponse bytes gRPC hands back (grad_input chunks) → one grad_input
          tensor, through the client's own deserializer and assembler.
The generated-protobuf path is timed too, for comparison. Prints GB/s and the share of a
step these take next to the engine and wire times measured in ../../shared/NOTES.md.

    /usr/bin/python3 bench/python/bench_serialization.py [--tokens 65535 --hidden 1024]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

# the flce package of this checkout
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "client" / "python"))
from flce import client as fclient, tensors, wire  # noqa: E402
from flce._pb import pb  # noqa: E402
from flce.buffers import BufferPool  # noqa: E402


def encode(hidden, targets, chunk_bytes):
    """Yields the request messages as gRPC would pull them: each is sent, then freed."""
    header = pb.ComputeHeader(request_id="bench", head_id="demo", session_id="s",
                              num_tokens=hidden.shape[0], hidden_dtype=pb.DTYPE_BF16,
                              targets=tensors.to_bytes_int32(targets))
    yield fclient._serialize(wire.encode_compute_header(header.SerializeToString(),
                                                        hidden.shape[1]))
    for row, piece in tensors.row_chunks(hidden, chunk_bytes):
        yield fclient._serialize(wire.encode_hidden_chunk(row, piece))
    yield fclient._serialize(wire.encode_end_of_input(hidden.shape[0]))


def encode_protobuf(hidden, targets, chunk_bytes):
    """The generated classes only: bytes() of every piece, set on a message, serialized."""
    yield pb.ComputeRequest(header=pb.ComputeHeader(
        num_tokens=hidden.shape[0], targets=tensors.to_bytes_int32(targets))).SerializeToString()
    for row, piece in tensors.row_chunks(hidden, chunk_bytes):
        yield pb.ComputeRequest(hidden=pb.HiddenChunk(
            token_offset=row, data=bytes(piece))).SerializeToString()
    yield pb.ComputeRequest(end=pb.EndOfInput(num_tokens=hidden.shape[0])).SerializeToString()


def drain(messages) -> int:
    return sum(len(m) for m in messages)


def response_bytes(grad, chunk_bytes):
    rows = []
    for row, piece in tensors.row_chunks(grad, chunk_bytes):
        n = len(piece) // (grad.shape[1] * grad.element_size())
        rows.append(pb.ComputeResponse(grad_input=pb.GradInputChunk(
            token_offset=row, num_tokens=n, data=bytes(piece))).SerializeToString())
    return rows


def decode(raw_messages, n, h, dtype, pool=None):
    """Into a tensor from the client's pool (its steady state: the previous step's
    grad_input has been released), or into a fresh one (first-touch page faults)."""
    asm = tensors.RowAssembler(n, h, dtype, pool)
    for raw in raw_messages:
        msg = fclient._decode_compute_response(raw)
        asm.put(msg.token_offset, msg.data)
    return asm.tensor


def decode_protobuf(raw_messages, n, h, dtype):
    asm = tensors.RowAssembler(n, h, dtype)
    for raw in raw_messages:
        msg = pb.ComputeResponse.FromString(raw).grad_input
        asm.put(msg.token_offset, msg.data)
    return asm.tensor


def timed(fn, repeat):
    fn()  # warm-up: first-touch page faults of fresh buffers are not the steady state
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=65535)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--chunk-mib", type=float, default=4)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--engine-ms", type=float, default=125.0,
                   help="engine time of a step (NOTES: ~1.2x the 104 ms 3-GEMM bound)")
    p.add_argument("--wire-ms", type=float, default=140.0,
                   help="loopback transfer of a step's 256 MiB on one connection (NOTES)")
    args = p.parse_args()
    n, h, chunk = args.tokens, args.hidden, int(args.chunk_mib * (1 << 20))
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(n, h, generator=g).to(torch.bfloat16)
    targets = torch.randint(0, 176245, (n,), generator=g)
    grad = torch.randn(n, h, generator=g).to(torch.bfloat16)
    raw = response_bytes(grad, chunk)
    assert torch.equal(decode(raw, n, h, torch.bfloat16), grad)
    nbytes = hidden.numel() * hidden.element_size()
    assert drain(encode(hidden, targets, chunk)) > nbytes
    pool = BufferPool()

    rows = []
    for name, fn in (("encode (flce.wire)", lambda: drain(encode(hidden, targets, chunk))),
                     ("encode (generated protobuf)",
                      lambda: drain(encode_protobuf(hidden, targets, chunk))),
                     ("decode (flce.wire, pooled)", lambda: decode(raw, n, h, torch.bfloat16, pool)),
                     ("decode, fresh tensor", lambda: decode(raw, n, h, torch.bfloat16)),
                     ("decode (generated protobuf)",
                      lambda: decode_protobuf(raw, n, h, torch.bfloat16))):
        s = timed(fn, args.repeat)
        rows.append((name, s))
        print(f"{name:30s} {s * 1e3:8.1f} ms  {nbytes / s / 1e9:6.2f} GB/s", flush=True)
    py_ms = (rows[0][1] + rows[2][1]) * 1e3
    base_ms = (rows[1][1] + rows[4][1]) * 1e3
    print(f"shape: BT={n} H={h} bf16, {nbytes / 2**20:.0f} MiB each way, "
          f"{args.chunk_mib:g} MiB chunks, torch {torch.__version__}, "
          f"numpy {np.__version__}, {torch.get_num_threads()} torch threads")
    print(f"python per step (flce.wire): {py_ms:.1f} ms = {py_ms / args.engine_ms:.0%} of the "
          f"engine's {args.engine_ms:g} ms, {py_ms / (py_ms + args.wire_ms):.0%} of a "
          f"wire-bound step ({args.wire_ms:g} ms + python, nothing overlapped)")
    print(f"python per step (generated protobuf, fresh tensors): {base_ms:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
