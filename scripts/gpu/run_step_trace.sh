#!/usr/bin/env bash
# On the device machine (see pack_served.sh; carry .served-dist): where a training step's
# time goes at the seed shape (65535 x 1024 x 176245, bf16) from PyTorch with hidden on the
# GPU, per transport: bench/python/trace_step.py's phases next to the server's request log
# (header_ms, setup_ms, input_ms, finish_ms, land_ms, duration_ms of each Compute and Commit), with
# flce_cuda_bench's default plan at that shape in the same session as the baseline.
set -u -o pipefail
source "$(dirname "$0")/served_seed_step.sh" /tmp/flce-trace.sock
for run in 1 2; do
  for transport in ${TRANSPORTS:-cuda_ipc shm grpc}; do
    timeout 120 "$py" bench/python/trace_step.py --target 127.0.0.1:50091 --device cuda \
      --transport "$transport" --steps 7 --json "$out/trace.jsonl" 2>&1 | tail -1
  done
done
kill %1; wait
grep -E "rpc=(Compute|Commit)" "$out/server.log" | tail -24
