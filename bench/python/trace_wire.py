#!/usr/bin/python3
"""When each hidden chunk left and each grad_input chunk arrived, in one Compute through
messages at a given shape: shows whether the upload, the download or neither waits.

    /usr/bin/python3 bench/python/trace_wire.py --target 127.0.0.1:50051 --device cuda
"""
from __future__ import annotations

import argparse
import ctypes
import json
import sys
import time
from pathlib import Path

import torch

# the flce package of this checkout (seed_step.py is beside this script)
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "client" / "python"))
import flce  # noqa: E402
from flce import client as client_mod  # noqa: E402
from seed_step import add_shape_args  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_shape_args(p)
    p.add_argument("--calls", type=int, default=4)
    p.add_argument("--json", help="append one JSON line per call")
    p.add_argument("--modes", default="cpu,cuda,cuda-pageable,cuda-autograd,cpu-pinned,cpu-again")
    args = p.parse_args()
    n, h, v = args.tokens, args.hidden, args.vocab
    g = torch.Generator().manual_seed(0)
    c = flce.Client(args.target, timeout=600, transport="grpc").wait_ready(60)
    try:
        c.unload_head("trace")  # a previous run's
    except flce.FlceError:
        pass
    c.upload_head("trace", (torch.randn(v, h, generator=g) / h ** 0.5).to(torch.bfloat16))
    x_cpu = torch.randn(n, h, generator=g).to(torch.bfloat16)
    y = torch.randint(0, v, (n,), generator=g)

    events = []
    t0 = [0.0]
    enc, put = client_mod.wire.encode_hidden_chunk, client_mod._put

    def traced_enc(row, piece):
        out = enc(row, piece)
        events.append(("up", time.perf_counter() - t0[0], row))
        return out

    def traced_put(method, asm, first_row, data):
        events.append(("down", time.perf_counter() - t0[0], first_row))
        return put(method, asm, first_row, data)

    client_mod.wire.encode_hidden_chunk = traced_enc
    client_mod._put = traced_put
    # cpu-pinned: hidden in page-locked host memory; cpu-again: the first mode once CUDA
    # is initialised in this process
    # *-mallopt: glibc's malloc told to keep freed memory (no trimming, no mmap for the
    # message-sized buffers), for the modes after it
    malloc_tuned = False
    for mode in args.modes.split(","):
        if mode.endswith("-mallopt"):
            libc = ctypes.CDLL("libc.so.6")
            ok = (libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD
                  and libc.mallopt(-3, 32 << 20))  # M_MMAP_THRESHOLD (its maximum)
            if not ok:
                raise RuntimeError("mallopt refused")
            malloc_tuned = True
            mode = mode[:-len("-mallopt")]
        x = x_cpu.to("cuda") if mode.startswith("cuda") else (
            x_cpu.pin_memory() if mode == "cpu-pinned" else x_cpu)
        head = flce.RemoteLMHead(c, "trace")
        for i in range(args.calls + 1):
            events.clear()
            if x.is_cuda:
                torch.cuda.synchronize()
            t0[0] = time.perf_counter()
            if mode == "cuda-autograd":
                xx = x.detach().requires_grad_(True)
                loss = head(xx, y.to(x.device))
                fwd = time.perf_counter() - t0[0]
                loss.backward()
                torch.cuda.synchronize()
                summary = head.last_summary
            else:
                # cuda-pageable: grad_input into recycled pageable memory, not pinned
                r = c.compute("trace", x, y,
                              pinned_result=False if mode == "cuda-pageable" else None)
                fwd = time.perf_counter() - t0[0]
                summary = r.summary
                del r
            wall = time.perf_counter() - t0[0]
            ups = [e[1] for e in events if e[0] == "up"]
            downs = [e[1] for e in events if e[0] == "down"]
            row = {"target": args.target, "mode": mode, "mallopt": malloc_tuned, "call": i, "wall_ms": round(wall * 1e3, 1),
                   "forward_ms": round(fwd * 1e3, 1),
                   "engine_ms": round(summary.timings.engine_ms, 1),
                   "server_total_ms": round(summary.timings.total_ms, 1),
                   "first_up_ms": round(ups[0] * 1e3, 1) if ups else None,
                   "last_up_ms": round(ups[-1] * 1e3, 1) if ups else None,
                   "first_down_ms": round(downs[0] * 1e3, 1) if downs else None,
                   "last_down_ms": round(downs[-1] * 1e3, 1) if downs else None,
                   "up_at_ms": [round(t * 1e3) for t in ups[::4]],
                   "down_at_ms": [round(t * 1e3) for t in downs[::4]]}
            print(json.dumps(row), flush=True)
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
