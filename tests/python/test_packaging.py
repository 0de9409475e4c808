"""The package as shipped: committed stubs that match the proto, imports that never run
protoc, one version, and a pip install into a venv over Debian's packages."""
from __future__ import annotations

import filecmp
import os
import re
import shutil
import stat
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import flce

REPO = Path(__file__).resolve().parents[2]
PKG = REPO / "client" / "python"
STUBS = ("flce/v1/flce_pb2.py", "flce/v1/flce_pb2_grpc.py")
REGENERATE = "scripts/gen_python_stubs.sh"


def _tools_present() -> bool:
    return bool(shutil.which("protoc") and shutil.which("grpc_python_plugin"))


def _env_without_protoc(path_dir: Path, **extra: str) -> dict:
    """PATH limited to one folder without protoc or grpc_python_plugin: what a user of the
    package may have, and what a DDP rank must not need."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FLCE_PROTO_ROOT")}
    env["PATH"] = str(path_dir)
    env.update(extra)
    assert shutil.which("protoc", path=env["PATH"]) is None
    return env


def test_stubs_are_part_of_the_package():
    for stub in STUBS:
        assert (PKG / stub).is_file(), f"{stub} missing: run {REGENERATE}"
    if shutil.which("git") and (REPO / ".git").exists():
        # an ignored stub would never reach a commit, and a clean checkout would lack it
        ignored = subprocess.run(["git", "-C", str(REPO), "check-ignore",
                                  *(str(PKG / s) for s in STUBS)],
                                 capture_output=True, text=True)
        assert ignored.returncode == 1, f"git ignores {ignored.stdout.split()}"


@pytest.mark.skipif(not _tools_present(),
                    reason="protoc and grpc_python_plugin are not installed "
                           "(Debian: protobuf-compiler protobuf-compiler-grpc)")
def test_committed_stubs_match_the_proto(tmp_path):
    """A proto change without regenerated stubs fails here."""
    subprocess.run([str(REPO / REGENERATE), str(tmp_path)], check=True)
    stale = [s for s in STUBS if not filecmp.cmp(tmp_path / s, PKG / s, shallow=False)]
    assert not stale, (f"{stale} differ from what proto/flce/v1/flce.proto generates; "
                       f"regenerate them with `{REGENERATE}` and commit the result")


def test_import_runs_no_code_generation_from_a_read_only_copy(tmp_path):
    """Import from a read-only copy, without the proto beside it and without protoc on PATH,
    stubs older than any proto: it must import what is there and write nothing."""
    copy = tmp_path / "python"
    shutil.copytree(PKG, copy, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info",
                                                             "build"))
    for stub in STUBS:
        os.utime(copy / stub, (0, 0))
    for path in [copy, *copy.rglob("*")]:
        mode = path.stat().st_mode
        path.chmod(mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    code = ("import sys, flce, flce.v1.flce_pb2 as pb; "
            "assert 'flce._codegen' not in sys.modules; "
            "assert pb.ComputeRequest.DESCRIPTOR.fields_by_name['end']; "
            "print(flce.__file__)")
    try:
        out = subprocess.run([sys.executable, "-B", "-c", code], check=True,
                             capture_output=True, text=True, cwd=tmp_path,
                             env=_env_without_protoc(tmp_path, PYTHONPATH=str(copy))).stdout
        assert out.strip() == str(copy / "flce" / "__init__.py")
        assert not any(copy.rglob("__pycache__"))
    finally:
        for path in [copy, *copy.rglob("*")]:
            path.chmod(path.stat().st_mode | stat.S_IWUSR)


def test_one_version():
    """pyproject.toml takes the version from flce.__version__ instead of repeating it."""
    project = tomllib.loads((PKG / "pyproject.toml").read_text())
    assert "version" not in project["project"], "pyproject.toml repeats the version"
    assert "version" in project["project"].get("dynamic", [])
    attr = project["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "flce.__version__"
    assert re.fullmatch(r"\d+\.\d+\.\d+", flce.__version__)
    # the client ships from the same tree as the server and its wire contract (API.md's
    # version notes), so the two version numbers move together
    cmake = re.search(r"project\(flce VERSION (\S+)", (REPO / "CMakeLists.txt").read_text())
    assert cmake and cmake.group(1) == flce.__version__


def test_py_typed_is_shipped():
    assert (PKG / "flce" / "py.typed").is_file()
    project = tomllib.loads((PKG / "pyproject.toml").read_text())
    assert "py.typed" in project["tool"]["setuptools"]["package-data"]["flce"]


@pytest.mark.skipif(not Path("/usr/bin/python3").exists(), reason="needs Debian's python3")
def test_pip_install_into_system_site_packages_venv_without_protoc(tmp_path):
    venv = tmp_path / "venv"
    made = subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages",
                           str(venv)], capture_output=True, text=True)
    if made.returncode != 0 or not (venv / "bin" / "pip").exists():
        pytest.skip("python3 -m venv with pip is unavailable (Debian: apt-get install "
                    f"python3-venv): {made.stderr.strip()[-300:]}")
    src = tmp_path / "src"  # a copy, so that the build leaves the checkout alone
    shutil.copytree(PKG, src, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info",
                                                            "build"))
    env = _env_without_protoc(venv / "bin")
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-build-isolation",
                    "--no-index", "--no-deps", str(src)], check=True, env=env, cwd=tmp_path)
    shutil.rmtree(src)  # the installed copy must stand alone
    code = ("import importlib.metadata as md, pathlib, flce, flce.v1.flce_pb2; "
            "root = pathlib.Path(flce.__file__).parent; "
            "assert (root / 'py.typed').is_file(); "
            "assert md.version('flce') == flce.__version__, md.version('flce'); "
            "print(flce.__file__)")
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code], check=True,
                         capture_output=True, text=True, cwd=tmp_path, env=env).stdout
    assert str(venv) in out
