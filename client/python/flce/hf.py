"""Hugging Face transformers: a causal LM whose LM head is computed by a flce server.

    import flce.hf
    head = flce.hf.offload_lm_head(model, "localhost:50051")  # uploads lm_head (and bias)
    loss = model(input_ids, labels=labels).loss                # flce's fused loss
    loss.backward()                                            # grad_W on the server
    opt = head.optimizer("adamw", lr=3e-4)                     # trained where it lives

What the patched forward does with labels (or shift_labels): runs the base model, then
the head on the server with HF's ForCausalLMLoss semantics — labels shifted left by one
(padded with ignore_index), ignore_index honoured, mean over the valid tokens, or the sum
divided by `num_items_in_batch` when the Trainer passes it (gradient accumulation). The
model's own logit transforms become flce loss options: Gemma-2/3's
`final_logit_softcapping` (softcap), Granite's `logits_scaling` (temperature) and Cohere's
`logit_scale` (temperature 1/scale). Logits are never made: `output.logits` is None.
A tied model (input embedding = lm_head.weight) looks its embeddings up on the server too
(flce.RemoteEmbedding), so both gradients land in the head's session.

Without labels (evaluation that wants logits, generate()): with logits="download" (the
default) the patch copies the server's weight into the local lm_head whenever the head's
version changed since the last copy (one DescribeHead per forward; a DownloadHead after a
step) and runs the model's own forward; with logits="refuse" it raises.

transformers is imported only when a function here is called.
"""
from __future__ import annotations

import inspect
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Union

import torch
import torch.nn.functional as F

from flce.client import Client
from flce.module import RemoteEmbedding, RemoteLMHead

# model types whose logits are lm_head(hidden) followed by at most the transforms that
# _logit_options maps (read from the config)
KNOWN_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gpt2", "gemma", "gemma2",
                     "gemma3", "gemma3_text", "granite", "cohere", "cohere2", "phi3", "olmo",
                     "olmo2")
_LOSS_ARGS = ("labels", "shift_labels", "num_items_in_batch", "logits_to_keep", "return_dict")


@dataclass
class _Patch:
    head: RemoteLMHead
    embedding: Optional[RemoteEmbedding]
    forward: Callable  # the model's own forward, bound
    signature: inspect.Signature
    embedding_forward: Optional[Callable]
    logits: str
    synced_version: Optional[int]


def _logit_options(config) -> Dict[str, float]:
    """flce loss options for the model's logit transforms (MATH.md: u = c·tanh(r/c),
    z = u/τ)."""
    options: Dict[str, float] = {}
    cap = getattr(config, "final_logit_softcapping", None)
    if cap:
        options["softcap"] = float(cap)
    scaling = getattr(config, "logits_scaling", None)  # Granite: logits / logits_scaling
    if scaling and float(scaling) != 1.0:
        options["temperature"] = float(scaling)
    scale = getattr(config, "logit_scale", None)  # Cohere: logits * logit_scale
    if scale and float(scale) != 1.0:
        if "temperature" in options:
            raise ValueError("a config with both logits_scaling and logit_scale is not known")
        options["temperature"] = 1.0 / float(scale)
    return options


def _text_config(model):
    config = model.config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def offload_lm_head(model, target: Union[str, Client], *, head_id: Optional[str] = None,
                    session_id: Optional[str] = None, upload: bool = True,
                    dtype: Optional[torch.dtype] = None, ignore_index: int = -100,
                    strategy: str = "auto", logits: str = "download",
                    any_model_type: bool = False) -> RemoteLMHead:
    """Patches `model` (a transformers *ForCausalLM, in place) so that its loss is computed
    by the flce server at `target` (an address or a flce.Client); returns the
    flce.RemoteLMHead (for head.optimizer(...), grad_into, checkpoints).

    upload: send the model's lm_head weight (and bias) as the head's weight (in `dtype`,
    default the weight's); False uses the head `head_id` as the server has it. head_id
    defaults to "hf-<model_type>-<random>". logits: "download" or "refuse", what a forward
    without labels does (see the module's docstring). Model types outside
    KNOWN_MODEL_TYPES are refused unless any_model_type=True says that their logits are
    lm_head(hidden) with at most the config's final_logit_softcapping / logits_scaling /
    logit_scale."""
    if logits not in ("download", "refuse"):
        raise ValueError(f"logits must be 'download' or 'refuse', got {logits!r}")
    if model.__dict__.get("_flce") is not None:
        raise ValueError("this model is already patched by flce.hf (flce.hf.restore first)")
    config = _text_config(model)
    model_type = getattr(config, "model_type", "?")
    if model_type not in KNOWN_MODEL_TYPES and not any_model_type:
        raise ValueError(
            f"flce.hf does not know how a {model_type!r} model computes its logits (it knows "
            f"{', '.join(KNOWN_MODEL_TYPES)}); if they are lm_head(hidden), with at most the "
            "config's final_logit_softcapping, logits_scaling or logit_scale, pass "
            "any_model_type=True")
    lm_head = model.get_output_embeddings()
    if not isinstance(lm_head, torch.nn.Linear):
        raise ValueError(f"the model's output embedding is a {type(lm_head).__name__}, "
                         "not an nn.Linear: nothing to offload")
    base = getattr(model, model.base_model_prefix, None)
    if base is None:
        raise ValueError(f"the model has no base model at .{model.base_model_prefix}")
    client = target if isinstance(target, Client) else Client(target, session_id=session_id)
    head = RemoteLMHead(client, head_id or f"hf-{model_type}-{uuid.uuid4().hex[:8]}",
                        session_id=session_id, ignore_index=ignore_index, strategy=strategy,
                        **_logit_options(config))
    if upload:
        head.load_from_module(lm_head, dtype=dtype)

    embedding, embedding_forward = None, None
    embed_module = model.get_input_embeddings()
    if embed_module is not None and getattr(embed_module, "weight", None) is lm_head.weight:
        weight_dtype = embed_module.weight.dtype
        embedding = RemoteEmbedding(head, padding_idx=embed_module.padding_idx,
                                    dtype=weight_dtype)
        embedding_forward = embed_module.forward
        # Gemma-3's scaled embedding multiplies its rows inside the module
        scale = getattr(embed_module, "embed_scale", None)

        def remote_embedding_forward(input_ids):
            rows = embedding(input_ids)
            if scale is None:
                return rows
            return rows * (scale.to(rows.dtype) if torch.is_tensor(scale) else scale)

        embed_module.forward = remote_embedding_forward

    own_forward = model.forward
    signature = inspect.signature(own_forward)
    model.__dict__["_flce"] = _Patch(head, embedding, own_forward, signature,
                                     embedding_forward, logits, None)

    def forward(*args, **kwargs):
        return _patched_forward(model, *args, **kwargs)

    # generate() and the Trainer inspect forward's parameters: they see the model's own
    forward.__signature__ = signature
    model.forward = forward
    return head


