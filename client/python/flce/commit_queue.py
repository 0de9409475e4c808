"""Commits that run behind the trainer: loss.backward() returns while its Commit is on the
wire, and the next call that reads or changes the session's gradient waits for it.

The autograd path stages a call's grad_W on the server and lands it with a Commit from
backward (flce.autograd). Waiting for that round trip in backward costs every training step
~2 ms at the seed shape, with nothing on the trainer's side depending on it: the gradient
is read only by the optimizer step, a fetch or a norm. So Client(async_commit=True) (the
default) hands the Commit to one background thread — commits go out, and land, in the
order of the backward passes — and the client's own calls that touch the session's
gradient (step, fetch_grad, zero_grad, grad_norm, embed_grad, checkpoints, sessions,
upload/unload, close) and RemoteLMHead.drain (so also ServerOptimizer.step / zero_grad and
flce.clip_grad_norm_, before their barrier under torch.distributed) drain the queue first,
and raise the first failure nobody has seen: a step never applies a gradient that silently
lacks a backward pass.
"""
from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Callable, List, Optional


class CommitQueue:
    """One background thread running commits in submission order."""

    def __init__(self):
        self._lock = threading.Lock()
        self._pool: Optional[ThreadPoolExecutor] = None
        # submitted and not drained yet; those that succeeded are dropped as new ones come
        self._pending: List[Future] = []

    def submit(self, commit: Callable[[], object]) -> None:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flce-commit")
            self._pending = [f for f in self._pending
                             if not f.done() or f.exception() is not None]
            self._pending.append(self._pool.submit(commit))

    def __len__(self) -> int:
        """Commits not finished yet."""
        with self._lock:
            return sum(not f.done() for f in self._pending)

    def drain(self, timeout: Optional[float] = None) -> None:
        """Waits for every commit submitted so far; raises the first that failed (once)."""
        with self._lock:
            waiting = list(self._pending)
        first_failure: Optional[BaseException] = None
        for future in waiting:
            try:
                future.result(timeout)
            except FutureTimeout:
                raise  # still running: stays pending for the next drain
            except Exception as err:  # noqa: BLE001 (the first is raised below)
                first_failure = first_failure or err
        with self._lock:
            self._pending = [f for f in self._pending if f not in waiting]
        if first_failure is not None:
            raise first_failure

    def close(self) -> None:
        """Drains (raising a failure nobody saw) and stops the thread."""
        try:
            self.drain()
        finally:
            with self._lock:
                pool, self._pool = self._pool, None
            if pool is not None:
                pool.shutdown(wait=True)
