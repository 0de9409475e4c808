"""Tied embeddings on the server (flce.RemoteEmbedding, Client.embed / embed_grad): a tiny
model whose input embedding is its LM head's weight, computed and trained with the head,
the embedding and the optimizer on the server, against the same model in torch with
nn.Embedding's weight tied to lm_head (lm_head.weight = emb.weight).

Real server only: the fake server has no Embed / EmbedGrad."""
from __future__ import annotations

import uuid

import grpc
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import conftest
import flce
from flce import wire
from flce._pb import pb

V, H, B, T = 131, 24, 4, 12
PAD = 5            # the padding id: its rows get no embedding gradient
STEPS = 20
# the CUDA engine's passes contract multiply-adds (FMA) and sum in another order
DEVICE = getattr(conftest, "SERVER_DEVICE", "cpu")
LOSS_TOL = 1e-6 if DEVICE == "cpu" else 1e-5
GRAD_TOL = 1e-5 if DEVICE == "cpu" else 1e-4


@pytest.fixture
def client(real_client):  # the real server only
    return real_client


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _ids() -> str:
    return f"tied-{uuid.uuid4().hex[:8]}"


def _contributions(client: flce.Client, head: flce.RemoteLMHead) -> int:
    """The session's committed contributions (0 for a session the server does not have)."""
    return sum(s.contributions for s in client.sessions(head.head_id)
               if s.session_id == head.session_id)


class LocalTied(nn.Module):
    """The reference: nn.Embedding tied to a bias-free lm_head, a Linear + tanh body."""

    def __init__(self, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.emb = nn.Embedding(V, H, padding_idx=PAD)
        self.body = nn.Linear(H, H)
        self.lm_head = nn.Linear(H, V, bias=False)
        self.lm_head.weight = self.emb.weight  # tied
        with torch.no_grad():
            self.emb.weight.copy_(torch.randn(V, H, generator=g) * 0.5)
            self.body.weight.copy_(torch.randn(H, H, generator=g) / H ** 0.5)
            self.body.bias.copy_(torch.randn(H, generator=g) * 0.1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.body(self.emb(x)))
        return F.cross_entropy(self.lm_head(h).reshape(-1, V), y.reshape(-1))


class RemoteTied(nn.Module):
    """The same model with the tied weight on the server: RemoteEmbedding + RemoteLMHead on
    one head id, one session."""

    def __init__(self, client: flce.Client, local: LocalTied, padding_idx=PAD):
        super().__init__()
        self.body = nn.Linear(H, H)
        self.body.load_state_dict(local.body.state_dict())
        self.head = flce.RemoteLMHead(client, _ids(), session_id=_ids())
        self.head.load_from_module(local.lm_head, dtype=torch.float32)
        self.embed = flce.RemoteEmbedding(self.head, padding_idx=padding_idx)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.body(self.embed(x))), y)


def _batch(gen: torch.Generator):
    """Sequences with padding (PAD, its targets ignored) and many repeated ids."""
    x = torch.randint(0, V, (B, T), generator=gen)
    x[:, -3:] = PAD
    x[0, :4] = x[1, 0]
    y = (x * 7 + 3) % V  # learnable: a fixed map of the input id
    y[x == PAD] = -100
    return x, y


# ------------------------------------------------------------------- gradients --

def test_tied_model_gives_the_local_tied_models_loss_and_gradients(client):
    """Two micro-batches (loss / 2 each) before any step: the head's total gradient on the
    server (its own plus the embedding's) is the local tied weight's .grad."""
    local = LocalTied()
    remote = RemoteTied(client, local)
    assert list(remote.embed.parameters()) == [] and list(remote.embed.buffers()) == []
    gen = torch.Generator().manual_seed(1)
    for _ in range(2):
        x, y = _batch(gen)
        want, got = local(x, y), remote(x, y)
        assert abs(float(got) - float(want)) <= LOSS_TOL * abs(float(want))
        (want / 2).backward()
        (got / 2).backward()
    assert isinstance(remote.embed.last_header, flce.EmbedHeader)
    assert remote.embed.last_header.dtype is flce.DType.FP32
    summary = remote.embed.last_grad_summary
    assert isinstance(summary, flce.EmbedGradSummary) and summary.committed
    assert summary.rows_applied == int((x != PAD).sum())
    g = remote.head.fetch_grad()
    assert g.header.contributions == 4  # two Compute and two EmbedGrad calls
    assert _rel(g.weight, local.emb.weight.grad) <= GRAD_TOL
    for mine, theirs in zip(remote.body.parameters(), local.body.parameters()):
        assert _rel(mine.grad, theirs.grad) <= GRAD_TOL
    client.unload_head(remote.head.head_id)


