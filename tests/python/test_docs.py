"""The README's recipes run as written: the PyTorch snippet against a bf16 model, and the
snippet that writes the .npy files of "A session by hand"."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import fake_server

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


def _section(text: str, title: str, *, prefix: bool = False) -> str:
    """The section under `## title` (prefix: the first heading that starts with it, for
    headings that carry a date)."""
    rest = r"[^\n]*" if prefix else ""
    match = re.search(rf"^## {re.escape(title)}{rest}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert match, f"README.md has no section {title!r}"
    return match.group(1)


def _blocks(section: str, lang: str) -> list:
    return re.findall(rf"^```{lang}\n(.*?)^```", section, re.S | re.M)


def test_from_pytorch_snippet_runs_on_a_bf16_head():
    """Assigning an fp32 gradient to a bf16 weight's .grad raises; the snippet must not."""
    code = _blocks(_section(README, "From PyTorch"), "python")[0]
    server, port = fake_server.start()
    try:
        V, H, N = 37, 16, 12
        torch.manual_seed(0)
        model = nn.Module()
        model.lm_head = nn.Linear(H, V, bias=False).to(torch.bfloat16)
        hidden = torch.randn(N, H, dtype=torch.bfloat16, requires_grad=True)
        targets = torch.randint(0, V, (N,))
        scope = {"model": model, "hidden": hidden, "targets": targets}
        exec(code.replace("127.0.0.1:50051", f"127.0.0.1:{port}"), scope)
        grad = model.lm_head.weight.grad
        assert grad is not None and grad.dtype == torch.bfloat16
        assert grad.shape == (V, H) and grad.float().abs().sum() > 0
        assert hidden.grad is not None and torch.isfinite(hidden.grad.float()).all()
    finally:
        server.stop(None)


def test_from_pytorch_server_optimizer_snippet_trains_the_head(real_server_bin):
    """The second recipe (the head trained on the server) after the first, as written."""
    from conftest import RealServer  # the fake server has no optimizer
    first, second = _blocks(_section(README, "From PyTorch"), "python")
    srv = RealServer(real_server_bin)
    try:
        V, H, N = 37, 16, 12
        torch.manual_seed(0)
        model = nn.Module()
        model.body = nn.Linear(8, H)
        model.lm_head = nn.Linear(H, V)
        hidden = torch.randn(N, H, requires_grad=True)
        targets = torch.randint(0, V, (N,))
        batches = [(torch.randn(N, 8), torch.randint(0, V, (N,))) for _ in range(3)]
        body_params = list(model.body.parameters())
        before = [p.detach().clone() for p in body_params]
        start = model.lm_head.weight.detach().clone()
        scope = {"model": model, "hidden": hidden, "targets": targets, "batches": batches,
                 "body_params": body_params,
                 "body_opt": torch.optim.SGD(body_params, lr=0.1)}
        exec(first.replace("127.0.0.1:50051", srv.target), scope)
        exec(second, scope)
        info = scope["head"].info()
        assert info.optimizer is not None and info.optimizer.steps == 3
        assert scope["opt"].last_step.applied
        assert not torch.equal(model.lm_head.weight, start), "copy_to brought no new weight"
        assert all(not torch.equal(p, b) for p, b in zip(body_params, before))
        scope["head"].client.close()
    finally:
        srv.stop()


def test_session_by_hand_has_a_recipe_for_its_npy_files(tmp_path):
    section = _section(README, "A session by hand")
    recipes = [b for b in _blocks(section, "sh") if "w.npy" in b and "np.save" in b]
    assert recipes, "no recipe writing w.npy, h.npy and t.npy"
    script = "\n".join(line for line in recipes[0].splitlines()
                       if not line.lstrip().startswith(("build/", "$C", "C=", "./")))
    subprocess.run(["bash", "-e", "-c", script.replace("python3 ", "/usr/bin/python3 ")],
                   check=True, cwd=tmp_path)
    w, h, t = (np.load(tmp_path / f) for f in ("w.npy", "h.npy", "t.npy"))
    assert w.ndim == 2 and w.dtype in (np.float32, np.float16)
    assert h.ndim == 2 and h.shape[1] == w.shape[1] and h.dtype == w.dtype
    assert t.shape == (h.shape[0],) and t.dtype in (np.int32, np.int64)
    valid = t[t != -100]
    assert valid.size and valid.min() >= 0 and valid.max() < w.shape[0]
    # the demo head (V=32000, H=512) takes the same hidden states and targets
    assert w.shape == (32000, 512)


@pytest.mark.parametrize("doc", ["docs/OPERATIONS.md", "README.md"])
def test_compose_commands_match_the_installed_docker_compose(doc):
    """setup.sh installs docker-compose 1.29 (`docker-compose`), not the compose plugin."""
    text = (REPO / doc).read_text()
    for block in _blocks(text, "(?:sh|bash)?"):
        assert not re.search(r"^\s*docker compose ", block, re.M), block
    assert not re.findall(r"`docker compose [^`]*`", text)


def test_client_readme_says_session_id_is_keyword_only():
    text = (REPO / "client" / "python" / "README.md").read_text()
    assert re.search(r"RemoteLMHead\(client, head_id, \*, session_id=None", text)
    assert "keyword-only" in text


def test_engine_times_are_kept_in_one_place():
    """Measured step times live in docs/perf; the READMEs point there instead of repeating
    them, so that the two cannot disagree. README keeps only the engine table (from
    bench/results) and client/python/README.md only docs/perf/python.md's serialization
    numbers."""
    perf = _section(README, "Performance (one H200, bf16, forward + backward", prefix=True)
    prose = "\n".join(line for line in perf.splitlines() if not line.startswith("|"))
    assert not re.findall(r"\d[\d.–-]* ms\b", prose), "README repeats served step times"
    assert "docs/perf/python.md" in perf and "docs/perf/cuda.md" in perf
    python_md = (REPO / "docs" / "perf" / "python.md").read_text()
    serialization = python_md.split("## Whole steps")[0]
    client_readme = (REPO / "client" / "python" / "README.md").read_text()
    wire = client_readme.split("## Wire and performance")[1].split("\n## ")[0]
    for number in re.findall(r"(\d[\d.]*)(?:–\d[\d.]*)? ms\b", wire):
        assert re.search(rf"\b{re.escape(number)}\b", serialization), \
            f"client README's {number} ms is not docs/perf/python.md's serialization table"
