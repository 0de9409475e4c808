"""Retries and late failures: a reset fetch carries a request id, a fused forward whose
Compute fails after the server staged its grad_W discards it, and the fields the client
always puts on the wire (ComputeHeader.hidden_size, CommitRequest.scale)."""
from __future__ import annotations

import uuid

import grpc
import pytest
import torch
from torch import nn

import flce
from conftest import RpcError
from flce import wire
from flce._pb import pb

V, H, N = 37, 16, 20



def _head(client, bias=False):
    g = torch.Generator().manual_seed(1)
    lin = nn.Linear(H, V, bias=bias)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(V, H, generator=g))
    head = flce.RemoteLMHead(client, f"r-{uuid.uuid4().hex[:8]}",
                             session_id=f"s-{uuid.uuid4().hex[:8]}")
    head.load_from_module(lin, dtype=torch.float32)
    x = torch.randn(N, H, generator=g, requires_grad=True)
    y = torch.randint(0, V, (N,), generator=g)
    return head, x, y


def _pending(head) -> int:
    return sum(s.pending for s in head.client.sessions(head.head_id)
               if s.session_id == head.session_id)


# ------------------------------------------------------- reset fetch retries --

def test_reset_fetch_generates_a_request_id_and_a_retry_replays(client):
    head, x, y = _head(client, bias=True)
    head(x, y).backward()
    first = head.fetch_grad(reset=True)
    assert first.request_id, "a reset without an id must get a generated one"
    assert first.header.contributions == 1 and first.weight.abs().sum() > 0
    again = head.fetch_grad(reset=True, request_id=first.request_id)
    assert again.request_id == first.request_id and again.header.replayed
    assert torch.equal(again.weight, first.weight) and torch.equal(again.bias, first.bias)
    other = head.fetch_grad(reset=True)  # a new id: the (now empty) accumulator
    assert other.request_id != first.request_id and not other.header.replayed
    assert other.header.contributions == 0 and other.weight.abs().sum() == 0
    assert head.fetch_grad().request_id == ""  # no reset: nothing to make idempotent


def test_reset_fetch_whose_answer_is_lost_is_retried_with_the_errors_request_id(
        client, monkeypatch):
    head, x, y = _head(client)
    head(x, y).backward()
    sent = []
    real_fetch = client._fetch

    def lose_the_answer(request, timeout=None):
        sent.append(request)
        list(real_fetch(request, timeout=timeout))  # the server resets the accumulator...
        raise RpcError(grpc.StatusCode.UNAVAILABLE, "connection reset")  # ...we never see it

    monkeypatch.setattr(client, "_fetch", lose_the_answer)
    with pytest.raises(flce.FlceError) as info:
        head.fetch_grad(reset=True)
    monkeypatch.undo()
    err = info.value
    assert err.code == grpc.StatusCode.UNAVAILABLE and err.method == "FetchGrad"
    assert sent[0].reset and sent[0].request_id and err.request_id == sent[0].request_id
    retried = head.fetch_grad(reset=True, request_id=err.request_id)
    assert retried.header.replayed and retried.header.contributions == 1
    assert retried.weight.abs().sum() > 0  # the gradient the lost answer carried


# ------------------------------------------------ late failure of a fused call --

def _fail_after_summary(client, monkeypatch, code=grpc.StatusCode.DEADLINE_EXCEEDED):
    """Makes Compute raise once the server's summary (the contribution staged) arrived."""
    real_compute = client._compute

    def late_failure(requests, timeout=None):
        for msg in real_compute(requests, timeout=timeout):
            if not isinstance(msg, wire.GradInputView) and msg.WhichOneof("msg") == "summary":
                assert msg.summary.staged
                raise RpcError(code, "Deadline Exceeded")
            yield msg

    monkeypatch.setattr(client, "_compute", late_failure)


def _spy_commits(client, monkeypatch, fail=False):
    calls = []
    real_commit = client.commit

    def commit(head_id, request_id, scale=1.0, **kw):
        calls.append(dict(head_id=head_id, request_id=request_id, scale=scale, **kw))
        if fail:
            raise flce.FlceError("Commit", grpc.StatusCode.UNAVAILABLE, "server gone")
        return real_commit(head_id, request_id, scale, **kw)

    monkeypatch.setattr(client, "commit", commit)
    return calls


