#!/usr/bin/env bash
# Packs flce-server, flce-client, the CUDA plugin, flce_host_bench and flce_cuda_bench in the
# build tree's layout (with their non-system shared libraries) into .served-dist/ (git-ignored) for the device machine:
# pass `carry: [".served-dist"]` and run scripts/gpu/run_served.sh there.
# DIST_NAME=.ref-dist BUILD_DIR=<a reference build> COMMIT=<its commit> packs a reference
# build beside it for scripts/gpu/run_before_after.sh.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-$root/build-main}
name=${DIST_NAME:-.served-dist}
dist=$root/$name
ninja -C "$build" -j2 flce-server flce-client flce_cuda flce_host_bench flce_cuda_bench
rm -rf "$dist" && mkdir -p "$dist/lib" "$dist/server" "$dist/client/cli" "$dist/kernels/cuda" \
  "$dist/bench/server" "$dist/bench/cuda"
# The build tree's layout: flce-server must find the plugin there by itself, as it does
# for a user who runs build/server/flce-server (no FLCE_CUDA_PLUGIN, no --cuda-plugin).
cp "$build/server/flce-server" "$dist/server/"
cp "$build/client/cli/flce-client" "$dist/client/cli/"
cp "$build/kernels/cuda/libflce_cuda.so" "$dist/kernels/cuda/"
cp "$build/bench/server/flce_host_bench" "$dist/bench/server/"
cp "$build/bench/cuda/flce_cuda_bench" "$dist/bench/cuda/"  # the engine-only baseline
bins=("$dist/server/flce-server" "$dist/client/cli/flce-client" "$dist/kernels/cuda/libflce_cuda.so"
      "$dist/bench/server/flce_host_bench" "$dist/bench/cuda/flce_cuda_bench")
# The wire's reference (scripts/gpu/run_wire_limit.sh): Debian's iperf3, where installed.
if [ -x /usr/bin/iperf3 ]; then
  mkdir -p "$dist/bin" && cp /usr/bin/iperf3 "$dist/bin/" && bins+=("$dist/bin/iperf3")
fi
for bin in "${bins[@]}"; do ldd "$bin" | awk '/=>/{print $3}'; done | sort -u |
  grep -v -E 'libc\.so|libm\.so|libstdc|libgcc_s|ld-linux|libcudart|libcublas|libdl\.so|libpthread|librt\.so' |
  xargs -r -I{} cp -L {} "$dist/lib/"
strip --strip-debug "${bins[@]}" "$dist"/lib/*
echo "${COMMIT:-$(git -C "$root" rev-parse HEAD)}" >"$dist/COMMIT"
# OpenBLAS alone is 36 MB: compress, the tree that travels is limited to 64 MiB.
tar -C "$root" -cJf "/tmp/$name.tar.xz" "$name" && rm -rf "$dist" && mkdir "$dist" && mv "/tmp/$name.tar.xz" "$dist/served.tar.xz"
du -sh "$dist"
