"""The head trained on the server (flce.ServerOptimizer, Client.step / grad_norm /
download_head) against torch.optim run locally on the same gradients: AdamW and SGD,
lr schedules, clipping by one global norm, skipped steps, retries and refusals.

Real server only: the fake server has no optimizer."""
from __future__ import annotations

import copy
import math
import uuid
import warnings

import grpc
import pytest
import torch
from torch import nn

import flce
from conftest import SERVER_DEVICE, RpcError
from flce import wire
from flce._pb import pb

V, H, N = 97, 32, 24
STEPS = 20
# fp32 master on both engines; the CUDA engine's passes contract multiply-adds (FMA).
TOL = 1e-6 if SERVER_DEVICE == "cpu" else 1e-5


@pytest.fixture
def client(real_client):  # the real server only
    return real_client



def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _head(client, bias=True, seed=0, dtype=torch.float32):
    """A RemoteLMHead of its own (head and session) and the nn.Linear it was loaded from."""
    g = torch.Generator().manual_seed(seed)
    lin = nn.Linear(H, V, bias=bias)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(V, H, generator=g) * 0.2)
        if bias:
            lin.bias.copy_(torch.randn(V, generator=g) * 0.2)
    head = flce.RemoteLMHead(client, f"opt-{uuid.uuid4().hex[:8]}",
                             session_id=f"s-{uuid.uuid4().hex[:8]}")
    head.load_from_module(lin, dtype=dtype)
    return head, lin


def _batch(gen):
    return torch.randn(N, H, generator=gen), torch.randint(0, V, (N,), generator=gen)


def _compute(head, gen):
    x, y = _batch(gen)
    head(x.requires_grad_(True), y).backward()


def _give_grads(ref: nn.Linear, g: flce.GradResult):
    ref.weight.grad = g.weight.clone()
    if ref.bias is not None:
        ref.bias.grad = g.bias.clone()


def _assert_same_weights(head, ref: nn.Linear, what: str):
    got = head.download()
    assert got.header.dtype == flce.DType.FP32
    assert _rel(got.weight, ref.weight.detach()) <= TOL, what
    if ref.bias is not None:
        assert _rel(got.bias, ref.bias.detach()) <= TOL, what
    return got


def _train_against_torch(client, kind, torch_cls, hyper, *, bias_hyper=None, bias_lr=None,
                         schedules=None, steps=STEPS, seed=0):
    """Both optimizers step on the same fetched gradient, `steps` times; after each step the
    server's weight must be torch's."""
    head, lin = _head(client, seed=seed)
    ref = copy.deepcopy(lin)
    opt = head.optimizer(kind, **hyper, **({"bias_weight_decay": bias_hyper["weight_decay"]}
                                           if bias_hyper else {}))
    assert [g["name"] for g in opt.param_groups] == ["weight", "bias"]
    torch_hyper = {k: v for k, v in hyper.items()}
    bias_group = dict(params=[ref.bias], **(bias_hyper or {}))
    topt = torch_cls([dict(params=[ref.weight]), bias_group], **torch_hyper)
    if bias_lr is not None:
        opt.param_groups[1]["lr"] = bias_lr
        topt.param_groups[1]["lr"] = bias_lr
    scheds = [(make(opt), make(topt)) for make in (schedules or [])]
    gen = torch.Generator().manual_seed(seed + 100)
    version = head.info().version
    lrs = []
    for k in range(steps):
        _compute(head, gen)
        g = head.fetch_grad()  # no reset: the Step consumes the session's gradient
        assert g.header.contributions == 1
        _give_grads(ref, g)
        lrs.append((opt.param_groups[0]["lr"], opt.param_groups[1]["lr"]))
        assert lrs[-1] == (topt.param_groups[0]["lr"], topt.param_groups[1]["lr"])
        topt.step()
        opt.step()
        step = opt.last_step
        assert step.outcome == flce.StepOutcome.APPLIED and not step.replayed
        assert step.head_version == version + k + 1 and step.steps == k + 1
        assert step.contributions == 1
        for mine, theirs in scheds:
            mine.step()
            theirs.step()
        _assert_same_weights(head, ref, f"step {k}")
    assert head.fetch_grad().header.contributions == 0  # every Step consumed its gradient
    info = head.info()
    assert info.version == version + steps and info.optimizer.steps == steps
    return head, opt, lrs


