"""flce.RemoteLMHead: an nn.Module whose weight lives on a flce server.

    head = flce.RemoteLMHead("localhost:50051", "my-head")  # or a flce.Client
    head.load_from_module(model.lm_head)            # weight (and bias) uploaded
    loss = head(hidden, targets)                    # replaces F.cross_entropy(lm_head(h), y)
    loss.backward()                                 # grad_input local, grad_W on the server
    head.grad_into(model.lm_head)                   # fetch (and reset) into .grad
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Union

import grpc
import torch
from torch import nn

from flce import safetensors
from flce.autograd import CallConfig, FusedLoss, PerTokenLoss
from flce.client import Client, GradResult
from flce.errors import FlceError
from flce.results import ComputeSummary, HeadInfo

REDUCTIONS = ("mean", "sum", "none")
_LOSS_OPTIONS = ("ignore_index", "label_smoothing", "z_loss", "softcap", "temperature",
                 "strategy", "chunk_tokens")


class LMHeadOutput(NamedTuple):
    loss: torch.Tensor              # scalar (mean, sum) or shaped like targets (none)
    logprob: Optional[torch.Tensor]  # shaped like targets, when asked for
    entropy: Optional[torch.Tensor]


class RemoteLMHead(nn.Module):
    """Fused linear + cross-entropy on a flce server (see MATH.md for the exact math).

    Under torch.no_grad() a forward is a forward-only call: nothing is created or staged
    on the server. With grad enabled, grad_W accumulates in the server session even when
    hidden needs no gradient (a frozen body), like a local head's weight.grad would."""

    def __init__(self, client: Union[Client, str], head_id: str, *,
                 session_id: Optional[str] = None,
                 reduction: str = "mean", ignore_index: int = -100,
                 label_smoothing: float = 0.0, z_loss: float = 0.0, softcap: float = 0.0,
                 temperature: float = 1.0, strategy: str = "auto", chunk_tokens: int = 0):
        super().__init__()
        if isinstance(client, str):  # a target such as "127.0.0.1:50051"
            client = Client(client, session_id=session_id)
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
        self.client = client
        self.head_id = head_id
        self.session_id = session_id or client.session_id
        self.reduction = reduction
        self.ignore_index = ignore_index
        self.label_smoothing = label_smoothing
        self.z_loss = z_loss
        self.softcap = softcap
        self.temperature = temperature
        self.strategy = strategy
        self.chunk_tokens = chunk_tokens
        # stands in for the remote weight in the graph, so that backward (and the grad_W
        # commit) runs even when hidden does not require grad
        self._weight_anchor = torch.empty(0, requires_grad=True)
        # the latest flce.ComputeSummary (n_valid, accuracy, timings); None after an overflow
        self.last_summary: Optional[ComputeSummary] = None

    # ------------------------------------------------------------- the head --
    def load_from_module(self, lm_head: nn.Linear,
                         dtype: Optional[torch.dtype] = None) -> HeadInfo:
        """Uploads lm_head.weight [V, H] (and lm_head.bias) in `dtype` (default theirs)."""
        return self.client.upload_head(self.head_id, lm_head.weight.detach(),
                                       None if lm_head.bias is None else lm_head.bias.detach(),
                                       dtype=dtype)

    def load_from_safetensors(self, path, weight_tensor: str = "lm_head.weight",
                              bias_tensor: Optional[str] = None,
                              dtype: Optional[torch.dtype] = None) -> HeadInfo:
        """Reads the tensors from a local safetensors file and uploads them."""
        w = safetensors.load_tensor(path, weight_tensor)
        b = safetensors.load_tensor(path, bias_tensor) if bias_tensor else None
        return self.client.upload_head(self.head_id, w, b, dtype=dtype)

    def info(self) -> HeadInfo:
        return self.client.describe_head(self.head_id)

    # ------------------------------------------------------------ gradients --
    def fetch_grad(self, dtype: torch.dtype = torch.float32, reset: bool = False,
                   request_id: Optional[str] = None) -> GradResult:
        """The session's grad_W and grad_b. A reset is retry-safe: see Client.fetch_grad."""
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
        try:
            self.client.zero_grad(self.head_id, session_id=self.session_id)
        except FlceError as err:
            if err.code != grpc.StatusCode.NOT_FOUND:
                raise

    # -------------------------------------------------------------- forward --
    def _config(self, overrides: dict) -> CallConfig:
        values = {k: getattr(self, k) for k in _LOSS_OPTIONS}
        values.update({k: v for k, v in overrides.items() if v is not None})
        return CallConfig(self.client, self.head_id, self.session_id, **values)

    def forward(self, hidden: torch.Tensor, targets: torch.Tensor, *,
                reduction: Optional[str] = None, ignore_index: Optional[int] = None,
                label_smoothing: Optional[float] = None, z_loss: Optional[float] = None,
                softcap: Optional[float] = None, temperature: Optional[float] = None,
                return_logprob: bool = False, return_entropy: bool = False):
        """hidden [..., H], targets [...] → loss; with return_logprob / return_entropy an
        LMHeadOutput whose per-token tensors are differentiable (RL objectives). Loss
        options given here override the module's for this call."""
        reduction = reduction or self.reduction
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
        if hidden.shape[:-1] != targets.shape:
            raise ValueError(f"hidden {tuple(hidden.shape)} does not match targets "
                             f"{tuple(targets.shape)}")
        shape = targets.shape
        h2 = hidden.reshape(-1, hidden.shape[-1])
        y = targets.reshape(-1)
        cfg = self._config(dict(ignore_index=ignore_index, label_smoothing=label_smoothing,
                                z_loss=z_loss, softcap=softcap, temperature=temperature))
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

    def extra_repr(self) -> str:
        return (f"head_id={self.head_id!r}, session_id={self.session_id!r}, "
                f"reduction={self.reduction!r}")
