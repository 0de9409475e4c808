#!/usr/bin/env bash
# Packs flce_small_bench and the CUDA plugin of this build, and of a reference build,
# with their non-system libraries, into .small-dist/ (git-ignored) for the device
# machine: carry it and run scripts/gpu/run_small_bench.sh there.
#   REF_COMMIT=b6c2fbc BUILD_DIR=build scripts/gpu/pack_small_bench.sh
# builds the reference (the issue's b6c2fbc) in /tmp/flce-ref-<commit>: a worktree of that
# commit with this tree's bench/cuda/small_bench.cc and its CMake target added (older trees
# lack it; it uses only the engine API). REF_BUILD=<dir> packs an existing build instead.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-$root/build-cuda}
dist=$root/.small-dist
if [[ -z ${REF_BUILD:-} && -n ${REF_COMMIT:-} ]]; then
  src=/tmp/flce-ref-$REF_COMMIT/src
  REF_BUILD=/tmp/flce-ref-$REF_COMMIT/build
  if [[ ! -d $src ]]; then
    git -C "$root" worktree add -f --detach "$src" "$REF_COMMIT" >/dev/null
    cp "$root/bench/cuda/small_bench.cc" "$src/bench/cuda/"
    if ! grep -q flce_small_bench "$src/bench/cuda/CMakeLists.txt"; then
      printf '%s\n' '' 'if(TARGET flce_cuda)' '  add_executable(flce_small_bench small_bench.cc)' \
        '  target_link_libraries(flce_small_bench PRIVATE flce_core nlohmann_json::nlohmann_json)' \
        'endif()' >>"$src/bench/cuda/CMakeLists.txt"
    fi
  fi
  cmake -S "$src" -B "$REF_BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  ninja -C "$REF_BUILD" -j2 flce_cuda flce_small_bench
fi
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
