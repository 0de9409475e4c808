"""The autograd functions under flce.RemoteLMHead and flce.RemoteEmbedding.

Two plans, chosen by what the caller differentiates:
- FusedLoss (mean or sum, no per-token outputs): ONE Compute call returns the loss and
  grad_input; its grad_W is staged (deferred commit). backward scales grad_input by
  grad_output and commits the staged grad_W with scale = grad_output. One GEMM pass set.
- PerTokenLoss (reduction none, or logprob / entropy asked for): the forward is a
  forward-only call (no grad_W, nothing staged); backward re-sends hidden with the
  per-token upstream gradients as weights a_t and e_t (MATH.md), which costs a second
  pass of the forward GEMM on the server.
- EmbeddingLookup (flce.RemoteEmbedding, a tied input embedding): the forward is an Embed
  call (the head's rows of the ids); backward sends the output's gradient to EmbedGrad,
  which adds it into the session's grad_W, where the head's own gradient accumulates.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import grpc
import torch

from flce.client import Client, new_request_id
from flce.errors import FlceError
from flce.loss_options import LossOptions
from flce.preference import PreferenceObjective


def _inf_like(hidden: torch.Tensor) -> torch.Tensor:
    return torch.full_like(hidden, float("inf"))


@dataclass(frozen=True)
class CallConfig:
    """Everything a call needs besides tensors: where it goes and the loss's options."""
    client: Client
    head_id: str
    session_id: str
    loss: LossOptions = LossOptions()

    def compute(self, hidden, targets, **kw):
        return self.client.compute(self.head_id, hidden, targets, session_id=self.session_id,
                                   **self.loss.keywords(), **kw)


# How long the best-effort discard of a staged contribution may take (it runs from a
# finalizer or while another exception propagates, so it must never hang).
DISCARD_TIMEOUT_S = 5.0


class StagedContribution:
    """A deferred call's grad_W, staged on the server until backward commits it.

    If the graph dies without a backward (a forward run with grad enabled and never
    differentiated, or an exception in between), or the Compute call itself fails after
    the server may have staged it (a deadline or a broken stream after the server's
    summary), the contribution is discarded, so that it neither lands late nor holds one
    of the session's --max-pending slots."""

    def __init__(self, cfg: CallConfig, request_id: str):
        self.cfg = cfg
        self.request_id = request_id
        self.done = False

    def commit(self, scale: float) -> None:
        if self.done:
            raise RuntimeError("this flce loss was already backpropagated: its grad_W was "
                               "committed once and cannot be applied again (retain_graph)")
        self.done = True
        # started, not waited for, unless Client(async_commit=False): the session's
        # gradient is next read by a call that waits for it (flce.commit_queue)
        self.cfg.client.commit_in_background(self.cfg.head_id, self.request_id, scale,
                                             session_id=self.cfg.session_id)

    def discard(self) -> None:
        """Best effort, never raises: NOT_FOUND (nothing was staged), a server that is
        gone, any other failure are ignored; the session's TTL cleans up what is left."""
        if self.done:
            return
        self.done = True
        client = self.cfg.client
        timeout = DISCARD_TIMEOUT_S
        if client.timeout is not None:
            timeout = min(timeout, client.timeout)
        try:
            client.commit(self.cfg.head_id, self.request_id, 0.0,
                          session_id=self.cfg.session_id, discard=True, timeout=timeout)
        except Exception:  # noqa: BLE001 (see the docstring)
            pass

    def __del__(self):
        self.discard()


def _compute_deferred(cfg: CallConfig, hidden, targets, **kw):
    """cfg.compute with its grad_W staged. The server's --max-pending counts staged
    contributions whose background Commit is still on its way: when
    it refuses the call for that, the commits are waited for and the call is made again
    (the refusal recorded nothing under the request id)."""
    try:
        return cfg.compute(hidden, targets, deferred_commit=True, **kw)
    except FlceError as err:
        if err.code != grpc.StatusCode.RESOURCE_EXHAUSTED or not cfg.client.pending_commits:
            raise
    cfg.client.drain_commits()
    return cfg.compute(hidden, targets, deferred_commit=True, **kw)


