"""Checkpoints of a head trained on the server (Client.save_checkpoint / load_checkpoint,
RemoteLMHead's, ServerOptimizer.save_checkpoint and a state_dict naming a checkpoint)
against a real server started with --checkpoint-dir, and a Step without a gradient
through ServerOptimizer.step().

Real server only: the fake server has no optimizer and no checkpoints."""
from __future__ import annotations

import io
import shutil
import tempfile
import uuid
from pathlib import Path

import grpc
import pytest
import torch
from torch import nn

import flce
from conftest import RpcError

V, H, N = 97, 32, 24
SAVE_AT, MORE = 3, 4  # steps before the save, steps after it (then repeated)


class _Server:
    def __init__(self, srv, directory: Path):
        self.srv, self.directory = srv, directory
        self.target = srv.target

    def file(self, name: str) -> Path:
        """Where the server keeps a checkpoint of the anonymous tenant (no auth)."""
        return self.directory / "anonymous" / f"{name}.safetensors"


@pytest.fixture(scope="module")
def server(real_server_bin):
    from conftest import RealServer
    directory = Path(tempfile.mkdtemp(prefix="flce-ckpt-"))
    # two engine threads: the steps below are repeated bit for bit
    srv = RealServer(real_server_bin, "--checkpoint-dir", str(directory), "--threads", "2")
    yield _Server(srv, directory)
    srv.stop()
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def client(server):
    with flce.Client(server.target, timeout=60) as c:
        c.wait_ready(10)
        yield c



def _name(what: str) -> str:
    return f"{what}.{uuid.uuid4().hex[:8]}"


def _head(client, dtype=torch.float32, seed=0, head_id=None):
    """A RemoteLMHead with a bias, of its own (head and session)."""
    g = torch.Generator().manual_seed(seed)
    lin = nn.Linear(H, V)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(V, H, generator=g) * 0.2)
        lin.bias.copy_(torch.randn(V, generator=g) * 0.2)
    head = flce.RemoteLMHead(client, head_id or f"ck-{uuid.uuid4().hex[:8]}",
                             session_id=f"s-{uuid.uuid4().hex[:8]}")
    head.load_from_module(lin, dtype=dtype)
    return head


def _batches(n: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(N, H, generator=gen), torch.randint(0, V, (N,), generator=gen))
            for _ in range(n)]


def _compute(head, batch):
    """One deterministic compute call into the head's session (its grad_W lands there)."""
    x, y = batch
    r = head.client.compute(head.head_id, x, y, session_id=head.session_id,
                            deterministic=True, grad_input=False)
    assert r.summary.committed


def _master(head):
    """The fp32 master weight and bias, and the served ones, with the head's version."""
    master = head.download(master=True)
    served = head.download()
    return (master.weight, master.bias, served.weight, served.bias,
            master.header.head.version)


def _train(head, opt, sched, batches):
    """A step per batch; the weights (master and served) after each."""
    seen = []
    for batch in batches:
        _compute(head, batch)
        opt.step()
        assert opt.last_step.applied, opt.last_step
        sched.step()
        seen.append(_master(head)[:4])
    return seen


def _assert_bitwise(got, want, what):
    assert len(got) == len(want)
    for k, (mine, theirs) in enumerate(zip(got, want)):
        for a, b, t in zip(mine, theirs, ("master weight", "master bias", "weight", "bias")):
            assert a.dtype == b.dtype and torch.equal(a, b), f"{what}: step {k}, {t}"


