"""flce.RemoteLMHead: an nn.Module whose weight lives on a flce server.

    head = flce.RemoteLMHead("localhost:50051", "my-head")  # or a flce.Client
    head.load_from_module(model.lm_head)            # weight (and bias) uploaded
    loss = head(hidden, targets)                    # replaces F.cross_entropy(lm_head(h), y)
    loss.backward()                                 # grad_input local, grad_W on the server
    head.grad_into(model.lm_head)                   # fetch (and reset) into .grad

or trained on the server, where no weight or gradient crosses the wire per step:

    opt = head.optimizer("adamw", lr=3e-4)          # flce.ServerOptimizer (see flce.optim)
    loss.backward(); opt.step(); opt.zero_grad()
    opt.save_checkpoint("step-1000")                # head + moments, on the server

A tied input embedding (GPT-2, Gemma, Llama-3.2-1B: embedding = lm_head.weight) lives on
the server with the head, its gradient added into the head's session:

    embed = flce.RemoteEmbedding(head)              # no parameters; Embed / EmbedGrad
    loss = head(model.body(embed(input_ids)), targets)
    loss.backward(); opt.step(); opt.zero_grad()    # one Step applies both gradients
"""
from __future__ import annotations

from typing import Mapping, NamedTuple, Optional, Tuple, Union

import grpc
import torch
from torch import nn

from flce import safetensors
from flce.autograd import CallConfig, EmbeddingLookup, FusedLoss, PerTokenLoss
from flce.client import Client, GradResult, HeadDownload
from flce.errors import FlceError
from flce.loss_options import NAMES, LossOptions, check_reduction, keyword_arguments
from flce.optim import ServerOptimizer
from flce.pipeline import InFlight, PendingLoss, submit_call
from flce.policy import PolicyObjective
from flce.preference import PreferenceObjective
from flce.results import (CheckpointInfo, ComputeSummary, EmbedGradSummary, EmbedHeader,
                          HeadInfo)


class LMHeadOutput(NamedTuple):
    loss: torch.Tensor              # scalar (mean, sum) or shaped like targets (none)
    logprob: Optional[torch.Tensor]  # shaped like targets, when asked for
    entropy: Optional[torch.Tensor]