def test_fused_forward_failing_after_staging_discards_the_contribution(client, monkeypatch):
    head, x, y = _head(client)
    _fail_after_summary(client, monkeypatch)
    commits = _spy_commits(client, monkeypatch)
    for _ in range(3):  # more than --max-pending (2): none of them may hold a slot
        with pytest.raises(flce.FlceError) as info:
            head(x, y)
        assert info.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        assert info.value.method == "Compute"
    assert len(commits) == 3 and all(c["discard"] for c in commits)
    assert len({c["request_id"] for c in commits}) == 3
    assert all(c["timeout"] <= flce.autograd.DISCARD_TIMEOUT_S for c in commits)
    assert _pending(head) == 0
    monkeypatch.undo()
    head(x, y).backward()  # the session still takes deferred calls
    assert x.grad is not None
    assert head.fetch_grad().header.contributions == 1


def test_failing_discard_never_masks_the_compute_error(client, monkeypatch):
    head, x, y = _head(client)
    _fail_after_summary(client, monkeypatch, grpc.StatusCode.UNAVAILABLE)
    commits = _spy_commits(client, monkeypatch, fail=True)
    with pytest.raises(flce.FlceError) as info:
        head(x, y)
    assert info.value.code == grpc.StatusCode.UNAVAILABLE and info.value.method == "Compute"
    assert len(commits) == 1 and commits[0]["discard"]
    monkeypatch.undo()
    client.commit(head.head_id, commits[0]["request_id"], discard=True,
                  session_id=head.session_id)  # clean up what the failed discard left
    assert _pending(head) == 0


def test_discard_of_nothing_staged_is_quiet(client, monkeypatch):
    """A call refused before anything was staged: the discard gets NOT_FOUND, ignored."""
    head, x, y = _head(client)
    commits = _spy_commits(client, monkeypatch)
    bad = y.clone()
    bad[0] = V + 5  # outside [0, V): INVALID_ARGUMENT before any gradient
    with pytest.raises(flce.FlceError) as info:
        head(x, bad)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert len(commits) == 1 and commits[0]["discard"]


# ----------------------------------------------------- fields always on the wire --

def test_compute_header_always_carries_hidden_size(client, monkeypatch):
    head, x, y = _head(client)
    firsts = []
    real_compute = client._compute

    def spy(requests, timeout=None):
        requests = iter(requests)
        first = next(requests)
        firsts.append(first)

        def all_requests():
            yield first
            yield from requests

        return real_compute(all_requests(), timeout=timeout)

    monkeypatch.setattr(client, "_compute", spy)
    head(x, y).backward()
    with torch.no_grad():
        head(x, y)
    assert len(firsts) == 2
    for raw in firsts:
        number, header = wire.split_oneof(raw)
        assert number == wire.COMPUTE_REQUEST_HEADER
        assert wire.parse_fields(header)[wire.COMPUTE_HEADER_HIDDEN_SIZE] == H
        parsed = pb.ComputeRequest.FromString(raw).header
        assert parsed.num_tokens == N and parsed.head_id == head.head_id


def test_commit_always_carries_scale_even_zero(client, monkeypatch):
    head, x, y = _head(client)
    sent = []
    real_commit = client._commit

    class Spy:  # the commit made at once, and the one started in the background
        def __call__(self, raw, timeout=None):
            sent.append(raw)
            return real_commit(raw, timeout=timeout)

        def future(self, raw, timeout=None):
            sent.append(raw)
            return real_commit.future(raw, timeout=timeout)

    monkeypatch.setattr(client, "_commit", Spy())
    (head(x, y) * 0.0).backward()  # grad_output 0: the contribution lands scaled by 0
    (head(x, y) * 1.0).backward()
    scales = [wire.parse_fields(memoryview(raw)).get(wire.COMMIT_REQUEST_SCALE) for raw in sent]
    assert [bytes(s) if s is not None else None for s in scales] == [
        wire.float32_bytes(0.0), wire.float32_bytes(1.0)]
    g = head.fetch_grad(reset=True)
    assert g.header.contributions == 2
    (head(x, y) * 0.0).backward()
    zero = head.fetch_grad()
    assert zero.header.contributions == 1 and zero.weight.abs().sum() == 0, \
        "a scale of 0 must not land as 1"