# ------------------------------------------------------------------ replay --

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_steps_after_a_loaded_checkpoint_repeat_bit_for_bit(client, server, dtype):
    """Train, save, train MORE steps; load the checkpoint (through the optimizer's
    state_dict, which also brings back the learning rates) and repeat the same steps on
    the same data: every weight equal bit for bit, the fp32 master and the served one."""
    head = _head(client, dtype)
    opt = head.optimizer("adamw", lr=2e-2, betas=(0.8, 0.95), weight_decay=0.1,
                         bias_weight_decay=0.0)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    batches = _batches(SAVE_AT + MORE, seed=1)
    _train(head, opt, sched, batches[:SAVE_AT])

    name = _name("replay")
    info = opt.save_checkpoint(name)
    assert isinstance(info, flce.CheckpointInfo)
    assert info.name == name and info.has_optimizer and not info.replayed
    assert info.steps == SAVE_AT and info.head_version == head.info().version
    assert info.bytes == server.file(name).stat().st_size > 0
    sd, sched_sd = opt.state_dict(), sched.state_dict()
    assert sd["flce"]["checkpoint"] == name and sd["flce"]["checkpoint_steps"] == SAVE_AT
    assert sd["flce"]["steps"] == SAVE_AT and sd["flce"]["head_version"] == info.head_version
    saved = _master(head)

    first = _train(head, opt, sched, batches[SAVE_AT:])
    assert not torch.equal(first[-1][0], saved[0])
    lrs = [g["lr"] for g in opt.param_groups]

    opt.load_state_dict(sd)
    sched.load_state_dict(sched_sd)
    loaded = head.info()
    assert loaded.source == f"checkpoint:{name}"
    assert loaded.version > saved[4]  # a new version, never one the head had
    assert loaded.optimizer.steps == SAVE_AT and loaded.optimizer.kind == flce.OptimizerKind.ADAMW
    assert opt.steps == SAVE_AT and opt.head_version == loaded.version
    assert opt.checkpoint == name
    assert [g["lr"] for g in opt.param_groups] == [g["lr"] for g in sd["param_groups"]]
    assert [g["lr"] for g in opt.param_groups] != lrs
    _assert_bitwise([_master(head)[:4]], [saved[:4]], "right after the load")

    again = _train(head, opt, sched, batches[SAVE_AT:])
    _assert_bitwise(again, first, "the repeated steps")
    assert head.info().optimizer.steps == SAVE_AT + MORE


def test_state_dict_round_trips_through_a_checkpoint_into_a_fresh_optimizer(client, server):
    head = _head(client, torch.bfloat16, seed=2)
    opt = head.optimizer("adamw", lr=1e-2, betas=(0.85, 0.99), eps=1e-6, weight_decay=0.05,
                         amsgrad=True, bias_weight_decay=0.0, run_id="first")
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)
    batches = _batches(4, seed=3)
    _train(head, opt, sched, batches[:2])
    name = _name("round-trip")
    opt.save_checkpoint(name)
    sd, sched_sd = opt.state_dict(), sched.state_dict()
    assert sd["state"] == {}  # the moments never travel
    saved = _master(head)
    first = _train(head, opt, sched, batches[2:])
    late = opt.state_dict()  # taken 2 steps after its checkpoint
    assert late["flce"]["checkpoint"] == name and late["flce"]["steps"] == 4

    # a fresh optimizer with other hyper-parameters and learning rate (its state replaces
    # the head's: moments from zero, step 0)
    fresh = head.optimizer("adamw", lr=1.0, weight_decay=0.3, replace=True, run_id="second")
    assert fresh.checkpoint is None and fresh.state_dict()["flce"]["checkpoint"] is None
    version = head.info().version
    with pytest.raises(ValueError, match="2 steps after checkpoint"):
        fresh.load_state_dict(late)  # refused before anything is loaded
    assert head.info().version == version and head.info().optimizer.steps == 0
    assert [g["lr"] for g in fresh.param_groups] == [1.0, 1.0]

    fresh.load_state_dict(sd)
    sched2 = torch.optim.lr_scheduler.StepLR(fresh, step_size=1, gamma=0.7)
    sched2.load_state_dict(sched_sd)
    for mine, theirs in zip(fresh.param_groups, sd["param_groups"]):
        for key in ("lr", "betas", "eps", "weight_decay", "amsgrad"):
            assert (tuple(mine[key]) if key == "betas" else mine[key]) == \
                (tuple(theirs[key]) if key == "betas" else theirs[key]), key
    assert [g["weight_decay"] for g in fresh.param_groups] == [0.05, 0.0]
    server_state = head.info().optimizer  # the checkpoint's, as saved
    assert server_state.steps == 2 and server_state.weight.amsgrad
    assert (server_state.weight.beta1, server_state.weight.eps) == (0.85, 1e-6)
    assert (server_state.weight.weight_decay, server_state.bias.weight_decay) == (0.05, 0.0)
    assert fresh.steps == 2 and fresh.head_version == head.info().version > saved[4]
    assert fresh.run_id == "second" and fresh.request_id == "second-step-2"
    again_sd = fresh.state_dict()["flce"]
    assert (again_sd["checkpoint"], again_sd["checkpoint_steps"], again_sd["steps"]) == \
        (name, 2, 2)
    _assert_bitwise([_master(head)[:4]], [saved[:4]], "right after the load")
    _assert_bitwise(_train(head, fresh, sched2, batches[2:]), first, "the fresh optimizer")

    # another kind's optimizer refuses the state before loading anything
    sgd = head.optimizer("sgd", lr=0.1, replace=True)
    with pytest.raises(ValueError, match="adamw optimizer, not sgd"):
        sgd.load_state_dict(sd)
    assert head.info().optimizer.kind == flce.OptimizerKind.SGD


