#!/usr/bin/python3
"""GRPO and DPO steps against a plain cross-entropy step through RemoteLMHead, in one process.

Four step kinds on the same head, hidden and targets, interleaved (the order reversed every
round) so that all see the same machine state:
  plain     head(x, y): the cross-entropy, one Compute call;
  grpo      head.policy_loss(x, y, PolicyObjective(...)): the clipped surrogate in one call;
  two_call  head(x, y, return_logprob=True) and the surrogate computed here from the
            log-probs: the way before objectives ran on the server (a forward call, then a
            weighted call in backward that recomputes the logits);
  dpo       head.preference_loss(x, y, PreferenceObjective(...)): DPO over pairs of
            512-token responses with given reference log-probs, one call (two passes over
            the rows inside the server).
Each step is timed from the client (forward + backward, the staged grad_W committed) and
reports the server's engine time of its first call (two_call's weighted call in backward has
no summary here; dpo's is split into its log-prob pass and its gradient pass by
PreferenceSummary.first_pass_ms, except with rows over the wire, where the passes overlap); the
medians, the ratios to plain, and whether plain and grpo ran the same plan
(ComputeSummary.strategy_used; the kernels each ran, ComputeSummary.kernels, beside it) are
printed and, with --json, appended.

    /usr/bin/python3 bench/python/bench_policy.py --target 127.0.0.1:50051 --device cuda \
        --transport cuda_ipc
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "client" / "python"))
import flce  # noqa: E402
from seed_step import (add_data_plane_arg, add_shape_args, data_plane_choice,  # noqa: E402
                       upload_problem)

KINDS = ("plain", "grpo", "two_call", "dpo")
RESPONSE_TOKENS = 512


def surrogate(logp, old_logp, advantages, valid, clip_low, clip_high):
    """verl's compute_policy_loss (vanilla), token-mean over the valid tokens."""
    ratio = torch.exp(torch.clamp(logp - old_logp, -20.0, 20.0))
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(-advantages * ratio, -advantages * clipped)
    return (per_token * valid).sum() / valid.sum()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_shape_args(p)
    p.add_argument("--rounds", type=int, default=5, help="timed rounds (one step of each kind)")
    p.add_argument("--device", default="cuda", help="where hidden lives (cpu or cuda)")
    p.add_argument("--transport", default="auto", choices=("auto", "grpc", "shm", "cuda_ipc"))
    p.add_argument("--tcp-only", action="store_true",
                   help="flce.Client(unix_socket=False): messages over TCP")
    add_data_plane_arg(p)
    p.add_argument("--gap-ms", type=float, default=0.0,
                   help="idle time before each timed step, so that every step starts from the "
                        "same GPU state (a loop's steps follow each other without one)")
    p.add_argument("--json", help="append the medians as one JSON line to this file")
    p.add_argument("--label", default="",
                   help="recorded in the JSON line (e.g. which server build ran)")
    args = p.parse_args()
    client = flce.Client(args.target, timeout=600, transport=args.transport,
                         unix_socket=not args.tcp_only,
                         data_plane=data_plane_choice(args)
                         ).wait_ready(60)
    head = flce.RemoteLMHead(client, "bench-policy")
    hidden, y = upload_problem(client, "bench-policy", args, args.device)
    valid = (y != -100).float()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        logp_now = head(hidden, y, return_logprob=True).logprob.float()
    # Old log-probs around the current ones (ratios on both sides of the bounds) and
    # advantages of both signs, as a GRPO batch would have them.
    noise = (torch.randn(y.shape, generator=g) * 0.2).to(logp_now.device)
    old_logp = (logp_now + noise).detach()
    advantages = torch.randn(y.shape, generator=g).to(logp_now.device)
    objective = flce.PolicyObjective(old_logp=old_logp, advantages=advantages, clip_low=0.2,
                                     clip_high=0.28)
    # Consecutive 512-token responses, alternately chosen and rejected; the last odd one
    # (and any rest) belongs to no pair.
    pairs = args.tokens // (2 * RESPONSE_TOKENS)
    sequence = torch.arange(args.tokens) // RESPONSE_TOKENS
    sequence[sequence >= 2 * pairs] = -1
    ref = torch.randn(2 * pairs, generator=g) + float(logp_now.sum()) / max(1, args.tokens) * \
        RESPONSE_TOKENS
    preference = flce.PreferenceObjective(sequence_of_token=sequence.to(torch.int32),
                                          num_pairs=pairs, ref_logp=ref, beta=0.1)

    def step(kind: str):
        x = hidden.detach().requires_grad_(True)
        if args.device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        if kind == "plain":
            loss = head(x, y)
            engine = head.last_summary.timings.engine_ms
        elif kind == "grpo":
            loss = head.policy_loss(x, y, objective)
            engine = head.last_summary.timings.engine_ms
        elif kind == "dpo":
            loss = head.preference_loss(x, y, preference)
            engine = head.last_summary.timings.engine_ms
        else:
            out = head(x, y, return_logprob=True)
            engine = head.last_summary.timings.engine_ms
            loss = surrogate(out.logprob.float(), old_logp, advantages, valid, 0.2, 0.28)
        summary = head.last_summary
        loss.backward()
        if args.device == "cuda":
            torch.cuda.synchronize()
        first_pass = summary.preference.first_pass_ms / 1e3 if kind == "dpo" else 0.0
        return (time.perf_counter() - t0, engine / 1e3, first_pass, summary.strategy_used,
                summary.kernels, float(loss))

    def passes_overlap() -> bool:
        # With rows over the wire (messages or the data plane; and not deterministic, which
        # this bench never asks for) the server pipelines DPO's passes with the upload and
        # with each other (API.md, first_pass_ms): their times overlap and do not split the
        # engine time.
        return client.last_transport in ("grpc", "data_plane")

    for kind in KINDS:  # warm-up
        step(kind)
    times = {k: [] for k in KINDS}
    engines = {k: [] for k in KINDS}
    strategies = {k: set() for k in KINDS}
    kernels = {k: set() for k in KINDS}
    dpo_first_pass = []
    for r in range(args.rounds):
        order = KINDS if r % 2 == 0 else tuple(reversed(KINDS))
        for kind in order:
            if args.gap_ms > 0:
                time.sleep(args.gap_ms / 1e3)
            wall, engine, first_pass, strategy, kernel_words, loss = step(kind)
            times[kind].append(wall)
            engines[kind].append(engine)
            strategies[kind].add(strategy)
            kernels[kind].add(kernel_words)
            passes = ""
            if kind == "dpo":
                dpo_first_pass.append(first_pass)
                if not passes_overlap():
                    passes = (f" (log-prob pass {first_pass * 1e3:6.1f}, gradient pass"
                              f" {(engine - first_pass) * 1e3:6.1f})")
            print(f"round {r} {kind:8s}: wall {wall * 1e3:6.1f} ms  engine {engine * 1e3:6.1f} ms"
                  f"{passes}  {strategy}  loss {loss:.4f}", flush=True)
    med = {k: statistics.median(times[k]) * 1e3 for k in KINDS}
    med_engine = {k: statistics.median(engines[k]) * 1e3 for k in KINDS}
    if passes_overlap():
        split, pass_ms = "passes overlap (rows over the wire)", None
    else:
        med_first_pass = statistics.median(dpo_first_pass) * 1e3
        med_second_pass = statistics.median(
            [e - f for e, f in zip(engines["dpo"], dpo_first_pass)]) * 1e3
        split = f"log-prob pass {med_first_pass:.1f} ms, gradient pass {med_second_pass:.1f} ms"
        pass_ms = {"log_prob": med_first_pass, "gradient": med_second_pass}
    same_plan = (strategies["plain"] == strategies["grpo"] == strategies["dpo"]
                 and len(strategies["plain"]) == 1)
    print(f"medians of {args.rounds}: " + ", ".join(
        f"{k} {med[k]:.1f} ms ({med[k] / med['plain']:.3f}x)" for k in KINDS)
        + f"; plans {', '.join(f'{k} {sorted(strategies[k])}' for k in KINDS)}"
        + f"; kernels {', '.join(f'{k} {sorted(kernels[k])}' for k in KINDS)}"
        + f"; transport {client.last_transport}"
        + f"; dpo engine: {split}")
    if args.json:
        import json
        with open(args.json, "a") as out:
            out.write(json.dumps({
                "label": args.label, "tokens": args.tokens, "hidden": args.hidden,
                "vocab": args.vocab, "device": args.device, "transport": client.last_transport,
                "rounds": args.rounds, "gap_ms": args.gap_ms, "wall_ms": med,
                "engine_ms": med_engine,
                "dpo_pass_engine_ms": pass_ms,
                "ratio_to_plain": {k: med[k] / med["plain"] for k in KINDS},
                "strategies": {k: sorted(strategies[k]) for k in KINDS},
                "kernels": {k: sorted(kernels[k]) for k in KINDS},
                "same_plan": same_plan}) + "\n")
    client.unload_head("bench-policy")
    return 0 if same_plan else 1


if __name__ == "__main__":
    sys.exit(main())
