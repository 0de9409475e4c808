#!/usr/bin/python3
"""A tiny character-level causal LM trained on tiny_corpus.txt, twice: once with a local
LM head and once with the head served by flce. Both runs start from the same weights
and see the same batches, so their loss curves must agree within fp32 rounding.

    flce-server --port 50051 --metrics-port 0 --device cpu &
    /usr/bin/python3 client/python/examples/train_tiny.py --target localhost:50051 --steps 300

The remote step is the one-line swap the package is for:
    loss = F.cross_entropy(model.lm_head(h), y)      # local
    loss = remote_head(h, y)                          # flce
with the gradient fetched into the local parameter before the optimizer step, and the
updated weight uploaded after it. With --server-optimizer the head is trained on the
server instead (remote_head.optimizer("adamw", ...), step, zero_grad): no weight or
gradient crosses the wire per step, only hidden states and grad_input.
    /usr/bin/python3 client/python/examples/train_tiny.py --server-optimizer \
        --metrics-url http://localhost:9464/metrics   # shows the bytes that did not move
With --tied the model's input embedding is its LM head's weight (tok.weight is
lm_head.weight, as GPT-2's): the remote run keeps that one weight on the server, where
flce.RemoteEmbedding looks the ids up (Embed) and sends the embedding's gradient into the
head's session (EmbedGrad), and the server's AdamW applies both gradients in one step
(--tied implies --server-optimizer).
"""
from __future__ import annotations

import argparse
import re
import sys
import time
import urllib.request
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
import flce  # noqa: E402

CORPUS = Path(__file__).with_name("tiny_corpus.txt")


