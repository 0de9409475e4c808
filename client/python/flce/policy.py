"""Policy-gradient objectives computed where the head lives (docs/MATH.md, "Policy
objectives"): one Compute call gives the loss, grad_input and grad_W of a PPO / GRPO /
DAPO clipped surrogate or of CISPO, with an optional KL to a reference policy, instead of
a forward call for the log-probs and a second, weighted call.

    objective = flce.PolicyObjective(old_logp=old, advantages=adv, clip_high=0.28)
    loss = head.policy_loss(hidden, targets, objective)   # differentiable, like head(...)
    result = client.compute("head", hidden, targets, policy=objective)

Per-token inputs are tensors of num_tokens entries (advantages may instead give one value
per sequence of `sequence_ids`). A token counts unless its target is ignore_index or its
mask is 0; what a token that does not count carries is not read.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import torch

from flce._pb import pb
from flce import tensors

LOSSES = {"ppo_clip": pb.POLICY_LOSS_PPO_CLIP, "cispo": pb.POLICY_LOSS_CISPO}
KL_ESTIMATORS = {"k3": pb.KL_ESTIMATOR_K3, "k1": pb.KL_ESTIMATOR_K1}
# verl's loss_agg_mode names, with "_" for "-"
AGGREGATIONS = {"token_mean": pb.LOSS_AGGREGATION_TOKEN_MEAN,
                "seq_mean_token_sum": pb.LOSS_AGGREGATION_SEQ_MEAN_TOKEN_SUM,
                "seq_mean_token_mean": pb.LOSS_AGGREGATION_SEQ_MEAN_TOKEN_MEAN}


@dataclass(frozen=True)
class PolicyObjective:
    """A policy objective and its per-token inputs (the server checks the ranges; API.md
    lists them).

    loss: "ppo_clip" (max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high)), with dual_clip
    c > 1 bounding it by -c A where A < 0) or "cispo" (-A sg(clip(r)) logp).
    kl_coef > 0 adds kl_coef x KL(ref) per token (kl_estimator "k3" or "k1"; ref_logp
    needed). aggregation: "token_mean", "seq_mean_token_sum" or "seq_mean_token_mean";
    normalizer > 0 divides instead of this call's own token or sequence count (a batch
    split over calls). log_ratio_clamp: logp - old_logp is clamped to +-it before exp."""
    old_logp: torch.Tensor
    advantages: torch.Tensor
    loss: str = "ppo_clip"
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float = 0.0
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    ref_logp: Optional[torch.Tensor] = None
    aggregation: str = "token_mean"
    normalizer: float = 0.0
    log_ratio_clamp: float = 20.0
    sequence_ids: Optional[torch.Tensor] = None
    mask: Optional[torch.Tensor] = None

    def flattened(self) -> "PolicyObjective":
        """The same objective with every per-token tensor flattened (hidden [..., H] and
        targets [...] are flattened the same way)."""
        flat = {name: getattr(self, name).reshape(-1)
                for name in ("old_logp", "advantages", "ref_logp", "sequence_ids", "mask")
                if getattr(self, name) is not None}
        return replace(self, **flat)

    def fill(self, header, num_tokens: int) -> None:
        """Writes the objective into a pb.ComputeHeader's policy field."""
        for name, table in (("loss", LOSSES), ("kl_estimator", KL_ESTIMATORS),
                            ("aggregation", AGGREGATIONS)):
            if getattr(self, name) not in table:
                raise ValueError(f"{name} must be one of {tuple(table)}, "
                                 f"got {getattr(self, name)!r}")
        p = header.policy
        p.loss = LOSSES[self.loss]
        p.clip_low = self.clip_low
        p.clip_high = self.clip_high
        p.dual_clip = self.dual_clip
        p.kl_coef = self.kl_coef
        p.kl_estimator = KL_ESTIMATORS[self.kl_estimator]
        p.aggregation = AGGREGATIONS[self.aggregation]
        p.normalizer = self.normalizer
        p.log_ratio_clamp = self.log_ratio_clamp
        p.old_logp = _per_token(self.old_logp, "old_logp", num_tokens)
        if self.advantages.numel() != num_tokens and self.sequence_ids is None:
            raise ValueError(f"advantages must have {num_tokens} elements (one per token) "
                             f"or one per sequence of sequence_ids, got "
                             f"{self.advantages.numel()}")
        p.advantages = tensors.to_bytes_fp32(self.advantages.reshape(-1))
        if self.ref_logp is not None:
            p.ref_logp = _per_token(self.ref_logp, "ref_logp", num_tokens)
        if self.sequence_ids is not None:
            ids = self.sequence_ids.reshape(-1)
            if ids.numel() != num_tokens:
                raise ValueError(f"sequence_ids must have {num_tokens} elements, "
                                 f"got {ids.numel()}")
            p.sequence_ids = tensors.to_bytes_int32(ids)
        if self.mask is not None:
            mask = self.mask.reshape(-1)
            if mask.numel() != num_tokens:
                raise ValueError(f"mask must have {num_tokens} elements, got {mask.numel()}")
            p.mask = (mask.to("cpu") != 0).to(torch.uint8).contiguous().numpy().tobytes()


def _per_token(t: torch.Tensor, name: str, n: int) -> bytes:
    if t.numel() != n:
        raise ValueError(f"{name} must have {n} elements, got {t.numel()}")
    return tensors.to_bytes_fp32(t.reshape(-1))


__all__ = ["AGGREGATIONS", "KL_ESTIMATORS", "LOSSES", "PolicyObjective"]