class RemoteLMHead(nn.Module):
    """Fused linear + cross-entropy on a flce server (see MATH.md for the exact math).

    Under torch.no_grad() a forward is a forward-only call: nothing is created or staged
    on the server. With grad enabled, grad_W accumulates in the server session even when
    hidden needs no gradient (a frozen body), like a local head's weight.grad would.

    The loss options (flce.loss_options.LossOptions: ignore_index, label_smoothing, z_loss,
    softcap, temperature, strategy, chunk_tokens) are keyword arguments with its defaults,
    kept as attributes of the same names that every call reads (set one to change the
    calls that follow); forward and submit take them too, for that call only."""

    @keyword_arguments()
    def __init__(self, client: Union[Client, str], head_id: str, *,
                 session_id: Optional[str] = None, reduction: str = "mean", **options):
        super().__init__()
        loss = LossOptions().updated(options)
        if isinstance(client, str):  # a target such as "127.0.0.1:50051"
            client = Client(client, session_id=session_id)
        check_reduction(reduction)
        self.client = client
        self.head_id = head_id
        self.session_id = session_id or client.session_id
        self.reduction = reduction
        for name, value in loss.keywords().items():  # self.ignore_index, self.z_loss, ...
            setattr(self, name, value)
        # stands in for the remote weight in the graph, so that backward (and the grad_W
        # commit) runs even when hidden does not require grad
        self._weight_anchor = torch.empty(0, requires_grad=True)
        # the latest flce.ComputeSummary (n_valid, entropy_sum, timings); None after an overflow
        self.last_summary: Optional[ComputeSummary] = None
        # the head's flce.ServerOptimizer, once optimizer() made one
        self._optimizer = None
        # flce.clip_grad_norm_'s coefficient, waiting for the next step
        self._clip_coef: Optional[float] = None
        # a tied RemoteEmbedding's gradient was not finite (nothing of it landed): the
        # next ServerOptimizer step is skipped as found_inf, as torch's would be by a
        # GradScaler (or would write Inf into a local tied weight)
        self._embed_found_inf = False
        # submitted calls not drained yet (flce.pipeline)
        self._in_flight = InFlight()

    # ------------------------------------------------------------- the head --
    def load_from_module(self, lm_head: nn.Linear, dtype: Optional[torch.dtype] = None,
                         reset_optimizer: bool = False) -> HeadInfo:
        """Uploads lm_head.weight [V, H] (and lm_head.bias) in `dtype` (default theirs).
        A head with optimizer state keeps its weight unless reset_optimizer (which drops
        the state: create it again with optimizer())."""
        return self.client.upload_head(self.head_id, lm_head.weight.detach(),
                                       None if lm_head.bias is None else lm_head.bias.detach(),
                                       dtype=dtype, reset_optimizer=reset_optimizer)

    def load_from_safetensors(self, path, weight_tensor: str = "lm_head.weight",
                              bias_tensor: Optional[str] = None,
                              dtype: Optional[torch.dtype] = None,
                              reset_optimizer: bool = False) -> HeadInfo:
        """Reads the tensors from a local safetensors file and uploads them."""
        w = safetensors.load_tensor(path, weight_tensor)
        b = safetensors.load_tensor(path, bias_tensor) if bias_tensor else None
        return self.client.upload_head(self.head_id, w, b, dtype=dtype,
                                       reset_optimizer=reset_optimizer)

    def download(self, master: bool = False) -> HeadDownload:
        """The head's weight and bias as the server holds them now (with master=True the
        fp32 master of a 16-bit head): Client.download_head."""
        return self.client.download_head(self.head_id, master)

    def copy_to(self, lm_head: nn.Linear, master: bool = True) -> HeadInfo:
        """Copies the server's weight (and bias) into lm_head's parameters, in their dtype:
        a head trained on the server, put into the model's own checkpoint."""
        got = self.download(master)
        with torch.no_grad():
            lm_head.weight.copy_(got.weight)
            if lm_head.bias is not None and got.bias is not None:
                lm_head.bias.copy_(got.bias)
        return got.header.head

    def info(self) -> HeadInfo:
        return self.client.describe_head(self.head_id)

    # ------------------------------------------------------------ gradients --
    def fetch_grad(self, dtype: torch.dtype = torch.float32, reset: bool = False,
                   request_id: Optional[str] = None) -> GradResult:
        """The session's grad_W and grad_b (after the head's submitted calls have landed).
        A reset is retry-safe: see Client.fetch_grad."""
        self.drain()
        return self.client.fetch_grad(self.head_id, session_id=self.session_id, dtype=dtype,
                                      reset=reset, request_id=request_id)

    def fetch_grad_weight(self, dtype: torch.dtype = torch.float32,
                          reset: bool = False) -> torch.Tensor:
        """The session's accumulated grad_W [V, H] (fp32 accumulator, sent as `dtype`)."""
        return self.fetch_grad(dtype, reset).weight

    def grad_into(self, lm_head: nn.Linear, reset: bool = True) -> None:
        """Adds the server's grad_W (and grad_b) into lm_head's .grad, as a local head's
        backward would, and by default resets the server's accumulator."""
        g = self.fetch_grad(torch.float32, reset)
        for param, grad in ((lm_head.weight, g.weight), (lm_head.bias, g.bias)):
            if param is None or grad is None:
                continue
            grad = grad.to(param.device, param.dtype)
            if param.grad is None:
                param.grad = grad
            else:
                param.grad.add_(grad)

    def zero_grad(self, set_to_none: bool = True) -> None:  # noqa: ARG002 (nn.Module API)
        """Zeroes the server session's grad_W accumulator (a session the server does not
        have yet holds no gradient: nothing to do)."""
        self.drain()
        try:
            self.client.zero_grad(self.head_id, session_id=self.session_id)
        except FlceError as err:
            if err.code != grpc.StatusCode.NOT_FOUND:
                raise
        self._embed_found_inf = False

    # ------------------------------------------------------------- training --
    def optimizer(self, kind: str, lr: float = 1e-3,
                  betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                  weight_decay: Optional[float] = None, amsgrad: bool = False,
                  momentum: float = 0.0, dampening: float = 0.0, nesterov: bool = False,
                  bias_weight_decay: Optional[float] = None, replace: bool = False,
                  grad_multiplier: Optional[float] = None, run_id: Optional[str] = None,
                  distributed: Optional[bool] = None, process_group=None):
        """Creates the head's optimizer state on the server (CreateOptimizer) and returns a
        flce.ServerOptimizer that steps it. kind "adamw" (betas, eps, weight_decay default
        1e-2, amsgrad) or "sgd" (momentum, dampening, weight_decay default 0, nesterov), as
        torch.optim.AdamW / SGD, which refuse the same values with the same messages.
        bias_weight_decay: the bias group's weight decay (default: weight_decay). replace:
        drop existing state (else a head that has state gives ALREADY_EXISTS).
        grad_multiplier multiplies the gradient a step applies; default 1, or 1/world_size
        under torch.distributed (distributed=None: when a process group of more than one
        rank is initialised), where every rank computes into this head's session and the
        ranks' mean losses add up there. run_id: the prefix of the steps' request ids
        (default random)."""
        return ServerOptimizer(self, kind, lr=lr, betas=betas, eps=eps,
                               weight_decay=weight_decay, amsgrad=amsgrad, momentum=momentum,
                               dampening=dampening, nesterov=nesterov,
                               bias_weight_decay=bias_weight_decay, replace=replace,
                               grad_multiplier=grad_multiplier, run_id=run_id,
                               distributed=distributed, process_group=process_group)

    def save_checkpoint(self, name: str, overwrite: bool = False,
                        request_id: Optional[str] = None) -> CheckpointInfo:
        """Saves the head with its optimizer state on the server (Client.save_checkpoint: a
        server started with --checkpoint-dir). The head's ServerOptimizer, if it has one,
        records the name for its state_dict(); under torch.distributed call the
        optimizer's save_checkpoint() on every rank instead."""
        info = self.client.save_checkpoint(self.head_id, name, overwrite=overwrite,
                                           request_id=request_id)
        if self._optimizer is not None:
            self._optimizer._track_save(info)
        return info

    def load_checkpoint(self, name: str, reset_optimizer: bool = False,
                        request_id: Optional[str] = None) -> HeadInfo:
        """Creates or replaces this head from the server checkpoint `name`, with the optimizer
        state it was saved with (Client.load_checkpoint); replacing a head that has
        optimizer state needs reset_optimizer. The head's ServerOptimizer, if it has one,
        follows the loaded state (step count, head version, checkpoint name; its learning
        rates stay its own: restore them with its load_state_dict(), which loads the
        checkpoint itself)."""
        info = self.client.load_checkpoint(self.head_id, name, reset_optimizer=reset_optimizer,
                                           request_id=request_id)
        self._clip_coef = None
        if self._optimizer is not None:
            self._optimizer._track_load(name, info)
        return info

    # -------------------------------------------------------------- forward --
    def _config(self, overrides: Mapping) -> CallConfig:
        """The call's head and session, and the module's loss options with the call's
        overrides (None: the module's; another name: TypeError)."""
        loss = LossOptions(**{name: getattr(self, name) for name in NAMES})
        return CallConfig(self.client, self.head_id, self.session_id, loss.updated(overrides))

    @keyword_arguments(overrides=True)
    def forward(self, hidden: torch.Tensor, targets: torch.Tensor, *,
                reduction: Optional[str] = None, return_logprob: bool = False,
                return_entropy: bool = False, **options):
        """hidden [..., H], targets [...] → loss; with return_logprob / return_entropy an
        LMHeadOutput whose per-token tensors are differentiable (RL objectives). Loss
        options given here override the module's for this call."""
        cfg = self._config(options)
        reduction = reduction or self.reduction
        check_reduction(reduction)
        if hidden.shape[:-1] != targets.shape:
            raise ValueError(f"hidden {tuple(hidden.shape)} does not match targets "
                             f"{tuple(targets.shape)}")
        shape = targets.shape
        h2 = hidden.reshape(-1, hidden.shape[-1])
        y = targets.reshape(-1)
        sink: list = []
        anchor = self._weight_anchor if torch.is_grad_enabled() else self._weight_anchor.detach()
        per_token = reduction == "none" or return_logprob or return_entropy
        if not per_token and torch.is_grad_enabled():
            loss = FusedLoss.apply(h2, anchor, y, cfg, reduction, sink)
            self.last_summary = sink[-1] if sink else None  # None: the call overflowed
            return loss
        loss, logprob, entropy = PerTokenLoss.apply(h2, anchor, y, cfg, reduction,
                                                    return_logprob, return_entropy, sink)
        self.last_summary = sink[-1] if sink else None  # None: the call overflowed
        if reduction == "none":
            loss = loss.reshape(shape)
        if not (return_logprob or return_entropy):
            return loss
        return LMHeadOutput(loss, logprob.reshape(shape) if return_logprob else None,
                            entropy.reshape(shape) if return_entropy else None)

    @keyword_arguments(overrides=True)
    def policy_loss(self, hidden: torch.Tensor, targets: torch.Tensor,
                    objective: PolicyObjective, **options) -> torch.Tensor:
        """hidden [..., H], targets [...] → a policy objective's loss (flce.PolicyObjective,
        per-token inputs shaped like targets), in one Compute call: differentiable like
        forward's loss, with grad_W staged until backward. The summary's statistics (clip
        fractions, approx KL, ratios) are in last_summary.policy. Loss options given here
        override the module's for this call (label smoothing and z-loss do not combine with
        an objective)."""
        return self._objective_loss(hidden, targets, objective, options)

    @keyword_arguments(overrides=True)
    def preference_loss(self, hidden: torch.Tensor, targets: torch.Tensor,
                        objective: PreferenceObjective, **options) -> torch.Tensor:
        """hidden [..., H], targets [...] → a preference objective's loss over pairs of
        responses (flce.PreferenceObjective; its per-token sequence map shaped like
        targets), in one Compute call that sends hidden once (the server goes over the rows
        twice): differentiable like forward's loss, with grad_W staged until backward. The
        rewards, accuracy and margins are in last_summary.preference."""
        return self._objective_loss(hidden, targets, objective, options)

    def _objective_loss(self, hidden: torch.Tensor, targets: torch.Tensor, objective,
                        options: Mapping) -> torch.Tensor:
        """One Compute call with a policy or preference objective, as FusedLoss."""
        cfg = self._config(options)
        if hidden.shape[:-1] != targets.shape:
            raise ValueError(f"hidden {tuple(hidden.shape)} does not match targets "
                             f"{tuple(targets.shape)}")
        h2 = hidden.reshape(-1, hidden.shape[-1])
        sink: list = []
        anchor = self._weight_anchor if torch.is_grad_enabled() else self._weight_anchor.detach()
        loss = FusedLoss.apply(h2, anchor, targets.reshape(-1), cfg, "mean", sink,
                               objective.flattened())
        self.last_summary = sink[-1] if sink else None  # None: the call overflowed
        return loss

    # ------------------------------------------------------ asynchronous calls --
    @keyword_arguments(overrides=True)
    def submit(self, hidden: torch.Tensor, targets: torch.Tensor, *, scale: float = 1.0,
               reduction: Optional[str] = None, **options) -> PendingLoss:
        """Starts this micro-batch's call and returns at once (see flce.pipeline): the
        trainer runs its next micro-batch while the server computes this one. Its grad_W
        lands in the session when the call completes, × scale (e.g. 1 / micro-batches),
        which multiplies grad_input too; PendingLoss.backward() waits and backpropagates
        grad_input through hidden's graph. reduction "mean" or "sum"; loss options given
        here override the module's."""
        reduction = reduction or self.reduction
        if reduction not in ("mean", "sum"):
            raise ValueError(f"submit computes a mean or sum loss, got reduction={reduction!r}")
        if hidden.shape[:-1] != targets.shape:
            raise ValueError(f"hidden {tuple(hidden.shape)} does not match targets "
                             f"{tuple(targets.shape)}")
        cfg = self._config(options)
        # hidden the server reads from this GPU (CUDA IPC) stays on it
        on_device = hidden.is_cuda and self.client.device_transport(hidden) is not None
        return submit_call(self.client.executor(), cfg.compute, hidden, targets,
                           self._in_flight, keep_on_device=on_device, reduction=reduction,
                           grad_scale=scale, grad_input=hidden.requires_grad,
                           pinned_result=hidden.is_cuda)

    def drain(self, timeout: Optional[float] = None) -> None:
        """Waits until every call submitted through this head has finished and the
        client's background commits (backward's, flce.commit_queue) have landed; raises
        the first failure no PendingLoss.result() / backward() has seen."""
        self._in_flight.drain(timeout)
        self.client.drain_commits(timeout)

    def extra_repr(self) -> str:
        return (f"head_id={self.head_id!r}, session_id={self.session_id!r}, "
                f"reduction={self.reduction!r}")


