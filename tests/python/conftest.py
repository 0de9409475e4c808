"""Fixtures: the flce package from the checkout, and servers to test against.

`server` is parametrized: "fake" (tests/python/fake_server.py, always) and "cpu" (the real
flce-server, started on a free port with --device cpu --metrics-port 0, when
$FLCE_SERVER_BIN names the binary; ctest sets it). $FLCE_TEST_SERVER_DEVICE=cuda runs the
real servers on the GPU instead."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import grpc
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "client" / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import flce  # noqa: E402
import fake_server  # noqa: E402

SERVER_BIN = os.environ.get("FLCE_SERVER_BIN", "")
# The engine real servers run on: "cpu" (CI) or "cuda" (the same tests on a GPU host).
SERVER_DEVICE = os.environ.get("FLCE_TEST_SERVER_DEVICE", "cpu")
# More flags for every server the tests start, e.g. "--gpus 0,0" on a GPU host.
SERVER_ARGS = os.environ.get("FLCE_TEST_SERVER_ARGS", "").split()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RpcError(grpc.RpcError):
    """What a grpc call raises (code() and details()): to make a call fail in a test."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(details)
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


class RealServer:
    """A flce-server process on a free loopback port; its log is kept for failures."""

    def __init__(self, binary: str, *extra: str, client_kwargs: Optional[dict] = None,
                 data_port: Optional[str] = "none"):
        """extra: more flags; client_kwargs: what a client needs to reach it (TLS, token);
        data_port: --data-port (tests of messages keep the data plane off; a flag in extra
        wins), None = the server's default."""
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile(prefix="flce-server-", suffix=".log",
                                               delete=False)
        own = [] if data_port is None else [f"--data-port={data_port}"]
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--metrics-port", "0", "--device", SERVER_DEVICE,
             *own, *SERVER_ARGS, *extra], stdout=self.log, stderr=subprocess.STDOUT)
        self.target = f"127.0.0.1:{self.port}"
        deadline = time.monotonic() + 30
        client = flce.Client(self.target, **(client_kwargs or {}))
        try:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"flce-server exited: {self.log_text()}")
                try:
                    client.wait_ready(0.5)
                    client.server_info()
                    break
                except flce.FlceError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"flce-server not ready: {self.log_text()}")
        finally:
            client.close()

    def log_text(self) -> str:
        return Path(self.log.name).read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        os.unlink(self.log.name)


@pytest.fixture(scope="session")
def real_server_bin():
    if not SERVER_BIN:
        pytest.skip("FLCE_SERVER_BIN is not set (ctest sets it when flce-server is built)")
    return SERVER_BIN


@pytest.fixture(scope="module", params=["fake", "cpu"])
def server_target(request):
    if request.param == "fake":
        server, port = fake_server.start()
        yield f"127.0.0.1:{port}"
        server.stop(None)
        return
    binary = request.getfixturevalue("real_server_bin")
    srv = RealServer(binary)
    yield srv.target
    srv.stop()


@pytest.fixture
def client(server_target):
    with flce.Client(server_target, timeout=60) as c:
        c.wait_ready(10)
        yield c


@pytest.fixture(scope="module")
def real_target(real_server_bin):
    """A real flce-server of the module's own, for what the fake server does not have."""
    srv = RealServer(real_server_bin)
    yield srv.target
    srv.stop()


@pytest.fixture(scope="module")
def shm_target(real_server_bin):
    """A real flce-server of the module's own that offers shared memory."""
    srv = RealServer(real_server_bin, "--local-transports=shm")
    yield srv.target
    srv.stop()


@pytest.fixture
def real_client(real_target):
    with flce.Client(real_target, timeout=120) as c:
        c.wait_ready(10)
        yield c


def probe_region(client, head_id: str, region_id: str, n: int, h: int, hidden_dtype: int,
                 attempts: int = 200):
    """Names `region_id` in forward-only Compute calls until the server answers NOT_FOUND
    (its Regions stream has ended: the region is released) or `attempts` run out; returns
    the last (code, details). While the server has not yet seen the stream end, a probe
    computes and lands nothing."""
    import time
    from flce import wire
    from flce._pb import pb
    header = pb.ComputeHeader(request_id="probe", head_id=head_id, session_id="probe",
                              num_tokens=n, targets=bytes(4 * n), hidden_dtype=hidden_dtype,
                              outputs=pb.OutputSelection(forward_only=True),
                              shared=pb.SharedHidden(region_id=region_id))
    code = details = None
    for _ in range(attempts):
        try:
            list(client._compute(iter([
                wire.encode_compute_header(header.SerializeToString(), h),
                wire.encode_end_of_input(n)])))
        except grpc.RpcError as err:
            code, details = err.code(), err.details()
            if code == grpc.StatusCode.NOT_FOUND:
                break
        time.sleep(0.05)
    return code, details


_KILLED_CLIENT = """
import sys, time, torch
sys.path.insert(0, {pkg!r})
import flce
from flce import wire
from flce._pb import pb
client = flce.Client({target!r}, timeout=60)
on_gpu = {on_gpu!r}
transport = (client.device_transport(torch.empty(1, device="cuda")) if on_gpu
             else client.shared_transport())
dtype = torch.bfloat16 if on_gpu else torch.float32
size = torch.empty((), dtype=dtype).element_size()
region = transport.acquire(2 * {n} * {h} * size)
region.tensor(0, ({n}, {h}), dtype).normal_()
if on_gpu:
    region.mark_written()
print(region.region_id, flush=True)
header = pb.ComputeHeader(request_id="killed", head_id={head!r}, session_id="victim",
                          num_tokens={n}, targets=bytes(4 * {n}),
                          hidden_dtype=pb.DTYPE_BF16 if on_gpu else pb.DTYPE_FP32,
                          outputs=pb.OutputSelection(grad_input=True),
                          shared=pb.SharedHidden(region_id=region.region_id,
                                                 grad_input_offset={n} * {h} * size))
def requests():
    yield wire.encode_compute_header(header.SerializeToString(), {h})
    print("sent", flush=True)
    time.sleep(3600)  # killed here: the end message never comes
for _ in client._compute(requests()):
    pass
"""


def kill_client_mid_call(target: str, head_id: str, n: int, h: int, on_gpu: bool) -> str:
    """Runs a client process that registers a region (shared memory, or GPU memory with
    on_gpu: bf16 instead of fp32), writes hidden into it, sends a Compute header naming it
    for session "victim" and is SIGKILLed before its end message; returns the region id."""
    script = _KILLED_CLIENT.format(pkg=str(REPO / "client" / "python"), target=target,
                                   head=head_id, n=n, h=h, on_gpu=on_gpu)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        region_id = child.stdout.readline().strip()
        assert region_id.startswith("r-")
        assert child.stdout.readline().strip() == "sent"
    finally:
        child.kill()
        child.wait()
    return region_id


def assert_nothing_landed(client, head_id: str, session_id: str) -> None:
    """The session has no contribution (or does not exist)."""
    try:
        assert client.fetch_grad(head_id, session_id=session_id).header.contributions == 0
    except flce.FlceError as err:
        assert err.code == grpc.StatusCode.NOT_FOUND
