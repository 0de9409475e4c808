#!/usr/bin/env bash
# On the device machine (carry .served-dist, see pack_served.sh): a remote trainer's step in
# messages over TCP loopback (bench/python/bench_step.py --tcp-only, hidden on the GPU) with
# its hidden over several connections (flce.Client(connections=N): ComputePiece) and the
# engine's token chunk the call asks for (ComputeHeader.chunk_tokens; 0 = the plan's),
# beside flce_cuda_bench's default plan at the shape (the engine alone), at the wire issue's
# three shapes. VARIANTS lists CONNECTIONS:CHUNK_TOKENS. ROUNDS rounds from FIRST_ROUND, a
# fresh server per shape and round, the engine first in odd rounds and last in even ones
# (so that two calls of one round each, FIRST_ROUND=1 then 2, balance the order too).
# Lines of $OUT/pieces.jsonl (bench_step.py) and $OUT/engine-*.json.
set -u -o pipefail
dist=$(pwd)/.served-dist; [ -x "$dist/server/flce-server" ] || tar -xJf "$dist/served.tar.xz"
out=${OUT:-/tmp/flce-out}
mkdir -p "$out"
export LD_LIBRARY_PATH=$dist/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
unset FLCE_CUDA_PLUGIN  # the server finds the plugin of its build tree by itself
py=$(command -v python3)
ROUNDS=${ROUNDS:-2}
STEPS=${STEPS:-4}
VARIANTS=${VARIANTS:-"1:0 2:0 4:0"}
# index in flce_cuda_bench's --shapes : tokens : hidden : vocab
SHAPES=${SHAPES:-"0:65535:1024:176245 2:8192:4096:128256 7:32768:4096:128256"}
commit=$(cat "$dist/COMMIT")
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

source "$(dirname "$0")/engine_rounds.sh"
served() {  # served INDEX ROUND N H V
  "$dist/server/flce-server" --port 50092 --metrics-port 0 --data-port=-1 >"$out/server-$1-$2.log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 300); do
    "$dist/client/cli/flce-client" --target 127.0.0.1:50092 health >/dev/null 2>&1 && break
    sleep 0.1
  done
  local order=($VARIANTS) c k
  (( $2 % 2 )) || order=($(printf '%s\n' "${order[@]}" | tac))
  for variant in "${order[@]}"; do
    IFS=: read -r c k <<<"$variant"
    echo "round $2 shape $1 connections $c chunk_tokens $k"
    timeout 150 "$py" bench/python/bench_step.py --target 127.0.0.1:50092 --device cuda \
      --tokens "$3" --hidden "$4" --vocab "$5" --tcp-only --connections "$c" --chunk-tokens "$k" \
      --steps "$STEPS" --json "$out/pieces.jsonl" 2>&1 | tail -1
  done
  kill "$pid"; wait "$pid"
}
engine_rounds
