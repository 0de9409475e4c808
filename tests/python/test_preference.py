"""Preference objectives through a real server (flce.PreferenceObjective): one Compute call
against a float64 PyTorch reference in TRL's form (DPOTrainer.dpo_loss for sigmoid / ipo /
hinge, CPOTrainer's simpo, ORPOTrainer.odds_ratio_loss with the chosen NLL; torch's
autograd), the autograd drop-in RemoteLMHead.preference_loss over TRL's concatenated
[chosen; rejected] layout, and bad inputs named."""
from __future__ import annotations

import uuid

import pytest
import torch
import torch.nn.functional as F

import flce
import fake_server
from conftest import RealServer

V, H, B, L = 37, 16, 3, 6  # pairs of [B, L] responses; chosen rows then rejected rows


@pytest.fixture(scope="module")
def server(real_server_bin):
    srv = RealServer(real_server_bin)
    yield srv
    srv.stop()


def _batch(seed=3):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(V, H, generator=g, dtype=torch.float64) * 0.4
    x = torch.randn(2 * B, L, H, generator=g, dtype=torch.float64)
    y = torch.randint(0, V, (2 * B, L), generator=g)
    mask = torch.ones(2 * B, L, dtype=torch.bool)
    mask[:, :2] = False            # the prompt
    mask[1, -1] = False            # uneven response lengths
    mask[B + 2, -2:] = False
    y[~mask] = -100                # TRL's labels: -100 outside the completion
    ref = torch.randn(2 * B, generator=g, dtype=torch.float64) - 8.0  # per sequence sums
    return w, x, y, mask, ref


def _reference(w, x, y, mask, ref, loss, beta, gamma=0.0, label_smoothing=0.0):
    """loss, grad_x, grad_w in float64 by torch's autograd, in TRL's form."""
    w = w.clone().requires_grad_(True)
    x = x.clone().requires_grad_(True)
    logp = torch.log_softmax(x @ w.T, -1).gather(-1, y.clamp(min=0)[..., None])[..., 0]
    logp = logp * mask
    n = mask.sum(-1).double()
    s = logp.sum(-1)
    if loss in ("ipo", "simpo", "orpo"):
        s = s / n                          # TRL averages over the completion for these
    pc, pr = s[:B], s[B:]
    if loss in ("dpo_sigmoid", "ipo", "dpo_hinge"):
        rc, rr = ref[:B], ref[B:]
        if loss == "ipo":
            rc, rr = rc / n[:B], rr / n[B:]
        h = (pc - rc) - (pr - rr)
        if loss == "dpo_sigmoid":
            per_pair = (-F.logsigmoid(beta * h) * (1 - label_smoothing)
                        - F.logsigmoid(-beta * h) * label_smoothing)
        elif loss == "ipo":
            per_pair = (h - 1 / (2 * beta)) ** 2
        else:
            per_pair = torch.relu(1 - beta * h)
        total = per_pair.mean()
    elif loss == "simpo":
        total = (-F.logsigmoid(beta * (pc - pr) - gamma)).mean()
    else:  # orpo
        log_odds = (pc - pr) - (torch.log1p(-torch.exp(pc)) - torch.log1p(-torch.exp(pr)))
        nll = -(logp[:B].sum()) / mask[:B].sum()
        total = nll - beta * F.logsigmoid(log_odds).mean()
    total.backward()
    return float(total), x.grad, w.grad


def _rel(a, b):
    return float((a.double() - b).norm() / b.norm())


