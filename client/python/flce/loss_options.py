"""The loss's options, named once: what they are called, their defaults, how they are
checked and where they go in a Compute call's header.

Client.compute takes them as keyword arguments, RemoteLMHead as constructor arguments
(kept as attributes of the same names) and as per-call overrides of forward and submit;
all of them read the names and defaults from LossOptions. A new option is a field of
LossOptions and a line of LossOptions.fill (plus its field in proto/flce/v1/flce.proto,
the regenerated flce/v1 stubs and the server that reads it).

The reduction and grad_scale go into the same header fields but are per call (a
RemoteLMHead's forward and submit choose them), so they are arguments of fill rather than
fields; REDUCTIONS names the reductions for everything that checks one.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Dict, Iterable, Mapping, TypeVar

from flce._pb import pb

# the reductions and engine strategies by name, as ComputeHeader spells them
REDUCTIONS = {"mean": pb.REDUCTION_MEAN, "sum": pb.REDUCTION_SUM, "none": pb.REDUCTION_NONE}
STRATEGIES = {"auto": pb.STRATEGY_AUTO, "chunked": pb.STRATEGY_CHUNKED,
              "vocab_split": pb.STRATEGY_VOCAB_SPLIT, "fuse_mn": pb.STRATEGY_FUSE_MN,
              "separate": pb.STRATEGY_SEPARATE, "naive": pb.STRATEGY_NAIVE}


@dataclass(frozen=True)
class LossOptions:
    """A call's loss options with their defaults (MATH.md has the math, API.md the ranges
    the server accepts; the server checks the values)."""
    ignore_index: int = -100        # the target of tokens that count for nothing
    label_smoothing: float = 0.0    # epsilon (PyTorch's definition)
    z_loss: float = 0.0             # s: s * LSE^2 added per token (LossOptions.z_loss_scale)
    softcap: float = 0.0            # c: logits capped at c * tanh(r / c); 0 = no cap
    temperature: float = 1.0        # tau: the logits divided by it
    strategy: str = "auto"          # the engine's plan: a key of STRATEGIES
    chunk_tokens: int = 0           # the engine's token-chunk size; 0 = the engine's choice

    def updated(self, overrides: Mapping[str, Any]) -> "LossOptions":
        """These options with `overrides` instead; a None value keeps this one's, a name
        that is not an option is a TypeError."""
        check_names(overrides)
        given = {k: v for k, v in overrides.items() if v is not None}
        return replace(self, **given) if given else self

    def keywords(self) -> Dict[str, Any]:
        """The options as keyword arguments (of Client.compute, say)."""
        return {name: getattr(self, name) for name in NAMES}

    def fill(self, header, reduction: str = "mean", grad_scale: float = 1.0) -> None:
        """Writes these options, the reduction and grad_scale into a pb.ComputeHeader: its
        strategy, reduction, ignore_index, chunk_tokens and LossOptions (temperature and
        grad_scale only when they are not 1, the server's default for them unset). An
        unknown reduction or strategy is a KeyError."""
        header.strategy = STRATEGIES[self.strategy]
        header.reduction = REDUCTIONS[reduction]
        header.ignore_index = self.ignore_index
        header.chunk_tokens = self.chunk_tokens
        options = header.options
        options.SetInParent()  # sent even when every option is at its default
        options.label_smoothing = self.label_smoothing
        options.z_loss_scale = self.z_loss
        options.softcap = self.softcap
        if self.temperature != 1.0:
            options.temperature = self.temperature
        if grad_scale != 1.0:
            options.grad_scale = grad_scale


# the option names, in the order of LossOptions' fields
NAMES = tuple(f.name for f in fields(LossOptions))


def check_names(names: Iterable[str]) -> None:
    """A TypeError naming every name that is not a loss option."""
    unknown = set(names) - set(NAMES)
    if unknown:
        raise TypeError(f"unknown loss options {sorted(unknown)}; known: {NAMES}")


def check_reduction(reduction: str) -> None:
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {tuple(REDUCTIONS)}, got {reduction!r}")


_F = TypeVar("_F", bound=Callable)


def keyword_arguments(*, overrides: bool = False) -> Callable[[_F], _F]:
    """Shows a function's `**options` as LossOptions' fields, keyword-only, in its signature
    (help(), inspect.signature, editors): with their defaults, or with None where the
    function takes them as overrides of options it already has (None: keep those). The
    function itself checks what it gets (LossOptions.updated)."""
    def decorate(func: _F) -> _F:
        sig = inspect.signature(func)
        params = [p for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD]
        params += [inspect.Parameter(
            f.name, inspect.Parameter.KEYWORD_ONLY, default=None if overrides else f.default,
            annotation=f"Optional[{f.type}]" if overrides else f.type)
            for f in fields(LossOptions)]
        func.__signature__ = sig.replace(parameters=params)
        return func
    return decorate


__all__ = ["LossOptions", "NAMES", "REDUCTIONS", "STRATEGIES", "check_names",
           "check_reduction", "keyword_arguments"]