def test_a_checkpoint_loads_into_another_head_and_the_heads_optimizer_follows(client):
    """A checkpoint belongs to the caller, not to one head id: loaded under a new id (as
    after a restart, where the head is gone) it brings the optimizer state along.
    RemoteLMHead.save_checkpoint / load_checkpoint keep the head's optimizer in step."""
    head = _head(client, torch.float32, seed=4)
    opt = head.optimizer("sgd", lr=0.1, momentum=0.9, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10)
    batches = _batches(2, seed=5)
    _train(head, opt, sched, batches[:1])
    name = _name("moved")
    info = head.save_checkpoint(name)  # through the head: its optimizer records it
    assert info.steps == 1 and opt.checkpoint == name and opt.checkpoint_steps == 1
    sd = opt.state_dict()
    assert sd["flce"]["checkpoint"] == name
    saved = _master(head)

    other = flce.RemoteLMHead(client, f"ck-{uuid.uuid4().hex[:8]}",
                              session_id=f"s-{uuid.uuid4().hex[:8]}")
    got = other.load_checkpoint(name)  # a new head: no reset_optimizer needed
    assert isinstance(got, flce.HeadInfo) and got.head_id == other.head_id
    assert got.source == f"checkpoint:{name}" and got.has_bias
    assert got.optimizer.kind == flce.OptimizerKind.SGD and got.optimizer.steps == 1
    assert got.optimizer.weight.momentum == 0.9
    assert got.version >= info.head_version
    _assert_bitwise([_master(other)[:4]], [saved[:4]], "the other head")

    # the same step on both heads from the same state (momentum buffer included): the
    # same weights; the other head's optimizer is a new one, given the state_dict
    want = _train(head, opt, sched, batches[1:])
    opt2 = other.optimizer("sgd", lr=0.1, momentum=0.9, weight_decay=0.01, replace=True)
    opt2.load_state_dict(sd)
    assert opt2.steps == 1 and opt2.checkpoint == name
    got_steps = _train(other, opt2, torch.optim.lr_scheduler.StepLR(opt2, 10), batches[1:])
    _assert_bitwise(got_steps, want, "the other head's step")

    # a load through the head needs reset_optimizer over a head with state; the head's
    # optimizer then follows the loaded state
    with pytest.raises(flce.FlceError) as kept:
        head.load_checkpoint(name)
    assert kept.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "reset_optimizer" in kept.value.details and kept.value.request_id
    back = head.load_checkpoint(name, reset_optimizer=True)
    assert back.optimizer.steps == 1
    assert (opt.steps, opt.head_version, opt.checkpoint) == (1, back.version, name)


