#!/usr/bin/env bash
# Configures and builds flce into ${FLCE_BUILD_DIR:-build} (Release with debug info).
# Further arguments go to cmake (e.g. -DFLCE_BUILD_BENCH=OFF).
#
#   --sanitize   ASan + UBSan (GCC) into ${FLCE_BUILD_DIR:-build-asan}: flce's code
#                instrumented, the CUDA plugin and the benchmarks not built.
#                Run its tests with: ctest --test-dir build-asan (scripts/test.sh --sanitize).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
sanitize=0
args=()
for arg in "$@"; do
  if [[ "$arg" == "--sanitize" ]]; then sanitize=1; else args+=("$arg"); fi
done
if ((sanitize)); then
  build="${FLCE_BUILD_DIR:-$root/build-asan}"
  args=(-DFLCE_SANITIZE=ON -DFLCE_BUILD_CUDA=OFF -DFLCE_BUILD_BENCH=OFF ${args[@]+"${args[@]}"})
else
  build="${FLCE_BUILD_DIR:-$root/build}"
fi
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo ${args[@]+"${args[@]}"} >/dev/null
ninja -C "$build" -j"${FLCE_JOBS:-$(nproc)}"
