"""RemoteLMHead against F.cross_entropy over a local nn.Linear: loss, grad_input and the
server's grad_W (and grad_b), for every plan the autograd function has."""
from __future__ import annotations

import uuid

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import flce

V, H, N = 67, 24, 50          # V prime, H not a multiple of 16
TOL = 1e-5                    # fp32 inputs: MATH.md's CPU contract


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def make_problem(bias: bool, seed: int = 0, n: int = N, ignore_frac: float = 0.1,
                 ignore_index: int = -100):
    g = torch.Generator().manual_seed(seed)
    lin = nn.Linear(H, V, bias=bias)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(V, H, generator=g) / H ** 0.5 * 3)
        if bias:
            lin.bias.copy_(torch.randn(V, generator=g) * 0.5)
    hidden = torch.randn(n, H, generator=g)
    y = torch.randint(0, V, (n,), generator=g)
    y[torch.rand(n, generator=g) < ignore_frac] = ignore_index
    return lin, hidden, y


def new_head(client, lin, **kw) -> flce.RemoteLMHead:
    head = flce.RemoteLMHead(client, f"h-{uuid.uuid4().hex[:8]}",
                             session_id=f"s-{uuid.uuid4().hex[:8]}", **kw)
    head.load_from_module(lin, dtype=torch.float32)
    return head


def local_run(lin, hidden, y, objective):
    """Loss and gradients of objective(logits, y) in float64 over a copy of lin."""
    lin64 = nn.Linear(H, V, bias=lin.bias is not None).double()
    lin64.load_state_dict({k: v.double() for k, v in lin.state_dict().items()})
    h = hidden.detach().double().requires_grad_(True)
    loss = objective(lin64(h), y)
    loss.backward()
    return (loss.detach(), h.grad, lin64.weight.grad,
            lin64.bias.grad if lin64.bias is not None else None)


def remote_run(head, hidden, y, objective):
    h = hidden.detach().clone().requires_grad_(True)
    loss = objective(head, h, y)
    loss.backward()
    g = head.fetch_grad()
    return loss.detach(), h.grad, g.weight, g.bias


def check(local, remote, tol=TOL, grad_input_tol=None):
    names = ("loss", "grad_input", "grad_W", "grad_b")
    for name, want, got in zip(names, local, remote):
        if want is None:
            assert got is None, name
            continue
        assert got is not None, name
        assert torch.isfinite(got.double()).all(), name
        limit = grad_input_tol if (name == "grad_input" and grad_input_tol) else tol
        assert rel(got, want) <= limit, f"{name}: rel err {rel(got, want):.3e} > {limit}"


BIAS = pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])


@BIAS
def test_mean(client, bias):
    lin, h, y = make_problem(bias)
    head = new_head(client, lin)
    check(local_run(lin, h, y, lambda z, y: F.cross_entropy(z, y)),
          remote_run(head, h, y, lambda m, h, y: m(h, y)))
    assert head.last_summary.n_valid == int((y != -100).sum())


@BIAS
def test_sum(client, bias):
    lin, h, y = make_problem(bias, seed=1)
    head = new_head(client, lin, reduction="sum")
    check(local_run(lin, h, y, lambda z, y: F.cross_entropy(z, y, reduction="sum")),
          remote_run(head, h, y, lambda m, h, y: m(h, y)))


@BIAS
def test_none_with_upstream_weights(client, bias):
    lin, h, y = make_problem(bias, seed=2)
    w = torch.rand(N, generator=torch.Generator().manual_seed(9)) * 2 - 0.5
    head = new_head(client, lin)
    check(local_run(lin, h, y,
                    lambda z, y: (F.cross_entropy(z, y, reduction="none") * w.double()).sum()),
          remote_run(head, h, y, lambda m, h, y: (m(h, y, reduction="none") * w).sum()))