def test_a_run_resumes_on_a_restarted_server_as_the_readme_says(client, server,
                                                               real_server_bin):
    """client/python/README.md's recipe: the optimizer's state_dict (torch.save'd) names
    the checkpoint; a new server on the same --checkpoint-dir (the first one "restarted")
    has no head; load it, make the optimizer, load the state: the steps after the save
    are repeated bit for bit there."""
    from conftest import RealServer
    head = _head(client, torch.bfloat16, seed=14)
    opt = head.optimizer("adamw", lr=1e-2, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.8)
    batches = _batches(4, seed=15)
    _train(head, opt, sched, batches[:2])
    opt.save_checkpoint(_name("restart"))
    path = io.BytesIO()
    torch.save({"opt": opt.state_dict(), "sched": sched.state_dict()}, path)
    first = _train(head, opt, sched, batches[2:])

    srv = RealServer(real_server_bin, "--checkpoint-dir", str(server.directory),
                     "--threads", "2")
    try:
        with flce.Client(srv.target, timeout=60) as fresh:
            fresh.wait_ready(10)
            assert head.head_id not in [h.head_id for h in fresh.heads()]
            head = flce.RemoteLMHead(fresh, head.head_id, session_id=head.session_id)
            path.seek(0)
            state = torch.load(path)
            head.load_checkpoint(state["opt"]["flce"]["checkpoint"])
            opt = head.optimizer("adamw", lr=1e-2, weight_decay=0.1, replace=True)
            opt.load_state_dict(state["opt"])
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.8)
            sched.load_state_dict(state["sched"])
            assert opt.steps == 2 and head.info().optimizer.steps == 2
            _assert_bitwise(_train(head, opt, sched, batches[2:]), first,
                            "on the restarted server")
    finally:
        srv.stop()


# ------------------------------------------------------------------ retries --

def test_a_repeated_save_is_replayed_and_needs_no_overwrite(client, server, monkeypatch):
    head = _head(client, seed=6)
    opt = head.optimizer("adamw", lr=1e-2, run_id="rep")
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10)
    batches = _batches(3, seed=7)
    _train(head, opt, sched, batches[:1])
    name = _name("repeat")
    first = client.save_checkpoint(head.head_id, name, request_id="save-1")
    stat = server.file(name).stat()
    _train(head, opt, sched, batches[1:2])  # the head moves on; the repeat writes nothing
    again = client.save_checkpoint(head.head_id, name, request_id="save-1")
    assert again.replayed and not first.replayed
    assert (again.name, again.bytes, again.head_version, again.steps, again.has_optimizer) == \
        (first.name, first.bytes, first.head_version, first.steps, first.has_optimizer)
    now = server.file(name).stat()
    assert (now.st_mtime_ns, now.st_size, now.st_ino) == \
        (stat.st_mtime_ns, stat.st_size, stat.st_ino)

    # a save whose answer is lost: the error's request id retries it
    real = client._stub.SaveCheckpoint
    sent = []

    def lossy(request, timeout=None):
        sent.append(request)
        answer = real(request, timeout=timeout)
        if len(sent) == 1:
            raise RpcError(grpc.StatusCode.UNAVAILABLE, "connection reset")
        return answer

    monkeypatch.setattr(client._stub, "SaveCheckpoint", lossy)
    lost = _name("lost")
    with pytest.raises(flce.FlceError) as err:
        client.save_checkpoint(head.head_id, lost)
    assert err.value.code == grpc.StatusCode.UNAVAILABLE
    assert err.value.method == "SaveCheckpoint"
    assert err.value.request_id == sent[0].request_id
    assert server.file(lost).exists()  # it was written
    retried = client.save_checkpoint(head.head_id, lost, request_id=err.value.request_id)
    assert retried.replayed and retried.name == lost

    # the optimizer's save: calling it again after the failure sends the same request
    sent.clear()
    mine = _name("opt-lost")
    with pytest.raises(flce.FlceError):
        opt.save_checkpoint(mine)
    assert opt.checkpoint != mine
    info = opt.save_checkpoint(mine)
    assert info.replayed and opt.checkpoint == mine and opt.checkpoint_steps == 2
    assert [r.request_id for r in sent] == ["rep-save-0", "rep-save-0"]
    nxt = _name("next")
    assert not opt.save_checkpoint(nxt).replayed  # a new save, a new request id
    assert sent[-1].request_id == "rep-save-1"
    # after a failure, a save of another name is a new save (the failed one may have
    # reached the server: its request id is not reused for another name)
    sent.clear()
    with pytest.raises(flce.FlceError):
        opt.save_checkpoint(_name("given-up"))
    other = _name("other")
    info = opt.save_checkpoint(other)
    assert not info.replayed and info.name == other and server.file(other).exists()
    assert [r.request_id for r in sent] == ["rep-save-2", "rep-save-3"]
    assert opt.checkpoint == other


# ---------------------------------------------------------------- refusals --

