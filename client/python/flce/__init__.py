"""flce: offload an LM head's fused linear + cross-entropy to a flce server.

    import flce
    client = flce.Client("localhost:50051")
    head = flce.RemoteLMHead(client, "lm")
    head.load_from_module(model.lm_head)
    loss = head(hidden, targets)      # instead of F.cross_entropy(model.lm_head(hidden), targets)
    embed = flce.RemoteEmbedding(head)  # a tied input embedding (= lm_head.weight), on the server
    pending = head.submit(hidden, targets)  # asynchronous: pending.backward() later
"""
# the package's one version: pyproject.toml reads it from here (without importing flce)
__version__ = "0.18.0"

from flce.client import Client, ComputeResult, GradResult, HeadDownload  # noqa: E402
from flce.clip import clip_grad_norm_  # noqa: E402
from flce.errors import FlceError  # noqa: E402
from flce.module import LMHeadOutput, RemoteEmbedding, RemoteLMHead, ignore_in_ddp  # noqa: E402
from flce.optim import ServerOptimizer  # noqa: E402
from flce.pipeline import PendingLoss  # noqa: E402
from flce.policy import PolicyObjective  # noqa: E402
from flce.preference import PreferenceObjective  # noqa: E402
from flce.results import (CheckpointInfo, CommitResult, ComputeSummary,  # noqa: E402
                          ContributionState, DType, DownloadHeader, EmbedGradSummary,
                          EmbedHeader, GradHeader, GradNorm,
                          GradVersions, HeadInfo, OptimizerGroup, OptimizerInfo,
                          OptimizerKind, PolicySummary, PreferenceSummary, ServerInfo, SessionInfo, StepOutcome,
                          StepResult, Timings, UnloadResult)
from flce import safetensors  # noqa: E402

__all__ = ["Client", "ComputeResult", "GradResult", "HeadDownload", "FlceError",
           "LMHeadOutput", "PendingLoss", "PolicyObjective", "PolicySummary",
           "PreferenceObjective", "PreferenceSummary",
           "RemoteEmbedding", "RemoteLMHead", "ignore_in_ddp", "ServerOptimizer",
           "clip_grad_norm_", "safetensors", "CheckpointInfo", "CommitResult",
           "ComputeSummary", "ContributionState", "DType", "DownloadHeader",
           "EmbedGradSummary", "EmbedHeader", "GradHeader",
           "GradNorm", "GradVersions", "HeadInfo", "OptimizerGroup", "OptimizerInfo",
           "OptimizerKind", "ServerInfo", "SessionInfo", "StepOutcome", "StepResult",
           "Timings", "UnloadResult"]
