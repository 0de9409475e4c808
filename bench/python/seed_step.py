"""What the training-step tools (bench_step.py, bench_policy.py, trace_step.py,
trace_wire.py) share: the flags that name the server, the seed shape and the data plane, and
the problem they time (a random bf16 head uploaded under a head id, bf16 hidden and targets
with 5 % ignored, seed 0)."""
from __future__ import annotations

import argparse
import time

import torch


def add_shape_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="127.0.0.1:50051")
    p.add_argument("--tokens", type=int, default=65535)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=176245)


def add_data_plane_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-plane", default="auto", choices=("auto", "on", "off"),
                   help="flce.Client(data_plane=...): rows and grad_input on the server's data "
                        "plane (flce-server --data-port) instead of messages")


def data_plane_choice(args: argparse.Namespace):
    """flce.Client's data_plane for --data-plane: None (where offered), True or False."""
    return {"auto": None, "on": True, "off": False}[args.data_plane]


def upload_problem(client, head_id: str, args: argparse.Namespace, device: str):
    """Uploads the head (printing how long it took) and returns (hidden, targets) on
    `device`."""
    n, h, v = args.tokens, args.hidden, args.vocab
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(v, h, generator=g) / h ** 0.5).to(torch.bfloat16)
    t0 = time.perf_counter()
    info = client.upload_head(head_id, w)
    print(f"upload {v}x{h} bf16 ({info.weight_bytes / 2**20:.0f} MiB): "
          f"{time.perf_counter() - t0:.2f} s", flush=True)
    del w
    hidden = torch.randn(n, h, generator=g).to(torch.bfloat16).to(device)
    y = torch.randint(0, v, (n,), generator=g)
    y[torch.rand(n, generator=g) < 0.05] = -100
    return hidden, y.to(device)