def test_a_save_without_overwrite_of_an_existing_name_is_already_exists(client, server):
    head = _head(client, seed=8)
    opt = head.optimizer("sgd", lr=0.1)
    name = _name("taken")
    first = opt.save_checkpoint(name)
    assert first.steps == 0 and first.has_optimizer
    stat = server.file(name).stat()
    _train(head, opt, torch.optim.lr_scheduler.StepLR(opt, 10), _batches(1, seed=9))
    for save in (lambda: client.save_checkpoint(head.head_id, name),
                 lambda: head.save_checkpoint(name),
                 lambda: opt.save_checkpoint(name)):
        with pytest.raises(flce.FlceError) as info:
            save()
        assert info.value.code == grpc.StatusCode.ALREADY_EXISTS
        assert "overwrite" in info.value.details and info.value.request_id
    assert server.file(name).stat().st_mtime_ns == stat.st_mtime_ns
    assert opt.checkpoint_steps == 0  # the refused saves recorded nothing
    over = opt.save_checkpoint(name, overwrite=True)
    assert over.steps == 1 and not over.replayed and opt.checkpoint_steps == 1
    with pytest.raises(flce.FlceError) as bad:
        client.save_checkpoint(head.head_id, "../escape")
    assert bad.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_a_load_of_a_missing_name_is_not_found_and_changes_nothing(client):
    head = _head(client, seed=10)
    opt = head.optimizer("adamw", lr=1e-2)
    before = head.info()
    for load in (lambda: client.load_checkpoint(head.head_id, "missing", reset_optimizer=True),
                 lambda: head.load_checkpoint("missing", reset_optimizer=True)):
        with pytest.raises(flce.FlceError) as info:
            load()
        assert info.value.code == grpc.StatusCode.NOT_FOUND
        assert info.value.method == "LoadCheckpoint" and info.value.request_id
        assert 'checkpoint "missing" does not exist' in info.value.details
    sd = opt.state_dict()
    sd["flce"]["checkpoint"] = "missing"
    sd["param_groups"][0]["lr"] = 0.5
    with pytest.raises(flce.FlceError) as info:
        opt.load_state_dict(sd)
    assert info.value.code == grpc.StatusCode.NOT_FOUND
    assert opt.param_groups[0]["lr"] == 1e-2 and opt.checkpoint is None
    assert head.info() == before


def test_a_server_without_a_checkpoint_dir_refuses_checkpoints(client, real_server_bin):
    from conftest import RealServer
    assert "checkpoint" in client.server_info().capabilities
    srv = RealServer(real_server_bin)
    try:
        with flce.Client(srv.target, timeout=60) as plain:
            plain.wait_ready(10)
            caps = plain.server_info().capabilities
            assert "checkpoint" not in caps and "optimizer" in caps
            head = _head(plain, seed=11)
            opt = head.optimizer("sgd", lr=0.1)
            for call in (lambda: plain.save_checkpoint(head.head_id, "c"),
                         lambda: head.save_checkpoint("c"),
                         lambda: opt.save_checkpoint("c"),
                         lambda: plain.load_checkpoint(head.head_id, "c",
                                                       reset_optimizer=True)):
                with pytest.raises(flce.FlceError) as info:
                    call()
                assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION
                assert "--checkpoint-dir" in info.value.details
            assert opt.checkpoint is None
    finally:
        srv.stop()


# ------------------------------------------------------------ no gradient --

def test_a_step_without_a_gradient_is_skipped_through_the_server_optimizer(client):
    head = _head(client, seed=12)
    opt = head.optimizer("adamw", lr=1e-2, weight_decay=0.5)
    before = _master(head)
    opt.step()  # the session was never created
    step = opt.last_step
    assert step.outcome == flce.StepOutcome.SKIPPED_NO_GRADIENT and not step.applied
    assert (step.head_version, step.steps, step.contributions) == (before[4], 0, 0)
    _compute(head, _batches(1, seed=13)[0])
    opt.zero_grad()
    opt.step()  # zeroed: no contribution left
    assert opt.last_step.outcome == flce.StepOutcome.SKIPPED_NO_GRADIENT
    assert opt.request_id.endswith("-step-2") and opt.steps == 0
    after = _master(head)
    _assert_bitwise([after[:4]], [before[:4]], "skipped steps")
    assert after[4] == before[4] and head.info().optimizer.steps == 0
