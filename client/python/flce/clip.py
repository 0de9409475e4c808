"""flce.clip_grad_norm_: torch.nn.utils.clip_grad_norm_ with a RemoteLMHead's gradient on
the server counted in; the coefficient is applied to the local gradients here and to the
head's by its ServerOptimizer's next step.

It takes the head or its optimizer, so it stands above both: flce.module (the head, which
makes its optimizer) imports flce.optim, and neither imports this module.
"""
from __future__ import annotations

from typing import Iterable, Optional, Tuple, Union

import torch

from flce.module import RemoteLMHead
from flce.optim import ServerOptimizer


def _head_and_optimizer(head_or_optimizer) -> Tuple[RemoteLMHead, Optional[ServerOptimizer]]:
    if isinstance(head_or_optimizer, ServerOptimizer):
        return head_or_optimizer.head, head_or_optimizer
    if isinstance(head_or_optimizer, RemoteLMHead):
        return head_or_optimizer, head_or_optimizer._optimizer
    raise TypeError("clip_grad_norm_ needs the flce.RemoteLMHead or its flce.ServerOptimizer, "
                    f"got {type(head_or_optimizer).__name__}")


def clip_grad_norm_(parameters: Union[torch.Tensor, Iterable[torch.Tensor]],
                    head_or_optimizer, max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_ over `parameters` AND a RemoteLMHead's gradient on the
    server, as if the head's weight and bias were among the parameters.

    The total norm is sqrt(Σ local squared norms + the head's squared norm × m²), where m
    is the optimizer's grad_multiplier (the head's gradient as its Step applies it); the
    local gradients are multiplied by min(1, max_norm / (total + 1e-6)) here, and the same
    coefficient is recorded for the head's next step (clip_coef). Returns the total norm.
    Only the L2 norm is available for the head (GradNorm gives its squared norm).
    Under torch.distributed every rank calls it after backward: rank 0 asks the server,
    every rank gets the same norm."""
    if float(norm_type) != 2.0:
        raise ValueError(f"flce.clip_grad_norm_ computes the L2 norm only (the server gives "
                         f"the head's squared L2 norm), got norm_type={norm_type}")
    head, opt = _head_and_optimizer(head_or_optimizer)
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    grads = [p.grad for p in parameters if p.grad is not None]
    ranks = opt._ranks if opt is not None else None
    multiplier = opt.grad_multiplier if opt is not None else 1.0

    def head_sq_norm() -> float:
        return head.client.grad_norm(head.head_id, head.session_id).sq_norm

    head.drain()  # this rank's submitted calls have landed (flce.pipeline)
    if ranks is not None:
        ranks.barrier()  # every rank's contributions have landed
        head_sq = ranks.on_leader("GradNorm", head_sq_norm)
    else:
        head_sq = head_sq_norm()
    head_sq *= multiplier * multiplier

    device = grads[0].device if grads else torch.device("cpu")
    dtype = grads[0].dtype if grads else torch.float32
    # each local norm as torch computes it, summed with the head's in fp64
    local = [torch.norm(g.detach(), 2.0).to(device, torch.float64) for g in grads]
    sq = torch.stack(local).pow(2).sum() if local else torch.zeros((), dtype=torch.float64,
                                                                    device=device)
    total_norm = torch.sqrt(sq + head_sq).to(dtype)
    if error_if_nonfinite and torch.logical_or(total_norm.isnan(), total_norm.isinf()):
        raise RuntimeError(
            f"The total norm of order {float(norm_type)} for gradients from `parameters` and "
            "the flce head is non-finite, so it cannot be clipped. To disable this error and "
            "scale the gradients by the non-finite norm anyway, set "
            "`error_if_nonfinite=False`")
    clip_coef = max_norm / (total_norm + 1e-6)
    clip_coef_clamped = torch.clamp(clip_coef, max=1.0)
    for g in grads:
        g.detach().mul_(clip_coef_clamped.to(g.device))
    head._clip_coef = float(clip_coef_clamped)
    return total_norm
