#!/usr/bin/env bash
# On the device machine (carry .served-dist: pack_served.sh): plain training steps through
# messages over TCP (bench/python/bench_step.py, hidden on the GPU) against the server with
# glibc's malloc as it is and with fixed thresholds (GLIBC_TUNABLES: trim 1 GiB, mmap 32 MiB,
# so freed memory stays mapped and a grad_input chunk's buffer is not faulted in anew for
# every chunk; setting either alone turns glibc's dynamic mmap threshold off),
# alternated per round (the order reversed every round), a fresh server each time, at
# SHAPES ("tokens hidden vocab", comma-separated). Lines in $OUT/server-malloc.jsonl,
# "label" naming the setting.
set -u -o pipefail
source "$(dirname "$0")/wait_for_server.sh"
out=${OUT:-/tmp/flce-out}
mkdir -p "$out"
dist=$(pwd)/.served-dist; [ -x "$dist/server/flce-server" ] || tar -xJf "$dist/served.tar.xz"
export LD_LIBRARY_PATH=$dist/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
py=$(command -v python3)
kept="glibc.malloc.trim_threshold=1073741824:glibc.malloc.mmap_threshold=33554432"
IFS=, read -r -a shapes <<<"${SHAPES:-8192 4096 128256,32768 4096 128256}"
rc=0
for round in $(seq 1 "${ROUNDS:-2}"); do
  settings=(default kept)
  (( round % 2 )) || settings=(kept default)
  for setting in "${settings[@]}"; do
    tunables=""
    [[ $setting == kept ]] && tunables=$kept
    GLIBC_TUNABLES=$tunables "$dist/server/flce-server" --port 50095 --metrics-port 0 \
      --data-port=-1 --device cuda >>"$out/server-malloc-$setting.log" 2>&1 &
    pid=$!
    wait_for_server "$dist/client/cli/flce-client" 127.0.0.1:50095 || rc=1
    for shape in "${shapes[@]}"; do
      read -r n h v <<<"$shape"
      echo "round $round: $setting ${n}x${h}x${v}"
      timeout 150 "$py" bench/python/bench_step.py --target 127.0.0.1:50095 --device cuda \
        --transport grpc --tcp-only --tokens "$n" --hidden "$h" --vocab "$v" \
        --steps "${STEPS:-5}" --label "$setting" --json "$out/server-malloc.jsonl" 2>&1 | tail -1
      [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
    done
    kill "$pid"; wait "$pid"
  done
done
exit $rc
