#!/usr/bin/env bash
# Packs flce_small_bench and the CUDA plugin of this build, and of a reference build
# (REF_BUILD, e.g. a worktree of an older commit with bench/cuda/small_bench.cc copied in
# and `ninja flce_cuda flce_small_bench`), with their non-system libraries, into
# .small-dist/ (git-ignored) for the device machine: carry it and run
# scripts/gpu/run_small_bench.sh there.
#   REF_BUILD=/tmp/old/build REF_COMMIT=b6c2fbc BUILD_DIR=build scripts/gpu/pack_small_bench.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-$root/build-cuda}
dist=$root/.small-dist
ninja -C "$build" -j2 flce_cuda flce_small_bench
rm -rf "$dist"
mkdir -p "$dist/lib" "$dist/this"
cp "$build/bench/cuda/flce_small_bench" "$build/kernels/cuda/libflce_cuda.so" "$dist/this/"
git -C "$root" rev-parse --short HEAD >"$dist/this/COMMIT"
if [[ -n ${REF_BUILD:-} ]]; then
  mkdir -p "$dist/ref"
  cp "$REF_BUILD/bench/cuda/flce_small_bench" "$REF_BUILD/kernels/cuda/libflce_cuda.so" "$dist/ref/"
  echo "${REF_COMMIT:-unknown}" >"$dist/ref/COMMIT"
fi
for bin in "$dist"/*/flce_small_bench "$dist"/*/libflce_cuda.so; do
  ldd "$bin" | awk '/=>/{print $3}'
done | sort -u |
  grep -v -E 'libc\.so|libm\.so|libstdc|libgcc_s|ld-linux|libcudart|libcublas|libdl\.so|libpthread|librt\.so' |
  xargs -r -I{} cp -L {} "$dist/lib/"
strip --strip-debug "$dist"/*/flce_small_bench "$dist"/*/libflce_cuda.so "$dist"/lib/*
tar -C "$root" -cJf /tmp/small.tar.xz .small-dist && rm -rf "$dist" && mkdir "$dist" && mv /tmp/small.tar.xz "$dist/"
du -sh "$dist"