@pytest.mark.parametrize("padding_idx", [PAD, PAD - V])
def test_padding_rows_get_no_embedding_gradient(client, padding_idx):
    """The embedding's gradient alone equals nn.Embedding(padding_idx=...)'s; a negative
    padding_idx counts from V, as torch's."""
    local = LocalTied()
    head = flce.RemoteLMHead(client, _ids(), session_id=_ids())
    head.load_from_module(local.lm_head, dtype=torch.float32)
    embed = flce.RemoteEmbedding(head, padding_idx=padding_idx)
    ref = nn.Embedding(V, H, padding_idx=padding_idx)
    with torch.no_grad():
        ref.weight.copy_(local.emb.weight)
    x, _ = _batch(torch.Generator().manual_seed(2))
    rows = embed(x)
    assert torch.equal(rows, ref(x).detach())  # padding rows come back as the head holds them
    upstream = torch.randn(rows.shape, generator=torch.Generator().manual_seed(3))
    (rows * upstream).sum().backward()
    (ref(x) * upstream).sum().backward()
    got = head.fetch_grad_weight()
    assert _rel(got, ref.weight.grad) <= GRAD_TOL
    assert torch.count_nonzero(got[PAD]) == 0
    unseen = torch.ones(V, dtype=torch.bool)
    unseen[x.reshape(-1)] = False
    assert torch.count_nonzero(got[unseen]) == 0
    assert embed.last_grad_summary.rows_applied == int((x != PAD).sum())
    client.unload_head(head.head_id)


def test_no_grad_forward_sends_nothing_and_unused_output_sends_nothing(client):
    local = LocalTied()
    head = flce.RemoteLMHead(client, _ids(), session_id=_ids())
    head.load_from_module(local.lm_head, dtype=torch.float32)
    embed = flce.RemoteEmbedding(head)
    x, _ = _batch(torch.Generator().manual_seed(4))
    with torch.no_grad():
        rows = embed(x)
    assert not rows.requires_grad and rows.shape == (B, T, H)
    assert torch.equal(rows, local.emb.weight.detach()[x])
    rows = embed(x)
    assert rows.requires_grad
    del rows  # the graph dies without a backward: nothing was staged, nothing to drop
    assert _contributions(client, head) == 0
    client.unload_head(head.head_id)


# -------------------------------------------------------------------- training --

@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_training_on_the_server_follows_torch_optim(client, kind):
    """20 steps: the head, its embedding and the optimizer on the server, the body local,
    against torch.optim over the local tied model. Losses and the downloaded head weight
    agree to 1e-5 for 5 steps, and to 1 % (smoothed over 5 steps) after."""
    hyper = (dict(lr=2e-2, weight_decay=0.01) if kind == "adamw"
             else dict(lr=0.3, momentum=0.9, weight_decay=1e-3))
    local = LocalTied()
    remote = RemoteTied(client, local)
    local_opt = (torch.optim.AdamW if kind == "adamw" else torch.optim.SGD)(
        local.parameters(), **hyper)
    body_opt = (torch.optim.AdamW if kind == "adamw" else torch.optim.SGD)(
        remote.body.parameters(), **hyper)
    head_opt = remote.head.optimizer(kind, **hyper)
    gen = torch.Generator().manual_seed(5)
    losses, weights = [], []
    for step in range(STEPS):
        x, y = _batch(gen)
        want, got = local(x, y), remote(x, y)
        for opt in (local_opt, body_opt, head_opt):
            opt.zero_grad()
        want.backward()
        got.backward()
        local_opt.step()
        body_opt.step()
        head_opt.step()
        assert head_opt.last_step.applied and head_opt.last_step.contributions == 2
        losses.append((float(want), float(got)))
        weights.append(_rel(remote.head.download().weight, local.emb.weight.detach()))
    early = [abs(g - w) / abs(w) for w, g in losses[:5]]
    assert max(early) <= 1e-5, early
    assert max(weights[:5]) <= 1e-5, weights
    smooth = torch.tensor(losses, dtype=torch.float64).unfold(0, 5, 1).mean(-1)
    assert float(((smooth[:, 1] - smooth[:, 0]).abs() / smooth[:, 0]).max()) <= 1e-2
    assert max(weights) <= 1e-2, weights
    assert float(smooth[-1, 1]) < 0.9 * float(smooth[0, 1])  # it trained
    assert remote.head.info().optimizer.steps == STEPS
    client.unload_head(remote.head.head_id)