def test_none_returns_per_token_losses(client):
    lin, h, y = make_problem(False, seed=3)
    head = new_head(client, lin, reduction="none")
    with torch.no_grad():
        got = head(h, y)
        want = F.cross_entropy(lin(h), y, reduction="none")
    assert got.shape == y.shape
    assert rel(got, want) <= TOL
    assert torch.all(got[y == -100] == 0)


@BIAS
def test_ignore_index(client, bias):
    lin, h, y = make_problem(bias, seed=4, ignore_frac=0.4, ignore_index=7)
    head = new_head(client, lin, ignore_index=7)
    check(local_run(lin, h, y, lambda z, y: F.cross_entropy(z, y, ignore_index=7)),
          remote_run(head, h, y, lambda m, h, y: m(h, y)))


@BIAS
def test_label_smoothing(client, bias):
    lin, h, y = make_problem(bias, seed=5)
    head = new_head(client, lin, label_smoothing=0.1)
    check(local_run(lin, h, y, lambda z, y: F.cross_entropy(z, y, label_smoothing=0.1)),
          remote_run(head, h, y, lambda m, h, y: m(h, y)))


@BIAS
def test_grad_output_not_one(client, bias):
    """loss × 0.5 (loss scaling): grad_input and the committed grad_W both scale."""
    lin, h, y = make_problem(bias, seed=6)
    head = new_head(client, lin)
    check(local_run(lin, h, y, lambda z, y: F.cross_entropy(z, y) * 0.5),
          remote_run(head, h, y, lambda m, h, y: m(h, y) * 0.5))


@BIAS
def test_two_microbatches_accumulate(client, bias):
    lin, h, y = make_problem(bias, seed=7, n=2 * N)
    head = new_head(client, lin)

    def local(z, y):
        return sum(F.cross_entropy(z[i * N:(i + 1) * N], y[i * N:(i + 1) * N]) / 2
                   for i in range(2))

    def remote(m, hh, yy):
        return sum(m(hh[i * N:(i + 1) * N], yy[i * N:(i + 1) * N]) / 2 for i in range(2))

    check(local_run(lin, h, y, local), remote_run(head, h, y, remote))


def test_micro_batches_accumulate_across_backward_calls(client):
    lin, h, y = make_problem(True, seed=8, n=2 * N)
    head = new_head(client, lin)
    for i in range(2):
        head(h[i * N:(i + 1) * N].clone().requires_grad_(True), y[i * N:(i + 1) * N]).backward()
    lin64 = nn.Linear(H, V).double()
    lin64.load_state_dict({k: v.double() for k, v in lin.state_dict().items()})
    for i in range(2):
        F.cross_entropy(lin64(h[i * N:(i + 1) * N].double()), y[i * N:(i + 1) * N]).backward()
    g = head.fetch_grad(reset=True)
    assert g.header.contributions == 2
    assert rel(g.weight, lin64.weight.grad) <= TOL
    assert rel(g.bias, lin64.bias.grad) <= TOL
    assert float(head.fetch_grad_weight().abs().max()) == 0.0  # reset took effect


@BIAS
def test_bf16_hidden(client, bias):
    lin, h, y = make_problem(bias, seed=9)
    hb = h.to(torch.bfloat16)
    head = new_head(client, lin)
    x = hb.clone().requires_grad_(True)
    loss = head(x, y)
    loss.backward()
    assert x.grad.dtype == torch.bfloat16
    want = local_run(lin, hb.float(), y, lambda z, y: F.cross_entropy(z, y))
    g = head.fetch_grad()
    # hidden exact in bf16; grad_input rounded to bf16 on the way back (2^-9 relative)
    check(want, (loss.detach(), x.grad, g.weight, g.bias), tol=TOL, grad_input_tol=5e-3)