# ------------------------------------------------------------ against torch --

@pytest.mark.parametrize("hyper,bias_hyper,bias_lr", [
    (dict(lr=1e-2, weight_decay=0.1), None, None),
    (dict(lr=5e-3, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05, amsgrad=True),
     dict(weight_decay=0.0), 2e-2),
], ids=["adamw", "adamw-amsgrad-bias-group"])
def test_adamw_matches_torch(client, hyper, bias_hyper, bias_lr):
    head, opt, _ = _train_against_torch(client, "adamw", torch.optim.AdamW, hyper,
                                        bias_hyper=bias_hyper, bias_lr=bias_lr)
    info = head.info().optimizer
    assert info.kind == flce.OptimizerKind.ADAMW
    assert info.weight.weight_decay == hyper["weight_decay"]
    if bias_hyper:
        assert info.bias.weight_decay == bias_hyper["weight_decay"]
        assert info.weight.amsgrad and info.weight.beta1 == 0.8


@pytest.mark.parametrize("hyper", [
    dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01),
    dict(lr=0.05, momentum=0.8, dampening=0.1, weight_decay=0.05),
    dict(lr=0.1),
], ids=["nesterov", "dampening", "plain"])
def test_sgd_matches_torch(client, hyper):
    _train_against_torch(client, "sgd", torch.optim.SGD, hyper)


@pytest.mark.parametrize("kind,torch_cls,hyper,make", [
    ("adamw", torch.optim.AdamW, dict(lr=1e-2),
     lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=4, gamma=0.5)),
    ("sgd", torch.optim.SGD, dict(lr=0.1, momentum=0.9),
     lambda o: torch.optim.lr_scheduler.LambdaLR(o, [lambda k: 1 / (1 + k),
                                                     lambda k: 0.5 ** k])),
    ("sgd", torch.optim.SGD, dict(lr=0.1, momentum=0.9),
     lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=10)),
    ("adamw", torch.optim.AdamW, dict(lr=1e-2),
     lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=2e-2, total_steps=12,
                                                   cycle_momentum=False)),
], ids=["steplr", "lambdalr-per-group", "cosine", "onecycle"])
def test_lr_schedules_drive_the_server_step(client, kind, torch_cls, hyper, make):
    _, _, lrs = _train_against_torch(client, kind, torch_cls, hyper, schedules=[make],
                                     steps=12)
    assert len({lr for lr, _ in lrs}) > 1, "the schedule never changed the learning rate"


def test_a_scheduler_that_cycles_betas_is_refused_at_step(client):
    head, _ = _head(client)
    opt = head.optimizer("adamw", lr=1e-2)
    torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-2, total_steps=10)  # cycles beta1
    _compute(head, torch.Generator().manual_seed(1))
    with pytest.raises(ValueError, match="cycle_momentum=False"):
        opt.step()
    assert head.info().optimizer.steps == 0


# ----------------------------------------------------------------- clipping --

