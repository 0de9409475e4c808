"""flce: offload an LM head's fused linear + cross-entropy to a flce server.

    import flce
    client = flce.Client("localhost:50051")
    head = flce.RemoteLMHead(client, "lm")
    head.load_from_module(model.lm_head)
    loss = head(hidden, targets)      # instead of F.cross_entropy(model.lm_head(hidden), targets)
"""
from flce.client import Client, ComputeResult, GradResult
from flce.errors import FlceError
from flce.module import LMHeadOutput, RemoteLMHead
from flce import safetensors

__all__ = ["Client", "ComputeResult", "GradResult", "FlceError", "LMHeadOutput",
           "RemoteLMHead", "safetensors"]
__version__ = "0.2.0"