class RemoteEmbedding(nn.Module):
    """A tied input embedding: the rows of a flce head's weight, looked up and trained on
    the server (an nn.Embedding whose weight is lm_head.weight).

        head = flce.RemoteLMHead(client, "lm", session_id="run-1")
        embed = flce.RemoteEmbedding(head)          # or (client, "lm"), session_id=...
        loss = head(body(embed(input_ids)), targets)
        loss.backward()                             # both gradients land in the session
        opt.step()                                  # head.optimizer(...): one Step for both

    forward(input_ids) (an integer tensor of any shape, ids in [0, V)) returns
    [*input_ids.shape, H] on input_ids' device, in `dtype` (torch.float32 by default; None:
    the head's dtype), from one Embed call: every row is of one head version. With grad
    enabled, backward sends the output's gradient to EmbedGrad, which adds it into the
    session's grad_W — the session of `head` (a RemoteLMHead: its session_id, read at each
    call) or `session_id` (default the client's) — where the head's own gradient
    accumulates, so that a ServerOptimizer step, flce.clip_grad_norm_ and fetch_grad see
    their sum, as a local tied weight's .grad holds both. The EmbedGrad call is
    synchronous: when backward returns, it has landed (a step cannot miss it).

    The rows sent are the true gradient dL/d(embeddings) of whatever was backpropagated,
    under the convention RemoteLMHead uses for grad_W (committed with scale = the loss's
    grad_output, never LossOptions.grad_scale): `loss * 0.5`, a GradScaler's scale or
    `/ accumulation_steps` reach both alike, and the optimizer's grad_multiplier and clip
    coefficient apply to their sum at Step.

    padding_idx: ids whose rows get no gradient (torch's nn.Embedding(padding_idx=...);
    negative counts from V; checked by the server at the first backward); their rows are
    returned as the head holds them. deterministic: repeated ids sum in token order, bit for
    bit the same every time (slower on the GPU).

    No parameters and no buffers (DistributedDataParallel needs nothing: `anchor`, which
    lets backward run although the ids need no gradient, is a plain attribute, as
    RemoteLMHead's). A gradient that is not finite (an fp16 overflow) is not sent: nothing
    lands, `found_inf` turns True and, for a RemoteLMHead's embedding, its ServerOptimizer's
    next step is skipped as found_inf (on every rank under torch.distributed) and the
    session's gradient dropped, as the server skips a step on a gradient that is not
    finite."""

    def __init__(self, head: Union[RemoteLMHead, Tuple[Union[Client, str], str]],
                 padding_idx: Optional[int] = None, deterministic: bool = False, *,
                 session_id: Optional[str] = None,
                 dtype: Optional[torch.dtype] = torch.float32):
        super().__init__()
        if isinstance(head, RemoteLMHead):
            if session_id is not None and session_id != head.session_id:
                raise ValueError(f"session_id {session_id!r} is not the head's "
                                 f"({head.session_id!r}): a tied embedding's gradient goes "
                                 "into its head's session")
            client, head_id = head.client, head.head_id
        else:
            try:
                client, head_id = head
            except (TypeError, ValueError):
                raise TypeError("RemoteEmbedding needs a flce.RemoteLMHead or a (client, "
                                f"head_id) pair, got {type(head).__name__}") from None
            if isinstance(client, str):
                client = Client(client, session_id=session_id)
            head = None
        if dtype not in (None, torch.float32, torch.float16, torch.bfloat16):
            raise TypeError(f"dtype must be None (the head's), torch.float32 or the head's "
                            f"16-bit dtype, got {dtype}")
        self.client = client
        self.head_id = head_id
        # not a submodule: the model holds the RemoteLMHead itself
        self.__dict__["lm_head"] = head
        self._session_id = session_id or client.session_id
        self.padding_idx = padding_idx
        self.deterministic = deterministic
        self.dtype = dtype
        self._anchor = torch.empty(0, requires_grad=True)
        self._found_inf = False
        # the last Embed's header (its head_version) and the last EmbedGrad's summary
        self.last_header: Optional[EmbedHeader] = None
        self.last_grad_summary: Optional[EmbedGradSummary] = None

    @property
    def session_id(self) -> str:
        """The session the gradient goes into: the RemoteLMHead's, when tied to one."""
        return self.lm_head.session_id if self.lm_head is not None else self._session_id

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if input_ids.dtype.is_floating_point or input_ids.dtype.is_complex \
                or input_ids.dtype == torch.bool:
            raise TypeError(f"input_ids must be an integer tensor, got {input_ids.dtype}")
        if not torch.is_grad_enabled():
            return self._lookup(input_ids)
        return EmbeddingLookup.apply(self._anchor, input_ids, self)

    def _lookup(self, input_ids: torch.Tensor) -> torch.Tensor:
        rows, self.last_header = self.client._embed_call(self.head_id, input_ids,
                                                         dtype=self.dtype)
        return rows.to(input_ids.device, non_blocking=rows.is_pinned())

    def _send_grad(self, input_ids: torch.Tensor, grad: torch.Tensor) -> None:
        if input_ids.numel() == 0:
            return
        if not bool(torch.isfinite(grad).all()):
            self._overflowed()
            return
        try:
            self.last_grad_summary = self.client.embed_grad(
                self.head_id, input_ids, grad.detach(), session_id=self.session_id,
                padding_idx=self.padding_idx, deterministic=self.deterministic)
        except FlceError as err:
            if not err.non_finite:  # its sum with the session's gradient overflowed
                raise
            self._overflowed()

    @property
    def found_inf(self) -> bool:
        """A backward's gradient was not finite and was not sent. Tied to a RemoteLMHead:
        its flag, which the head's ServerOptimizer step (skipped) and zero_grad() clear;
        otherwise this module's own, which stays set until you set it to False."""
        return self.lm_head._embed_found_inf if self.lm_head is not None else self._found_inf

    @found_inf.setter
    def found_inf(self, value: bool) -> None:
        if self.lm_head is not None:
            self.lm_head._embed_found_inf = bool(value)
        else:
            self._found_inf = bool(value)

    def _overflowed(self) -> None:
        self.found_inf = True

    def extra_repr(self) -> str:
        return (f"head_id={self.head_id!r}, session_id={self.session_id!r}, "
                f"padding_idx={self.padding_idx}, dtype={self.dtype}")


