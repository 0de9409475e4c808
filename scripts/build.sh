#!/usr/bin/env bash
# Configures and builds flce into ${FLCE_BUILD_DIR:-build} (Release with debug info).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${FLCE_BUILD_DIR:-$root/build}"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
ninja -C "$build" -j"${FLCE_JOBS:-$(nproc)}"
