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
from typing import Optional, Tuple

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


class OptimizerKind(enum.IntEnum):
    UNSPECIFIED = pb.OPTIMIZER_UNSPECIFIED
    SGD = pb.OPTIMIZER_SGD
    ADAMW = pb.OPTIMIZER_ADAMW


class StepOutcome(enum.IntEnum):
    UNSPECIFIED = pb.STEP_OUTCOME_UNSPECIFIED
    APPLIED = pb.STEP_APPLIED
    SKIPPED_FOUND_INF = pb.STEP_SKIPPED_FOUND_INF
    SKIPPED_NON_FINITE_GRADIENT = pb.STEP_SKIPPED_NON_FINITE_GRADIENT
    SKIPPED_NON_FINITE_WEIGHT = pb.STEP_SKIPPED_NON_FINITE_WEIGHT
    SKIPPED_NO_GRADIENT = pb.STEP_SKIPPED_NO_GRADIENT  # no contribution: torch's grad None


def _optional(m, name: str):
    """An `optional` scalar: None when the message leaves it unset."""
    return getattr(m, name) if m.HasField(name) else None


@dataclass(frozen=True)
class GradVersions:
    """The head versions a session's contributions were computed on (0, 0 when it holds
    none): older than the head's version means computed before a Step."""
    oldest: int
    newest: int

    @classmethod
    def from_pb(cls, m) -> "GradVersions":
        return cls(m.oldest, m.newest)


@dataclass(frozen=True)
class OptimizerGroup:
    """One parameter group's hyper-parameters (torch.optim's names). Also what
    Client.create_optimizer takes: None leaves an optional field to the server's
    default (torch's)."""
    weight_decay: Optional[float] = None
    momentum: float = 0.0
    dampening: float = 0.0
    nesterov: bool = False
    beta1: Optional[float] = None
    beta2: Optional[float] = None
    eps: Optional[float] = None
    amsgrad: bool = False

    @classmethod
    def from_pb(cls, m) -> "OptimizerGroup":
        return cls(_optional(m, "weight_decay"), m.momentum, m.dampening, m.nesterov,
                   _optional(m, "beta1"), _optional(m, "beta2"), _optional(m, "eps"),
                   m.amsgrad)

    def to_pb(self):
        msg = pb.OptimizerGroup(momentum=self.momentum, dampening=self.dampening,
                                nesterov=self.nesterov, amsgrad=self.amsgrad)
        for name in ("weight_decay", "beta1", "beta2", "eps"):
            value = getattr(self, name)
            if value is not None:
                setattr(msg, name, value)
        return msg


@dataclass(frozen=True)
class OptimizerInfo:
    """A head's optimizer state as the server applies it (defaults filled in)."""
    kind: OptimizerKind
    weight: OptimizerGroup
    bias: Optional[OptimizerGroup]  # None if the server sent none
    steps: int
    skipped_steps: int
    state_bytes: int

    @classmethod
    def from_pb(cls, m) -> "OptimizerInfo":
        return cls(OptimizerKind(m.kind), OptimizerGroup.from_pb(m.weight),
                   OptimizerGroup.from_pb(m.bias) if m.HasField("bias") else None,
                   m.steps, m.skipped_steps, m.state_bytes)