@pytest.mark.parametrize("kind,torch_cls,hyper,clip", [
    ("sgd", torch.optim.SGD, dict(lr=0.1, momentum=0.9), 0.25),
    ("adamw", torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.1), 0.25),
    ("sgd", torch.optim.SGD, dict(lr=0.1), 4.0),  # max_norm above the norm: coef 1
], ids=["sgd", "adamw", "no-clip"])
def test_clip_grad_norm_is_torchs_over_body_and_head(client, kind, torch_cls, hyper, clip):
    """flce.clip_grad_norm_ over (a local body, the remote head) equals
    torch.nn.utils.clip_grad_norm_ over (the body, a local head holding the fetched grads):
    the norm, the clipped body gradients and the weights both optimizers step to."""
    head, lin = _head(client, seed=3)
    torch.manual_seed(3)
    body = nn.Linear(8, H)
    ref_body, ref_head = copy.deepcopy(body), copy.deepcopy(lin)
    opt = head.optimizer(kind, **hyper)
    body_opt = torch_cls(body.parameters(), **hyper)
    ref_opt = torch_cls(list(ref_body.parameters()) + list(ref_head.parameters()), **hyper)
    gen = torch.Generator().manual_seed(4)
    clipped = 0
    for k in range(4):
        x, y = torch.randn(N, 8, generator=gen), torch.randint(0, V, (N,), generator=gen)
        head(body(x), y).backward()
        _give_grads(ref_head, head.fetch_grad())
        for mine, ref in zip(body.parameters(), ref_body.parameters()):
            ref.grad = mine.grad.clone()
        everything = list(ref_body.parameters()) + list(ref_head.parameters())
        unclipped = math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in everything))
        max_norm = clip * unclipped
        want = torch.nn.utils.clip_grad_norm_(everything, max_norm)
        got = flce.clip_grad_norm_(body.parameters(), opt, max_norm)
        assert isinstance(got, torch.Tensor) and got.dtype == want.dtype
        assert abs(float(got) - float(want)) <= TOL * float(want), (float(got), float(want))
        for mine, ref in zip(body.parameters(), ref_body.parameters()):
            assert _rel(mine.grad, ref.grad) <= TOL
        coef = head._clip_coef
        assert coef is not None and (coef < 1.0) == (clip < 1)
        clipped += coef < 1.0
        body_opt.step()
        ref_opt.step()
        opt.step()
        assert head._clip_coef is None, "a coefficient applies to one step only"
        body_opt.zero_grad()
        ref_opt.zero_grad()
        _assert_same_weights(head, ref_head, f"step {k}")
        for mine, ref in zip(body.parameters(), ref_body.parameters()):
            assert _rel(mine.detach(), ref.detach()) <= TOL
    assert clipped == (4 if clip < 1 else 0)


def test_grad_norm_is_the_fp64_sum_of_squares_of_the_fetched_gradient(client):
    head, _ = _head(client)
    gen = torch.Generator().manual_seed(5)
    _compute(head, gen)
    _compute(head, gen)
    g = head.fetch_grad()
    norm = client.grad_norm(head.head_id, head.session_id)
    assert isinstance(norm, flce.GradNorm) and norm.contributions == 2
    w, b = float(g.weight.double().pow(2).sum()), float(g.bias.double().pow(2).sum())
    assert norm.weight_sq_norm == pytest.approx(w, rel=1e-12)
    assert norm.bias_sq_norm == pytest.approx(b, rel=1e-12)
    assert norm.sq_norm == pytest.approx(w + b, rel=1e-12)
    version = head.info().version
    assert norm.head_version == version
    assert (norm.computed_on.oldest, norm.computed_on.newest) == (version, version)
    missing = client.grad_norm(head.head_id, "nobody-computed-here")
    assert missing.sq_norm == 0.0 and missing.contributions == 0


def test_clip_grad_norm_refuses_other_norms_and_can_raise_on_non_finite(client):
    head, _ = _head(client)
    opt = head.optimizer("sgd", lr=0.1)
    p = nn.Parameter(torch.ones(3))
    p.grad = torch.ones(3)
    with pytest.raises(ValueError, match="L2 norm only"):
        flce.clip_grad_norm_([p], opt, 1.0, norm_type=float("inf"))
    p.grad = torch.tensor([1.0, float("inf"), 0.0])
    with pytest.raises(RuntimeError, match="non-finite"):
        flce.clip_grad_norm_([p], opt, 1.0, error_if_nonfinite=True)
    # A NaN norm: torch would write NaN into the weights (coefficient NaN); the head's step
    # is skipped instead, and its gradient dropped.
    _compute(head, torch.Generator().manual_seed(6))
    before = head.download().weight
    p.grad = torch.tensor([1.0, float("nan"), 0.0])
    assert torch.isnan(flce.clip_grad_norm_([p], head, 1.0))
    opt.step()
    assert opt.last_step.outcome == flce.StepOutcome.SKIPPED_FOUND_INF
    assert torch.equal(head.download().weight, before)
    assert head.fetch_grad().header.contributions == 0
    # An infinite norm: coefficient 0, as torch's, which multiplies the head's gradient by 0
    _compute(head, torch.Generator().manual_seed(6))
    p.grad = torch.tensor([1.0, float("inf"), 0.0])
    assert torch.isinf(flce.clip_grad_norm_([p], head, 1.0)) and head._clip_coef == 0.0
    opt.step()
    assert opt.last_step.applied  # plain SGD with a zero gradient: the weight stays
    assert torch.equal(head.download().weight, before)


