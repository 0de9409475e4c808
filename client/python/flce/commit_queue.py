"""Commits that run behind the trainer: loss.backward() returns while its Commit is on the
wire, and the next call that reads or changes the session's gradient waits for it.

The autograd path stages a call's grad_W on the server and lands it with a Commit from
backward (flce.autograd). Waiting for that round trip in backward cost every training step
~2 ms at the seed shape, with nothing on the trainer's side depending on it: the gradient
is read only by the optimizer step, a fetch or a norm. So Client(async_commit=True) (the
default) starts the Commit as a gRPC future and returns; one commit is on the wire at a
time, so they land in the order of the backward passes. The client's own calls that touch
the session's gradient (step, fetch_grad, zero_grad, grad_norm, embed_grad, checkpoints,
sessions, upload/unload, close) and RemoteLMHead.drain (so also ServerOptimizer.step /
zero_grad and flce.clip_grad_norm_, before their barrier under torch.distributed) drain the
queue first, and raise the first failure nobody has seen: a step never applies a gradient
that silently lacks a backward pass. No thread of the client's own runs the commits: a
Python thread would compete with the trainer's for the interpreter lock.
"""
from __future__ import annotations

import threading
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Callable, List, Optional

import grpc

from flce.errors import from_rpc_error


class CommitQueue:
    """Commits started as futures (grpc's, or any with done / result(timeout)), one at a
    time, in submission order."""

    def __init__(self):
        self._lock = threading.Lock()
        # started and not drained yet; those that succeeded are dropped as new ones come
        self._pending: List = []

    def submit(self, start: Callable[[], object]) -> None:
        """Waits for the previous commit if it is still on the wire (landing order), then
        start() starts this one and returns its future."""
        with self._lock:
            previous = self._pending[-1] if self._pending else None
        if previous is not None:
            _settle(previous, None)
        future = start()
        with self._lock:
            self._pending = [f for f in self._pending
                             if not f.done() or _settle(f, 0) is not None]
            self._pending.append(future)

    def __len__(self) -> int:
        """Commits not finished yet."""
        with self._lock:
            return sum(not f.done() for f in self._pending)

    def drain(self, timeout: Optional[float] = None) -> None:
        """Waits for every commit started so far; raises the first that failed (once)."""
        with self._lock:
            waiting = list(self._pending)
        failures = [_settle(f, timeout) for f in waiting]
        with self._lock:
            self._pending = [f for f in self._pending if f not in waiting]
        for failure in failures:
            if failure is not None:
                raise failure


def _settle(future, timeout: Optional[float]) -> Optional[BaseException]:
    """Waits for `future`; its failure as a FlceError (a timeout is raised: the commit is
    still running and stays pending)."""
    try:
        future.result(timeout)
    except (grpc.FutureTimeoutError, FutureTimeout):
        raise
    except grpc.RpcError as err:
        return from_rpc_error("Commit", err)
    except Exception as err:  # noqa: BLE001 (returned, raised by drain)
        return err
    return None

