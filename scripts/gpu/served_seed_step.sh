# Sourced by the device machine's scripts that time a training step at the seed shape
# through flce-server (run_transports.sh, run_step_trace.sh): unpacks .served-dist (see
# pack_served.sh), sets $dist, $out and $py, times flce_cuda_bench's default plan at the
# seed shape as the session's baseline, then starts a GPU server with both local transports
# and a Unix socket at $1 on port 50091 (its log in $out/server.log; extra flags in
# $SERVER_FLAGS) and waits until it answers.
dist=$(pwd)/.served-dist; [ -x "$dist/server/flce-server" ] || tar -xJf "$dist/served.tar.xz"
out=${OUT:-/tmp/flce-out}
mkdir -p "$out"
export LD_LIBRARY_PATH=$dist/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
py=$(command -v python3)
"$dist/bench/cuda/flce_cuda_bench" --shapes=0 --strategies=auto --runs=5 \
  --out="$out/engine-baseline.json" --commit="$(cat "$dist/COMMIT")" 2>&1 | tail -4
"$dist/server/flce-server" --port 50091 --metrics-port 0 --data-port=-1 --device cuda --local-transports=shm,cuda_ipc \
  --unix-socket="$1" ${SERVER_FLAGS:-} >"$out/server.log" 2>&1 &
for _ in $(seq 1 300); do "$dist/client/cli/flce-client" --target 127.0.0.1:50091 health >/dev/null 2>&1 && break; sleep 0.1; done