class TinyLM(nn.Module):
    """Embedding, a causal Transformer encoder and a separate lm_head (the part flce serves).
    tied: lm_head.weight is tok.weight (initialised as GPT-2's, N(0, 0.02))."""

    def __init__(self, vocab: int, dim: int, layers: int, heads: int, context: int,
                 bias: bool, tied: bool = False):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(context, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0,
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers)
        self.norm = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=bias)
        if tied:
            nn.init.normal_(self.tok.weight, std=0.02)
            self.lm_head.weight = self.tok.weight
        self.register_buffer("mask", torch.triu(torch.full((context, context), float("-inf")),
                                                diagonal=1))

    def body(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        h = self.tok(x) + self.pos[:t]
        return self.norm(self.blocks(h, mask=self.mask[:t, :t]))


def batches(data: torch.Tensor, steps: int, batch: int, context: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        starts = torch.randint(0, len(data) - context - 1, (batch,), generator=g)
        idx = starts[:, None] + torch.arange(context + 1)
        chunk = data[idx]
        yield chunk[:, :-1], chunk[:, 1:]


# The /metrics counters of tensor bytes that a server-side optimizer keeps off the wire.
WIRE_COUNTERS = ('flce_received_bytes_total{rpc="UploadHead"}',
                 'flce_sent_bytes_total{rpc="FetchGrad"}',
                 'flce_received_bytes_total{rpc="Compute"}')
# and with a tied embedding: no weight comes down, embedding rows and their gradient move
TIED_COUNTERS = ('flce_sent_bytes_total{rpc="DownloadHead"}',
                 'flce_sent_bytes_total{rpc="Embed"}',
                 'flce_received_bytes_total{rpc="EmbedGrad"}')


def scrape(url: str, names=WIRE_COUNTERS) -> dict:
    """These counters from a Prometheus text page (a series not yet created counts 0)."""
    with urllib.request.urlopen(url, timeout=10) as page:
        text = page.read().decode()
    values = {}
    for name in names:
        m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
        values[name] = float(m.group(1)) if m else 0.0
    return values


def train(args, data: torch.Tensor, vocab: int, remote: bool):
    torch.manual_seed(args.seed)
    model = TinyLM(vocab, args.dim, args.layers, args.heads, args.context, args.bias,
                   tied=args.tied)
    on_server = remote and args.server_optimizer
    head = head_opt = None
    if remote:
        client = flce.Client(args.target, timeout=120).wait_ready(30)
        head = flce.RemoteLMHead(client, args.head_id)
        # reset_optimizer: state a crashed earlier run left on this head id is dropped
        head.load_from_module(model.lm_head, dtype=torch.float32, reset_optimizer=True)
        head.zero_grad()
        if on_server:
            head_opt = head.optimizer("adamw", lr=args.lr, weight_decay=0.0)
        if args.tied:
            # the tied weight is the head's: the embedding looks it up on the server and
            # sends its gradient into the head's session (the local copy goes unused)
            model.tok = flce.RemoteEmbedding(head)
    if on_server:  # the body here, the head (and a tied embedding) there: AdamW split in two
        remote_names = ("lm_head.", "tok.") if args.tied else ("lm_head.",)
        body = [p for n, p in model.named_parameters() if not n.startswith(remote_names)]
        opt = torch.optim.AdamW(body, lr=args.lr, weight_decay=0.0)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    counters = WIRE_COUNTERS + (TIED_COUNTERS if args.tied else ())
    losses, wire = [], []
    t0 = time.perf_counter()
    for step, (x, y) in enumerate(batches(data, args.steps, args.batch, args.context,
                                          args.seed)):
        h = model.body(x)
        if remote:
            loss = head(h, y)
        else:
            loss = F.cross_entropy(model.lm_head(h).reshape(-1, vocab), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        if head_opt is not None:
            head_opt.zero_grad()
        loss.backward()
        if remote and not on_server:
            head.grad_into(model.lm_head)  # fetch and reset the server's grad_W (and grad_b)
        opt.step()
        if head_opt is not None:
            head_opt.step()  # the server applies AdamW to its grad_W: nothing to upload
        elif remote:
            head.load_from_module(model.lm_head, dtype=torch.float32)  # serve the new weight
        losses.append(float(loss.detach()))
        if remote and args.metrics_url and step in (0, args.steps - 1):
            wire.append(scrape(args.metrics_url, counters))
    seconds = time.perf_counter() - t0
    if len(wire) == 2:
        for name in counters:
            print(f"metrics from step 0 to step {args.steps - 1}: {name} "
                  f"+{wire[1][name] - wire[0][name]:.0f}")
    if remote:
        head.client.unload_head(args.head_id)
        head.client.close()
    return losses, seconds


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", default="localhost:50051")
    p.add_argument("--head-id", default="train-tiny")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--bias", action="store_true", help="give lm_head a bias")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mode", choices=["both", "remote", "local"], default="both")
    p.add_argument("--server-optimizer", action="store_true",
                   help="train the remote head on the server (AdamW there, step and "
                        "zero_grad), instead of fetching grad_W and uploading the weight")
    p.add_argument("--tied", action="store_true",
                   help="tie the input embedding to the LM head (tok.weight is "
                        "lm_head.weight); the remote run keeps it on the server "
                        "(flce.RemoteEmbedding) and trains it there (implies "
                        "--server-optimizer)")
    p.add_argument("--metrics-url", default="",
                   help="the server's /metrics: print how much its UploadHead, FetchGrad and "
                        "Compute byte counters grew between the first and the last step")
    p.add_argument("--rtol", type=float, default=1e-2,
                   help="largest relative difference of the two curves, each smoothed over "
                        "--window steps (single steps differ more: training amplifies "
                        "rounding differences into different, equally good trajectories)")
    p.add_argument("--window", type=int, default=20)
    p.add_argument("--early-steps", type=int, default=10)
    p.add_argument("--early-tol", type=float, default=1e-4,
                   help="largest |remote - local| over the first --early-steps steps, before "
                        "fp32 rounding differences have been amplified by training")
    p.add_argument("--log-every", type=int, default=25)
    args = p.parse_args(argv)
    if args.tied:
        args.server_optimizer = True

    text = CORPUS.read_text(encoding="utf-8")
    chars = sorted(set(text))
    lookup = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([lookup[c] for c in text], dtype=torch.long)  # once, at load time
    print(f"corpus: {len(text)} characters, vocabulary {len(chars)}")
    if args.tied:
        print("tied embedding: tok.weight is lm_head.weight; the remote run keeps it on the "
              "server (Embed, EmbedGrad) with the head")
    if args.server_optimizer:
        print("remote head: trained on the server (AdamW there; no weight or gradient "
              "crosses the wire per step)")

    runs = {}
    for mode in (["local", "remote"] if args.mode == "both" else [args.mode]):
        losses, seconds = train(args, data, len(chars), remote=mode == "remote")
        runs[mode] = losses
        print(f"{mode}: first loss {losses[0]:.4f}, last loss {losses[-1]:.4f}, "
              f"{seconds:.1f} s for {args.steps} steps")
    names = list(runs)
    print("step  " + "  ".join(f"{n:>8}" for n in names) +
          ("      |diff|" if len(names) == 2 else ""))
    for step in range(args.steps):
        if step % max(args.log_every, 1) and step != args.steps - 1:
            continue
        row = [runs[n][step] for n in names]
        diff = f"  {abs(row[0] - row[1]):10.2e}" if len(row) == 2 else ""
        print(f"{step:4d}  " + "  ".join(f"{v:8.5f}" for v in row) + diff)
    if args.mode != "both":
        return 0
    local, remote = runs["local"], runs["remote"]
    early = max(abs(a - b) for a, b in zip(local[:args.early_steps], remote[:args.early_steps]))
    window = max(1, min(args.window, len(local)))
    smooth_l, smooth_r = (torch.tensor(c, dtype=torch.float64).unfold(0, window, 1).mean(1)
                          for c in (local, remote))
    rel = ((smooth_r - smooth_l).abs() / smooth_l.abs()).max().item()
    ok = early <= args.early_tol and rel <= args.rtol
    print(f"first {args.early_steps} steps: max |remote - local| = {early:.2e} "
          f"(tolerance {args.early_tol:g}); curves smoothed over {window} steps: max relative "
          f"difference {rel:.2e} (tolerance {args.rtol:g}): "
          f"{'SAME CURVE' if ok else 'CURVES DIFFER'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
