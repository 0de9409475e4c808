"""Released clients against this server, and this client against a released server's
protocol, in messages: the 0.9 and 0.11 Python clients (taken from this repository's
history with `git archive`) compute against today's flce-server exactly what today's client
computes, and today's client (several connections asked for, its defaults otherwise)
computes against each release's test server (tests/python/fake_server.py as it was then)
exactly what that release's own client computes there. A server with a data plane serves
the released clients in messages, and today's client on the data plane, the same bits."""
from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

import flce
from conftest import RealServer

REPO = Path(__file__).resolve().parents[2]
# the last commit of each release
RELEASES = {"0.9.0": "50bc0a7^", "0.11.0": "337be8f"}
V, H, N = 67, 40, 2500

# Run by a release's Python: one Compute of the problem below, its results to a JSON file.
CLIENT_SCRIPT = r"""
import hashlib, json, sys, torch, flce
target, out, want = sys.argv[1], sys.argv[2], sys.argv[3]
assert flce.__version__ == want, (flce.__version__, want)
g = torch.Generator().manual_seed(21)
w = torch.randn(%(V)d, %(H)d, generator=g) * 0.2
x = torch.randn(%(N)d, %(H)d, generator=g)
y = torch.randint(0, %(V)d, (%(N)d,), generator=g)
with flce.Client(target, timeout=60, chunk_bytes=32 << 10) as c:
    c.upload_head("compat", w)
    r = c.compute("compat", x, y, deterministic=True, session_id="old")
    json.dump({"loss": r.loss, "grad_input": hashlib.sha256(
        r.grad_input.contiguous().numpy().tobytes()).hexdigest()}, open(out, "w"))
""" % {"V": V, "H": H, "N": N}

SERVER_SCRIPT = r"""
import sys, fake_server
server, port = fake_server.start()
print(port, flush=True)
server.wait_for_termination()
"""


def _problem():
    g = torch.Generator().manual_seed(21)
    w = torch.randn(V, H, generator=g) * 0.2
    x = torch.randn(N, H, generator=g)
    y = torch.randint(0, V, (N,), generator=g)
    return w, x, y


@pytest.fixture(scope="module", params=sorted(RELEASES))
def release(request, tmp_path_factory):
    """(version, directory holding that release's client/python and tests/python)."""
    version, rev = request.param, RELEASES[request.param]
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "client/python",
                              "tests/python"], capture_output=True)
    if archive.returncode != 0:
        pytest.skip(f"release {version} ({rev}) is not in this clone's history "
                    f"(a shallow clone?): {archive.stderr.decode().strip()}")
    root = tmp_path_factory.mktemp(f"flce-{version}")
    tarfile.open(fileobj=io.BytesIO(archive.stdout)).extractall(root)
    return version, root


def _run_old_client(release, target: str, tmp_path) -> dict:
    version, root = release
    out = tmp_path / "old.json"
    env = dict(os.environ, PYTHONPATH=str(root / "client" / "python"),
               PYTHONDONTWRITEBYTECODE="1")
    done = subprocess.run([sys.executable, "-c", CLIENT_SCRIPT, target, str(out), version],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


def _new_client_result(target: str, **kw) -> dict:
    w, x, y = _problem()
    with flce.Client(target, timeout=60, chunk_bytes=32 << 10, **kw) as c:
        c.upload_head("compat-new", w)
        r = c.compute("compat-new", x, y, deterministic=True, session_id="new")
    return {"loss": r.loss, "grad_input": hashlib.sha256(
        r.grad_input.contiguous().numpy().tobytes()).hexdigest()}


def test_a_released_client_computes_against_this_server(release, real_server_bin, tmp_path):
    srv = RealServer(real_server_bin, data_port=None)  # this server's defaults
    try:
        old = _run_old_client(release, srv.target, tmp_path)
        assert old == _new_client_result(srv.target)
    finally:
        srv.stop()


def test_a_released_client_computes_against_a_server_with_a_data_plane(release, real_server_bin,
                                                                       tmp_path):
    """The released client in messages, today's on the data plane: the same bits."""
    srv = RealServer(real_server_bin, "--data-port=0")
    try:
        old = _run_old_client(release, srv.target, tmp_path)
        assert old == _new_client_result(srv.target, transport="grpc", data_plane=True)
    finally:
        srv.stop()


def test_this_client_computes_against_a_released_servers_protocol(release, tmp_path):
    version, root = release
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(root / "client" / "python"), str(root / "tests" / "python")]),
        PYTHONDONTWRITEBYTECODE="1")
    server = subprocess.Popen([sys.executable, "-c", SERVER_SCRIPT], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        port = server.stdout.readline().strip()
        assert port.isdigit(), server.stderr.read()[-3000:]
        target = f"127.0.0.1:{port}"
        old = _run_old_client(release, target, tmp_path)
        assert _new_client_result(target, connections=4) == old
    finally:
        server.kill()
        server.wait()
