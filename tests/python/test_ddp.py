"""Data-parallel training with the head on the server: 2 gloo ranks under
DistributedDataParallel, each computing its half of every batch into ONE shared session,
equal 1 rank computing the whole batch (the same script runs on every rank).

The model keeps the local lm_head it uploaded (for its checkpoint) beside the
RemoteLMHead, as a training script would: DDP must be told to ignore it
(flce.ignore_in_ddp), since the loss never uses it. With a tied embedding
(flce.RemoteEmbedding: the input embedding is the head's weight, on the server) every rank
adds its embedding gradient into the shared session too. Real server only."""
from __future__ import annotations

import datetime
import uuid
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import flce
from conftest import RealServer, free_port

V, H, B, T = 61, 16, 4, 6  # B sequences per rank and step
STEPS = 3
MAX_NORM = 0.1
LR = 0.2


class TinyLM(nn.Module):
    def __init__(self, head: flce.RemoteLMHead, tied: bool = False):
        super().__init__()
        self.tok = flce.RemoteEmbedding(head) if tied else nn.Embedding(V, H)
        self.body = nn.Linear(H, H)
        self.lm_head = nn.Linear(H, V)  # where the served head came from; unused in forward
        self.head = head

    def forward(self, x, y):
        return self.head(torch.tanh(self.body(self.tok(x))), y)


def _batch(step: int):
    """The whole batch of a step: 2B sequences (each rank takes B of them)."""
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randint(0, V, (2 * B, T), generator=g), torch.randint(0, V, (2 * B, T),
                                                                         generator=g)


def train(rank: int, world: int, target: str, head_id: str, session_id: str,
          tied: bool = False) -> dict:
    """One rank's training, the same code for 1 or 2 ranks."""
    torch.manual_seed(0)
    head = flce.RemoteLMHead(flce.Client(target, timeout=60), head_id, session_id=session_id)
    model = TinyLM(head, tied)
    if rank == 0:
        head.load_from_module(model.lm_head)
    if world > 1:
        dist.barrier()  # the head is there before any rank computes
        flce.ignore_in_ddp(model, model.lm_head)
        wrapped = nn.parallel.DistributedDataParallel(model)
    else:
        wrapped = model
    local = [p for n, p in model.named_parameters() if not n.startswith("lm_head.")]
    body_opt = torch.optim.SGD(local, lr=LR, momentum=0.9)
    head_opt = head.optimizer("sgd", lr=LR, momentum=0.9, run_id=f"{head_id}-run")
    losses, norms = [], []
    for step in range(STEPS):
        x, y = _batch(step)
        rows = slice(rank * B, (rank + 1) * B) if world > 1 else slice(None)
        loss = wrapped(x[rows], y[rows])
        loss.backward()
        norms.append(float(flce.clip_grad_norm_(local, head_opt, MAX_NORM)))
        body_opt.step()
        head_opt.step()
        body_opt.zero_grad()
        head_opt.zero_grad()
        losses.append(float(loss))
    out = dict(losses=losses, norms=norms, grad_multiplier=head_opt.grad_multiplier,
               steps=head_opt.steps, last_step=head_opt.last_step,
               body={n: p.detach().clone() for n, p in model.named_parameters()})
    if rank == 0:
        out["head"] = head.download()
        out["info"] = head.info()
    head.client.close()
    return out


def _rank_main(rank: int, world: int, port: int, target: str, head_id: str, session_id: str,
               out_dir: str, tied: bool):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=120))
    try:
        torch.save(train(rank, world, target, head_id, session_id, tied),
                   Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def target(real_server_bin):
    srv = RealServer(real_server_bin)
    yield srv.target
    srv.stop()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_two_ranks_sharing_a_session_equal_one_rank_with_the_whole_batch(target, tmp_path,
                                                                          tied):
    one = train(0, 1, target, f"ddp1-{uuid.uuid4().hex[:6]}", "one", tied)
    head_id = f"ddp2-{uuid.uuid4().hex[:6]}"
    mp.spawn(_rank_main, args=(2, free_port(), target, head_id, "shared", str(tmp_path), tied),
             nprocs=2, join=True)
    # The ranks' own files, holding flce result objects: not weights only.
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]

    assert one["grad_multiplier"] == 1.0
    assert [r["grad_multiplier"] for r in ranks] == [0.5, 0.5]
    assert all(n > MAX_NORM for n in one["norms"]), "the test must clip to test clipping"
    # rank 0 alone stepped, once per step; every rank got its outcome
    assert ranks[0]["info"].optimizer.steps == STEPS
    assert all(r["steps"] == STEPS and r["last_step"] == ranks[0]["last_step"] for r in ranks)
    for r in ranks:  # every rank saw the same (global) norm
        assert r["norms"] == pytest.approx(one["norms"], rel=1e-5)
    for k in range(STEPS):  # equal tokens per rank: the mean of the halves' means
        assert (ranks[0]["losses"][k] + ranks[1]["losses"][k]) / 2 == \
            pytest.approx(one["losses"][k], rel=1e-5)

    w2, w1 = ranks[0]["head"], one["head"]
    assert w2.header.head.version == w1.header.head.version
    assert _rel(w2.weight, w1.weight) <= 1e-5 and _rel(w2.bias, w1.bias) <= 1e-5
    for name, p in one["body"].items():
        for r in ranks:
            assert _rel(r["body"][name], p) <= 1e-5, name
    assert _rel(one["head"].weight, one["body"]["lm_head.weight"]) > 1e-3, \
        "the head did not train"
    assert torch.equal(ranks[0]["body"]["lm_head.weight"], one["body"]["lm_head.weight"]), \
        "the ignored local lm_head stays as it was"


def test_ignore_in_ddp_names_the_parameters():
    model = TinyLM(flce.RemoteLMHead(flce.Client("127.0.0.1:1"), "unused"))
    assert flce.ignore_in_ddp(model, model.lm_head) == ["lm_head.weight", "lm_head.bias"]
    assert flce.ignore_in_ddp(model, model.body.weight) == ["lm_head.weight", "lm_head.bias",
                                                           "body.weight"]
    assert model._ddp_params_and_buffers_to_ignore == ["lm_head.weight", "lm_head.bias",
                                                       "body.weight"]
    with pytest.raises(ValueError, match="none of these"):
        flce.ignore_in_ddp(model, nn.Linear(2, 2))
