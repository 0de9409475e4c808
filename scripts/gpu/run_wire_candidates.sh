#!/usr/bin/env bash
# On the device machine (carry .served-dist and .gpu-dist, see pack_served.sh and
# pack_cuda.sh, and .ref-client, git-ignored: `mkdir .ref-client && git archive REF
# bench/python client/python | tar -x -C .ref-client`, the client measured against): the
# wire's candidates, stage by stage (STAGES, default
# "tests wire"), each stage's logs packed into $OUT/<stage>.tgz.
#   tests  the CUDA engine's streaming tests, then the Python data-plane tests against
#          servers on the CPU and on the GPU (hidden on the GPU needs a GPU on the client).
#   wire   bench_step.py on the data plane, hidden on the GPU, at SHAPES: per round and
#          shape the engine alone (flce_cuda_bench's default plan) and two fresh servers,
#          FLCE_CUDA_WIRE_SLOTS=2 and =3, each stepped by the reference client and by this
#          checkout's; every order reversed in even rounds. Lines in wire.jsonl, labelled
#          slots<S>-<ref|new>.
#   engine flce_cuda_bench's interleaved rounds at ENGINE_SHAPES: the default plan, the same
#          with grad_W's algorithm measured (FLCE_CUDA_GEMM_TILES=measured), the
#          best-algorithm 3-GEMM bound and the cuBLAS rebuild of QuACK's pipeline.
#   policy run_policy.sh bench on the data plane and through CUDA IPC (policy.jsonl).
#   builds each build of DISTS (default ".served-dist .ref-dist"; pack the reference with
#          DIST_NAME=.ref-dist) on a fresh server, builds alternated and their order reversed
#          in even rounds (ROUNDS): the wire alone at 32768x4096 (bench_wire.py's data-plane
#          variants, a vocabulary-8 head; wire-alone.jsonl) and the data-plane step at SHAPES
#          (bench_step.py, hidden on the GPU; builds.jsonl), each line labelled by the build's
#          commit; the servers' request logs beside them.
set -u -o pipefail
source "$(dirname "$0")/wait_for_server.sh"
root=$(pwd)
dist=$root/.served-dist; [ -x "$dist/server/flce-server" ] || tar -xJf "$dist/served.tar.xz"
gpu=$root/.gpu-dist; [ -x "$gpu/flce_cuda_tests" ] || tar -xJf "$gpu/gpu.tar.xz"
out=${OUT:-/tmp/flce-out}
mkdir -p "$out"
export LD_LIBRARY_PATH=$dist/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
unset FLCE_CUDA_PLUGIN  # the server finds the plugin of its build tree by itself
py=$(command -v python3)
cli=$dist/client/cli/flce-client
commit=$(cat "$dist/COMMIT")
ROUNDS=${ROUNDS:-2}
STEPS=${STEPS:-7}
SHAPES=${SHAPES:-"2:8192:4096:128256 7:32768:4096:128256"}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
rc=0

pack() {  # pack STAGE DIR: the stage's logs as one file
  tar -C "$2" -czf "$out/$1.tgz" . && rm -rf "$2"
}

stage_tests() {
  local logs=$out/tests-logs
  mkdir -p "$logs"
  local tests=$logs/cuda_tests.log
  LD_LIBRARY_PATH=$gpu/lib:$LD_LIBRARY_PATH FLCE_CUDA_PLUGIN=$gpu/libflce_cuda.so \
    timeout 200 "$gpu/flce_cuda_tests" \
    --gtest_filter='CudaEngineTest.*:ChunkPlanTest.*:KernelSwitchesTest.*' >"$tests" 2>&1 || rc=1
  echo "flce_cuda_tests: $(grep -E '^\[  (PASSED|FAILED)' "$tests" | tr '\n' ' ')"
  for device in cpu cuda; do
    (cd tests/python && FLCE_SERVER_BIN=$dist/server/flce-server FLCE_TEST_SERVER_DEVICE=$device \
       timeout 240 "$py" -m pytest -q -p no:cacheprovider -rs test_data_plane.py) \
      >"$logs/pytest-$device-server.log" 2>&1 || rc=1
    echo "pytest test_data_plane.py ($device server): $(tail -1 "$logs/pytest-$device-server.log")"
  done
  pack tests "$logs"
}