# ------------------------------------------------------------ skipped steps --

def test_found_inf_skips_the_step_and_drops_the_gradient(client):
    head, _ = _head(client)
    opt = head.optimizer("adamw", lr=1e-2)
    before = head.download()
    _compute(head, torch.Generator().manual_seed(7))
    opt.step(found_inf=True)
    step = opt.last_step
    assert step.outcome == flce.StepOutcome.SKIPPED_FOUND_INF and step.steps == 0
    assert step.head_version == before.header.head.version
    after = head.download()
    assert after.header.head.version == before.header.head.version
    assert torch.equal(after.weight, before.weight) and torch.equal(after.bias, before.bias)
    assert head.fetch_grad().header.contributions == 0
    info = head.info().optimizer
    assert info.steps == 0 and info.skipped_steps == 1
    _compute(head, torch.Generator().manual_seed(8))
    opt.step()  # the next one applies, under the next request id
    assert opt.last_step.applied and opt.last_step.steps == 1


def test_a_step_without_a_gradient_is_skipped_as_torch_skips_grad_none(client):
    """torch.optim skips a parameter whose grad is None: no weight decay, no moment update,
    no step counted. The server's Step on a session holding no contribution (zeroed, or
    never created) is STEP_SKIPPED_NO_GRADIENT: weight, version and step count unchanged,
    and the next applied step is torch's after the same skip."""
    head, lin = _head(client)
    ref = copy.deepcopy(lin)
    opt = head.optimizer("adamw", lr=1e-2, weight_decay=0.1)
    topt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
    gen = torch.Generator().manual_seed(16)
    _compute(head, gen)
    _give_grads(ref, head.fetch_grad())
    topt.step()
    opt.step()
    assert opt.last_step.applied
    before = _assert_same_weights(head, ref, "first step")
    version = before.header.head.version
    assert opt.last_step.head_version == version and opt.last_step.steps == 1

    opt.zero_grad()
    topt.zero_grad(set_to_none=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to warn about any more
        opt.step()
    topt.step()  # every grad None: torch changes nothing either
    step = opt.last_step
    assert step.outcome == flce.StepOutcome.SKIPPED_NO_GRADIENT and not step.applied
    assert not step.replayed and step.contributions == 0
    assert step.head_version == version and step.steps == 1
    assert opt.head_version == version and opt.steps == 1
    after = head.download()
    assert after.header.head.version == version
    assert torch.equal(after.weight, before.weight) and torch.equal(after.bias, before.bias)

    # a session the server does not have holds no gradient either (no NOT_FOUND)
    nobody = client.step(head.head_id, 1e-2, session_id=f"never-{uuid.uuid4().hex[:8]}")
    assert nobody.outcome == flce.StepOutcome.SKIPPED_NO_GRADIENT
    assert nobody.head_version == version and nobody.steps == 1
    assert torch.equal(head.download().weight, before.weight)
    info = head.info()
    assert info.version == version and info.optimizer.steps == 1
    assert info.optimizer.skipped_steps == 0  # no gradient is no step: not counted

    # the moments and the step count (bias correction) were left alone: the next step is
    # torch's after its own skipped step
    _compute(head, gen)
    _give_grads(ref, head.fetch_grad())
    topt.step()
    opt.step()
    assert opt.last_step.applied and opt.last_step.steps == 2
    assert opt.last_step.head_version == version + 1
    _assert_same_weights(head, ref, "the step after the skipped one")


def test_zero_grad_zeroes_the_session(client):
    head, _ = _head(client)
    opt = head.optimizer("sgd", lr=0.1)
    _compute(head, torch.Generator().manual_seed(9))
    assert client.grad_norm(head.head_id, head.session_id).sq_norm > 0
    opt.zero_grad()
    assert client.grad_norm(head.head_id, head.session_id).sq_norm == 0.0


# ------------------------------------------------------------------ retries --

def _lose_step_answers(client, monkeypatch, times=1):
    """Step reaches the server and is applied; its answer is lost `times` times."""
    real = client._stub.Step
    sent = []

    def lossy(request, timeout=None):
        sent.append(request)
        answer = real(request, timeout=timeout)
        if len(sent) <= times:
            raise RpcError(grpc.StatusCode.UNAVAILABLE, "connection reset")
        return answer

    monkeypatch.setattr(client._stub, "Step", lossy)
    return sent


def test_a_step_whose_answer_is_lost_is_retried_with_the_errors_request_id(client,
                                                                          monkeypatch):
    head, _ = _head(client)
    client.create_optimizer(head.head_id, "sgd")
    _compute(head, torch.Generator().manual_seed(10))
    version = head.info().version
    sent = _lose_step_answers(client, monkeypatch)
    with pytest.raises(flce.FlceError) as info:
        client.step(head.head_id, 0.1, session_id=head.session_id)
    err = info.value
    assert err.method == "Step" and err.code == grpc.StatusCode.UNAVAILABLE
    assert err.request_id and err.request_id == sent[0].request_id
    stepped = head.download().weight
    _compute(head, torch.Generator().manual_seed(11))  # a gradient the retry must not apply
    again = client.step(head.head_id, 0.1, session_id=head.session_id,
                        request_id=err.request_id)
    assert again.replayed and again.head_version == version + 1 and again.steps == 1
    assert torch.equal(head.download().weight, stepped)
    assert head.fetch_grad().header.contributions == 1
    with pytest.raises(flce.FlceError) as other:  # the same id for another step: refused
        client.step(head.head_id, 0.2, session_id=head.session_id, request_id=err.request_id)
    assert other.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "other values" in other.value.details


def test_server_optimizer_step_retried_after_a_failure_is_applied_once(client, monkeypatch):
    head, lin = _head(client)
    ref = copy.deepcopy(lin)
    opt = head.optimizer("sgd", lr=0.1, momentum=0.9, run_id="run-a")
    topt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    _compute(head, torch.Generator().manual_seed(12))
    _give_grads(ref, head.fetch_grad())
    flce.clip_grad_norm_([], opt, 1e-3)  # the retry must send the same coefficient
    assert opt.request_id == "run-a-step-0"
    _lose_step_answers(client, monkeypatch)
    with pytest.raises(flce.FlceError):
        opt.step()
    assert opt.request_id == "run-a-step-0" and head._clip_coef is not None
    opt.step()
    assert opt.last_step.replayed and opt.last_step.steps == 1
    assert opt.request_id == "run-a-step-1" and head._clip_coef is None
    monkeypatch.undo()
    torch.nn.utils.clip_grad_norm_(ref.parameters(), 1e-3)
    topt.step()
    _assert_same_weights(head, ref, "after the retried step")
    _compute(head, torch.Generator().manual_seed(13))
    opt.step()
    assert not opt.last_step.replayed and opt.last_step.steps == 2


# ---------------------------------------------------------------- refusals --

def test_unknown_optimizer_is_refused(client):
    head, _ = _head(client)
    with pytest.raises(ValueError, match="unknown optimizer 'adam'"):
        head.optimizer("adam")
    with pytest.raises(ValueError, match="unknown optimizer"):
        client.create_optimizer(head.head_id, "lion")
    req = pb.CreateOptimizerRequest(head_id=head.head_id, kind=7)
    with pytest.raises(grpc.RpcError) as raw:  # what the server says to an unknown kind
        client._stub.CreateOptimizer(req)
    assert raw.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert head.info().optimizer is None


@pytest.mark.parametrize("kind,torch_cls,bad", [
    ("adamw", torch.optim.AdamW, dict(betas=(0.9, 1.0))),
    ("adamw", torch.optim.AdamW, dict(betas=(-0.1, 0.999))),
    ("adamw", torch.optim.AdamW, dict(eps=-1.0)),
    ("adamw", torch.optim.AdamW, dict(lr=-1e-3)),
    ("sgd", torch.optim.SGD, dict(nesterov=True)),
    ("sgd", torch.optim.SGD, dict(momentum=-0.5)),
    ("sgd", torch.optim.SGD, dict(weight_decay=-0.1)),
], ids=["beta2", "beta1", "eps", "lr", "nesterov", "momentum", "weight_decay"])
def test_hyper_parameters_torch_refuses_are_refused_with_torchs_message(client, kind,
                                                                       torch_cls, bad):
    head, _ = _head(client)
    kw = dict(lr=1e-3, **bad) if "lr" not in bad else dict(bad)
    with pytest.raises(ValueError) as theirs:
        torch_cls([nn.Parameter(torch.zeros(1))], **kw)
    with pytest.raises(ValueError) as mine:
        head.optimizer(kind, **kw)
    assert str(mine.value) == str(theirs.value)
    assert head.info().optimizer is None


def test_the_server_refuses_what_torch_refuses_too(client):
    head, _ = _head(client)
    with pytest.raises(flce.FlceError) as info:
        client.create_optimizer(head.head_id, "adamw", weight={"beta2": 1.0})
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "Invalid beta parameter at index 1" in info.value.details
    with pytest.raises(ValueError, match="momentum is not a parameter of adamw"):
        head.optimizer("adamw", momentum=0.9)
    with pytest.raises(ValueError, match="betas is not a parameter of sgd"):
        head.optimizer("sgd", betas=(0.5, 0.9))
    with pytest.raises(TypeError):
        client.create_optimizer(head.head_id, "sgd", weight={"momentun": 0.9})
    nobias, _ = _head(client, bias=False)
    with pytest.raises(ValueError, match="has no bias"):
        nobias.optimizer("sgd", bias_weight_decay=0.1)
    opt = nobias.optimizer("sgd", lr=0.1)
    assert [g["name"] for g in opt.param_groups] == ["weight"]
    with pytest.raises(ValueError, match="no other group"):
        opt.add_param_group(dict(params=[nn.Parameter(torch.zeros(1))]))


def test_step_without_optimizer_state_is_a_failed_precondition(client):
    head, lin = _head(client)
    _compute(head, torch.Generator().manual_seed(14))
    with pytest.raises(flce.FlceError) as info:
        client.step(head.head_id, 0.1, session_id=head.session_id)
    assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "CreateOptimizer" in info.value.details
    # a head with state keeps its weight unless the upload resets the state
    opt = head.optimizer("sgd", lr=0.1, momentum=0.9)
    with pytest.raises(flce.FlceError) as kept:
        head.load_from_module(lin)
    assert kept.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "reset_optimizer" in kept.value.details
    head.load_from_module(lin, reset_optimizer=True)
    assert head.info().optimizer is None
    with pytest.raises(flce.FlceError) as gone:
        opt.step()
    assert gone.value.code == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(flce.FlceError) as twice:
        head.optimizer("sgd", lr=0.1)
        head.optimizer("sgd", lr=0.1)
    assert twice.value.code == grpc.StatusCode.ALREADY_EXISTS
    assert head.optimizer("adamw", lr=0.1, replace=True).info.kind == flce.OptimizerKind.ADAMW


def test_stale_expected_head_version_is_a_failed_precondition(client):
    head, _ = _head(client)
    opt = head.optimizer("sgd", lr=0.1)
    _compute(head, torch.Generator().manual_seed(15))
    version = head.info().version
    with pytest.raises(flce.FlceError) as info:
        opt.step(expected_head_version=version - 1)
    assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert f"expected_head_version = {version - 1}" in info.value.details
    assert head.info().version == version
    opt.step(expected_head_version=version)
    assert opt.last_step.applied and opt.last_step.head_version == version + 1


# ------------------------------------------------------------- state_dict --

def test_state_dict_holds_hyper_parameters_lrs_and_counts(client):
    head, _ = _head(client)
    opt = head.optimizer("adamw", lr=1e-2, weight_decay=0.1, bias_weight_decay=0.0)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    for k in range(2):
        _compute(head, torch.Generator().manual_seed(20 + k))
        opt.step()
        sched.step()
    sd = opt.state_dict()
    assert sd["state"] == {}  # the moments live on the server
    assert [g["lr"] for g in sd["param_groups"]] == [2.5e-3, 2.5e-3]
    assert [g["weight_decay"] for g in sd["param_groups"]] == [0.1, 0.0]
    assert sd["flce"]["steps"] == 2 and sd["flce"]["step_calls"] == 2
    assert sd["flce"]["head_version"] == head.info().version

    other = head.optimizer("adamw", lr=1.0, weight_decay=0.3, replace=True)
    other.load_state_dict(sd)
    assert [g["lr"] for g in other.param_groups] == [2.5e-3, 2.5e-3]
    assert [g["weight_decay"] for g in other.param_groups] == [0.1, 0.0]
    info = head.info().optimizer  # the server's state now has the restored values
    assert (info.weight.weight_decay, info.bias.weight_decay) == (0.1, 0.0)
    assert other.request_id.endswith("-step-2") and other.run_id != opt.run_id
    _compute(head, torch.Generator().manual_seed(30))
    other.step()
    assert other.last_step.applied and not other.last_step.replayed
    with pytest.raises(ValueError, match="sgd"):
        head.optimizer("sgd", lr=0.1, replace=True).load_state_dict(sd)


def test_an_earlier_state_loaded_into_the_same_optimizer_never_replays_a_step(client):
    """Step request ids are "<run_id>-step-<k>": loading an earlier state_dict into the
    optimizer that took later steps must not send an id the server has seen (it would
    answer with that old step's outcome and apply nothing)."""
    head, _ = _head(client)
    opt = head.optimizer("sgd", lr=0.1, run_id="same")
    sd = opt.state_dict()
    for k in range(2):
        _compute(head, torch.Generator().manual_seed(40 + k))
        opt.step()
    opt.load_state_dict(sd)
    assert opt.request_id == "same-step-2"
    _compute(head, torch.Generator().manual_seed(42))
    opt.step()
    assert opt.last_step.applied and not opt.last_step.replayed and opt.last_step.steps == 3


# ---------------------------------------------------------------- download --

def test_download_head_assembles_pieces_and_gives_a_16_bit_heads_master(client):
    head, lin = _head(client)
    got = client.download_head(head.head_id, chunk_rows=7)
    assert torch.equal(got.weight, lin.weight.detach()) and torch.equal(got.bias,
                                                                        lin.bias.detach())
    assert got.header.head.head_id == head.head_id and got.header.dtype == flce.DType.FP32
    half, hlin = _head(client, dtype=torch.bfloat16, seed=4)
    served = client.download_head(half.head_id)
    assert served.weight.dtype == torch.bfloat16
    assert torch.equal(served.weight, hlin.weight.detach().to(torch.bfloat16))
    opt = half.optimizer("sgd", lr=1e-3)
    _compute(half, torch.Generator().manual_seed(31))
    opt.step()
    master = client.download_head(half.head_id, master=True)
    assert master.weight.dtype == torch.float32 and master.header.dtype == flce.DType.FP32
    now = client.download_head(half.head_id)
    assert torch.equal(now.weight, master.weight.to(torch.bfloat16))  # served = master rounded
    assert not torch.equal(master.weight, master.weight.to(torch.bfloat16).float()), \
        "a small step on a bf16 head must live on in its fp32 master"
    back = nn.Linear(H, V).to(torch.bfloat16)
    half.copy_to(back)
    assert torch.equal(back.weight, master.weight.to(torch.bfloat16))


def _tampered_download(client, monkeypatch, edit):
    real = client._download

    def stream(request, timeout=None):
        yield from edit(list(real(request, timeout=timeout)))

    monkeypatch.setattr(client, "_download", stream)


@pytest.mark.parametrize("edit,message", [
    (lambda msgs: msgs[:2] + [msgs[1]] + msgs[3:], "arrived twice"),  # a duplicate for one
    (lambda msgs: msgs[:2] + msgs[3:], "rows received"),  # one piece missing
], ids=["duplicate", "missing"])
def test_download_refuses_duplicate_and_missing_rows(client, monkeypatch, edit, message):
    head, _ = _head(client)
    _tampered_download(client, monkeypatch, edit)
    with pytest.raises(flce.FlceError) as info:
        client.download_head(head.head_id, chunk_rows=10)
    assert info.value.code == grpc.StatusCode.INTERNAL and message in info.value.details


def test_download_chunk_ids_are_the_wire_constant():
    assert pb.DownloadHeadResponse.DESCRIPTOR.fields_by_name["chunk"].number == \
        wire.DOWNLOAD_RESPONSE_CHUNK
