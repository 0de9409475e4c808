"""What the server answers, as frozen dataclasses with typed fields.

The client hands these out instead of protobuf messages: they are immutable, typed for a
type checker, and do not tie callers to the generated classes. Each field has the name of
the protobuf field it comes from, so `.loss`, `.n_valid`, `.committed`, `.contributions`
read as before; enum fields are IntEnums, equal to the protobuf constants
(`info.dtype == DType.BF16 == pb.DTYPE_BF16`). tests/python/test_results.py checks that
every field of the messages is here.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional

from flce._pb import pb


class DType(enum.IntEnum):
    UNSPECIFIED = pb.DTYPE_UNSPECIFIED
    FP32 = pb.DTYPE_FP32
    FP16 = pb.DTYPE_FP16
    BF16 = pb.DTYPE_BF16


class ContributionState(enum.IntEnum):
    UNKNOWN = pb.CONTRIBUTION_UNKNOWN
    STAGED = pb.CONTRIBUTION_STAGED
    COMMITTED = pb.CONTRIBUTION_COMMITTED
    DISCARDED = pb.CONTRIBUTION_DISCARDED


@dataclass(frozen=True)
class ServerInfo:
    instance_id: str
    version: str
    engine: str
    workspace_budget_bytes: int
    max_request_tokens: int
    max_message_bytes: int

    @classmethod
    def from_pb(cls, m) -> "ServerInfo":
        return cls(m.instance_id, m.version, m.engine, m.workspace_budget_bytes,
                   m.max_request_tokens, m.max_message_bytes)


@dataclass(frozen=True)
class HeadInfo:
    head_id: str
    vocab_size: int
    hidden_size: int
    dtype: DType
    has_bias: bool
    version: int
    weight_bytes: int
    source: str
    sessions: int

    @classmethod
    def from_pb(cls, m) -> "HeadInfo":
        return cls(m.head_id, m.vocab_size, m.hidden_size, DType(m.dtype), m.has_bias,
                   m.version, m.weight_bytes, m.source, m.sessions)


@dataclass(frozen=True)
class UnloadResult:
    head: Optional[HeadInfo]  # the head as it was; None if the server sent none
    sessions_dropped: int

    @classmethod
    def from_pb(cls, m) -> "UnloadResult":
        return cls(HeadInfo.from_pb(m.head) if m.HasField("head") else None,
                   m.sessions_dropped)


@dataclass(frozen=True)
class Timings:
    total_ms: float
    engine_ms: float
    wait_ms: float

    @classmethod
    def from_pb(cls, m) -> "Timings":
        return cls(m.total_ms, m.engine_ms, m.wait_ms)


@dataclass(frozen=True)
class ComputeSummary:
    loss: float
    n_valid: int
    z_loss: float
    accuracy: float
    n_correct: int
    strategy_used: str
    engine: str
    head_version: int
    server_instance_id: str
    timings: Timings
    replayed: bool
    staged: bool
    committed: bool
    entropy_sum: float

    @classmethod
    def from_pb(cls, m) -> "ComputeSummary":
        return cls(m.loss, m.n_valid, m.z_loss, m.accuracy, m.n_correct, m.strategy_used,
                   m.engine, m.head_version, m.server_instance_id, Timings.from_pb(m.timings),
                   m.replayed, m.staged, m.committed, m.entropy_sum)


@dataclass(frozen=True)
class CommitResult:
    """CommitResponse: what became of a deferred call's staged grad_W."""
    state: ContributionState
    replayed: bool
    scale: float

    @classmethod
    def from_pb(cls, m) -> "CommitResult":
        return cls(ContributionState(m.state), m.replayed, m.scale)


@dataclass(frozen=True)
class GradHeader:
    vocab_size: int
    hidden_size: int
    dtype: DType
    has_bias: bool
    contributions: int
    head_version: int
    replayed: bool

    @classmethod
    def from_pb(cls, m) -> "GradHeader":
        return cls(m.vocab_size, m.hidden_size, DType(m.dtype), m.has_bias, m.contributions,
                   m.head_version, m.replayed)


@dataclass(frozen=True)
class SessionInfo:
    head_id: str
    session_id: str
    contributions: int
    pending: int
    tokens: int
    idle_seconds: float
    grad_bytes: int

    @classmethod
    def from_pb(cls, m) -> "SessionInfo":
        return cls(m.head_id, m.session_id, m.contributions, m.pending, m.tokens,
                   m.idle_seconds, m.grad_bytes)


# result class -> the protobuf message it mirrors (for the test that they stay in step)
MIRRORS = {ServerInfo: "ServerInfo", HeadInfo: "HeadInfo", UnloadResult: "UnloadHeadResponse",
           Timings: "Timings", ComputeSummary: "ComputeSummary",
           CommitResult: "CommitResponse", GradHeader: "GradHeader", SessionInfo: "SessionInfo"}

__all__ = ["DType", "ContributionState", "ServerInfo", "HeadInfo", "UnloadResult", "Timings",
           "ComputeSummary", "CommitResult", "GradHeader", "SessionInfo"]