CASES = {
    "dpo_sigmoid": dict(beta=0.5),
    "cdpo": dict(loss="dpo_sigmoid", beta=0.5, label_smoothing=0.1),
    "ipo": dict(beta=0.3),
    "dpo_hinge": dict(beta=0.1),
    "simpo": dict(beta=2.0, gamma=0.5),
    "orpo": dict(beta=0.1),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_one_call_matches_a_float64_reference_in_trls_form(server, case):
    kw = dict(CASES[case])
    loss = kw.pop("loss", case)
    w, x, y, mask, ref = _batch()
    with_ref = loss in flce.preference.WITH_REFERENCE
    objective = flce.PreferenceObjective.for_batch(
        mask[:B], mask[B:], loss=loss, ref_chosen_logp=ref[:B].float() if with_ref else None,
        ref_rejected_logp=ref[B:].float() if with_ref else None, **kw)
    head = f"pref-{uuid.uuid4().hex[:8]}"
    with flce.Client(server.target, timeout=60) as client:
        client.upload_head(head, w.float())
        got = client.compute(head, x.float().reshape(-1, H), y.reshape(-1),
                             preference=objective.flattened(), session_id=head, logprob=True)
        grad_w = client.fetch_grad(head, session_id=head).weight
    want_loss, want_gx, want_gw = _reference(w, x, y, mask, ref.float().double(), loss, **kw)
    assert got.loss == pytest.approx(want_loss, rel=1e-5, abs=1e-6)
    assert _rel(got.grad_input, want_gx.reshape(-1, H)) < 1e-5
    assert _rel(grad_w, want_gw) < 1e-5
    summary = got.summary.preference
    assert summary.loss == loss and summary.pairs == B


def test_a_per_token_reference_is_summed_per_sequence(server):
    w, x, y, mask, _ = _batch(4)
    g = torch.Generator().manual_seed(9)
    ref_tokens = torch.randn(2 * B, L, generator=g) - 2.0
    ref_sums = (ref_tokens * mask).sum(-1)
    head = f"pref-{uuid.uuid4().hex[:8]}"
    with flce.Client(server.target, timeout=60) as client:
        client.upload_head(head, w.float())
        args = (head, x.float().reshape(-1, H), y.reshape(-1))
        by_token = client.compute(*args, session_id="a", preference=flce.PreferenceObjective.for_batch(
            mask[:B], mask[B:], ref_token_logp=ref_tokens).flattened())
        by_sequence = client.compute(*args, session_id="b", preference=flce.PreferenceObjective.for_batch(
            mask[:B], mask[B:], ref_chosen_logp=ref_sums[:B],
            ref_rejected_logp=ref_sums[B:]).flattened())
    assert by_token.loss == pytest.approx(by_sequence.loss, rel=1e-6)
    assert torch.allclose(by_token.grad_input.float(), by_sequence.grad_input.float(), rtol=1e-5,
                          atol=1e-7)


def test_preference_loss_is_an_autograd_drop_in(server):
    w, x, y, mask, ref = _batch(5)
    head_id = f"pref-{uuid.uuid4().hex[:8]}"
    with flce.Client(server.target, timeout=60) as client:
        client.upload_head(head_id, w.float())
        head = flce.RemoteLMHead(client, head_id)
        xs = x.float().requires_grad_(True)
        objective = flce.PreferenceObjective.for_batch(mask[:B], mask[B:],
                                                       ref_chosen_logp=ref[:B].float(),
                                                       ref_rejected_logp=ref[B:].float(), beta=0.5)
        loss = head.preference_loss(xs, y, objective)
        loss.backward()
        grad_w = head.fetch_grad_weight()
        stats = head.last_summary.preference
    want_loss, want_gx, want_gw = _reference(w, x, y, mask, ref.float().double(), "dpo_sigmoid",
                                             0.5)
    assert float(loss) == pytest.approx(want_loss, rel=1e-5)
    assert _rel(xs.grad, want_gx) < 1e-5
    assert _rel(grad_w, want_gw) < 1e-5
    assert 0.0 <= stats.reward_accuracy <= 1.0
    assert stats.reward_margin_mean == pytest.approx(
        stats.chosen_reward_mean - stats.rejected_reward_mean)
    assert 0.0 < stats.first_pass_ms < head.last_summary.timings.engine_ms


def test_bad_inputs_are_named_and_nothing_lands(server):
    w, x, y, mask, ref = _batch()
    head = f"pref-{uuid.uuid4().hex[:8]}"
    good = flce.PreferenceObjective.for_batch(mask[:B], mask[B:], ref_logp=ref.float())
    seq = good.sequence_of_token.clone()
    seq[0, 3] = 2 * B  # outside [-1, 2B)
    cases = {
        "sequence_of_token[3] = 6": flce.PreferenceObjective(seq, B, ref_logp=ref.float()),
        "needs ref_logp": flce.PreferenceObjective(good.sequence_of_token, B),
        "beta = 0": flce.PreferenceObjective(good.sequence_of_token, B, ref_logp=ref.float(),
                                             beta=0.0),
        "uses no reference": flce.PreferenceObjective(good.sequence_of_token, B, loss="simpo",
                                                      ref_logp=ref.float()),
    }
    with flce.Client(server.target, timeout=60) as client:
        client.upload_head(head, w.float())
        for expected, objective in cases.items():
            with pytest.raises(flce.FlceError) as err:
                client.compute(head, x.float().reshape(-1, H), y.reshape(-1), session_id=head,
                               preference=objective.flattened())
            assert err.value.code.name == "INVALID_ARGUMENT", expected
            assert expected in str(err.value), (expected, str(err.value))
        # nothing landed: the refused calls did not even open the session
        with pytest.raises(flce.FlceError) as err:
            client.fetch_grad(head, session_id=head)
        assert err.value.code.name == "NOT_FOUND"


def test_a_server_without_preference_objectives_is_refused_before_sending():
    srv, port = fake_server.start()  # speaks the protocol, names no objective
    try:
        w, x, y, mask, ref = _batch()
        with flce.Client(f"127.0.0.1:{port}", timeout=60) as client:
            client.upload_head("h", w.float())
            with pytest.raises(flce.FlceError) as err:
                client.compute("h", x.float().reshape(-1, H), y.reshape(-1),
                               preference=flce.PreferenceObjective.for_batch(
                                   mask[:B], mask[B:], ref_chosen_logp=ref[:B],
                                   ref_rejected_logp=ref[B:]).flattened())
            assert err.value.code.name == "FAILED_PRECONDITION"
            assert "preference_objectives" in str(err.value)
    finally:
        srv.stop(None)
