"""The stubs generator and a pip install into a venv over Debian's packages."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from flce import _codegen

REPO = Path(__file__).resolve().parents[2]
needs_protoc = pytest.mark.skipif(
    not (shutil.which("protoc") and shutil.which("grpc_python_plugin")),
    reason="protoc and grpc_python_plugin are not installed")


@needs_protoc
def test_generate_into_a_fresh_folder(tmp_path):
    _codegen.generate(out_dir=tmp_path)
    for stub in _codegen.STUBS:
        assert (tmp_path / stub).is_file()
    code = ("from flce.v1 import flce_pb2 as pb; "
            "h = pb.ComputeHeader(ignore_index=-1); assert h.HasField('ignore_index')")
    subprocess.run([sys.executable, "-c", code], check=True,
                   env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert not _codegen.stale(tmp_path)


@needs_protoc
def test_stubs_older_than_the_proto_are_stale(tmp_path):
    _codegen.generate(out_dir=tmp_path)
    stub = tmp_path / _codegen.STUBS[0]
    os.utime(stub, (0, 0))
    assert _codegen.stale(tmp_path)


@needs_protoc
@pytest.mark.skipif(not Path("/usr/bin/python3").exists(), reason="needs Debian's python3")
def test_pip_install_into_system_site_packages_venv(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", str(venv)],
                   check=True)
    src = tmp_path / "src"  # a copy, so that the build leaves the checkout alone
    subprocess.run(["cp", "-r", str(REPO / "client" / "python"), str(src)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-build-isolation",
                    "--no-index", "--no-deps", str(src)], check=True,
                   env={**os.environ, "FLCE_PROTO_ROOT": str(REPO / "proto")})
    out = subprocess.run([str(venv / "bin" / "python"), "-c",
                          "import flce, flce.v1.flce_pb2; print(flce.__file__)"],
                         check=True, capture_output=True, text=True, cwd=tmp_path).stdout
    assert str(venv) in out
