#!/usr/bin/env bash
# On the device machine (carry .gpu-dist and .served-dist: pack_cuda.sh, pack_served.sh):
#   scripts/gpu/run_policy.sh tests   the CUDA engine's policy and preference objectives and every plan's
#                                     rows: the engine conformance suite's CUDA cases (its
#                                     policy cases included), the CUDA, peer and sharded tests,
#                                     the policy cases with the own backward GEMMs and the
#                                     pre-Hopper plans, the Python policy tests on a GPU server;
#   scripts/gpu/run_policy.sh bench   bench/python/bench_policy.py at SHAPE (the seed shape by
#                                     default), hidden on the GPU, through CUDA IPC and through
#                                     messages over TCP, a fresh server per round (ROUNDS),
#                                     the transports' order reversed every round.
#                                     DISTS=".served-dist .ref-dist" pairs builds (pack the
#                                     reference with DIST_NAME=.ref-dist): each round runs every
#                                     build, the order reversed every round; TRANSPORTS picks
#                                     ("cuda_ipc messages" by default; data_plane: rows on the
#                                     server's data plane over TCP). The servers' request
#                                     logs (each Compute's input_ms and finish_ms) land in $OUT.
# Logs and $OUT/policy.jsonl in $OUT.
set -u -o pipefail
source "$(dirname "$0")/wait_for_server.sh"
mode=${1:-tests}
out=${OUT:-/tmp/flce-out}
mkdir -p "$out"
gpu=$(pwd)/.gpu-dist; [ -x "$gpu/flce_cuda_tests" ] || tar -xJf "$gpu/gpu.tar.xz"
dist=$(pwd)/.served-dist; [ -x "$dist/server/flce-server" ] || tar -xJf "$dist/served.tar.xz"
export LD_LIBRARY_PATH=$dist/lib:$gpu/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
py=$(command -v python3)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
rc=0
summary() { grep -E '^\[  FAILED|^\[  PASSED|^\[==========\]|Failure|Expected|Which|actual' | tail -${1:-30}; }
if [[ $mode == tests ]]; then
  export FLCE_CUDA_PLUGIN=$gpu/libflce_cuda.so
  FLCE_TEST_PRINT_ERRORS=1 "$gpu/flce_engine_tests" --gtest_filter='*cuda*' 2>&1 |
    tee "$out/engine_tests.log" | summary 40
  [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
  for t in flce_cuda_tests flce_cuda_peer_tests flce_sharded_tests; do
    "$gpu/$t" 2>&1 | tee "$out/$t.log" | summary 20
    [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
  done
  FLCE_CUDA_BACKWARD=own FLCE_TEST_PRINT_ERRORS=1 "$gpu/flce_engine_tests" \
    --gtest_filter='*Policy*cuda*:*Preference*cuda*' 2>&1 | tee "$out/policy_own_backward.log" | summary 10
  [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
  FLCE_CUDA_GENERIC=1 FLCE_TEST_PRINT_ERRORS=1 "$gpu/flce_engine_tests" \
    --gtest_filter='*Policy*cuda*:*Preference*cuda*' 2>&1 | tee "$out/policy_generic.log" | summary 10
  [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
  unset FLCE_CUDA_PLUGIN  # the server finds the plugin of its build tree by itself
  (cd tests/python && FLCE_SERVER_BIN=$dist/server/flce-server FLCE_TEST_SERVER_DEVICE=cuda \
     timeout 300 "$py" -m pytest -q -p no:cacheprovider -rs test_policy.py \
     test_policy_training.py test_preference.py) >"$out/pytest-objectives-cuda.log" 2>&1 || rc=1
  echo "pytest of the objectives (cuda server): $(tail -1 "$out/pytest-objectives-cuda.log")"
fi
if [[ $mode == bench ]]; then
  unset FLCE_CUDA_PLUGIN
  read -r n h v <<<"${SHAPE:-65535 1024 176245}"
  read -r -a dists <<<"${DISTS:-.served-dist}"
  for d in "${dists[@]}"; do [ -x "$d/server/flce-server" ] || tar -xJf "$d/served.tar.xz"; done
  read -r -a transports <<<"${TRANSPORTS:-cuda_ipc messages}"
  for round in $(seq 1 "${ROUNDS:-3}"); do
    order=("${dists[@]}")
    (( round % 2 )) || order=($(printf '%s\n' "${dists[@]}" | tac))
    for d in "${order[@]}"; do
      label=$(cat "$d/COMMIT")
      # a build that knows --data-port gets one where the data plane is a transport, else
      # none, so that messages stay messages (0.18+ offers the data plane by default)
      data_flag=
      if LD_LIBRARY_PATH=$(pwd)/$d/lib:/usr/local/cuda/lib64 \
        "$(pwd)/$d/server/flce-server" --helpfull 2>/dev/null | grep -q -- '-data_port'; then
        data_flag=--data-port=-1
        [[ " ${transports[*]} " == *" data_plane "* ]] && data_flag=--data-port=50094
      fi
      LD_LIBRARY_PATH=$(pwd)/$d/lib:$gpu/lib:/usr/local/cuda/lib64 "$(pwd)/$d/server/flce-server" \
        --port 50093 --metrics-port 0 $data_flag >>"$out/server-${d#.}.log" 2>&1 &
      pid=$!
      wait_for_server "$(pwd)/$d/client/cli/flce-client" 127.0.0.1:50093 || rc=1
      t_order=("${transports[@]}")
      (( round % 2 )) || t_order=($(printf '%s\n' "${transports[@]}" | tac))
      for transport in "${t_order[@]}"; do
        flags="--transport cuda_ipc"
        [[ $transport == messages ]] && flags="--transport grpc --tcp-only --data-plane off"
        [[ $transport == data_plane ]] && flags="--transport grpc --tcp-only --data-plane on"
        echo "round $round: $label $transport"
        timeout 200 "$py" bench/python/bench_policy.py --target 127.0.0.1:50093 --device cuda \
          --tokens "$n" --hidden "$h" --vocab "$v" $flags --rounds "${BENCH_ROUNDS:-5}" \
          --label "$label" --json "$out/policy.jsonl" 2>&1 | tail -1
        [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
      done
      kill "$pid"; wait "$pid"
    done
  done
  for d in "${dists[@]}"; do echo "$d $(cat "$d/COMMIT")"; done | tee "$out/commit.txt"
fi
exit $rc
