#!/usr/bin/env bash
# On the device machine, with .gpu-dist and .served-dist carried (pack_cuda.sh,
# pack_served.sh): the CUDA tests (the peer-memory ones included) and conformance cases,
# the Python client's local-transport tests against a server on the GPU, the transports
# bench at the seed shape, and micro-batch pipelining through CUDA IPC. Logs and results
# go to $OUT.
set -u -o pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp/flce-out}
mkdir -p "$out"
rc=0
"$here/run_cuda.sh" tests || rc=1
dist=$(pwd)/.served-dist; [ -x "$dist/server/flce-server" ] || tar -xJf "$dist/served.tar.xz"
export LD_LIBRARY_PATH=$dist/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
(
  export FLCE_SERVER_BIN=$dist/server/flce-server
  cd tests/python && FLCE_TEST_SERVER_DEVICE=cuda timeout 300 python3 -m pytest -q \
    -p no:cacheprovider -rs test_cuda_ipc.py test_shm.py test_submit.py
) >"$out/pytest-local-transports.log" 2>&1 || rc=1
tail -3 "$out/pytest-local-transports.log"
"$here/run_transports.sh" || rc=1
"$dist/server/flce-server" --port 50092 --metrics-port 0 --data-port=-1 --device cuda \
  --local-transports=shm,cuda_ipc >"$out/server-pipelining.log" 2>&1 &
for body in sleep compute; do
  timeout 150 python3 client/python/examples/pipelined_micro_batches.py --target 127.0.0.1:50092 \
    --vocab 176245 --hidden 1024 --tokens 8192 --micro-batches 8 --steps 5 --body $body \
    --device cuda | tee "$out/pipelined-cuda-ipc-$body.json" | tail -2
done
kill %1; wait
exit $rc