def _scaled(grad: torch.Tensor, scale: torch.Tensor, device) -> torch.Tensor:
    """grad × scale in fp32, rounded once to grad's dtype (bf16 would round scale too)."""
    grad = _to_device(grad, device)
    if scale.numel() == 1 and float(scale) == 1.0:
        return grad
    return (grad.to(torch.float32) * scale.to(device, torch.float32)).to(grad.dtype)


def _to_device(t: torch.Tensor, device) -> torch.Tensor:
    # from pinned memory the copy is asynchronous; torch's pinned-memory cache keeps the
    # block alive until the copy has finished
    return t.to(device, non_blocking=t.is_pinned())


def _objective_argument(objective) -> dict:
    """Client.compute's keyword for a policy or preference objective (none: {})."""
    if objective is None:
        return {}
    return {"preference" if isinstance(objective, PreferenceObjective) else "policy": objective}


class FusedLoss(torch.autograd.Function):
    """loss = reduction(ℓ) in one call (or a policy or preference objective's loss); grad_W
    staged until backward commits it."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, anchor: torch.Tensor, targets: torch.Tensor,
                cfg: CallConfig, reduction: str, sink: Optional[list], objective=None):
        staged = StagedContribution(cfg, new_request_id())
        try:
            result = _compute_deferred(cfg, hidden, targets, reduction=reduction,
                                       request_id=staged.request_id,
                                       grad_input=ctx.needs_input_grad[0],
                                       **_objective_argument(objective))
        except FlceError as err:
            if not err.non_finite:
                staged.discard()
                raise
            staged.done = True  # refused before anything was staged
            # An overflow (nothing landed): inf loss and grad_input, so that a GradScaler
            # finds inf gradients and skips the step as it would for a local one.
            ctx.staged = None
            ctx.device = hidden.device
            ctx.grad_input = _inf_like(hidden) if ctx.needs_input_grad[0] else None
            return torch.tensor(float("inf"), dtype=torch.float32, device=hidden.device)
        except BaseException:
            # the server may have staged the contribution before the call failed on our
            # side (deadline, broken stream): drop it, then re-raise the original error
            staged.discard()
            raise
        if sink is not None:
            sink.append(result.summary)
        ctx.staged = staged
        ctx.device = hidden.device
        ctx.grad_input = result.grad_input  # not an input or output: held as an attribute
        # torch.full fills on the GPU: no host copy that waits for the stream
        return torch.full((), result.loss, dtype=torch.float32, device=hidden.device)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        if ctx.staged is not None:
            ctx.staged.commit(float(grad_output))
        grad_input, ctx.grad_input = ctx.grad_input, None
        if grad_input is not None and ctx.needs_input_grad[0]:
            grad_input = _scaled(grad_input, grad_output, ctx.device)
        else:
            grad_input = None
        return grad_input, None, None, None, None, None, None


class PerTokenLoss(torch.autograd.Function):
    """(loss, logprob, entropy) from a forward-only call; backward is a second call with
    a_t = ∂L/∂ℓ_t − ∂L/∂logprob_t and e_t = ∂L/∂entropy_t."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, anchor: torch.Tensor, targets: torch.Tensor,
                cfg: CallConfig, reduction: str, want_logprob: bool, want_entropy: bool,
                sink: Optional[list]):
        try:
            result = cfg.compute(hidden, targets, reduction=reduction, forward_only=True,
                                 per_token_loss=reduction == "none", logprob=want_logprob,
                                 entropy=want_entropy)
        except FlceError as err:
            if not err.non_finite:
                raise
            result = None
        if result is None:  # an overflow: inf outputs; backward's call will say the same
            dev, n = hidden.device, targets.numel()
            inf = torch.full((n,) if reduction == "none" else (), float("inf"), device=dev)
            empty = torch.zeros(0, dtype=torch.float32, device=dev)
            ctx.set_materialize_grads(False)
            ctx.save_for_backward(hidden, targets)
            ctx.cfg, ctx.reduction, ctx.n_valid = cfg, reduction, 0
            return (inf, torch.full((n,), float("inf"), device=dev) if want_logprob else empty,
                    torch.full((n,), float("inf"), device=dev) if want_entropy else empty.clone())
        if sink is not None:
            sink.append(result.summary)
        dev = hidden.device
        outs = result.token_outputs
        loss = (outs["loss"].to(dev) if reduction == "none"
                else torch.tensor(result.loss, dtype=torch.float32, device=dev))
        empty = torch.zeros(0, dtype=torch.float32, device=dev)
        logprob = outs["logprob"].to(dev) if want_logprob else empty
        entropy = outs["entropy"].to(dev) if want_entropy else empty.clone()
        ctx.set_materialize_grads(False)  # unused outputs give None: no weights to send
        ctx.save_for_backward(hidden, targets)
        ctx.cfg, ctx.reduction, ctx.n_valid = cfg, reduction, result.summary.n_valid
        return loss, logprob, entropy

    @staticmethod
    def backward(ctx, g_loss, g_logprob, g_entropy):
        hidden, targets = ctx.saved_tensors
        cfg = ctx.cfg
        n = targets.numel()
        a = torch.zeros(n, dtype=torch.float32)
        if g_loss is not None:
            g = g_loss.detach().to("cpu", torch.float32)
            if ctx.reduction == "none":
                a += g.reshape(-1)
            else:
                valid = (targets.detach().to("cpu") != cfg.loss.ignore_index).to(torch.float32)
                per_token = 1.0 / max(ctx.n_valid, 1) if ctx.reduction == "mean" else 1.0
                a += valid * (g * per_token)
        if g_logprob is not None and g_logprob.numel():
            if cfg.loss.label_smoothing or cfg.loss.z_loss:
                # ℓ_t = −logprob_t only without smoothing and z-loss: no a_t expresses it
                raise NotImplementedError(
                    "gradients through logprob need label_smoothing = z_loss = 0")
            a -= g_logprob.detach().to("cpu", torch.float32).reshape(-1)
        e = None
        if g_entropy is not None and g_entropy.numel():
            e = g_entropy.detach().to("cpu", torch.float32).reshape(-1)
        try:
            result = cfg.compute(hidden, targets, reduction="none", token_weights=a,
                                 entropy_weights=e, grad_input=ctx.needs_input_grad[0])
        except FlceError as err:
            if not err.non_finite:
                raise
            # an overflow (nothing landed): inf gradients, which a GradScaler skips
            return ((_inf_like(hidden) if ctx.needs_input_grad[0] else None),
                    None, None, None, None, None, None, None)
        grad_input = (_to_device(result.grad_input, hidden.device)
                      if ctx.needs_input_grad[0] else None)
        return grad_input, None, None, None, None, None, None, None


class EmbeddingLookup(torch.autograd.Function):
    """rows = W[token_ids] from an Embed call; backward hands the rows' gradient to
    `owner` (the flce.RemoteEmbedding), which sends it to EmbedGrad. `anchor` stands in
    for the remote weight, so that backward runs although the ids need no gradient."""

    @staticmethod
    def forward(ctx, anchor: torch.Tensor, token_ids: torch.Tensor, owner):
        rows = owner._lookup(token_ids)
        ctx.owner = owner
        ctx.save_for_backward(token_ids)
        ctx.set_materialize_grads(False)  # an unused output: no gradient, nothing sent
        return rows

    @staticmethod
    def backward(ctx, grad_rows: Optional[torch.Tensor]):
        if grad_rows is not None:
            token_ids, = ctx.saved_tensors
            ctx.owner._send_grad(token_ids, grad_rows)
        return None, None, None
