"""Preference objectives computed where the head lives (docs/MATH.md, "Preference
objectives"): DPO (sigmoid, with cDPO's label smoothing), IPO, the hinge loss, SimPO and
ORPO over pairs of a chosen and a rejected response, in one Compute call. The server holds
the call's rows and goes over them twice (the responses' log-probs, then the weighted
gradient), so hidden is sent once.

    objective = flce.PreferenceObjective.for_batch(chosen_mask, rejected_mask,
                                                   ref_logp=ref, beta=0.1)
    loss = head.preference_loss(torch.cat([hidden_c, hidden_r]), torch.cat([y_c, y_r]),
                                objective)   # differentiable, like head(...)

Sequence 2p is pair p's chosen response and 2p + 1 its rejected one; a token counts for its
sequence unless its target is ignore_index.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import torch

from flce._pb import pb
from flce import tensors

LOSSES = {"dpo_sigmoid": pb.PREFERENCE_LOSS_DPO_SIGMOID, "ipo": pb.PREFERENCE_LOSS_IPO,
          "dpo_hinge": pb.PREFERENCE_LOSS_DPO_HINGE, "simpo": pb.PREFERENCE_LOSS_SIMPO,
          "orpo": pb.PREFERENCE_LOSS_ORPO}
WITH_REFERENCE = ("dpo_sigmoid", "ipo", "dpo_hinge")


@dataclass(frozen=True)
class PreferenceObjective:
    """A preference objective and its pairs (the server checks the ranges; API.md lists them).

    sequence_of_token: per token, its sequence in [0, 2 num_pairs) or -1 (a prompt, padding).
    loss: "dpo_sigmoid" (-log sigma(beta h), h the margin of the responses' log-ratios to the
    reference; label_smoothing > 0: conservative DPO), "ipo" ((h - 1/(2 beta))^2 on
    length-averaged log-probs), "dpo_hinge" (max(0, 1 - beta h)), "simpo" (-log sigma(beta
    (mean_c - mean_r) - gamma), no reference), "orpo" (the chosen responses' NLL plus beta x
    -log sigma of the log-odds difference, no reference). The reference's log-probs for the
    first three: ref_logp, one per sequence summed over its counted tokens, or
    ref_token_logp, one per token. normalizer > 0 divides instead of num_pairs."""
    sequence_of_token: torch.Tensor
    num_pairs: int
    loss: str = "dpo_sigmoid"
    beta: float = 0.1
    gamma: float = 0.0
    label_smoothing: float = 0.0
    ref_logp: Optional[torch.Tensor] = None
    ref_token_logp: Optional[torch.Tensor] = None
    normalizer: float = 0.0

    capability = "preference_objectives"

    @classmethod
    def for_batch(cls, chosen_mask: torch.Tensor, rejected_mask: torch.Tensor,
                  ref_chosen_logp: Optional[torch.Tensor] = None,
                  ref_rejected_logp: Optional[torch.Tensor] = None,
                  **kw) -> "PreferenceObjective":
        """For tokens laid out as torch.cat([chosen, rejected]) of two [B, L] batches (TRL's
        concatenated forward): row b of each is pair b; the masks mark the response tokens.
        ref_chosen_logp / ref_rejected_logp: [B] each, the reference's summed log-probs as
        TRL's dpo_loss takes them (ref_token_logp, shaped [2B, L], also works)."""
        if chosen_mask.shape != rejected_mask.shape or chosen_mask.dim() != 2:
            raise ValueError(f"need two [B, L] masks of one shape, got {tuple(chosen_mask.shape)} "
                             f"and {tuple(rejected_mask.shape)}")
        b, length = chosen_mask.shape
        pair = torch.arange(b, device=chosen_mask.device)[:, None].expand(b, length)
        chosen = torch.where(chosen_mask != 0, 2 * pair, torch.full_like(pair, -1))
        rejected = torch.where(rejected_mask != 0, 2 * pair + 1, torch.full_like(pair, -1))
        if (ref_chosen_logp is None) != (ref_rejected_logp is None):
            raise ValueError("give both ref_chosen_logp and ref_rejected_logp, or neither")
        if ref_chosen_logp is not None:
            if ref_chosen_logp.numel() != b or ref_rejected_logp.numel() != b:
                raise ValueError(f"ref_chosen_logp and ref_rejected_logp need {b} values each")
            # sequence order: pair b's chosen (2b), then its rejected (2b + 1)
            kw["ref_logp"] = torch.stack([ref_chosen_logp.reshape(-1),
                                          ref_rejected_logp.reshape(-1)], 1).reshape(-1)
        return cls(sequence_of_token=torch.cat([chosen, rejected]), num_pairs=b, **kw)

    def flattened(self) -> "PreferenceObjective":
        """The same objective with its per-token tensors flattened (hidden [..., H] and
        targets [...] are flattened the same way)."""
        flat = {name: getattr(self, name).reshape(-1)
                for name in ("sequence_of_token", "ref_token_logp")
                if getattr(self, name) is not None}
        return replace(self, **flat)

    def fill(self, header, num_tokens: int) -> None:
        """Writes the objective into a pb.ComputeHeader's preference field."""
        if self.loss not in LOSSES:
            raise ValueError(f"loss must be one of {tuple(LOSSES)}, got {self.loss!r}")
        seq = self.sequence_of_token.reshape(-1)
        if seq.numel() != num_tokens:
            raise ValueError(f"sequence_of_token must have {num_tokens} elements, "
                             f"got {seq.numel()}")
        p = header.preference
        p.loss = LOSSES[self.loss]
        p.beta = self.beta
        p.gamma = self.gamma
        p.label_smoothing = self.label_smoothing
        p.num_pairs = self.num_pairs
        p.normalizer = self.normalizer
        p.sequence_of_token = tensors.to_bytes_int32(seq)
        if self.ref_logp is not None:
            if self.ref_logp.numel() != 2 * self.num_pairs:
                raise ValueError(f"ref_logp must have one value per sequence "
                                 f"({2 * self.num_pairs}), got {self.ref_logp.numel()}")
            p.ref_logp = tensors.to_bytes_fp32(self.ref_logp.reshape(-1))
        if self.ref_token_logp is not None:
            if self.ref_token_logp.numel() != num_tokens:
                raise ValueError(f"ref_token_logp must have {num_tokens} elements, "
                                 f"got {self.ref_token_logp.numel()}")
            p.ref_token_logp = tensors.to_bytes_fp32(self.ref_token_logp.reshape(-1))


__all__ = ["LOSSES", "PreferenceObjective", "WITH_REFERENCE"]