step() {  # step CLIENT SLOTS N H V
  local bench=$root/bench/python/bench_step.py
  [[ $1 == ref ]] && bench=$root/.ref-client/bench/python/bench_step.py
  timeout 150 "$py" "$bench" --target 127.0.0.1:50097 --device cuda --transport grpc \
    --tcp-only --data-plane on --tokens "$3" --hidden "$4" --vocab "$5" --steps "$STEPS" \
    --label "slots$2-$1" --json "$out/wire.jsonl" 2>&1 | tail -1 | cut -c1-200
  [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
}

served() {  # served INDEX ROUND N H V
  local slots client pid order=(2 3) clients=(ref new)
  (( $2 % 2 )) || { order=(3 2); clients=(new ref); }
  for slots in "${order[@]}"; do
    FLCE_CUDA_WIRE_SLOTS=$slots "$dist/server/flce-server" --port 50097 --data-port 50098 \
      --metrics-port 0 >"$out/wire-logs/server-$1-$2-$slots.log" 2>&1 &
    pid=$!
    wait_for_server "$cli" 127.0.0.1:50097 || rc=1
    for client in "${clients[@]}"; do
      echo "round $2 shape $1 slots $slots client $client"
      step "$client" "$slots" "$3" "$4" "$5"
    done
    kill "$pid"; wait "$pid"
  done
}

stage_wire() {
  mkdir -p "$out/wire-logs"
  source "$(dirname "$0")/engine_rounds.sh"
  engine_rounds
  mv "$out"/engine-*.json "$out/wire-logs/"
  cp "$out/wire.jsonl" "$out/wire-logs/"
  pack wire "$out/wire-logs"
}

stage_engine() {
  mkdir -p "$out/engine-logs"
  local bounds=gemm_bound_best_algos,cublas_quack_rebuild log=$out/engine-logs/bench.log
  "$dist/bench/cuda/flce_cuda_bench" --interleave --stages=0 --runs="${ENGINE_RUNS:-9}" \
    --shapes="${ENGINE_SHAPES:-0,2,8}" \
    --strategies="chunked,chunked@FLCE_CUDA_GEMM_TILES=measured,$bounds" \
    --out="$out/engine-candidates.json" --commit="$commit" >"$log" 2>&1 || rc=1
  grep -E 'interleaved|median|shape|ms' "$log" | tail -30
  pack engine "$out/engine-logs"
}

stage_policy() {
  mkdir -p "$out/policy-logs"
  OUT=$out/policy-logs ROUNDS=${POLICY_ROUNDS:-2} TRANSPORTS="data_plane cuda_ipc" \
    "$(dirname "$0")/run_policy.sh" bench 2>&1 | tail -12 || rc=1
  cp "$out/policy-logs/policy.jsonl" "$out/" 2>/dev/null
  pack policy "$out/policy-logs"
}

stage_builds() {
  local logs=$out/builds-logs round d label pid shape index n h v
  mkdir -p "$logs"
  read -r -a dists <<<"${DISTS:-.served-dist .ref-dist}"
  for d in "${dists[@]}"; do [ -x "$d/server/flce-server" ] || tar -xJf "$d/served.tar.xz"; done
  for round in $(seq 1 "$ROUNDS"); do
    local order=("${dists[@]}")
    (( round % 2 )) || order=($(printf '%s\n' "${dists[@]}" | tac))
    for d in "${order[@]}"; do
      label=$(cat "$d/COMMIT")
      LD_LIBRARY_PATH=$root/$d/lib:/usr/local/cuda/lib64 "$root/$d/server/flce-server" \
        --port 50097 --data-port 50098 --metrics-port 0 --local-transports=none \
        >"$logs/server-$label-$round.log" 2>&1 &
      pid=$!
      wait_for_server "$cli" 127.0.0.1:50097 || rc=1
      echo "round $round build $label"
      timeout 200 "$py" bench/python/bench_wire.py --target 127.0.0.1:50097 --device cuda \
        --tokens 32768 --hidden 4096 --calls 5 \
        --variants data_plane,data_plane_forward_only,data_plane_hidden_on_gpu \
        --label "$label" --json "$out/wire-alone.jsonl" | cut -c1-200 || rc=1
      for shape in $SHAPES; do
        IFS=: read -r index n h v <<<"$shape"
        timeout 150 "$py" bench/python/bench_step.py --target 127.0.0.1:50097 --device cuda \
          --transport grpc --tcp-only --data-plane on --tokens "$n" --hidden "$h" --vocab "$v" \
          --steps "$STEPS" --label "$label" --json "$out/builds.jsonl" 2>&1 | tail -1 | cut -c1-200
        [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
      done
      kill "$pid"; wait "$pid"
    done
  done
  "$py" bench/python/request_phases.py "$logs"/server-*.log | sed "s|$logs/||" | cut -c1-240
  pack builds "$logs"
}

for stage in ${STAGES:-tests wire}; do
  case $stage in
    tests) stage_tests ;;
    wire) stage_wire ;;
    engine) stage_engine ;;
    policy) stage_policy ;;
    builds) stage_builds ;;
    *) echo "unknown stage $stage" >&2; rc=1 ;;
  esac
done
exit $rc
