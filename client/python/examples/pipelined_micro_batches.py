#!/usr/bin/python3
"""Gradient accumulation over micro-batches, sequential and pipelined (flce.pipeline).

Sequential: body k, head k, backward k, body k+1, ... — the trainer waits for every call.
Pipelined: head k runs on the server while the trainer runs body k+1 (head.submit), and
backward k follows; the step costs about max(body, head) per micro-batch instead of
body + head.

    flce-server --port 50051 --metrics-port 0 &
    /usr/bin/python3 client/python/examples/pipelined_micro_batches.py --target localhost:50051

The body has a fixed cost (--body-ms; default half the head's measured step), a third in
its forward and two thirds in its backward, as a Transformer's. --body sleep spends it
waiting, as a body on another device would (it does not compete with the server for
this machine's cores or GPU); --body compute spends it in matmuls on --device. Prints one
JSON object: the head's step, the body's cost, both accumulation steps (medians over
--steps) and their ratio. Both runs start from the same weights and batches; their body
gradients are checked to agree.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
import flce  # noqa: E402


class FixedCost(torch.autograd.Function):
    """Identity that costs forward_s going forward and 2·forward_s going back."""

    @staticmethod
    def forward(ctx, x, forward_s: float, spend):
        ctx.forward_s, ctx.spend = forward_s, spend
        spend(forward_s)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.spend(2 * ctx.forward_s)
        return grad, None, None


def sleeper(seconds: float) -> None:
    time.sleep(seconds)


def matmul_spender(device: torch.device, hidden: int):
    """Spends about `seconds` in matmuls on device (calibrated once)."""
    a = torch.randn(hidden, hidden, device=device)

    def run(n: int) -> None:
        x = a
        for _ in range(n):
            x = torch.tanh(x @ a)
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    run(2)
    start = time.perf_counter()
    run(20)
    per_matmul = (time.perf_counter() - start) / 20

    def spend(seconds: float) -> None:
        run(max(1, round(seconds / per_matmul)))

    return spend


class Body(nn.Module):
    def __init__(self, hidden: int, cost_s: float, spend):
        super().__init__()
        self.proj = nn.Linear(hidden, hidden)
        self.forward_s = cost_s / 3
        self.spend = spend

    def forward(self, x):
        return FixedCost.apply(self.proj(x), self.forward_s, self.spend)


def accumulate(head, body, batches, pipelined: bool) -> float:
    """One accumulation step over the micro-batches; its wall time in seconds."""
    body.zero_grad()
    start = time.perf_counter()
    scale = 1 / len(batches)
    if pipelined:
        pending = []
        for x, y in batches:
            pending.append(head.submit(body(x), y, scale=scale))
            if len(pending) == 2:
                pending.pop(0).backward()
        for p in pending:
            p.backward()
    else:
        for x, y in batches:
            (head(body(x), y) * scale).backward()
    head.drain()
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="localhost:50051")
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=2048, help="tokens per micro-batch")
    ap.add_argument("--micro-batches", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5, help="accumulation steps timed per mode")
    ap.add_argument("--body", choices=("sleep", "compute"), default="sleep")
    ap.add_argument("--body-ms", type=float, default=0.0,
                    help="the body's forward+backward per micro-batch (0: half the head's step)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--transport", default="auto", choices=("auto", "grpc", "shm", "cuda_ipc"),
                    help="flce.Client(transport=...)")
    args = ap.parse_args()

    device = torch.device(args.device)
    gen = torch.Generator().manual_seed(0)
    client = flce.Client(args.target, timeout=600, transport=args.transport).wait_ready(30)
    head = flce.RemoteLMHead(client, f"pipeline-demo-{uuid.uuid4().hex[:8]}")
    lm_head = nn.Linear(args.hidden, args.vocab, bias=False)
    with torch.no_grad():
        lm_head.weight.copy_(torch.randn(args.vocab, args.hidden, generator=gen) * 0.02)
    head.load_from_module(lm_head, dtype=torch.bfloat16 if device.type == "cuda" else None)
    batches = [(torch.randn(args.tokens, args.hidden, generator=gen).to(device),
                torch.randint(0, args.vocab, (args.tokens,), generator=gen).to(device))
               for _ in range(args.micro_batches)]
    try:
        # the head's step alone: forward and backward of one micro-batch, grad_input back
        head_times = []
        for _ in range(5):
            x = batches[0][0].clone().requires_grad_(True)
            start = time.perf_counter()
            head(x, batches[0][1]).backward()
            head_times.append(time.perf_counter() - start)
        head_s = statistics.median(head_times[1:])
        body_s = args.body_ms / 1e3 if args.body_ms > 0 else head_s / 2
        spend = sleeper if args.body == "sleep" else matmul_spender(device, args.hidden)
        body = Body(args.hidden, body_s, spend).to(device)

        times = {"sequential": [], "pipelined": []}
        grads = {}
        for _ in range(args.steps):
            for mode in times:
                times[mode].append(accumulate(head, body, batches, mode == "pipelined"))
                grads[mode] = body.proj.weight.grad.detach().clone()
        head.zero_grad()
        rel = float((grads["pipelined"] - grads["sequential"]).norm()
                    / grads["sequential"].norm())
        seq, pip = (statistics.median(times[m]) for m in ("sequential", "pipelined"))
        print(json.dumps({
            "vocab": args.vocab, "hidden": args.hidden, "tokens": args.tokens,
            "micro_batches": args.micro_batches, "body": args.body, "device": str(device),
            "transport": client.last_transport,
            "head_step_ms": round(head_s * 1e3, 2), "body_ms": round(body_s * 1e3, 2),
            "sequential_ms": round(seq * 1e3, 2), "pipelined_ms": round(pip * 1e3, 2),
            "speedup": round(seq / pip, 3), "body_grad_rel_diff": rel}))
        if rel > 1e-5:
            print(f"the two modes' body gradients differ: relative {rel:.2e}", file=sys.stderr)
            return 1
        return 0
    finally:
        client.unload_head(head.head_id)
        client.close()


if __name__ == "__main__":
    sys.exit(main())
