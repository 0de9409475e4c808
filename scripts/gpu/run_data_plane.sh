#!/usr/bin/env bash
# On the device machine (carry .served-dist, see pack_served.sh): a TCP trainer's training
# step (bench/python/bench_step.py, hidden on the GPU, --tcp-only) in messages and on the
# data plane (flce-server --data-port), against one fresh server per shape and round,
# beside flce_cuda_bench's default plan at the shape (the engine alone); ROUNDS rounds, the
# order reversed every other round. Then the wire alone (bench/python/bench_wire.py, a
# vocabulary-8 head) at WIRE_SHAPE, messages against the data plane, and the CLI's bench
# both ways (WIRE=0 leaves them out). Lines in $OUT/data-plane.jsonl, $OUT/wire.jsonl,
# $OUT/wire-cli.jsonl and $OUT/engine-*.json.
set -u -o pipefail
source "$(dirname "$0")/wait_for_server.sh"
dist=$(pwd)/.served-dist; [ -x "$dist/server/flce-server" ] || tar -xJf "$dist/served.tar.xz"
out=${OUT:-/tmp/flce-out}
mkdir -p "$out"
export LD_LIBRARY_PATH=$dist/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
unset FLCE_CUDA_PLUGIN  # the server finds the plugin of its build tree by itself
py=$(command -v python3)
cli=$dist/client/cli/flce-client
ROUNDS=${ROUNDS:-2}
STEPS=${STEPS:-5}
SHAPES=${SHAPES:-"0:65535:1024:176245 2:8192:4096:128256 7:32768:4096:128256"}
commit=$(cat "$dist/COMMIT")
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
rc=0

source "$(dirname "$0")/engine_rounds.sh"
served() {  # served INDEX ROUND N H V: messages and the data plane against one fresh server
  "$dist/server/flce-server" --port 50097 --data-port 50098 --metrics-port 0 \
    >"$out/server-$1-$2.log" 2>&1 &
  local pid=$! modes=(off on)
  (( $2 % 2 )) || modes=(on off)
  wait_for_server "$cli" 127.0.0.1:50097 || rc=1
  for mode in "${modes[@]}"; do
    echo "round $2 shape $1 data plane $mode"
    timeout 200 "$py" bench/python/bench_step.py --target 127.0.0.1:50097 --device cuda \
      --transport grpc --tcp-only --data-plane "$mode" --tokens "$3" --hidden "$4" \
      --vocab "$5" --steps "$STEPS" --label "data-plane-$mode" \
      --json "$out/data-plane.jsonl" 2>&1 | tail -1
    [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
  done
  kill "$pid"; wait "$pid"
}
engine_rounds

[[ ${WIRE:-1} == 1 ]] || exit $rc
read -r tokens hidden <<<"${WIRE_SHAPE:-32768 4096}"
"$dist/server/flce-server" --port 50097 --data-port 50098 --metrics-port 0 \
  >"$out/server-wire.log" 2>&1 &
pid=$!
wait_for_server "$cli" 127.0.0.1:50097 || rc=1
timeout 200 "$py" bench/python/bench_wire.py --target 127.0.0.1:50097 --device cuda \
  --tokens "$tokens" --hidden "$hidden" \
  --variants baseline,data_plane,forward_only,data_plane_forward_only,hidden_on_gpu,data_plane_hidden_on_gpu \
  --json "$out/wire.jsonl" | cut -c1-240 || rc=1
for mode in off on; do
  timeout 100 "$cli" --target 127.0.0.1:50097 --transport grpc --data-plane "$mode" bench \
    --head bench-wire \
    --tokens "$tokens" --steps 5 |
    sed "s|^{|{\"data_plane\":\"$mode\",\"vocab\":8,|" | tee -a "$out/wire-cli.jsonl" || rc=1
done
kill "$pid"; wait "$pid"
exit $rc
