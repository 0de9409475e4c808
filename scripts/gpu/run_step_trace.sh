#!/usr/bin/env bash
# On the device machine (see pack_served.sh; carry .served-dist): where a training step's
# time goes at the seed shape (65535 x 1024 x 176245, bf16) from PyTorch with hidden on the
# GPU, per transport: client/python/trace_step.py's phases next to the server's request log
# (setup_ms, input_ms, finish_ms, land_ms and duration_ms of each Compute and Commit), with
# flce_cuda_bench's default plan at that shape in the same session as the baseline.
set -u -o pipefail
dist=$(pwd)/.served-dist; [ -x "$dist/server/flce-server" ] || tar -xJf "$dist/served.tar.xz"
out=${OUT:-/tmp/flce-out}
mkdir -p "$out"
export LD_LIBRARY_PATH=$dist/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
py=$(command -v python3)
"$dist/bench/cuda/flce_cuda_bench" --shapes=0 --strategies=auto --runs=5 \
  --out="$out/engine-baseline.json" --commit="$(cat "$dist/COMMIT")" 2>&1 | tail -2
"$dist/server/flce-server" --port 50091 --metrics-port 0 --device cuda --local-transports=shm,cuda_ipc \
  --unix-socket=/tmp/flce-trace.sock ${SERVER_FLAGS:-} >"$out/server.log" 2>&1 &
for _ in $(seq 1 300); do "$dist/client/cli/flce-client" --target 127.0.0.1:50091 health >/dev/null 2>&1 && break; sleep 0.1; done
for run in 1 2; do
  for transport in ${TRANSPORTS:-cuda_ipc shm grpc}; do
    timeout 120 "$py" client/python/trace_step.py --target 127.0.0.1:50091 --device cuda \
      --transport "$transport" --steps 7 --json "$out/trace.jsonl" 2>&1 | tail -1
  done
done
kill %1; wait
grep -E "rpc=(Compute|Commit)" "$out/server.log" | tail -24
