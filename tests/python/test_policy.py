"""Policy objectives through a real server (flce.PolicyObjective): one Compute call against
a float64 PyTorch reference written from docs/MATH.md's formulas in verl's form (torch's
autograd, so the gradient's choices at clip bounds are torch's), the autograd drop-in
RemoteLMHead.policy_loss, a server without the capability refused before anything is sent."""
from __future__ import annotations

import uuid

import pytest
import torch

import flce
import fake_server
from conftest import RealServer

V, H, N = 53, 24, 40


@pytest.fixture(scope="module")
def server(real_server_bin):
    srv = RealServer(real_server_bin)
    yield srv
    srv.stop()


def _problem(seed=5):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(V, H, generator=g, dtype=torch.float64) * 0.3
    x = torch.randn(N, H, generator=g, dtype=torch.float64)
    y = torch.randint(0, V, (N,), generator=g)
    y[7] = -100
    logp = torch.log_softmax(x @ w.T, -1).gather(1, y.clamp(min=0)[:, None])[:, 0]
    old = (logp + 0.3 * torch.randn(N, generator=g, dtype=torch.float64)).float()
    ref = (logp + 0.3 * torch.randn(N, generator=g, dtype=torch.float64)).float()
    return w, x, y, old, ref, g


def _reference(w, x, y, *, old, adv, ref=None, mask=None, seq=None, clip_low=0.2,
               clip_high=0.2, dual_clip=0.0, kl_coef=0.0, kl="k3", loss="ppo_clip",
               aggregation="token_mean", clamp=20.0):
    """loss, grad_x, grad_w in float64 by autograd, from MATH.md (verl's compute_policy_loss,
    kl_penalty and agg_loss in form)."""
    w = w.clone().requires_grad_(True)
    x = x.clone().requires_grad_(True)
    logp = torch.log_softmax(x @ w.T, -1).gather(1, y.clamp(min=0)[:, None])[:, 0]
    counts = (y != -100).double()
    if mask is not None:
        counts = counts * mask.double()
    old, adv = old.double(), adv.double()
    log_ratio = torch.clamp(logp - old, -clamp, clamp)
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    if loss == "cispo":
        per_token = -adv * clipped.detach() * logp
    else:
        per_token = torch.maximum(-adv * ratio, -adv * clipped)
        if dual_clip:
            per_token = torch.where(adv < 0, torch.minimum(-adv * dual_clip, per_token),
                                    per_token)
    if kl_coef:
        if kl == "k1":
            per_token = per_token + kl_coef * (logp - ref.double())
        else:
            d = torch.clamp(ref.double() - logp, -20, 20)
            per_token = per_token + kl_coef * torch.clamp(torch.exp(d) - d - 1, -10, 10)
    per_token = torch.where(counts > 0, per_token, torch.zeros_like(per_token))
    if aggregation == "token_mean":
        total = (per_token * counts).sum() / counts.sum()
    else:
        seqs = []
        for s in torch.unique_consecutive(seq):
            idx = seq == s
            n_s = counts[idx].sum()
            if n_s == 0:
                continue
            part = (per_token[idx] * counts[idx]).sum()
            seqs.append(part / n_s if aggregation == "seq_mean_token_mean" else part)
        total = torch.stack(seqs).mean()
    total.backward()
    return float(total), x.grad, w.grad


def _rel(a, b):
    return float((a.double() - b).norm() / b.norm())


