"""A call whose results overflow is refused by the server with nothing landed; the module
turns that into an inf loss and inf grad_input, so that a GradScaler skips the step, and
the session's gradient stays as it was."""
from __future__ import annotations

import uuid

import pytest
import torch
from torch import nn

import flce

V, H, N = 67, 24, 30


@pytest.fixture(scope="module")
def real_client(real_server_bin):
    from conftest import RealServer  # the fake server computes in float64 and never overflows

    srv = RealServer(real_server_bin)
    with flce.Client(srv.target, timeout=60) as c:
        c.wait_ready(10)
        yield c
    srv.stop()


def problem(seed: int):
    g = torch.Generator().manual_seed(seed)
    lin = nn.Linear(H, V, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(V, H, generator=g) / H ** 0.5)
    return lin, torch.randn(N, H, generator=g), torch.randint(0, V, (N,), generator=g)


def new_head(client, lin, **kw) -> flce.RemoteLMHead:
    head = flce.RemoteLMHead(client, f"h-{uuid.uuid4().hex[:8]}",
                             session_id=f"s-{uuid.uuid4().hex[:8]}", **kw)
    head.load_from_module(lin, dtype=torch.float32)
    return head


def test_overflow_gives_inf_loss_and_grad_and_lands_nothing(real_client):
    lin, hidden, y = problem(0)
    head = new_head(real_client, lin, temperature=1e-3)
    good = hidden.clone().requires_grad_(True)
    head(good, y).backward()
    before = head.fetch_grad_weight()
    assert torch.isfinite(before).all() and before.abs().sum() > 0

    # finite hidden states whose logits / temperature overflow fp32
    h = (hidden * 1e36).requires_grad_(True)
    loss = head(h, y)
    assert torch.isinf(loss)
    loss.backward()
    assert torch.isinf(h.grad).all()
    assert torch.equal(head.fetch_grad_weight(), before)

    # what a GradScaler does with it: inf found, the optimizer step skipped
    found_inf = not torch.isfinite(h.grad).all()
    assert found_inf


def test_the_error_says_so_and_bad_input_is_not_mistaken_for_it(real_client):
    lin, hidden, y = problem(1)
    head = new_head(real_client, lin)
    head.load_from_module(lin, dtype=torch.float32)
    with pytest.raises(flce.FlceError) as overflow:
        real_client.compute(head.head_id, hidden * 1e36, y, temperature=1e-3,
                            session_id=head.session_id)
    assert overflow.value.non_finite
    with pytest.raises(flce.FlceError) as bad:
        real_client.compute(head.head_id, hidden, y, temperature=1e-9, session_id=head.session_id)
    assert not bad.value.non_finite
    assert "options.temperature" in bad.value.details
