#!/usr/bin/python3
"""A toy policy trained with GRPO through flce: the policy's LM head lives on the server,
which computes the clipped surrogate (flce.PolicyObjective) and steps the head with its
own AdamW; the trainer only samples, scores and sends hidden states.

Each prompt is a fixed random feature vector (the "hidden state" a model body would
produce); the policy answers with one token; the reward is 1 when the token is the
prompt's secret answer (prompt id mod V), else 0. Per step: sample a group of answers per
prompt from the current head (downloaded: it is V x H), take their log-probs as old_logp
(a forward-only call), turn rewards into group-normalised advantages (GRPO), then several
policy-gradient updates on the same samples, each one Compute call (loss, grad_input,
grad_W) and one server optimizer step. The mean reward climbs from ~1/V towards 1.

    flce-server --port 50051 --metrics-port 0 --device cpu &
    /usr/bin/python3 client/python/examples/grpo_toy.py --target localhost:50051
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
import flce  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", default="localhost:50051")
    p.add_argument("--vocab", type=int, default=16)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--group", type=int, default=8, help="answers sampled per prompt")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--updates", type=int, default=2, help="policy updates per batch of samples")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    g = torch.Generator().manual_seed(args.seed)
    V, H = args.vocab, args.hidden
    prompts = torch.randn(args.prompts, H, generator=g)
    answers = torch.arange(args.prompts) % V

    client = flce.Client(args.target, timeout=60).wait_ready(30)
    head_id = f"grpo-toy-{args.seed}"
    client.upload_head(head_id, torch.randn(V, H, generator=g) * 0.01)
    head = flce.RemoteLMHead(client, head_id, session_id="grpo")
    optimizer = head.optimizer("adamw", lr=args.lr, weight_decay=0.0, replace=True)
    # the group's copies of each prompt: [prompts * group, H]
    hidden = prompts.repeat_interleave(args.group, 0)
    group_of = torch.arange(args.prompts).repeat_interleave(args.group)
    for step in range(args.steps):
        weight = client.download_head(head_id).weight.float()
        probs = torch.softmax(hidden @ weight.T, -1)
        tokens = torch.multinomial(probs, 1, generator=g)[:, 0]
        reward = (tokens == answers[group_of]).float()
        # GRPO: each answer against its group's mean, in units of the group's spread
        r = reward.view(args.prompts, args.group)
        advantages = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).view(-1)
        old = client.compute(head_id, hidden, tokens, forward_only=True, logprob=True,
                             session_id="grpo").token_outputs["logprob"]
        for _ in range(args.updates):
            objective = flce.PolicyObjective(old_logp=old, advantages=advantages,
                                             clip_low=0.2, clip_high=0.28)
            loss = head.policy_loss(hidden, tokens, objective)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        stats = head.last_summary.policy
        print(json.dumps({"step": step, "mean_reward": round(float(reward.mean()), 4),
                          "loss": round(float(loss), 5),
                          "clip_fraction": round(stats.clip_fraction_low +
                                                 stats.clip_fraction_high, 4),
                          "approx_kl": round(stats.approx_kl, 6),
                          "ratio_max": round(stats.ratio_max, 4)}), flush=True)
    client.unload_head(head_id)
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