CASES = {
    "grpo_dapo_clip": dict(clip_low=0.2, clip_high=0.28),
    "dual_clip": dict(dual_clip=3.0),
    "cispo": dict(loss="cispo", clip_low=1.0, clip_high=0.28),
    "kl_k3": dict(kl_coef=0.1, kl="k3"),
    "kl_k1": dict(kl_coef=0.1, kl="k1"),
    "masked_seq_mean_token_mean": dict(aggregation="seq_mean_token_mean", masked=True),
    "seq_mean_token_sum": dict(aggregation="seq_mean_token_sum"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_one_call_matches_a_float64_reference(server, case):
    kw = dict(CASES[case])
    masked = kw.pop("masked", False)
    w, x, y, old, ref, g = _problem()
    adv = torch.randn(N, generator=g)
    seq = torch.arange(N) // 6
    mask = (torch.rand(N, generator=g) > 0.2).to(torch.uint8) if masked else None
    if masked:
        old[mask == 0] = float("nan")  # not read
    objective = flce.PolicyObjective(
        old_logp=old, advantages=adv, ref_logp=ref if kw.get("kl_coef") else None,
        sequence_ids=seq, mask=mask, **{k: v for k, v in kw.items() if k != "kl"},
        kl_estimator=kw.get("kl", "k3"))
    head = f"policy-{uuid.uuid4().hex[:8]}"
    with flce.Client(server.target, timeout=60) as client:
        client.upload_head(head, w.float())
        got = client.compute(head, x.float(), y, policy=objective, session_id=head)
        grad_w = client.fetch_grad(head, session_id=head).weight
    want_loss, want_gx, want_gw = _reference(  # masked tokens' NaN: any value does there
        w, x, y, old=torch.nan_to_num(old), adv=adv, ref=ref, mask=mask, seq=seq,
        **{k: v for k, v in kw.items()})
    assert got.loss == pytest.approx(want_loss, rel=1e-5, abs=1e-6)
    assert _rel(got.grad_input, want_gx) < 1e-5
    assert _rel(grad_w, want_gw) < 1e-5
    assert got.summary.policy is not None
    assert got.summary.policy.loss == kw.get("loss", "ppo_clip")
    counted = int(((y != -100) & (mask != 0 if mask is not None else True)).sum())
    assert got.summary.policy.tokens == counted


def test_per_sequence_advantages_are_spread_over_their_tokens(server):
    w, x, y, old, _, g = _problem(6)
    seq = torch.arange(N) // 8  # five sequences
    per_seq = torch.randn(5, generator=g)
    head = f"policy-{uuid.uuid4().hex[:8]}"
    with flce.Client(server.target, timeout=60) as client:
        client.upload_head(head, w.float())
        a = client.compute(head, x.float(), y, session_id="a", policy=flce.PolicyObjective(
            old_logp=old, advantages=per_seq, sequence_ids=seq))
        b = client.compute(head, x.float(), y, session_id="b", policy=flce.PolicyObjective(
            old_logp=old, advantages=per_seq[seq], sequence_ids=seq))
    assert a.loss == b.loss
    assert torch.equal(a.grad_input, b.grad_input)


def test_policy_loss_is_an_autograd_drop_in(server):
    w, x, y, old, _, g = _problem(7)
    adv = torch.randn(N, generator=g)
    head_id = f"policy-{uuid.uuid4().hex[:8]}"
    with flce.Client(server.target, timeout=60) as client:
        client.upload_head(head_id, w.float())
        head = flce.RemoteLMHead(client, head_id)
        xs = x.float().reshape(4, N // 4, H).requires_grad_(True)
        objective = flce.PolicyObjective(old_logp=old.reshape(4, -1), advantages=adv.reshape(4, -1),
                                         clip_high=0.28)
        loss = head.policy_loss(xs, y.reshape(4, -1), objective)
        loss.backward()
        grad_w = head.fetch_grad_weight()
        assert head.last_summary.policy.tokens == N - 1
    want_loss, want_gx, want_gw = _reference(w, x, y, old=old, adv=adv, clip_high=0.28)
    assert float(loss) == pytest.approx(want_loss, rel=1e-5, abs=1e-6)
    assert _rel(xs.grad.reshape(N, H), want_gx) < 1e-5
    assert _rel(grad_w, want_gw) < 1e-5


def test_bad_inputs_are_named(server):
    w, x, y, old, _, _ = _problem()
    head = f"policy-{uuid.uuid4().hex[:8]}"
    with flce.Client(server.target, timeout=60) as client:
        client.upload_head(head, w.float())
        bad = old.clone()
        bad[3] = float("inf")
        with pytest.raises(flce.FlceError) as err:
            client.compute(head, x.float(), y, policy=flce.PolicyObjective(
                old_logp=bad, advantages=torch.ones(N)))
        assert "old_logp[3] = inf is not finite" in str(err.value)
        with pytest.raises(flce.FlceError, match=r"clip_high = 20 is outside \[0, 10\]"):
            client.compute(head, x.float(), y, policy=flce.PolicyObjective(
                old_logp=old, advantages=torch.ones(N), clip_high=20.0))
        with pytest.raises(ValueError, match="advantages must have 40 elements"):
            client.compute(head, x.float(), y, policy=flce.PolicyObjective(
                old_logp=old, advantages=torch.ones(3)))
        with pytest.raises(flce.FlceError, match="label_smoothing"):
            client.compute(head, x.float(), y, label_smoothing=0.1, policy=flce.PolicyObjective(
                old_logp=old, advantages=torch.ones(N)))


def test_a_server_without_objectives_is_refused_before_sending():
    srv, port = fake_server.start()
    try:
        w, x, y, old, _, _ = _problem()
        with flce.Client(f"127.0.0.1:{port}", timeout=60) as client:
            client.upload_head("h", w.float())
            with pytest.raises(flce.FlceError) as err:
                client.compute("h", x.float(), y, policy=flce.PolicyObjective(
                    old_logp=old, advantages=torch.ones(N)))
            assert err.value.code.name == "FAILED_PRECONDITION"
            assert "policy_objectives" in str(err.value)
    finally:
        srv.stop(None)


def test_the_grpo_example_trains_its_toy_policy(server):
    """client/python/examples/grpo_toy.py against the server: its reward climbs."""
    import json
    import subprocess
    import sys

    from conftest import REPO
    example = REPO / "client" / "python" / "examples" / "grpo_toy.py"
    run = subprocess.run([sys.executable, str(example), "--target", server.target,
                          "--steps", "20"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    rewards = [json.loads(line)["mean_reward"] for line in run.stdout.splitlines()]
    assert len(rewards) == 20
    # one answer of 16 is right: ~0.06 at first
    assert rewards[0] < 0.2
    assert sum(rewards[-5:]) / 5 > 0.4, rewards