@dataclass(frozen=True)
class ServerInfo:
    instance_id: str
    version: str
    engine: str
    workspace_budget_bytes: int
    max_request_tokens: int
    max_message_bytes: int
    # e.g. "optimizer" (CreateOptimizer, Step, GradNorm, DownloadHead), "checkpoint"
    # (SaveCheckpoint, LoadCheckpoint: the server has a --checkpoint-dir), "embed"
    # (Embed, EmbedGrad: tied embeddings)
    capabilities: Tuple[str, ...]
    boot_id: str = ""  # the server host's /proc/sys/kernel/random/boot_id
    # transports beyond messages this caller may use: "shm" and "cuda_ipc", offered by
    # default to a caller on the server's Unix socket that runs as the server's user
    # (flce-server --local-transports)
    local_transports: Tuple[str, ...] = ()
    device_uuid: str = ""  # "GPU-..." of the GPU the server computes on; "" for the CPU
    # the server's Unix-domain socket (flce-server --unix-socket), told to callers on its
    # host; "" otherwise
    unix_socket: str = ""
    # the data plane's TCP port (flce-server --data-port), capability "data_plane"; 0 = none
    data_plane_port: int = 0

    @classmethod
    def from_pb(cls, m) -> "ServerInfo":
        return cls(m.instance_id, m.version, m.engine, m.workspace_budget_bytes,
                   m.max_request_tokens, m.max_message_bytes, tuple(m.capabilities),
                   m.boot_id, tuple(m.local_transports), m.device_uuid,
                   getattr(m, "unix_socket", ""), getattr(m, "data_plane_port", 0))


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
    optimizer: Optional[OptimizerInfo]  # None until CreateOptimizer

    @classmethod
    def from_pb(cls, m) -> "HeadInfo":
        return cls(m.head_id, m.vocab_size, m.hidden_size, DType(m.dtype), m.has_bias,
                   m.version, m.weight_bytes, m.source, m.sessions,
                   OptimizerInfo.from_pb(m.optimizer) if m.HasField("optimizer") else None)


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
class PolicySummary:
    """ComputeSummary.policy: an objective's parts and what RL trainers log, over the
    tokens that count (fractions and means; 0 when none counted)."""
    loss: str
    tokens: int
    surrogate_loss: float
    kl_loss: float
    clip_fraction_low: float
    clip_fraction_high: float
    dual_clip_fraction: float
    approx_kl: float
    kl_mean: float
    ratio_mean: float
    ratio_min: float
    ratio_max: float

    @classmethod
    def from_pb(cls, m) -> "PolicySummary":
        return cls(m.loss, m.tokens, m.surrogate_loss, m.kl_loss, m.clip_fraction_low,
                   m.clip_fraction_high, m.dual_clip_fraction, m.approx_kl, m.kl_mean,
                   m.ratio_mean, m.ratio_min, m.ratio_max)


@dataclass(frozen=True)
class PreferenceSummary:
    """ComputeSummary.preference: a preference objective's parts and what preference
    trainers log, as means over the call's pairs."""
    loss: str
    pairs: int
    pair_loss: float
    nll_loss: float
    chosen_reward_mean: float
    rejected_reward_mean: float
    reward_accuracy: float
    reward_margin_mean: float
    chosen_logp_mean: float
    rejected_logp_mean: float
    # The server's two passes over the rows: the log-prob pass's part of timings.engine_ms.
    first_pass_ms: float

    @classmethod
    def from_pb(cls, m) -> "PreferenceSummary":
        return cls(m.loss, m.pairs, m.pair_loss, m.nll_loss, m.chosen_reward_mean,
                   m.rejected_reward_mean, m.reward_accuracy, m.reward_margin_mean,
                   m.chosen_logp_mean, m.rejected_logp_mean, m.first_pass_ms)


@dataclass(frozen=True)
class ComputeSummary:
    loss: float
    n_valid: int
    z_loss: float
    # accuracy and n_correct: only for a call with accuracy=True (0 otherwise: the
    # server computes no argmax for calls that do not ask)
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
    policy: Optional[PolicySummary] = None  # with a policy objective: loss is sum_t w_t L_t
    preference: Optional[PreferenceSummary] = None  # with a preference objective
    # The kernels the call's chunks ran, "key=value" words (CUDA engine; "" on
    # the CPU engine and on servers before 0.17.0)
    kernels: str = ""

    @classmethod
    def from_pb(cls, m) -> "ComputeSummary":
        return cls(m.loss, m.n_valid, m.z_loss, m.accuracy, m.n_correct, m.strategy_used,
                   m.engine, m.head_version, m.server_instance_id, Timings.from_pb(m.timings),
                   m.replayed, m.staged, m.committed, m.entropy_sum,
                   PolicySummary.from_pb(m.policy) if m.HasField("policy") else None,
                   PreferenceSummary.from_pb(m.preference) if m.HasField("preference")
                   else None,
                   m.kernels)


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
    computed_on: GradVersions

    @classmethod
    def from_pb(cls, m) -> "GradHeader":
        return cls(m.vocab_size, m.hidden_size, DType(m.dtype), m.has_bias, m.contributions,
                   m.head_version, m.replayed, GradVersions.from_pb(m.computed_on))


@dataclass(frozen=True)
class SessionInfo:
    head_id: str
    session_id: str
    contributions: int
    pending: int
    tokens: int
    idle_seconds: float
    grad_bytes: int
    computed_on: GradVersions

    @classmethod
    def from_pb(cls, m) -> "SessionInfo":
        return cls(m.head_id, m.session_id, m.contributions, m.pending, m.tokens,
                   m.idle_seconds, m.grad_bytes, GradVersions.from_pb(m.computed_on))