def test_an_embedding_gradient_that_is_not_finite_skips_the_step(client):
    """An overflow (an fp16 GradScaler's) is not sent: nothing lands, and the head's next
    server step is skipped as found_inf, as torch's would be."""
    local = LocalTied()
    remote = RemoteTied(client, local)
    opt = remote.head.optimizer("sgd", lr=0.1)
    x, y = _batch(torch.Generator().manual_seed(6))
    rows = remote.embed(x)
    (rows * float("inf")).sum().backward()
    assert remote.embed.found_inf and remote.embed.last_grad_summary is None
    assert _contributions(client, remote.head) == 0
    version = remote.head.info().version
    opt.step()
    assert opt.last_step.outcome == flce.StepOutcome.SKIPPED_FOUND_INF
    assert not remote.embed.found_inf
    assert remote.head.info().version == version
    # and the next finite step applies
    remote(x, y).backward()
    opt.step()
    assert opt.last_step.applied and not remote.embed.found_inf
    # untied from a RemoteLMHead, the flag is the module's own, for the caller to clear
    free = flce.RemoteEmbedding((client, remote.head.head_id), session_id=_ids())
    (free(x) * float("nan")).sum().backward()
    assert free.found_inf
    free.found_inf = False
    assert not free.found_inf
    client.unload_head(remote.head.head_id)


def test_ddp_wraps_a_tied_model(client, tmp_path):
    """RemoteEmbedding and RemoteLMHead have no parameters: DistributedDataParallel wraps
    the model as it is (no unused parameter, nothing to ignore)."""
    import torch.distributed as dist
    local = LocalTied()
    remote = RemoteTied(client, local)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        ddp = nn.parallel.DistributedDataParallel(remote)
        opt = remote.head.optimizer("sgd", lr=0.1, distributed=False)
        gen = torch.Generator().manual_seed(7)
        for _ in range(2):  # DDP's unused-parameter check fires at the second iteration
            x, y = _batch(gen)
            ddp(x, y).backward()
            opt.step()
            assert opt.last_step.applied and opt.last_step.contributions == 2
    finally:
        dist.destroy_process_group()
    client.unload_head(remote.head.head_id)


# ---------------------------------------------------------------- client calls --

def test_deterministic_embed_grad_is_bitwise_repeatable(client):
    local = LocalTied()
    head = flce.RemoteLMHead(client, _ids(), session_id=_ids())
    head.load_from_module(local.lm_head, dtype=torch.float32)
    gen = torch.Generator().manual_seed(8)
    ids = torch.randint(0, 7, (600,), generator=gen)  # each id about 85 times
    rows = torch.randn(600, H, generator=gen)
    grads = []
    for _ in range(2):
        s = client.embed_grad(head.head_id, ids, rows, session_id=head.session_id,
                              deterministic=True)
        assert s.committed and not s.replayed and s.rows_applied == 600
        grads.append(head.fetch_grad(reset=True).weight.clone())
    assert torch.equal(grads[0], grads[1])
    # and through the module
    embed = flce.RemoteEmbedding(head, deterministic=True)
    x = ids.reshape(20, 30)
    for _ in range(2):
        (embed(x) * rows.reshape(20, 30, H)).sum().backward()
        grads.append(head.fetch_grad(reset=True).weight.clone())
    assert torch.equal(grads[2], grads[3])
    assert _rel(grads[2], grads[0]) <= 1e-6
    client.unload_head(head.head_id)


