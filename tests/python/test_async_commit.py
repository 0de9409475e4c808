"""Background commits (Client(async_commit=True), flce.commit_queue): loss.backward()
returns while its Commit is still on its way, every read of the gradient through the client
waits for it, a failure is raised by the next such read, and the server's --max-pending
does not turn the overlap into refusals."""
from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
import torch

import flce
from conftest import RealServer

V, H, N = 53, 24, 17


def _data(seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(N, H, generator=g), torch.randint(0, V, (N,), generator=g)


def _weight():
    return torch.randn(V, H, generator=torch.Generator().manual_seed(7)) * 0.3


def _head(client: flce.Client, head_id: str) -> flce.RemoteLMHead:
    return flce.RemoteLMHead(client, head_id, session_id=f"s-{uuid.uuid4().hex[:8]}")


class HeldCommits:
    """Holds the client's background commits until release(): what they would look like
    on a slow wire, without timing anything."""

    def __init__(self, client: flce.Client):
        self.gate = threading.Event()
        self.started = threading.Event()
        rpc = client._commit
        pool = ThreadPoolExecutor(1)

        class Held:
            @staticmethod
            def future(payload, timeout=None):
                self.started.set()
                return pool.submit(lambda: (self.gate.wait(30), rpc(payload, timeout=timeout)))

            def __call__(self_, *args, **kw):  # noqa: N805 (the synchronous commit)
                return rpc(*args, **kw)
        client._commit = Held()

    def release(self) -> None:
        self.gate.set()


def _step(head: flce.RemoteLMHead, seed: int) -> None:
    x, y = _data(seed)
    head(x.requires_grad_(True), y).backward()


@pytest.fixture
def head_id(real_client):
    hid = f"ac-{uuid.uuid4().hex[:8]}"
    real_client.upload_head(hid, _weight())
    yield hid
    real_client.unload_head(hid)


def test_backward_returns_before_its_commit_and_reads_wait_for_it(real_client, real_target,
                                                                  head_id):
    head = _head(real_client, head_id)
    held = HeldCommits(real_client)
    _step(head, 1)
    assert held.started.wait(10)
    assert real_client.pending_commits == 1
    # another client does not wait for this one's commits: nothing has landed yet
    with flce.Client(real_target, timeout=60) as other:
        sessions = {s.session_id: s for s in other.sessions(head_id)}
        assert head.session_id not in sessions or sessions[head.session_id].contributions == 0
    threading.Timer(0.2, held.release).start()
    got = head.fetch_grad_weight()  # waits for the commit
    assert real_client.pending_commits == 0

    with flce.Client(real_target, timeout=60, async_commit=False) as sync_client:
        sync_head = _head(sync_client, head_id)
        _step(sync_head, 1)
        assert sync_client.pending_commits == 0
        want = sync_head.fetch_grad_weight()
    assert torch.equal(got, want)


def test_commits_land_in_order_and_every_step_counts(real_client, real_target, head_id):
    head = _head(real_client, head_id)
    for seed in (1, 2, 3):
        _step(head, seed)
    got = head.fetch_grad_weight()
    with flce.Client(real_target, timeout=60, async_commit=False) as sync_client:
        sync_head = _head(sync_client, head_id)
        for seed in (1, 2, 3):
            _step(sync_head, seed)
        want = sync_head.fetch_grad_weight()
    assert torch.equal(got, want)
    sessions = {s.session_id: s for s in real_client.sessions(head_id)}
    assert sessions[head.session_id].contributions == 3


def test_a_failed_background_commit_is_raised_by_the_next_read_once(real_client, real_target,
                                                                   head_id):
    head = _head(real_client, head_id)
    held = HeldCommits(real_client)
    _step(head, 1)
    assert held.started.wait(10)
    with flce.Client(real_target, timeout=60) as other:  # the session goes meanwhile
        other.delete_session(head_id, head.session_id)
    held.release()
    with pytest.raises(flce.FlceError) as err:
        head.fetch_grad_weight()
    assert err.value.method == "Commit"
    assert err.value.code == grpc.StatusCode.NOT_FOUND
    # raised once: the next read is about the read itself
    with pytest.raises(flce.FlceError) as err:
        head.fetch_grad_weight()
    assert err.value.method == "FetchGrad"


def test_close_waits_for_background_commits(real_target, head_id):
    client = flce.Client(real_target, timeout=60)
    head = _head(client, head_id)
    held = HeldCommits(client)
    _step(head, 1)
    threading.Timer(0.2, held.release).start()
    client.close()
    with flce.Client(real_target, timeout=60) as other:
        sessions = {s.session_id: s for s in other.sessions(head_id)}
        assert sessions[head.session_id].contributions == 1


def test_max_pending_of_one_waits_for_the_commit_instead_of_refusing(real_server_bin):
    srv = RealServer(real_server_bin, "--max-pending=1")
    try:
        with flce.Client(srv.target, timeout=60) as client:
            client.upload_head("lm", _weight())
            head = _head(client, "lm")
            held = HeldCommits(client)
            _step(head, 1)
            assert held.started.wait(10)
            # the first contribution is still staged: the server refuses a second one
            # until the commit lands, which the retry waits for
            threading.Timer(0.3, held.release).start()
            _step(head, 2)
            sessions = {s.session_id: s for s in client.sessions("lm")}
            assert sessions[head.session_id].contributions == 2
    finally:
        srv.stop()
