#!/usr/bin/env bash
# Builds the CUDA engine's plugin, tests and benchmark here (build-cuda) and
# packs them, with their non-system shared libraries and the commit, into
# .gpu-dist/ (git-ignored) for the device machine: pass `carry: [".gpu-dist"]`
# and run scripts/gpu/run_cuda.sh there.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-$root/build-cuda}
dist=$root/.gpu-dist
cmake -S "$root" -B "$build" -G Ninja >/dev/null
ninja -C "$build" -j2 flce_cuda flce_cuda_tests flce_cuda_peer_tests flce_sharded_tests flce_shard_bench flce_cuda_bench flce_optimizer_bench flce_gemm_algo_bench flce_engine_tests
rm -rf "$dist"
mkdir -p "$dist/lib"
cp "$build/kernels/cuda/libflce_cuda.so" "$build/tests/cuda/flce_cuda_tests" \
   "$build/tests/cuda/flce_cuda_peer_tests" "$build/tests/cuda/flce_sharded_tests" \
   "$build/bench/cuda/flce_cuda_bench" "$build/bench/cuda/flce_optimizer_bench" \
   "$build/bench/cuda/flce_shard_bench" "$build/bench/cuda/flce_gemm_algo_bench" \
   "$build/tests/engine/flce_engine_tests" "$dist/"
for bin in "$dist"/flce_* "$dist"/libflce_cuda.so; do
  ldd "$bin" | awk '/=>/{print $3}'
done | sort -u |
  grep -v -E 'libc\.so|libm\.so|libstdc|libgcc_s|ld-linux|libcudart|libcublas|libdl\.so|libpthread|librt\.so' |
  xargs -r -I{} cp -L {} "$dist/lib/"
# Debug info stays here: the tree that travels is limited to 64 MiB.
strip --strip-debug "$dist"/flce_* "$dist"/libflce_cuda.so "$dist"/lib/*
git -C "$root" rev-parse HEAD >"$dist/COMMIT"
# OpenBLAS (the engine tests' CPU engine) alone is 36 MB: compressed, the tree fits 64 MiB.
tar -C "$root" -cJf /tmp/gpu.tar.xz .gpu-dist && rm -rf "$dist" && mkdir "$dist" && mv /tmp/gpu.tar.xz "$dist/"
du -sh "$dist"
