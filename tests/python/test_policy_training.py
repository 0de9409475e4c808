"""Training with a policy objective, step by step against PyTorch: a GRPO run in PyTorch
(fp32 head, torch.optim.AdamW, DAPO's clip-higher surrogate written in verl's form, two
updates per batch of the policy's own samples) visits 30 states; from each, one step is
taken both ways from the same weights, PyTorch's (autograd, torch.optim.SGD) and the
server's (RemoteLMHead.policy_loss, then its own SGD step), and the steps, losses and the
statistics a trainer logs are compared. Step by step rather than whole curves: a token that
crosses a clip bound can split two curves that agree at every step."""
from __future__ import annotations

import uuid

import pytest
import torch

import flce
from conftest import RealServer

V, H, PROMPTS, GROUP, LENGTH = 41, 16, 4, 4, 5
N = PROMPTS * GROUP * LENGTH
CLIP_LOW, CLIP_HIGH, LR = 0.2, 0.28, 0.5
STATES = 30


@pytest.fixture(scope="module")
def server(real_server_bin):
    srv = RealServer(real_server_bin)
    yield srv
    srv.stop()


def _surrogate(w, x, y, old, adv):
    """The token-mean clipped surrogate of verl's compute_policy_loss_vanilla, with the
    per-token terms the statistics are taken from."""
    logp = torch.log_softmax(x @ w.T, -1).gather(1, y[:, None])[:, 0]
    log_ratio = torch.clamp(logp - old, -20.0, 20.0)
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1 - CLIP_LOW, 1 + CLIP_HIGH)
    unclipped_term, clipped_term = -adv * ratio, -adv * clipped
    loss = torch.maximum(unclipped_term, clipped_term).mean()
    held = clipped_term > unclipped_term
    return loss, dict(ratio=ratio.detach(), log_ratio=log_ratio.detach(),
                      low=(held & (ratio < 1 - CLIP_LOW)).double().mean(),
                      high=(held & (ratio > 1 + CLIP_HIGH)).double().mean())


def _states():
    """30 (weight, hidden, targets, old_logp, advantages) of a PyTorch GRPO run."""
    g = torch.Generator().manual_seed(11)
    w = (torch.randn(V, H, generator=g) * 0.3).requires_grad_(True)
    optimizer = torch.optim.AdamW([w], lr=0.05, weight_decay=0.0)
    prompts = torch.randn(PROMPTS, LENGTH, H, generator=g)
    x = prompts.repeat_interleave(GROUP, 0).reshape(N, H)  # a group shares its prompt
    states = []
    while len(states) < STATES:
        with torch.no_grad():
            y = torch.multinomial(torch.softmax(x @ w.T, -1), 1, generator=g)[:, 0]
            old = torch.log_softmax(x @ w.T, -1).gather(1, y[:, None])[:, 0]
        # a sequence's reward: how many of its tokens are even; GRPO's advantage against
        # the group's mean, in units of its spread, on every token of the sequence
        reward = (y % 2 == 0).float().reshape(PROMPTS, GROUP, LENGTH).mean(-1)
        adv = (reward - reward.mean(1, keepdim=True)) / (reward.std(1, keepdim=True) + 1e-4)
        adv = adv.reshape(-1).repeat_interleave(LENGTH)
        for _ in range(2):  # the second update starts off the sampling policy: r != 1
            states.append((w.detach().clone(), x, y, old, adv))
            loss, _ = _surrogate(w, x, y, old, adv)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return states[:STATES]


def _torch_step(w0, x, y, old, adv):
    w = w0.clone().requires_grad_(True)
    xs = x.clone().requires_grad_(True)
    loss, stats = _surrogate(w, xs, y, old, adv)
    loss.backward()
    torch.optim.SGD([w], lr=LR).step()
    return float(loss), xs.grad, w.detach(), stats


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def test_thirty_states_of_a_grpo_run_step_for_step(server):
    worst = {"step": 0.0, "grad_input": 0.0}
    clipped_states = 0
    with flce.Client(server.target, timeout=60) as client:
        for k, (w0, x, y, old, adv) in enumerate(_states()):
            want_loss, want_gx, want_w, want = _torch_step(w0, x, y, old, adv)
            head_id = f"policy-training-{uuid.uuid4().hex[:8]}"
            client.upload_head(head_id, w0)
            head = flce.RemoteLMHead(client, head_id)
            optimizer = head.optimizer("sgd", lr=LR)
            xs = x.clone().requires_grad_(True)
            loss = head.policy_loss(xs, y, flce.PolicyObjective(
                old_logp=old, advantages=adv, clip_low=CLIP_LOW, clip_high=CLIP_HIGH))
            loss.backward()
            optimizer.step()
            got_w = client.download_head(head_id).weight.float()
            stats = head.last_summary.policy
            client.unload_head(head_id)

            assert float(loss) == pytest.approx(want_loss, rel=1e-5, abs=1e-6), k
            worst["grad_input"] = max(worst["grad_input"], _rel(xs.grad, want_gx))
            worst["step"] = max(worst["step"], _rel(got_w - w0, want_w - w0))
            assert stats.tokens == N
            # a ratio within rounding of a bound may land on either side of it
            assert stats.clip_fraction_low == pytest.approx(float(want["low"]), abs=1.5 / N), k
            assert stats.clip_fraction_high == pytest.approx(float(want["high"]), abs=1.5 / N), k
            assert stats.ratio_max == pytest.approx(float(want["ratio"].max()), rel=1e-5), k
            assert stats.ratio_min == pytest.approx(float(want["ratio"].min()), rel=1e-5), k
            assert stats.approx_kl == pytest.approx(float(-want["log_ratio"].mean()),
                                                    rel=1e-4, abs=1e-7), k
            clipped_states += int(want["low"] + want["high"] > 0)
    print(f"worst relative differences over {STATES} states: {worst}; {clipped_states} clip")
    assert worst["grad_input"] < 1e-5, worst
    assert worst["step"] < 1e-5, worst
    # the run clips: the comparison covers the surrogate's clipped side, not only r = 1
    assert clipped_states >= STATES // 4, clipped_states
