#!/usr/bin/python3
"""Training steps through RemoteLMHead against a running server, timed from the client.

Reports per step: wall time, the server's own engine time (ComputeSummary.timings), and
the client's CPU time — the main thread (chunk decoding, autograd, Python glue) and the
whole process (adds gRPC's threads and the request-encoding thread) — so the share of a
step the client spends in Python can be read off against the engine.

    /usr/bin/python3 bench/python/bench_step.py --target 127.0.0.1:50051 \
        --tokens 65535 --hidden 1024 --vocab 176245 [--device cuda]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

# the flce package of this checkout (seed_step.py is beside this script)
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "client" / "python"))
import flce  # noqa: E402
from seed_step import (add_data_plane_arg, add_shape_args, data_plane_choice,  # noqa: E402
                       upload_problem)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_shape_args(p)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--device", default="cpu", help="where hidden lives (cpu or cuda)")
    p.add_argument("--transport", default="auto", choices=("auto", "grpc", "shm", "cuda_ipc"),
                   help="flce.Client(transport=...): shm / cuda_ipc need the server's "
                        "--local-transports")
    p.add_argument("--tcp-only", action="store_true",
                   help="flce.Client(unix_socket=False): messages stay on TCP even where the "
                        "server names a Unix socket")
    p.add_argument("--no-malloc-tuning", action="store_true",
                   help="flce.Client(malloc_tuning=False): glibc's malloc left as it is")
    p.add_argument("--connections", type=int, default=1,
                   help="flce.Client(connections=...): hidden in messages over this many "
                        "connections (flce.pieces)")
    add_data_plane_arg(p)
    p.add_argument("--chunk-tokens", type=int, default=0,
                   help="the engine's token-chunk size the call asks for (0: the engine's choice)")
    p.add_argument("--json", help="append the medians as one JSON line to this file")
    p.add_argument("--label", default="",
                   help="recorded in the JSON line (e.g. which server setting ran)")
    args = p.parse_args()
    n, h, v = args.tokens, args.hidden, args.vocab
    client = flce.Client(args.target, timeout=600, transport=args.transport,
                         unix_socket=not args.tcp_only,
                         malloc_tuning=not args.no_malloc_tuning,
                         connections=args.connections,
                         data_plane=data_plane_choice(args)
                         ).wait_ready(60)
    head = flce.RemoteLMHead(client, "bench-step", chunk_tokens=args.chunk_tokens)
    hidden, y = upload_problem(client, "bench-step", args, args.device)
    rows = []
    for step in range(args.steps + 1):  # the first is a warm-up
        x = hidden.detach().requires_grad_(True)
        if args.device == "cuda":
            torch.cuda.synchronize()
        wall0, proc0, main0 = time.perf_counter(), time.process_time(), time.thread_time()
        loss = head(x, y)
        forward = time.perf_counter() - wall0  # the Compute call
        loss.backward()  # the Commit of the staged grad_W, grad_input to x.grad
        if args.device == "cuda":
            torch.cuda.synchronize()
        wall = time.perf_counter() - wall0
        row = (wall, time.thread_time() - main0, time.process_time() - proc0,
               head.last_summary.timings.engine_ms / 1e3, head.last_summary.timings.total_ms / 1e3,
               forward, wall - forward)
        if step:
            rows.append(row)
        print(f"step {step}: loss {float(loss.detach()):.4f}  wall {wall * 1e3:.0f} ms  main-thread CPU "
              f"{row[1] * 1e3:.0f} ms  process CPU {row[2] * 1e3:.0f} ms  engine "
              f"{row[3] * 1e3:.0f} ms  server total {row[4] * 1e3:.0f} ms  forward "
              f"{row[5] * 1e3:.1f} ms  backward {row[6] * 1e3:.1f} ms", flush=True)
    med = [statistics.median(c) for c in zip(*rows)]
    moved = 2 * n * h * 2
    print(f"median of {len(rows)}: wall {med[0] * 1e3:.0f} ms, engine {med[3] * 1e3:.0f} ms "
          f"({med[3] / med[0]:.0%} of wall), client main thread CPU {med[1] * 1e3:.0f} ms "
          f"({med[1] / med[0]:.0%}), client process CPU {med[2] * 1e3:.0f} ms; "
          f"{moved / 2**20:.0f} MiB moved, {moved / med[0] / 1e9:.2f} GB/s end to end; "
          f"engine {head.last_summary.engine}; transport {client.last_transport} "
          f"(messages via {client.messages_target})")
    if args.json:
        import json
        with open(args.json, "a") as out:
            out.write(json.dumps({
                "label": args.label, "tokens": n, "hidden": h, "vocab": v, "device": args.device,
                "transport": client.last_transport, "messages_target": client.messages_target,
                "connections": args.connections, "chunk_tokens": args.chunk_tokens,
                "malloc_tuning": not args.no_malloc_tuning,
                "steps": len(rows), "wall_ms": med[0] * 1e3, "engine_ms": med[3] * 1e3,
                "server_total_ms": med[4] * 1e3, "main_thread_cpu_ms": med[1] * 1e3,
                "process_cpu_ms": med[2] * 1e3, "forward_ms": med[5] * 1e3,
                "backward_ms": med[6] * 1e3}) + "\n")
    client.unload_head("bench-step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
