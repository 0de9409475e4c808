#!/usr/bin/env bash
# On the device machine, from the repo root, with .gpu-dist carried (see
# pack_cuda.sh): CUDA tests, the engine conformance suite's CUDA cases, then
# the benchmark. Logs and the benchmark JSON go to $OUT.
#   scripts/gpu/run_cuda.sh tests|bench|statistic|optimizer|shard|all [extra bench flags...]
# statistic: issue 14's statistic, INVOCATIONS (default 5) bench processes of 11
# interleaved rounds of the bound and the default call at the three shapes, each
# process's ratio the median of its rounds', then per shape the median over the
# processes; everything packed into $OUT/statistic.tgz (one file to bring back).
set -u -o pipefail
mode=${1:-all}
shift || true
dist=$(pwd)/.gpu-dist; [ -x "$dist/flce_cuda_tests" ] || tar -xJf "$dist/gpu.tar.xz"
out=${OUT:-/tmp/flce-out}
mkdir -p "$out"
export LD_LIBRARY_PATH=$dist/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export FLCE_CUDA_PLUGIN=$dist/libflce_cuda.so
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader || true
rc=0
if [[ $mode == tests || $mode == all ]]; then
  "$dist/flce_cuda_tests" 2>&1 | tee "$out/cuda_tests.log" | grep -E '^\[|  \[|BT=|sticky|Failure|error|Expected|Which|actual' | tail -80
  [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
  "$dist/flce_cuda_peer_tests" 2>&1 | tee "$out/cuda_peer_tests.log" | grep -E '^\[  FAILED|^\[  PASSED|^\[==|Failure|Expected|Which|actual|error' | tail -30
  [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
  "$dist/flce_sharded_tests" 2>&1 | tee "$out/sharded_tests.log" | grep -E '^\[  FAILED|^\[  PASSED|^\[  SKIPPED|^\[==|Failure|Expected|Which|actual|error|Skipped|NCCL' | tail -30
  [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
  FLCE_TEST_PRINT_ERRORS=1 "$dist/flce_engine_tests" --gtest_filter='*cuda*' 2>&1 | tee "$out/engine_tests.log" |
    grep -E '^\[  FAILED|^\[  PASSED|^\[==|Failure|Expected|Which|actual|error' | tail -60
  [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
  # The own Hopper backward GEMMs at every size (by default they take chunks
  # of 2048 tokens and more, which the conformance shapes are not).
  FLCE_CUDA_BACKWARD=own FLCE_TEST_PRINT_ERRORS=1 "$dist/flce_engine_tests" --gtest_filter='*cuda*' 2>&1 |
    tee "$out/engine_tests_own_backward.log" |
    grep -E '^\[  FAILED|^\[  PASSED|^\[==|Failure|Expected|Which|actual|error' | tail -20
  [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
  FLCE_CUDA_BACKWARD=own "$dist/flce_cuda_tests" --gtest_filter='*RowScaled*:*Deterministic*:*EveryStrategy*:*Peaked*:*LogitsStats*' 2>&1 |
    tee "$out/cuda_tests_own_backward.log" | grep -E '^\[  FAILED|^\[  PASSED|^\[==|Failure|Expected|Which|actual' | tail -20
  [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
  # The plans of GPUs before Hopper (A100, L40S), on this one.
  FLCE_CUDA_GENERIC=1 "$dist/flce_engine_tests" --gtest_filter='*cuda*' 2>&1 | tee "$out/engine_tests_generic.log" |
    grep -E '^\[  FAILED|^\[  PASSED|^\[==|Failure|Expected|Which|actual|error' | tail -20
  [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
  # Which machine code the plugin carries.
  if command -v cuobjdump >/dev/null; then
    cuobjdump --list-elf "$dist/libflce_cuda.so" | tee "$out/cubins.txt" | grep -o 'sm_[0-9a]*' | sort | uniq -c
    cuobjdump --list-ptx "$dist/libflce_cuda.so" | grep -o 'sm_[0-9a]*' | sort | uniq -c | sed 's/^/ptx /'
  fi
fi
if [[ $mode == optimizer ]]; then
  "$dist/flce_optimizer_bench" --out="$out/optimizer-bench.json" --commit="$(cat "$dist/COMMIT")" "$@" 2>&1 |
    tee "$out/optimizer-bench.log"
  [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
fi
if [[ $mode == shard ]]; then
  "$dist/flce_shard_bench" --out="$out/shard-bench.json" --commit="$(cat "$dist/COMMIT")" "$@" 2>&1 |
    tee "$out/shard-bench.log"
  [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
fi
if [[ $mode == statistic ]]; then
  stat=$out/statistic
  mkdir -p "$stat"
  for i in $(seq 1 "${INVOCATIONS:-5}"); do
    "$dist/flce_cuda_bench" --shapes=0,1,2 --stages=0 --interleave --runs=11 --strategies=chunked \
      --out="$stat/invocation-$i.json" --commit="$(cat "$dist/COMMIT")" "$@" >"$stat/invocation-$i.log" 2>&1 || rc=1
  done
  # "== BT=... H=... V=..." names the shape of the "<ratio>x bound" lines that follow.
  cat "$stat"/invocation-*.log |
    awk '/^== BT=/ { shape = $2 "_" $3 "_" $4 }
         / chunked .*x bound/ { for (i = 1; i <= NF; ++i) if ($i ~ /x$/ && $(i + 1) == "bound") print shape, substr($i, 1, length($i) - 1) }' |
    sort -k1,1 -k2,2n |
    awk '{ v[$1] = v[$1] " " $2 }
         END { for (s in v) { k = split(v[s], a, " "); m = (k % 2) ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2;
                              printf "%s: median %.3f over %d invocations (%s )\n", s, m, k, v[s] } }' |
    sort | tee "$stat/summary.txt"
  tar -C "$out" -czf "$out/statistic.tgz" statistic && rm -rf "$stat"
fi
if [[ $mode == bench || $mode == all ]]; then
  "$dist/flce_cuda_bench" --out="$out/cuda-bench.json" --commit="$(cat "$dist/COMMIT")" "$@" 2>&1 |
    tee "$out/bench.log"
  [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
fi
exit $rc