def test_embed_grad_is_retry_safe_and_chunked(real_target):
    """Rows go out in chunk_bytes pieces; a repeated request id is replayed, not applied;
    the same id with other rows is refused."""
    with flce.Client(real_target, timeout=60, chunk_bytes=5 * H * 4 + 7) as client:
        local = LocalTied()
        head = flce.RemoteLMHead(client, _ids(), session_id=_ids())
        head.load_from_module(local.lm_head, dtype=torch.float32)
        gen = torch.Generator().manual_seed(9)
        ids = torch.randint(0, V, (3, 17), generator=gen)  # 51 rows: 11 pieces of 5 or 1
        rows = torch.randn(3, 17, H, generator=gen)
        first = client.embed_grad(head.head_id, ids, rows, session_id=head.session_id,
                                  request_id="eg-1")
        again = client.embed_grad(head.head_id, ids, rows.reshape(51, H),
                                  session_id=head.session_id, request_id="eg-1")
        assert first.committed and not first.replayed
        assert again.replayed and again.head_version == first.head_version
        want = torch.zeros(V, H).index_add_(0, ids.reshape(-1), rows.reshape(51, H))
        g = head.fetch_grad()
        assert g.header.contributions == 1 and _rel(g.weight, want) <= 1e-6
        with pytest.raises(flce.FlceError) as err:
            client.embed_grad(head.head_id, ids, rows * 2, session_id=head.session_id,
                              request_id="eg-1")
        assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.request_id == "eg-1"
        # bf16 rows are accepted too (summed in fp32 on the server)
        client.embed_grad(head.head_id, ids, rows.to(torch.bfloat16),
                          session_id=head.session_id)
        assert head.fetch_grad().header.contributions == 2
        client.unload_head(head.head_id)


def test_embed_rows_dtypes_and_chunks(client):
    local = LocalTied()
    hid = _ids()
    client.upload_head(hid, local.emb.weight.detach(), dtype=torch.bfloat16)
    ids = torch.randint(0, V, (2, 3, 7), generator=torch.Generator().manual_seed(10))
    want = local.emb.weight.detach().to(torch.bfloat16)[ids]
    got = client.embed(hid, ids)  # the head's dtype
    assert got.dtype == torch.bfloat16 and got.shape == (2, 3, 7, H)
    assert torch.equal(got, want)
    wide = client.embed(hid, ids, dtype=torch.float32, chunk_rows=4)
    assert wide.dtype == torch.float32 and torch.equal(wide, want.float())
    embed = flce.RemoteEmbedding((client, hid))  # fp32 by default
    assert torch.equal(embed(ids), want.float())
    assert flce.RemoteEmbedding((client, hid), dtype=None)(ids).dtype == torch.bfloat16
    version = client.describe_head(hid).version
    assert torch.equal(client.embed(hid, ids[0, 0], expected_head_version=version), want[0, 0])
    with pytest.raises(flce.FlceError) as err:
        client.embed(hid, ids, expected_head_version=version + 1)
    assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(flce.FlceError) as err:
        client.embed(hid, ids, dtype=torch.float16)  # neither the head's dtype nor fp32
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert client.embed(hid, torch.zeros(0, dtype=torch.long)).shape == (0, H)
    client.unload_head(hid)


def test_bad_input_is_refused(client):
    local = LocalTied()
    hid, sid = _ids(), _ids()
    client.upload_head(hid, local.emb.weight.detach())
    rows = torch.randn(3, H)
    for bad in ([1, V, 2], [1, -1, 2], [1, 2 ** 40, 2]):
        ids = torch.tensor(bad)
        with pytest.raises(flce.FlceError) as err:
            client.embed(hid, ids)
        assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT, bad
        with pytest.raises(flce.FlceError) as err:
            client.embed_grad(hid, ids, rows, session_id=sid)
        assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT, bad
        assert err.value.request_id  # retry-safe: the id it carried
    with pytest.raises(flce.FlceError) as err:
        client.embed(hid, torch.tensor([1, V]))
    assert f"token id {V} at index 1" in err.value.details
    ok = torch.tensor([1, 2, 3])
    with pytest.raises(flce.FlceError) as err:
        client.embed_grad(hid, ok, torch.tensor([[float("nan")] * H] * 3), session_id=sid)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(flce.FlceError) as err:
        client.embed_grad(hid, ok, rows, session_id=sid, padding_idx=V)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(flce.FlceError) as err:  # nothing to add: the server refuses it
        client.embed_grad(hid, ok[:0], rows[:0], session_id=sid)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    sessions = [s for s in client.sessions(hid) if s.session_id == sid]
    assert not sessions or sessions[0].contributions == 0  # nothing landed
    with pytest.raises(ValueError):
        client.embed_grad(hid, ok, torch.randn(4, H), session_id=sid)
    with pytest.raises(TypeError):
        client.embed(hid, torch.tensor([1.0, 2.0]))
    with pytest.raises(TypeError):
        flce.RemoteEmbedding((client, hid))(torch.tensor([0.5]))
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    with pytest.raises(flce.FlceError) as err:
        client.embed(missing, ok)
    assert err.value.code == grpc.StatusCode.NOT_FOUND
    with pytest.raises(flce.FlceError) as err:
        client.embed_grad(missing, ok, rows, request_id="to-a-missing-head")
    assert err.value.code == grpc.StatusCode.NOT_FOUND
    assert err.value.request_id == "to-a-missing-head"
    with pytest.raises(ValueError):
        head = flce.RemoteLMHead(client, hid, session_id=sid)
        flce.RemoteEmbedding(head, session_id="another")
    client.unload_head(hid)



