"""flce.hf.offload_lm_head on tiny randomly initialised transformers models (built from
configs, nothing downloaded): the patched model's loss and every gradient equal the
unpatched model's, for plain, soft-capped (Gemma-2/3), scaled (Granite, Cohere) and tied
(GPT-2, Gemma, tied Llama) heads; num_items_in_batch; a forward without labels and
generate(); the Trainer with the head trained on the server.

transformers is not packaged for Debian 12: these tests skip where it is missing and run
on the GPU machine (docs/TESTING.md)."""
from __future__ import annotations

import copy
import uuid

import pytest
import torch

try:
    import transformers
except ImportError:
    transformers = None
# Each test is collected and skipped (a module skipped whole collects nothing, which
# pytest reports as a failure to collect).
pytestmark = pytest.mark.skipif(
    transformers is None, reason="transformers is not installed here (not packaged for "
    "Debian 12): the Hugging Face tests run where it is, e.g. the GPU machine "
    "(docs/TESTING.md)")

import flce  # noqa: E402
import flce.hf  # noqa: E402
from conftest import SERVER_DEVICE  # noqa: E402

V, H, T, B = 101, 32, 12, 2
LOSS_TOL = 1e-6 if SERVER_DEVICE == "cpu" else 1e-5
GRAD_TOL = 1e-5 if SERVER_DEVICE == "cpu" else 1e-4

COMMON = dict(vocab_size=V, hidden_size=H, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)


def _configs():
    c = transformers
    return {
        "llama": lambda: c.LlamaConfig(**COMMON),
        "llama-tied": lambda: c.LlamaConfig(**COMMON, tie_word_embeddings=True),
        "qwen2": lambda: c.Qwen2Config(**COMMON),
        "gpt2": lambda: c.GPT2Config(vocab_size=V, n_embd=H, n_layer=2, n_head=4,
                                     n_positions=64),
        "gemma": lambda: c.GemmaConfig(**COMMON, head_dim=8),
        "gemma2": lambda: c.Gemma2Config(**COMMON, head_dim=8, final_logit_softcapping=3.0,
                                         query_pre_attn_scalar=8),
        "granite": lambda: c.GraniteConfig(**COMMON, logits_scaling=4.0),
        "cohere": lambda: c.CohereConfig(**COMMON, logit_scale=0.25),
    }


@pytest.fixture
def client(real_client):  # the real server only
    return real_client


def _model(name: str, seed: int = 0):
    config = _configs()[name]()
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # a head far from uniform, so that a wrong transform shows
        model.get_output_embeddings().weight.mul_(20.0)
    return model.eval()


def _batch(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (B, T), generator=g)
    labels = ids.clone()
    labels[0, :3] = -100  # a prompt that is not trained on
    return ids, labels


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def _patched_pair(client, name):
    ref = _model(name)
    model = copy.deepcopy(ref)
    head = flce.hf.offload_lm_head(model, client, head_id=f"hf-{uuid.uuid4().hex[:8]}",
                                   session_id=f"s-{uuid.uuid4().hex[:8]}")
    return ref, model, head


@pytest.mark.parametrize("name", list(_configs()))
def test_loss_and_gradients_equal_the_unpatched_model(client, name):
    ref, model, head = _patched_pair(client, name)
    ids, labels = _batch()
    for num_items in (None, 7):
        extra = {} if num_items is None else {"num_items_in_batch": torch.tensor(num_items)}
        ref.zero_grad()
        model.zero_grad()
        head.zero_grad()
        want = ref(input_ids=ids, labels=labels, **extra)
        got = model(input_ids=ids, labels=labels, **extra)
        assert got.logits is None
        assert abs(float(got.loss) - float(want.loss)) <= LOSS_TOL * abs(float(want.loss))
        want.loss.backward()
        got.loss.backward()
        lm_w = ref.get_output_embeddings().weight
        for (n, p_ref), (_, p) in zip(ref.named_parameters(), model.named_parameters()):
            if p_ref is lm_w:
                continue  # the head (and a tied embedding): on the server
            assert (p.grad is None) == (p_ref.grad is None), n
            if p_ref.grad is not None and p_ref.grad.abs().max() > 0:
                assert _rel(p.grad, p_ref.grad) <= GRAD_TOL, (name, n)
        assert model.get_output_embeddings().weight.grad is None
        assert _rel(head.fetch_grad().weight, lm_w.grad) <= GRAD_TOL, name