def restore(model) -> None:
    """Undoes offload_lm_head (the server's head stays; copy it back with
    remote_head(model).copy_to(model.lm_head) first if it was trained there)."""
    patch = model.__dict__.pop("_flce", None)
    if patch is None:
        raise ValueError("this model is not patched by flce.hf")
    del model.forward  # the instance attribute: the class's forward shows again
    if patch.embedding_forward is not None:
        del model.get_input_embeddings().forward


def remote_head(model) -> RemoteLMHead:
    """The flce.RemoteLMHead a patched model computes its loss with."""
    patch = model.__dict__.get("_flce")
    if patch is None:
        raise ValueError("this model is not patched by flce.hf")
    return patch.head


def _patched_forward(self, *args, **kwargs):
    patch: _Patch = self.__dict__["_flce"]
    bound = patch.signature.bind_partial(*args, **kwargs)
    arguments: Dict[str, Any] = {}
    for name, value in bound.arguments.items():
        kind = patch.signature.parameters[name].kind
        if kind is inspect.Parameter.VAR_KEYWORD:
            arguments.update(value)
        elif kind is not inspect.Parameter.VAR_POSITIONAL:
            arguments[name] = value
    labels = arguments.get("labels")
    shift_labels = arguments.get("shift_labels")
    if labels is None and shift_labels is None:
        return _forward_with_logits(self, patch, arguments)

    loss_args = {k: arguments.pop(k, None) for k in _LOSS_ARGS}
    base = getattr(self, self.base_model_prefix)
    outputs = base(**arguments)
    hidden = outputs[0]
    loss = _loss(patch.head, hidden, loss_args["labels"], loss_args["shift_labels"],
                 loss_args["num_items_in_batch"])
    from transformers.modeling_outputs import CausalLMOutputWithPast
    result = CausalLMOutputWithPast(
        loss=loss, logits=None, past_key_values=getattr(outputs, "past_key_values", None),
        hidden_states=getattr(outputs, "hidden_states", None),
        attentions=getattr(outputs, "attentions", None))
    if loss_args["return_dict"] is False:
        return result.to_tuple()
    return result


def _loss(head: RemoteLMHead, hidden: torch.Tensor, labels, shift_labels,
          num_items_in_batch) -> torch.Tensor:
    """HF's ForCausalLMLoss over hidden [B, T, H]: position t predicts label t+1."""
    if shift_labels is None:
        labels = labels.to(hidden.device)
        shift_labels = F.pad(labels, (0, 1), value=head.ignore_index)[..., 1:]
    shift_labels = shift_labels.to(hidden.device)
    if num_items_in_batch is None:
        return head(hidden, shift_labels, reduction="mean")
    loss = head(hidden, shift_labels, reduction="sum")
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(loss.device)
    return loss / num_items_in_batch


def _forward_with_logits(model, patch: _Patch, arguments: Dict[str, Any]):
    if patch.logits == "refuse":
        raise RuntimeError(
            "this model's LM head is computed by flce (flce.hf.offload_lm_head(..., "
            "logits='refuse')): a forward without labels would need logits, which are never "
            "made; pass labels, or patch with logits='download' to compute them from the "
            "server's weight")
    version = patch.head.info().version
    if version != patch.synced_version:
        patch.head.copy_to(model.get_output_embeddings(), master=True)
        patch.synced_version = version
    return patch.forward(**arguments)


def trainer_callback(optimizer, max_grad_norm: float = 0.0):
    """A transformers.TrainerCallback that steps a flce.ServerOptimizer (the head trained on
    the server) each time the Trainer steps its own optimizer, at the Trainer's current
    learning rate. With max_grad_norm > 0 it clips by one global norm over the model's
    parameters and the head's gradient (flce.clip_grad_norm_) before the Trainer's step:
    give the Trainer max_grad_norm=0 then, else it clips without the head."""
    from transformers import TrainerCallback

    from flce.optim import clip_grad_norm_

    server = optimizer

    class ServerStep(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            if max_grad_norm > 0:
                clip_grad_norm_([p for p in model.parameters() if p.grad is not None],
                                server, max_grad_norm)

        def on_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
            if optimizer is not None:  # the Trainer's: its learning rate of this step
                for group in server.param_groups:
                    group["lr"] = optimizer.param_groups[0]["lr"]
            server.step()

    return ServerStep()