def test_hidden_3d_and_options(client):
    """[B, T, H] input; softcap, temperature and z-loss against the formula in torch."""
    lin, h, y = make_problem(True, seed=10, n=48)
    c, tau, s = 2.0, 0.7, 1e-2
    head = new_head(client, lin, softcap=c, temperature=tau, z_loss=s)

    def local(r, y):
        z = c * torch.tanh(r / c) / tau
        lse = torch.logsumexp(z, 1)
        return F.cross_entropy(z, y) + s * (lse ** 2)[y != -100].mean()

    check(local_run(lin, h, y, local),
          remote_run(head, h, y, lambda m, h, y: m(h.reshape(4, 12, H), y.reshape(4, 12))))


@BIAS
def test_rl_objective_on_logprob_and_entropy(client, bias):
    lin, h, y = make_problem(bias, seed=11, ignore_frac=0.2)
    adv = torch.randn(N, generator=torch.Generator().manual_seed(3))
    valid = (y != -100)

    def local(z, y):
        logp_all = F.log_softmax(z, dim=1)
        logp = logp_all.gather(1, y.clamp_min(0)[:, None])[:, 0] * valid
        ent = -(logp_all.exp() * logp_all).sum(1)
        return -(adv.double() * logp).sum() / valid.sum() - 0.01 * ent.mean()

    def remote(m, h, y):
        out = m(h, y, return_logprob=True, return_entropy=True)
        assert out.logprob.shape == y.shape and out.entropy.shape == y.shape
        return -(adv * out.logprob).sum() / valid.sum() - 0.01 * out.entropy.mean()

    head = new_head(client, lin)
    check(local_run(lin, h, y, local), remote_run(head, h, y, remote))


def test_n_valid_zero_gives_zero_not_nan(client):
    lin, h, y = make_problem(False, seed=12, ignore_frac=1.0)
    head = new_head(client, lin)
    x = h.clone().requires_grad_(True)
    loss = head(x, y)
    loss.backward()
    assert float(loss.detach()) == 0.0
    assert float(x.grad.abs().max()) == 0.0
    assert float(head.fetch_grad_weight().abs().max()) == 0.0


def test_no_grad_forward_creates_nothing(client):
    lin, h, y = make_problem(False, seed=13)
    head = new_head(client, lin)
    with torch.no_grad():
        loss = head(h, y)
    assert abs(float(loss) - float(F.cross_entropy(lin(h), y).detach())) <= 1e-5 * float(loss)
    assert [s for s in client.sessions(head.head_id) if s.session_id == head.session_id] == []


def test_frozen_hidden_still_accumulates_grad_w(client):
    lin, h, y = make_problem(True, seed=14)
    head = new_head(client, lin)
    loss = head(h, y)  # h does not require grad
    loss.backward()
    want = local_run(lin, h, y, lambda z, y: F.cross_entropy(z, y))
    g = head.fetch_grad()
    assert rel(g.weight, want[2]) <= TOL and rel(g.bias, want[3]) <= TOL


def test_fetch_bf16_and_zero_grad(client):
    lin, h, y = make_problem(False, seed=15)
    head = new_head(client, lin)
    head(h.clone().requires_grad_(True), y).backward()
    g32 = head.fetch_grad_weight(torch.float32)
    g16 = head.fetch_grad_weight(torch.bfloat16)
    assert g16.dtype == torch.bfloat16 and g16.shape == (V, H)
    assert rel(g16, g32) <= 4e-3
    head.zero_grad()
    assert float(head.fetch_grad_weight().abs().max()) == 0.0


def test_grad_into_local_parameter(client):
    lin, h, y = make_problem(True, seed=16)
    head = new_head(client, lin)
    head(h.clone().requires_grad_(True), y).backward()
    head.grad_into(lin)
    want = local_run(lin, h, y, lambda z, y: F.cross_entropy(z, y))
    assert rel(lin.weight.grad, want[2]) <= TOL and rel(lin.bias.grad, want[3]) <= TOL