def ignore_in_ddp(model: nn.Module, *parts: Union[nn.Module, torch.Tensor]) -> list:
    """Tells torch.nn.parallel.DistributedDataParallel to leave these submodules'
    parameters and buffers (or these tensors) of `model` alone; call it before wrapping.

    A model that keeps its local lm_head (the nn.Linear a RemoteLMHead was loaded from,
    for its checkpoint) while the RemoteLMHead computes the loss never uses that
    lm_head's weight in forward: DDP then fails at the second iteration ("Expected to
    have finished reduction in the prior iteration ... parameters that were not used in
    producing loss"). Ignoring it avoids that and the cost of find_unused_parameters=True.
    Returns the names now ignored."""
    wanted = set()
    for part in parts:
        if isinstance(part, nn.Module):
            wanted.update(id(t) for t in part.parameters())
            wanted.update(id(t) for t in part.buffers())
        else:
            wanted.add(id(part))
    names = [name for name, t in list(model.named_parameters()) + list(model.named_buffers())
             if id(t) in wanted]
    if parts and not names:
        raise ValueError("none of these are parameters or buffers of the model")
    ignored = list(getattr(model, "_ddp_params_and_buffers_to_ignore", []))
    ignored += [n for n in names if n not in ignored]
    # DDP's own way of excluding parameters (torch 1.13 and 2.x): read when it wraps
    nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
        model, ignored)
    return ignored
