#!/usr/bin/env bash
# Sets up and builds flce, starts flce-server on its embedded "demo" head
# (V=32000, H=512, bf16), and runs a short client session against it:
# a loss + grad_input computation, the accumulated grad_W, and a small bench.
#   scripts/demo.sh [--skip-setup]   (--skip-setup: no package installs, and no build when
#                                     the binaries are there already, e.g. a build tree
#                                     carried to a GPU host without a registry)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
skip_setup=0
for arg in "$@"; do
  case "$arg" in
    --skip-setup) skip_setup=1 ;;
    *) echo "usage: $0 [--skip-setup]" >&2; exit 2 ;;
  esac
done
((skip_setup)) || "$root/scripts/setup.sh"
build="${FLCE_BUILD_DIR:-$root/build}"
python="${FLCE_PYTHON:-/usr/bin/python3}"  # with numpy (python3-numpy from setup.sh)
if ! ((skip_setup)) || [ ! -x "$build/server/flce-server" ] || [ ! -x "$build/client/cli/flce-client" ]; then
  FLCE_BUILD_DIR="$build" "$root/scripts/build.sh"
fi

port="${FLCE_PORT:-50051}"
metrics_port="${FLCE_METRICS_PORT:-9464}"
work="$(mktemp -d)"
server_log="$work/server.log"
# Read by OpenBLAS when it loads (the CPU engine; see docs/perf/cpu.md).
OPENBLAS_THREAD_TIMEOUT="${OPENBLAS_THREAD_TIMEOUT:-4}" \
  "$build/server/flce-server" --port "$port" --metrics-port "$metrics_port" --device auto \
  >"$server_log" 2>&1 &
server_pid=$!
cleanup() {
  kill -TERM "$server_pid" 2>/dev/null || true
  wait "$server_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

client() { "$build/client/cli/flce-client" --target "127.0.0.1:$port" "$@"; }
for _ in $(seq 1 100); do
  client health >/dev/null 2>&1 && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$server_log"; exit 1; }
  sleep 0.1
done
# Another server already on the port would have answered the health check:
# ours then fails to bind and exits.
sleep 0.5
if ! kill -0 "$server_pid" 2>/dev/null; then
  echo "flce-server did not start (is port $port or $metrics_port in use? set FLCE_PORT / FLCE_METRICS_PORT):" >&2
  cat "$server_log" >&2
  exit 1
fi
echo "== server"; client server-info
engine="$(client server-info | "$python" -c 'import json, sys; print(json.load(sys.stdin)["engine"])')"
echo "== served by the ${engine} engine"
grep -E ' W |no CUDA engine' "$server_log" || true
echo "== the embedded head"; client describe --head demo

# 1024 tokens of random hidden states and targets, 5% of them ignored (-100).
"$python" - "$work" <<'PY'
import sys, numpy as np
rng = np.random.default_rng(0)
h = rng.standard_normal((1024, 512), dtype=np.float32)
t = rng.integers(0, 32000, size=1024).astype(np.int64)
t[rng.random(1024) < 0.05] = -100
np.save(f"{sys.argv[1]}/h.npy", h)
np.save(f"{sys.argv[1]}/t.npy", t)
PY
echo "== compute: loss and grad_input for 1024 tokens"
client compute --head demo --session demo-session --hidden "$work/h.npy" --targets "$work/t.npy" \
  --out-grad-input "$work/gx.npy"
echo "== fetch the session's accumulated grad_W"
client fetch-grad --head demo --session demo-session --out "$work/gw.npy" --reset
echo "== bench: 4 steps of 4096 tokens"
client bench --head demo --tokens 4096 --steps 4
echo "== metrics (excerpt)"
curl -s "http://127.0.0.1:$metrics_port/metrics" | grep -E '^flce_(requests|tokens)_total' || true
echo "== the demo ran on the ${engine} engine"
