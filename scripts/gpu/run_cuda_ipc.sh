#!/usr/bin/env bash
# On the device machine, with .gpu-dist and .served-dist carried (pack_cuda.sh,
# pack_served.sh): the CUDA tests (the peer-memory ones included) and conformance cases,
# the Python client's local-transport tests against a server on the GPU, then the
# transports bench at the seed shape. Logs and results go to $OUT.
set -u -o pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp/flce-out}
mkdir -p "$out"
rc=0
"$here/run_cuda.sh" tests || rc=1
dist=$(pwd)/.served-dist; [ -x "$dist/server/flce-server" ] || tar -xJf "$dist/served.tar.xz"
(
  export LD_LIBRARY_PATH=$dist/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
  export FLCE_SERVER_BIN=$dist/server/flce-server
  cd tests/python && FLCE_TEST_SERVER_DEVICE=cuda timeout 300 python3 -m pytest -q \
    -p no:cacheprovider -rs test_cuda_ipc.py test_shm.py test_submit.py
) >"$out/pytest-local-transports.log" 2>&1 || rc=1
tail -15 "$out/pytest-local-transports.log"
"$here/run_transports.sh" || rc=1
exit $rc
