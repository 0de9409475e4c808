#!/usr/bin/python3
"""The Compute call's wire alone, from Python: a vocabulary-8 head makes the engine's part
negligible, so what is timed is hidden going up and grad_input coming down in messages.

Variants (each the median of --calls calls after one warm-up, one JSON line each):
chunk sizes, hidden on the CPU or a GPU, forward-only (hidden up, nothing down), extra
gRPC channel options, and the tokens split over several concurrent calls on channels of
their own (one TCP connection each) to see whether more connections carry more. Against a
server with --data-port, the data_plane variants move the same bytes on the data plane
(flce.data_plane) instead of in messages; every other variant keeps to messages.

    /usr/bin/python3 bench/python/bench_wire.py --target 127.0.0.1:50051 [--device cuda]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

import grpc
import torch

# the flce package of this checkout
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "client" / "python"))
import flce  # noqa: E402

HEAD = "bench-wire"


def timed_calls(clients, x, y, calls: int, **kw):
    """Median wall time of `calls` rounds; each round sends x's rows split evenly over the
    clients, one concurrent call each."""
    parts = torch.tensor_split(torch.arange(x.shape[0]), len(clients))
    walls, engine = [], []
    for i in range(calls + 1):
        results = [None] * len(clients)

        def run(k):
            idx = parts[k]
            results[k] = clients[k].compute(HEAD, x[idx[0]:idx[-1] + 1], y[idx[0]:idx[-1] + 1],
                                            **kw)

        if x.is_cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        threads = [threading.Thread(target=run, args=(k,)) for k in range(len(clients))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        if any(r is None for r in results):
            raise RuntimeError("a call failed")
        if i > 0:
            walls.append(wall * 1e3)
            engine.append(max(r.summary.timings.engine_ms for r in results))
    return statistics.median(walls), statistics.median(engine), walls


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", default="127.0.0.1:50051")
    p.add_argument("--tokens", type=int, default=65535)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--calls", type=int, default=5)
    p.add_argument("--device", default="cpu", help="where hidden lives in the GPU variants")
    p.add_argument("--json", help="append one JSON line per variant to this file")
    p.add_argument("--label", default="", help="written into each JSON line (e.g. the build)")
    p.add_argument("--variants", default="",
                   help="comma-separated names to run (default: all)")
    args = p.parse_args()
    only = set(filter(None, args.variants.split(",")))
    n, h = args.tokens, args.hidden
    g = torch.Generator().manual_seed(0)
    first = flce.Client(args.target, timeout=600, transport="grpc").wait_ready(60)
    first.upload_head(HEAD, (torch.randn(8, h, generator=g) / h ** 0.5).to(torch.bfloat16))
    x_cpu = torch.randn(n, h, generator=g).to(torch.bfloat16)
    y = torch.randint(0, 8, (n,), generator=g)
    mib = n * h * 2 / 2**20

    def variant(name, *, chunk_mb=4, device="cpu", connections=1, pieces=1, options=(),
                data_plane=False, **kw):
        if only and name not in only:
            return
        clients = []
        for k in range(connections):
            opts = list(options)
            if connections > 1:  # a TCP connection of its own
                opts.append(("grpc.use_local_subchannel_pool", 1))
            ch = grpc.insecure_channel(args.target, options=opts + [
                ("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)])
            clients.append(flce.Client(args.target, channel=ch, timeout=600, transport="grpc",
                                       connections=pieces, data_plane=data_plane,
                                       chunk_bytes=int(chunk_mb * 2**20),
                                       session_id=f"wire-{k}"))
        x = x_cpu.to(device)
        med, eng, walls = timed_calls(clients, x, y, args.calls, **kw)
        down = 0 if kw.get("forward_only") else mib
        row = {"label": args.label, "variant": name, "target": args.target,
               "chunk_mb": chunk_mb, "device": device,
               "connections": connections, "pieces": pieces, "data_plane": data_plane,
               "options": [list(o) for o in options],
               "wall_ms_median": round(med, 2), "walls_ms": [round(w, 2) for w in walls],
               "engine_ms_median": round(eng, 2),
               "gb_per_s_up": round(mib * 2**20 / med / 1e6, 3),
               "gb_per_s_down": round(down * 2**20 / med / 1e6, 3), "tokens": n, "hidden": h}
        print(json.dumps(row), flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(row) + "\n")
        for c in clients:
            c.close()

    variant("baseline")
    variant("forward_only", forward_only=True)
    variant("chunk_1mb", chunk_mb=1)
    variant("chunk_16mb", chunk_mb=16)
    if args.device != "cpu":
        variant("hidden_on_gpu", device=args.device)
    variant("lookahead_64mb", options=(("grpc.http2.lookahead_bytes", 64 << 20),))
    variant("bdp_off_window_64mb", options=(("grpc.http2.bdp_probe", 0),
                                            ("grpc.http2.lookahead_bytes", 64 << 20)))
    variant("max_frame_16mb", options=(("grpc.http2.max_frame_size", (16 << 20) - 1),))
    for k in (2, 4):
        variant(f"connections_{k}", connections=k)  # k calls of n / k tokens
    for k in (2, 4):
        variant(f"pieces_{k}", pieces=k)  # one call over k connections (flce.pieces)
    if "data_plane" in first.server_info().capabilities:
        variant("data_plane", data_plane=True)
        variant("data_plane_forward_only", data_plane=True, forward_only=True)
        if args.device != "cpu":
            variant("data_plane_hidden_on_gpu", data_plane=True, device=args.device)
    variant("baseline_again")
    return 0


if __name__ == "__main__":
    sys.exit(main())