def test_embed_is_tried_again_after_a_step_aborted_it(client, monkeypatch):
    local = LocalTied()
    hid = _ids()
    client.upload_head(hid, local.emb.weight.detach())
    calls = []
    real = client._embed

    def flaky(req, timeout=None):
        calls.append(req.head_id)
        if len(calls) == 1:
            raise conftest.RpcError(grpc.StatusCode.ABORTED, "head changed during the call")
        return real(req, timeout=timeout)

    monkeypatch.setattr(client, "_embed", flaky)
    ids = torch.tensor([3, 1, 4, 1, 5])
    assert torch.equal(client.embed(hid, ids), local.emb.weight.detach()[ids])
    assert len(calls) == 2
    calls.clear()
    monkeypatch.setattr(client, "_embed", lambda req, timeout=None: (_ for _ in ()).throw(
        conftest.RpcError(grpc.StatusCode.ABORTED, "again")))
    with pytest.raises(flce.FlceError) as err:
        client.embed(hid, ids, retries=1)
    assert err.value.code == grpc.StatusCode.ABORTED
    client.unload_head(hid)


@pytest.mark.parametrize("pieces,message", [
    ([(0, 2), (1, 2)], "arrived twice"),
    ([(0, 2)], "2 of 3 rows received"),
    ([(0, 2), (2, 2)], "lies outside"),
])
def test_embed_checks_the_rows_it_receives(client, monkeypatch, pieces, message):
    """Rows are placed by their offset: a piece twice, a piece missing or outside the
    tensor is the server's fault (INTERNAL), never a silently wrong embedding."""
    header = pb.EmbedResponse(header=pb.EmbedHeader(num_tokens=3, hidden_size=H,
                                                    dtype=pb.DTYPE_FP32, head_version=1))
    # The first bulk call may move the bulk stubs to the server's Unix socket: let
    # that happen before the patch, or it would undo it.
    client._prepare_bulk_call()

    def stream(req, timeout=None):
        yield header
        for offset, n in pieces:
            yield wire.EmbedRowsView(offset, n, memoryview(bytes(n * H * 4)))

    monkeypatch.setattr(client, "_embed", stream)
    with pytest.raises(flce.FlceError) as err:
        client.embed("any", torch.tensor([1, 2, 3]))
    assert err.value.code == grpc.StatusCode.INTERNAL and message in err.value.details


def test_the_client_readme_recipe_trains_a_tied_model(client):
    """client/python/README.md's "Tied embeddings" recipe, run as written."""
    import re
    text = (conftest.REPO / "client" / "python" / "README.md").read_text()
    section = text.split("### Tied embeddings\n", 1)[1].split("\n### ", 1)[0]
    code = re.findall(r"^```python\n(.*?)^```", section, re.S | re.M)[0]

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(V, H)
            self.layer = nn.Linear(H, H)
            self.lm_head = nn.Linear(H, V, bias=False)
            self.lm_head.weight = self.embed_tokens.weight

        def body(self, x):
            return torch.tanh(self.layer(self.embed_tokens(x)))

    torch.manual_seed(0)
    model = Model()
    start = model.lm_head.weight.detach().clone()
    layer = model.layer.weight.detach().clone()
    gen = torch.Generator().manual_seed(11)
    batches = [_batch(gen) for _ in range(3)]
    scope = {"flce": flce, "torch": torch, "client": client, "model": model,
             "batches": batches}
    exec(code.replace('"lm"', f'"{_ids()}"'), scope)
    head = scope["head"]
    assert isinstance(model.embed_tokens, flce.RemoteEmbedding)
    assert scope["opt"].last_step.applied and head.info().optimizer.steps == 3
    assert model.lm_head.weight is not None and not torch.equal(model.lm_head.weight, start)
    assert not torch.equal(model.layer.weight, layer)
    assert all(not n.startswith("embed_tokens.") for n, _ in model.named_parameters())
    client.unload_head(head.head_id)