def test_load_from_safetensors(client, tmp_path):
    lin, h, y = make_problem(True, seed=17)
    path = tmp_path / "head.safetensors"
    flce.safetensors.save({"lm_head.weight": lin.weight, "lm_head.bias": lin.bias}, path)
    head = flce.RemoteLMHead(client, f"st-{uuid.uuid4().hex[:8]}")
    info = head.load_from_safetensors(path, bias_tensor="lm_head.bias")
    assert (info.vocab_size, info.hidden_size, info.has_bias) == (V, H, True)
    with torch.no_grad():
        assert rel(head(h, y), F.cross_entropy(lin(h), y)) <= TOL


def test_bad_input_raises_flce_error(client):
    lin, h, y = make_problem(False, seed=18)
    head = new_head(client, lin)
    y = y.clone()
    y[0] = V + 5  # out of range: INVALID_ARGUMENT from the server
    with pytest.raises(flce.FlceError):
        with torch.no_grad():
            head(h, y)


def test_head_from_target_string(server_target):
    lin, h, y = make_problem(False, seed=19)
    head = flce.RemoteLMHead(server_target, f"t-{uuid.uuid4().hex[:8]}", session_id="run-1")
    head.load_from_module(lin, dtype=torch.float32)
    assert head.client.session_id == "run-1" and head.session_id == "run-1"
    head(h.clone().requires_grad_(True), y).backward()
    lin.weight.grad = head.fetch_grad_weight(reset=True)
    want = local_run(lin, h, y, lambda z, y: F.cross_entropy(z, y))
    assert rel(lin.weight.grad, want[2]) <= TOL
    head.client.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@BIAS
def test_cuda_hidden(client, bias):
    """hidden on a GPU: the loss and grad_input come back on that device."""
    lin, h, y = make_problem(bias, seed=20)
    head = new_head(client, lin)
    x = h.cuda().requires_grad_(True)
    loss = head(x, y.cuda()) * 2.0
    loss.backward()
    assert loss.device == x.device and x.grad.device == x.device
    want = local_run(lin, h, y, lambda z, y: F.cross_entropy(z, y) * 2.0)
    g = head.fetch_grad()
    check(want, (loss.detach().cpu(), x.grad.cpu(), g.weight, g.bias))
    out = head(x, y.cuda(), return_logprob=True)
    assert out.logprob.device == x.device


def test_forward_without_backward_discards_its_staged_grad(client):
    """A graph dropped before backward must not leave its grad_W staged (the server caps
    staged contributions per session) nor let it land."""
    lin, h, y = make_problem(False, seed=21)
    head = new_head(client, lin)
    for _ in range(3):  # more than the server's default --max-pending (2)
        loss = head(h.clone().requires_grad_(True), y)
        del loss
    pending = [s.pending for s in client.sessions(head.head_id)
               if s.session_id == head.session_id]
    assert pending in ([], [0])
    head(h.clone().requires_grad_(True), y).backward()
    g = head.fetch_grad()
    assert g.header.contributions == 1
    want = local_run(lin, h, y, lambda z, y: F.cross_entropy(z, y))
    assert rel(g.weight, want[2]) <= TOL


def test_second_backward_through_retained_graph_raises(client):
    lin, h, y = make_problem(False, seed=22)
    head = new_head(client, lin)
    loss = head(h.clone().requires_grad_(True), y)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="already backpropagated"):
        loss.backward()


def test_per_call_options_override_the_module(client):
    lin, h, y = make_problem(True, seed=23, ignore_index=3)
    head = new_head(client, lin)  # module defaults: ignore_index -100, no smoothing
    check(local_run(lin, h, y,
                    lambda z, y: F.cross_entropy(z, y, ignore_index=3, label_smoothing=0.2)),
          remote_run(head, h, y,
                     lambda m, h, y: m(h, y, ignore_index=3, label_smoothing=0.2)))
    assert head.ignore_index == -100 and head.label_smoothing == 0.0
