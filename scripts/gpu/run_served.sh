#!/usr/bin/env bash
# On the device machine (see pack_served.sh): the served path. The same
# inputs through flce-server --device cuda and --device cpu, compared; then
# end-to-end tokens/s through gRPC on loopback at the first bench shape.
set -u -o pipefail
dist=$(pwd)/.served-dist; [ -x "$dist/server/flce-server" ] || tar -xJf "$dist/served.tar.xz"
out=${OUT:-/tmp/flce-out}
mkdir -p "$out"
export LD_LIBRARY_PATH=$dist/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
unset FLCE_CUDA_PLUGIN  # the server must find the plugin in the build tree's layout by itself
# The README's demo on the packed build tree: which engine served it.
FLCE_PYTHON="$(command -v python3)" FLCE_BUILD_DIR="$dist" FLCE_PORT=50071 FLCE_METRICS_PORT=50072 scripts/demo.sh --skip-setup \
  >"$out/demo.log" 2>&1
echo "demo rc=$?: $(grep -E 'served by|ran on|W flce-server' "$out/demo.log" | tr '\n' ' ')"
py=$(command -v python3)
"$dist/server/flce-server" --port 50061 --metrics-port 0 --data-port=-1 --device cuda \
  >"$out/server-cuda.log" 2>&1 &
"$dist/server/flce-server" --port 50062 --metrics-port 0 --data-port=-1 --device cpu \
  >"$out/server-cpu.log" 2>&1 &
cl() { "$dist/client/cli/flce-client" --target "127.0.0.1:$1" "${@:2}"; }
for port in 50061 50062; do
  for _ in $(seq 1 200); do cl $port health >/dev/null 2>&1 && break; sleep 0.1; done
done
cl 50061 server-info
"$py" - "$out" <<'PY'
import sys, numpy as np
rng = np.random.default_rng(7)
h = rng.standard_normal((3001, 512), dtype=np.float32)
t = rng.integers(0, 32000, size=3001).astype(np.int64); t[rng.random(3001) < 0.05] = -100
np.save(f"{sys.argv[1]}/h.npy", h); np.save(f"{sys.argv[1]}/t.npy", t)
PY
for port in 50061 50062; do
  cl $port compute --head demo --session s --hidden "$out/h.npy" --targets "$out/t.npy" --out-grad-input "$out/gx-$port.npy" >"$out/compute-$port.json"
  cl $port fetch-grad --head demo --session s --out "$out/gw-$port.npy" >/dev/null
  cat "$out/compute-$port.json"; echo
done
"$py" - "$out" <<'PY'
import sys, json, numpy as np
o = sys.argv[1]
def rel(a, b): a, b = a.astype(np.float64), b.astype(np.float64); return float(np.linalg.norm(a - b) / np.linalg.norm(b))
lc, lp = (json.load(open(f"{o}/compute-{p}.json"))["loss"] for p in (50061, 50062))
print(json.dumps({"served_cuda_vs_cpu": {"loss_rel": abs(lc - lp) / abs(lp),
  "grad_input_rel": rel(np.load(f"{o}/gx-50061.npy"), np.load(f"{o}/gx-50062.npy")),
  "grad_w_rel": rel(np.load(f"{o}/gw-50061.npy"), np.load(f"{o}/gw-50062.npy"))}}))
rng = np.random.default_rng(3)
w = (rng.standard_normal((176245, 1024), dtype=np.float32) / 32).astype(np.float32)
np.save(f"{o}/w.npy", (w.view(np.uint32) >> 16).astype(np.uint16))  # bf16 bits (truncation is fine for a bench)
PY
cl 50061 load-weight --head seed --weight "$out/w.npy" --dtype bf16
cl 50061 bench --head seed --tokens 65535 --steps 5 --warmup 2 | tee "$out/served-bench.json"
rm -f "$out"/w.npy "$out"/*.npy
kill %1 %2; wait
# The per-byte host work of a call (fingerprint, non-finite scans) on this host's cores.
"$dist/bench/server/flce_host_bench" --benchmark_repetitions=5 --benchmark_report_aggregates_only=true \
  --benchmark_out="$out/host-bench.json" 2>&1 | tee "$out/host-bench.log"
