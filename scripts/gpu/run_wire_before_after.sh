#!/usr/bin/env bash
# On the device machine: a TCP trainer's step through the wire with the build under test
# (.served-dist) against a reference build (.ref-dist), both packed with pack_served.sh
# (the reference with DIST_NAME=.ref-dist BUILD_DIR=<its build> COMMIT=<its commit>).
# 1. iperf3 over loopback (from either dist: pack_served.sh packs Debian's where installed),
#    1 and 2 connections, both directions at once, 5 s each: the host's own reference.
# 2. ROUNDS rounds (numbered from FIRST_ROUND) over SHAPES: flce_cuda_bench's default plan
#    (the engine alone, the build under test) and, per build in an order that alternates,
#    one fresh server (--data-port) and bench/python/bench_step.py in messages and on the
#    data plane (hidden on the GPU, --tcp-only).
# Lines in $OUT/iperf.jsonl and $OUT/wire-before-after.jsonl (label: build and mode),
# the engine's JSON in $OUT/engine-*.json, logs beside them. MODES ("off on" by default:
# the data plane off and on) and ENGINE=0 (no engine-alone runs) narrow a short lease.
set -u -o pipefail
source "$(dirname "$0")/wait_for_server.sh"
for d in .served-dist .ref-dist; do
  [ -x "$d/server/flce-server" ] || tar -xJf "$d/served.tar.xz"
done
new=$(pwd)/.served-dist
ref=$(pwd)/.ref-dist
out=${OUT:-/tmp/flce-out}
mkdir -p "$out"
unset FLCE_CUDA_PLUGIN  # each server takes the plugin of its own build tree
export LD_LIBRARY_PATH=$new/lib:/usr/local/cuda/lib64
py=$(command -v python3)
ROUNDS=${ROUNDS:-2}
STEPS=${STEPS:-5}
SHAPES=${SHAPES:-"0:65535:1024:176245 2:8192:4096:128256 7:32768:4096:128256"}
commit=$(cat "$new/COMMIT")
echo "new $commit ref $(cat "$ref/COMMIT")"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
rc=0

iperf=$new/bin/iperf3
if [[ ${IPERF:-1} == 1 && -x $iperf ]]; then
  "$iperf" -s -p 5299 >"$out/iperf-server.log" 2>&1 &
  iperf_pid=$!
  sleep 1
  for p in 1 2; do
    "$iperf" -c 127.0.0.1 -p 5299 -t 5 -P $p --bidir -J \
      >"$out/iperf-$p.json" 2>&1 &&
      "$py" "$(dirname "$0")/iperf_row.py" "$p" bidir "$out/iperf-$p.json" |
      tee -a "$out/iperf.jsonl"
  done
  kill "$iperf_pid"
fi

dist=$new
source "$(dirname "$0")/engine_rounds.sh"
port=50100
serve() {  # serve DIST NAME INDEX ROUND N H V
  local d=$1 name=$2
  port=$((port + 2))  # a port of its own: nothing can answer for another build's server
  LD_LIBRARY_PATH=$d/lib:/usr/local/cuda/lib64 "$d/server/flce-server" --port $port \
    --data-port $((port + 1)) --metrics-port 0 >"$out/server-$name-$3-$4.log" 2>&1 &
  local pid=$! modes=(${MODES:-off on})
  (( $4 % 2 )) || modes=($(printf '%s\n' "${modes[@]}" | tac))
  wait_for_server "$new/client/cli/flce-client" 127.0.0.1:$port || rc=1
  for mode in "${modes[@]}"; do
    echo "round $4 shape $3 $name data plane $mode"
    timeout 200 "$py" bench/python/bench_step.py --target 127.0.0.1:$port --device cuda \
      --transport grpc --tcp-only --data-plane "$mode" --tokens "$5" --hidden "$6" \
      --vocab "$7" --steps "$STEPS" --label "$name-data-plane-$mode" \
      --json "$out/wire-before-after.jsonl" 2>&1 | tail -1
    [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
  done
  kill "$pid"; wait "$pid"
}
served() {  # served INDEX ROUND N H V: both builds, the order alternating
  if (( $2 % 2 )); then serve "$ref" ref "$@"; serve "$new" new "$@"
  else serve "$new" new "$@"; serve "$ref" ref "$@"; fi
}
[[ ${ENGINE:-1} == 1 ]] || engine() { :; }  # ENGINE=0: the served steps alone
engine_rounds
exit $rc