@dataclass(frozen=True)
class StepResult:
    """StepResponse: what a Step did. A replayed step (its request id seen before) reports
    the first outcome and applied nothing now. A session that holds no contribution (none
    computed since the last step or zero_grad, or no such session) is SKIPPED_NO_GRADIENT:
    nothing changes, as torch.optim skips a parameter whose grad is None."""
    outcome: StepOutcome
    head_version: int
    steps: int          # steps applied so far (skipped ones not counted)
    contributions: int  # the session's contributions the step consumed
    replayed: bool

    @property
    def applied(self) -> bool:
        return self.outcome == StepOutcome.APPLIED

    @classmethod
    def from_pb(cls, m) -> "StepResult":
        return cls(StepOutcome(m.outcome), m.head_version, m.steps, m.contributions,
                   m.replayed)


@dataclass(frozen=True)
class GradNorm:
    """GradNormResponse: squared L2 norms (fp64) of a session's gradient; zeros for a
    session that holds none."""
    sq_norm: float
    weight_sq_norm: float
    bias_sq_norm: float
    contributions: int
    head_version: int
    computed_on: GradVersions

    @classmethod
    def from_pb(cls, m) -> "GradNorm":
        return cls(m.sq_norm, m.weight_sq_norm, m.bias_sq_norm, m.contributions,
                   m.head_version, GradVersions.from_pb(m.computed_on))


@dataclass(frozen=True)
class DownloadHeader:
    """What a DownloadHead stream describes: the head (its version is the weight's) and
    the dtype of the tensors sent."""
    head: HeadInfo
    dtype: DType

    @classmethod
    def from_pb(cls, m) -> "DownloadHeader":
        return cls(HeadInfo.from_pb(m.head), DType(m.dtype))


@dataclass(frozen=True)
class CheckpointInfo:
    """What SaveCheckpoint wrote: the head (and its optimizer state, when it has one) as
    `<name>.safetensors` in the caller's directory under the server's --checkpoint-dir. A
    repeated save (same request id) reports the first outcome (replayed) and writes
    nothing."""
    name: str
    bytes: int          # the file's size
    head_version: int   # the version saved
    steps: int          # optimizer steps applied (0 without optimizer state)
    has_optimizer: bool
    replayed: bool

    @classmethod
    def from_pb(cls, m) -> "CheckpointInfo":
        return cls(m.name, m.bytes, m.head_version, m.steps, m.has_optimizer, m.replayed)


@dataclass(frozen=True)
class EmbedHeader:
    """What an Embed stream describes: the rows' count, width and dtype, and the head
    version every row is of (a step during the call aborts it instead)."""
    num_tokens: int
    hidden_size: int
    dtype: DType
    head_version: int

    @classmethod
    def from_pb(cls, m) -> "EmbedHeader":
        return cls(m.num_tokens, m.hidden_size, DType(m.dtype), m.head_version)


@dataclass(frozen=True)
class EmbedGradSummary:
    """What an EmbedGrad call did: its rows landed in the session's grad_W (committed), or
    the request id was seen before (replayed: nothing applied now)."""
    head_version: int   # of the head when the call started
    replayed: bool
    committed: bool
    rows_applied: int   # tokens whose id was not padding_idx
    timings: Timings

    @classmethod
    def from_pb(cls, m) -> "EmbedGradSummary":
        return cls(m.head_version, m.replayed, m.committed, m.rows_applied,
                   Timings.from_pb(m.timings))


# result class -> the protobuf message it mirrors (for the test that they stay in step)
MIRRORS = {ServerInfo: "ServerInfo", HeadInfo: "HeadInfo", UnloadResult: "UnloadHeadResponse",
           Timings: "Timings", ComputeSummary: "ComputeSummary",
           CommitResult: "CommitResponse", GradHeader: "GradHeader", SessionInfo: "SessionInfo",
           GradVersions: "GradVersions", OptimizerGroup: "OptimizerGroup",
           OptimizerInfo: "OptimizerInfo", StepResult: "StepResponse",
           GradNorm: "GradNormResponse", DownloadHeader: "DownloadHeader",
           CheckpointInfo: "CheckpointInfo", EmbedHeader: "EmbedHeader",
           EmbedGradSummary: "EmbedGradSummary"}

__all__ = ["DType", "ContributionState", "OptimizerKind", "StepOutcome", "ServerInfo",
           "HeadInfo", "UnloadResult", "Timings", "ComputeSummary", "CommitResult",
           "GradHeader", "SessionInfo", "GradVersions", "OptimizerGroup", "OptimizerInfo",
           "StepResult", "GradNorm", "DownloadHeader", "CheckpointInfo", "EmbedHeader",
           "EmbedGradSummary"]
