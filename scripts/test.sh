#!/usr/bin/env bash
# Sets up, builds and runs every flce test. GPU tests skip with a message when
# no CUDA device is present; they run on a GPU machine.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/setup.sh"
build="${FLCE_BUILD_DIR:-$root/build}"
FLCE_BUILD_DIR="$build" "$root/scripts/build.sh"
cd "$build"
ctest --output-on-failure --timeout 600 -j"${FLCE_TEST_JOBS:-2}"