def test_logit_transforms_become_loss_options(client):
    _, _, gemma2 = _patched_pair(client, "gemma2")
    _, _, granite = _patched_pair(client, "granite")
    _, _, cohere = _patched_pair(client, "cohere")
    assert gemma2.softcap == 3.0 and gemma2.temperature == 1.0
    assert granite.temperature == 4.0 and granite.softcap == 0.0
    assert cohere.temperature == pytest.approx(4.0)


def test_without_labels_the_logits_come_from_the_servers_current_weight(client):
    ref, model, head = _patched_pair(client, "llama")
    ids, labels = _batch()
    torch.testing.assert_close(model(input_ids=ids).logits, ref(input_ids=ids).logits)
    want = ref.generate(ids[:, :4], max_new_tokens=4, do_sample=False)
    assert torch.equal(model.generate(ids[:, :4], max_new_tokens=4, do_sample=False), want)

    opt = head.optimizer("sgd", lr=0.5)
    model(input_ids=ids, labels=labels).loss.backward()
    opt.step()
    served = head.download(master=True).weight
    assert _rel(served, ref.lm_head.weight) > 1e-4  # the step moved it
    with torch.no_grad():
        ref.lm_head.weight.copy_(served)
    torch.testing.assert_close(model(input_ids=ids).logits, ref(input_ids=ids).logits)


def test_refuse_mode_and_unknown_models_are_refused_clearly(client):
    model = _model("llama")
    flce.hf.offload_lm_head(model, client, head_id=f"hf-{uuid.uuid4().hex[:8]}",
                            logits="refuse")
    with pytest.raises(RuntimeError, match="pass labels"):
        model(input_ids=_batch()[0])
    with pytest.raises(ValueError, match="already patched"):
        flce.hf.offload_lm_head(model, client)
    flce.hf.restore(model)
    assert model(input_ids=_batch()[0]).logits.shape == (B, T, V)  # its own forward again

    other = _model("llama")
    other.config.model_type = "mystery"
    with pytest.raises(ValueError, match="any_model_type=True"):
        flce.hf.offload_lm_head(other, client)


def test_trainer_with_the_head_trained_on_the_server(client, tmp_path):
    pytest.importorskip("accelerate", reason="the Trainer needs accelerate")
    ids = torch.randint(0, V, (8, T), generator=torch.Generator().manual_seed(3))
    data = [{"input_ids": row, "labels": row.clone()} for row in ids]

    def train(model, callbacks):
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path / uuid.uuid4().hex), max_steps=3,
            per_device_train_batch_size=2, gradient_accumulation_steps=2,
            learning_rate=1e-2, lr_scheduler_type="linear", warmup_steps=0,
            weight_decay=0.0, max_grad_norm=0.0 if callbacks else 1.0, logging_steps=1,
            save_strategy="no", report_to=[], use_cpu=True, seed=0,
            dataloader_num_workers=0)
        trainer = transformers.Trainer(model=model, args=args, train_dataset=data,
                                       callbacks=callbacks)
        trainer.train()
        return [e["loss"] for e in trainer.state.log_history if "loss" in e]

    ref, model, head = _patched_pair(client, "llama")
    opt = head.optimizer("adamw", lr=1e-2, weight_decay=0.0)
    want = train(ref, [])
    got = train(model, [flce.hf.trainer_callback(opt, max_grad_norm=1.0)])
    assert len(got) == len(want) == 3
    assert got == pytest.approx(want, rel=1e-4)
    assert opt.steps == 3
    assert _rel(head.download(master=True).weight, ref.lm_head.weight) <= 1e-4
