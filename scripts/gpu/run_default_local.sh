#!/usr/bin/env bash
# On the device machine (carry .served-dist, see pack_served.sh): a server and a trainer
# started on one host as a user starts them, with no transport flags. The server: no
# --local-transports, no --unix-socket (its defaults: a private Unix socket, regions for
# clients on it that run as its user). The trainer: bench/python/bench_step.py with hidden
# on the GPU and flce.Client's defaults (the Unix socket the server names, then the region
# kind it offers there: CUDA IPC on the server's GPU). Beside it, the same trainer kept on
# TCP loopback (--tcp-only: messages, as the server offers no regions there), and
# flce_cuda_bench's default plan at the shape (the engine alone, inputs on the device).
# ROUNDS rounds, a fresh server per shape and round, the order of the three reversed every
# other round. Lines of $OUT/default-local.jsonl (bench_step.py) and $OUT/engine-*.json.
set -u -o pipefail
dist=$(pwd)/.served-dist; [ -x "$dist/server/flce-server" ] || tar -xJf "$dist/served.tar.xz"
out=${OUT:-/tmp/flce-out}
mkdir -p "$out"
export LD_LIBRARY_PATH=$dist/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
unset FLCE_CUDA_PLUGIN  # the server finds the plugin of its build tree by itself
py=$(command -v python3)
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-5}
# index in flce_cuda_bench's --shapes : tokens : hidden : vocab
SHAPES=${SHAPES:-"0:65535:1024:176245 2:8192:4096:128256 7:32768:4096:128256"}
commit=$(cat "$dist/COMMIT")
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

source "$(dirname "$0")/engine_rounds.sh"
served() {  # served INDEX ROUND N H V: both trainers against one fresh server
  "$dist/server/flce-server" --port 50091 --metrics-port 0 >"$out/server-$1-$2.log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 300); do
    "$dist/client/cli/flce-client" --target 127.0.0.1:50091 health >/dev/null 2>&1 && break
    sleep 0.1
  done
  for mode in default tcp-only; do
    local flags=(--steps "$STEPS")
    [[ $mode == tcp-only ]] && flags=(--tcp-only --steps 3)
    echo "round $2 shape $1 $mode"
    timeout 240 "$py" bench/python/bench_step.py --target 127.0.0.1:50091 --device cuda \
      --tokens "$3" --hidden "$4" --vocab "$5" "${flags[@]}" \
      --json "$out/default-local.jsonl" 2>&1 | tail -1
  done
  kill "$pid"; wait "$pid"
}
engine_rounds
