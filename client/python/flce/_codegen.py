"""Generates the gRPC stubs of proto/flce/v1/flce.proto into this package (flce/v1/).

Run as `/usr/bin/python3 -m flce._codegen` (setup.py's build step and the tests do), or let
`import flce` do it when the stubs are missing or older than the proto.

Why the system protoc: Debian's grpc_tools bundles protoc 3.5, which rejects proto3
`optional`; protoc 3.21 with gRPC's own Python plugin handles it.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

PROTO_FILE = "flce/v1/flce.proto"
PACKAGE_ROOT = Path(__file__).resolve().parent.parent  # the folder holding flce/
STUBS = ("flce/v1/flce_pb2.py", "flce/v1/flce_pb2_grpc.py")


def find_proto_root() -> Path | None:
    """$FLCE_PROTO_ROOT, else the repository's proto/ when running from a checkout."""
    env = os.environ.get("FLCE_PROTO_ROOT")
    candidates = [Path(env)] if env else []
    candidates.append(PACKAGE_ROOT.parent.parent / "proto")  # client/python/../../proto
    for root in candidates:
        if (root / PROTO_FILE).is_file():
            return root
    return None


def _find_tool(env_name: str, name: str, fallback: str) -> str:
    path = os.environ.get(env_name) or shutil.which(name) or fallback
    if not Path(path).exists():
        raise RuntimeError(f"{name} not found (set ${env_name}); Debian: apt-get install "
                           "protobuf-compiler protobuf-compiler-grpc")
    return path


def generate(proto_root: Path | None = None, out_dir: Path = PACKAGE_ROOT) -> None:
    proto_root = proto_root or find_proto_root()
    if proto_root is None:
        raise RuntimeError(f"cannot find {PROTO_FILE}: set $FLCE_PROTO_ROOT")
    protoc = _find_tool("FLCE_PROTOC", "protoc", "/usr/bin/protoc")
    plugin = _find_tool("FLCE_GRPC_PYTHON_PLUGIN", "grpc_python_plugin",
                        "/usr/bin/grpc_python_plugin")
    subprocess.run([protoc, f"-I{proto_root}", f"--python_out={out_dir}",
                    f"--grpc_python_out={out_dir}",
                    f"--plugin=protoc-gen-grpc_python={plugin}", PROTO_FILE], check=True)


def stale(out_dir: Path = PACKAGE_ROOT) -> bool:
    """Stubs missing, or older than a proto we can see (an installed copy sees none)."""
    stubs = [out_dir / s for s in STUBS]
    if not all(s.is_file() for s in stubs):
        return True
    root = find_proto_root()
    if root is None:
        return False
    proto_mtime = (root / PROTO_FILE).stat().st_mtime
    return any(s.stat().st_mtime < proto_mtime for s in stubs)


def ensure() -> None:
    if stale():
        generate()


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else None)
