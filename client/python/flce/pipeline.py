"""Asynchronous calls: the server computes micro-batch k while the trainer runs k+1.

    pending = []
    for x, y in micro_batches:
        hidden = model.body(x)                         # the body of this micro-batch
        pending.append(head.submit(hidden, y, scale=1 / len(micro_batches)))
        if len(pending) == 2:                          # the one before is done by now
            pending.pop(0).backward()                  # grad_input through the body
    for p in pending:
        p.backward()
    opt.step()                                         # drains anything still in flight

A submitted call is a training call whose grad_W lands in the session when it completes
(multiplied by `scale`, as grad_input is): there is no autograd node for the head, so
`PendingLoss.backward()` runs `hidden.backward(grad_input)` itself. The hidden state and
targets are copied off the GPU when the call is submitted (ordered on the current CUDA
stream, so the next micro-batch's kernels do not delay the call); on the CPU they are read
by the call as they are, so they must not change before the result is there.

Calls go out in submission order on the client's pool (Client(max_in_flight=1) by default),
so their contributions land in that order. ServerOptimizer.step / zero_grad,
flce.clip_grad_norm_ and the head's fetch_grad wait for the head's calls in flight first
(RemoteLMHead.drain) and raise the first failure nobody has looked at: a step never applies
a gradient that silently lacks a micro-batch.

In asyncio code a PendingLoss is awaitable: `result = await head.submit(hidden, y)`.
"""
from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from typing import Any, Callable, List, Optional

import torch

from flce.client import ComputeResult


def host_copy(t: torch.Tensor):
    """(host tensor, ready event or None): a CUDA tensor is copied into pinned memory on the
    current stream and the event marks the copy's end; a CPU tensor is used as it is."""
    t = t.detach()
    if not t.is_cuda:
        return t.contiguous(), None
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    event = torch.cuda.Event()
    event.record()
    return host, event


def device_copy(t: torch.Tensor):
    """(copy on t's GPU, ready event): for a call whose transport reads GPU memory
    (flce.cuda_ipc), where a trip through the host would only cost."""
    copy = t.detach().clone(memory_format=torch.contiguous_format)
    event = torch.cuda.Event()
    event.record()
    return copy, event


class PendingLoss:
    """One submitted micro-batch (flce.RemoteLMHead.submit): a future of its ComputeResult
    plus what backward needs."""

    def __init__(self, future: "Future[ComputeResult]", hidden: torch.Tensor):
        self.future = future
        self._hidden = hidden
        self._observed = False  # result() or backward() has seen the outcome
        self._backward_done = False

    def done(self) -> bool:
        return self.future.done()

    def result(self, timeout: Optional[float] = None) -> ComputeResult:
        """Waits for the call; its FlceError is raised here (nothing of a refused call
        landed: the server's landing rules hold for submitted calls too)."""
        self._observed = True
        return self.future.result(timeout)

    @property
    def loss(self) -> torch.Tensor:
        """The micro-batch's loss (without `scale`), a float32 scalar on hidden's device."""
        return torch.tensor(self.result().loss, dtype=torch.float32,
                            device=self._hidden.device)

    def backward(self) -> torch.Tensor:
        """Waits for the call, then backpropagates its grad_input (already × scale) through
        the graph that produced hidden. Returns the loss (detached). Once only."""
        if self._backward_done:
            raise RuntimeError("this submitted micro-batch was already backpropagated")
        result = self.result()
        self._backward_done = True
        hidden, self._hidden = self._hidden, self._hidden.detach()
        if result.grad_input is not None and hidden.requires_grad:
            grad = result.grad_input.to(hidden.device, non_blocking=result.grad_input.is_pinned())
            hidden.backward(grad.reshape(hidden.shape))
        return torch.tensor(result.loss, dtype=torch.float32, device=hidden.device)

    async def abackward(self) -> torch.Tensor:
        """backward() once the call is done, without blocking the event loop meanwhile."""
        await self
        return self.backward()

    def __await__(self):
        self._observed = True
        return asyncio.wrap_future(self.future).__await__()


class InFlight:
    """The calls a head has submitted that have not been drained yet."""

    def __init__(self):
        self._lock = threading.Lock()
        self._pending: List[PendingLoss] = []
        self._failed: List[PendingLoss] = []  # settled with an error nobody has seen yet

    def add(self, pending: PendingLoss) -> None:
        with self._lock:
            self._pending.append(pending)

    def settled(self, pending: PendingLoss) -> None:
        with self._lock:
            if pending in self._pending:
                self._pending.remove(pending)
            if pending.future.exception() is not None:
                self._failed.append(pending)

    def __len__(self) -> int:
        with self._lock:
            return len(self._pending)

    def drain(self, timeout: Optional[float] = None) -> None:
        """Waits for every call in flight; raises the first failure no result() saw."""
        with self._lock:
            waiting = list(self._pending)
        for pending in waiting:
            try:
                pending.future.result(timeout)
            except Exception:  # noqa: BLE001 (collected by settled(), raised below)
                pass
        with self._lock:
            failed, self._failed = self._failed, []
        for pending in failed:
            if not pending._observed:
                pending._observed = True
                raise pending.future.exception()


def submit_call(executor, call: Callable[..., ComputeResult], hidden: torch.Tensor,
                targets: torch.Tensor, in_flight: InFlight, *, keep_on_device: bool = False,
                **kw: Any) -> PendingLoss:
    """Copies hidden (to the host, or on its GPU with keep_on_device) and targets now, so
    that the caller may reuse its tensors at once, and runs `call` on the pool."""
    rows = hidden.reshape(-1, hidden.shape[-1])
    host_hidden, ready = device_copy(rows) if keep_on_device else host_copy(rows)
    host_targets, targets_ready = host_copy(targets.reshape(-1))

    def run() -> ComputeResult:
        for event in (ready, targets_ready):
            if event is not None:
                event.synchronize()
        return call(host_hidden, host_targets, **kw)

    pending = PendingLoss(executor.submit(run), hidden)
    in_flight.add(pending)
    # after add(): a call that is already done settles now, once
    pending.future.add_done_callback(lambda _: in_flight.settled(pending))
    return pending
