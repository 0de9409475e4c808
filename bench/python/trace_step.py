#!/usr/bin/python3
"""Where a training step's time goes on the client, phase by phase.

Runs RemoteLMHead steps (loss = head(x, y); loss.backward()) like bench_step.py and times,
inside each step: taking a region and writing hidden into it (local transports), the
Compute RPC up to its summary and up to the end of its stream, the rest of the forward
(grad_input out of the region, the loss tensor), the Commit RPC, and the rest of backward.
Put next to the server's request log (setup_ms, input_ms, finish_ms, land_ms,
duration_ms of each Compute and Commit), it shows what the wire and the client add.

    /usr/bin/python3 bench/python/trace_step.py --target 127.0.0.1:50051 \
        --device cuda --transport cuda_ipc [--json trace.jsonl]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

# the flce package of this checkout (seed_step.py is beside this script)
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "client" / "python"))
import flce  # noqa: E402
from flce import client as client_module  # noqa: E402
from seed_step import add_shape_args, upload_problem  # noqa: E402

_marks: dict = {}


def _mark(name: str) -> None:
    _marks.setdefault(name, time.perf_counter())


def _traced_stream(calls, requests, **kw):
    """The Compute stream, marking when the summary arrives and when the stream ends."""
    for msg in calls(requests, **kw):
        if not isinstance(msg, client_module.wire.GradInputView) and \
                msg.WhichOneof("msg") == "summary":
            _mark("summary")
        yield msg
    _mark("stream_end")


def _wrap_compute(client: flce.Client) -> None:
    compute = client._compute
    client._compute = lambda requests, **kw: _traced_stream(compute, requests, **kw)


def _marked_after(owner, name: str, mark: str) -> None:
    fn = getattr(owner, name)

    def marked(*args, **kw):
        result = fn(*args, **kw)
        _mark(mark)
        return result
    setattr(owner, name, marked)


def _marked_around(owner, name: str, before: str, after: str) -> None:
    fn = getattr(owner, name)

    def marked(*args, **kw):
        _mark(before)
        try:
            return fn(*args, **kw)
        finally:
            _mark(after)
    setattr(owner, name, marked)


def _install(client: flce.Client) -> None:
    # the call's own work before the RPC: targets to bytes (a device-to-host copy when
    # they are on a GPU), a region, hidden written into it
    _marked_after(client_module.tensors, "to_bytes_int32", "targets_bytes")
    _marked_after(client_module.SharedTransport, "acquire", "region_acquired")
    _marked_after(client_module.cuda_ipc.DeviceRegion, "mark_written", "hidden_written")
    _wrap_compute(client)
    bind_bulk = client._bind_bulk

    def bind_bulk_traced(channel):  # a move to the server's Unix socket rebinds Compute
        bind_bulk(channel)
        _wrap_compute(client)
    client._bind_bulk = bind_bulk_traced
    _marked_around(client, "_run_compute", "rpc_start", "rpc_return")
    # with async_commit this only starts the Commit
    _marked_around(client, "commit_in_background", "commit_start", "commit_end")

def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_shape_args(p)
    p.add_argument("--steps", type=int, default=7)
    p.add_argument("--device", default="cuda")
    p.add_argument("--transport", default="auto", choices=("auto", "grpc", "shm", "cuda_ipc"))
    p.add_argument("--json", help="append the per-phase medians as one JSON line to this file")
    args = p.parse_args()
    n, h, v = args.tokens, args.hidden, args.vocab
    client = flce.Client(args.target, timeout=600, transport=args.transport).wait_ready(60)
    _install(client)
    head = flce.RemoteLMHead(client, "trace-step")
    hidden, y = upload_problem(client, "trace-step", args, args.device)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    order = ("targets_bytes", "region_acquired", "hidden_written", "rpc_start", "summary",
             "stream_end", "rpc_return", "forward_end", "commit_start", "commit_end",
             "backward_end")
    rows = []
    for step in range(args.steps + 1):  # the first is a warm-up
        x = hidden.detach().requires_grad_(True)
        sync()
        _marks.clear()
        t0 = time.perf_counter()
        loss = head(x, y)
        _mark("forward_end")
        loss.backward()
        sync()
        _mark("backward_end")
        # between the marks this path reached (messages take no region; targets in a
        # region are not serialized)
        reached = [("call", t0)] + [(k, _marks[k]) for k in order if k in _marks]
        phases = {f"{a}->{b}": (t1 - t_0) * 1e3
                  for (a, t_0), (b, t1) in zip(reached, reached[1:])}
        phases["server_total"] = head.last_summary.timings.total_ms
        phases["engine"] = head.last_summary.timings.engine_ms
        phases["wall"] = (_marks["backward_end"] - t0) * 1e3
        if step:
            rows.append(phases)
        print(f"step {step} ({client.last_transport}): " +
              "  ".join(f"{k} {ms:.2f}" for k, ms in phases.items()), flush=True)
    med = {k: statistics.median(r[k] for r in rows if k in r) for k in rows[0]}
    print("median: " + "  ".join(f"{k} {ms:.2f}" for k, ms in med.items()))
    if args.json:
        with open(args.json, "a") as out:
            out.write(json.dumps({"transport": client.last_transport, "tokens": n,
                                  "hidden": h, "vocab": v, "steps": len(rows),
                                  "median_ms": med}) + "\n")
    client.unload_head("trace-step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
