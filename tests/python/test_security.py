"""flce.Client's bearer token and TLS options against a real flce-server started with
--auth-token-file, and with --tls-cert/--tls-key (a test CA made by the openssl CLI)."""
from __future__ import annotations

import shutil
import subprocess
import uuid

import grpc
import pytest
import torch
from torch import nn

import flce
from conftest import RealServer

TOKENS = "# token tenant [admin]\ntok-a alice\ntok-admin root admin\n"
FAST = 5.0  # seconds: every call here is tiny; a refused one must fail fast, not hang


@pytest.fixture(scope="module")
def token_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("auth") / "tokens"
    path.write_text(TOKENS)
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def auth_server(real_server_bin, token_file):
    srv = RealServer(real_server_bin, "--auth-token-file", str(token_file),
                     client_kwargs=dict(auth_token="tok-a"))
    yield srv
    srv.stop()


@pytest.fixture(autouse=True)
def no_token_from_the_environment(monkeypatch):
    monkeypatch.delenv("FLCE_AUTH_TOKEN", raising=False)


def _step(client: flce.Client) -> None:
    """Upload a tiny head, one forward/backward, fetch the gradient."""
    g = torch.Generator().manual_seed(0)
    lin = nn.Linear(8, 11, bias=False)
    head = flce.RemoteLMHead(client, f"sec-{uuid.uuid4().hex[:6]}")
    head.load_from_module(lin, dtype=torch.float32)
    x = torch.randn(5, 8, generator=g, requires_grad=True)
    head(x, torch.randint(0, 11, (5,), generator=g)).backward()
    assert x.grad is not None
    assert head.fetch_grad(reset=True).header.contributions == 1


def _refused(client: flce.Client, code: grpc.StatusCode) -> flce.FlceError:
    with pytest.raises(flce.FlceError) as info:
        client.server_info()
    assert info.value.code == code, info.value
    return info.value


# ------------------------------------------------------------------ tokens --

def test_no_token_is_unauthenticated(auth_server):
    with flce.Client(auth_server.target, timeout=FAST) as client:
        err = _refused(client, grpc.StatusCode.UNAUTHENTICATED)
        assert err.method == "GetServerInfo"
        with pytest.raises(flce.FlceError) as info:  # the bulk RPCs too
            _step(client)
        assert info.value.code == grpc.StatusCode.UNAUTHENTICATED


def test_unknown_token_is_unauthenticated(auth_server):
    with flce.Client(auth_server.target, timeout=FAST, auth_token="tok-nobody") as client:
        err = _refused(client, grpc.StatusCode.UNAUTHENTICATED)
        assert "tok-nobody" not in str(err)


@pytest.mark.parametrize("how", ["argument", "file", "environment", "admin"])
def test_good_token_works(auth_server, tmp_path, monkeypatch, how):
    kwargs = {}
    if how == "argument":
        kwargs["auth_token"] = "tok-a"
    elif how == "admin":
        kwargs["auth_token"] = "tok-admin"
    elif how == "file":
        path = tmp_path / "my.token"
        path.write_text("tok-a\n")
        kwargs["auth_token_file"] = str(path)
    else:
        monkeypatch.setenv("FLCE_AUTH_TOKEN", "tok-a")
    with flce.Client(auth_server.target, timeout=FAST, **kwargs) as client:
        assert client.server_info().engine == "cpu"
        _step(client)


# --------------------------------------------------------------------- TLS --

def _make_certs(d) -> dict:
    """A test CA, a server certificate it signs (SAN IP:127.0.0.1, DNS:localhost), and a
    second CA that signed nothing; EC keys, generated in milliseconds (as tests/server)."""
    key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
    script = f"""set -e
openssl req -x509 {key} -keyout ca.key -out ca.crt -days 2 -subj '/CN=flce test CA'
openssl req -x509 {key} -keyout other-ca.key -out other-ca.crt -days 2 -subj '/CN=flce other CA'
openssl req {key} -keyout server.key -out server.csr -subj '/CN=localhost'
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > server.ext
openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
  -extfile server.ext -out server.crt
openssl req {key} -keyout client.key -out client.csr -subj '/CN=flce test client'
openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -out client.crt
"""
    done = subprocess.run(["sh", "-c", script], cwd=d, capture_output=True, text=True,
                          timeout=60)
    if done.returncode != 0:
        pytest.fail(f"openssl failed: {done.stderr}")
    files = {"ca": "ca.crt", "other_ca": "other-ca.crt", "server": "server.crt",
             "server_key": "server.key", "client": "client.crt", "client_key": "client.key"}
    return {name: str(d / f) for name, f in files.items()}


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("no openssl CLI to make a test CA")
    return _make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def tls_server(real_server_bin, certs, token_file):
    srv = RealServer(real_server_bin, "--tls-cert", certs["server"],
                     "--tls-key", certs["server_key"], "--auth-token-file", str(token_file),
                     client_kwargs=dict(tls_ca=certs["ca"], auth_token="tok-a"))
    yield srv
    srv.stop()


def test_tls_with_the_ca_and_a_token_works(tls_server, certs):
    with flce.Client(tls_server.target, timeout=FAST, tls_ca=certs["ca"],
                     auth_token="tok-a") as client:
        _step(client)


def test_tls_server_name_override(tls_server, certs):
    # "localhost" is in the certificate; the target's address is what we dial
    with flce.Client(tls_server.target, timeout=FAST, tls_ca=certs["ca"],
                     tls_server_name="localhost", auth_token="tok-a") as client:
        assert client.server_info().engine == "cpu"


def test_tls_with_the_ca_but_no_token_is_unauthenticated(tls_server, certs):
    with flce.Client(tls_server.target, timeout=FAST, tls_ca=certs["ca"]) as client:
        _refused(client, grpc.StatusCode.UNAUTHENTICATED)


@pytest.mark.parametrize("how", ["plaintext", "other_ca", "system_roots"])
def test_tls_server_refuses_clients_that_cannot_verify_it(tls_server, certs, how):
    kwargs = {"plaintext": {}, "other_ca": {"tls_ca": certs["other_ca"]},
              "system_roots": {"tls": True}}[how]
    with flce.Client(tls_server.target, timeout=FAST, auth_token="tok-a", **kwargs) as client:
        _refused(client, grpc.StatusCode.UNAVAILABLE)


@pytest.fixture(scope="module")
def mtls_server(real_server_bin, certs):
    srv = RealServer(real_server_bin, "--tls-cert", certs["server"],
                     "--tls-key", certs["server_key"], "--tls-client-ca", certs["ca"],
                     client_kwargs=dict(tls_ca=certs["ca"], tls_cert=certs["client"],
                                        tls_key=certs["client_key"]))
    yield srv
    srv.stop()


def test_mutual_tls_needs_the_client_certificate(mtls_server, certs):
    with flce.Client(mtls_server.target, timeout=FAST, tls_ca=certs["ca"],
                     tls_cert=certs["client"], tls_key=certs["client_key"]) as client:
        _step(client)
    with flce.Client(mtls_server.target, timeout=FAST, tls_ca=certs["ca"]) as client:
        _refused(client, grpc.StatusCode.UNAVAILABLE)


def test_tls_cert_without_key_is_refused_early():
    with pytest.raises(ValueError):
        flce.Client("127.0.0.1:1", tls_cert="client.crt")
