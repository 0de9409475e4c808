#!/usr/bin/env bash
# Regenerates the Python client's gRPC stubs (client/python/flce/v1/flce_pb2*.py) from
# proto/flce/v1/flce.proto. The stubs are committed, so that `import flce` and
# `pip install client/python` need neither protoc nor the proto; run this after every
# change to the proto and commit the result (tests/python/test_packaging.py compares them).
#
# Usage: scripts/gen_python_stubs.sh [OUT_DIR]   (default: client/python, the package root)
#
# The system protoc (Debian: protobuf-compiler, 3.21) with gRPC's Python plugin (Debian:
# protobuf-compiler-grpc): Debian's python3-grpc-tools bundles protoc 3.5, which rejects
# proto3 `optional`. $PROTOC and $GRPC_PYTHON_PLUGIN override the tools.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$repo/client/python}"
protoc="${PROTOC:-$(command -v protoc || true)}"
plugin="${GRPC_PYTHON_PLUGIN:-$(command -v grpc_python_plugin || true)}"
if [[ -z "$protoc" || -z "$plugin" ]]; then
  echo "gen_python_stubs.sh: needs protoc and grpc_python_plugin" \
       "(Debian: apt-get install protobuf-compiler protobuf-compiler-grpc)" >&2
  exit 2
fi
mkdir -p "$out"
"$protoc" -I"$repo/proto" --python_out="$out" --grpc_python_out="$out" \
  --plugin=protoc-gen-grpc_python="$plugin" flce/v1/flce.proto
