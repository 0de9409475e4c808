#!/usr/bin/env bash
# Sets up, builds and runs every flce test. GPU tests skip with a message when
# no CUDA device is present; they run on a GPU machine.
#
#   --fuzz       then a fixed libFuzzer run over tests/fuzz/corpus (scripts/fuzz.sh)
#   --sanitize   then the whole suite again under ASan + UBSan (build-asan)
# With CI set (to anything but "false"), the fuzz run follows the normal suite; the
# sanitized suite is on demand (docs/TESTING.md).
# docs/TESTING.md says what each adds and how long it takes.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
fuzz=0
sanitize=0
for arg in "$@"; do
  case "$arg" in
    --fuzz) fuzz=1 ;;
    --sanitize) sanitize=1 ;;
    *) echo "usage: $0 [--fuzz] [--sanitize]" >&2; exit 2 ;;
  esac
done
if [[ -n "${CI:-}" && "${CI}" != "false" ]]; then
  fuzz=1
fi

"$root/scripts/setup.sh"
build="${FLCE_BUILD_DIR:-$root/build}"
FLCE_BUILD_DIR="$build" "$root/scripts/build.sh"
(cd "$build" && ctest --output-on-failure --timeout 600 -j"${FLCE_TEST_JOBS:-2}")

if ((fuzz)); then
  "$root/scripts/fuzz.sh"
fi
if ((sanitize)); then
  asan="${FLCE_ASAN_BUILD_DIR:-$root/build-asan}"
  FLCE_BUILD_DIR="$asan" "$root/scripts/build.sh" --sanitize
  # The suite's servers and clients are instrumented too: a report in any of
  # them fails its test. Leak checks stay on.
  (cd "$asan" && UBSAN_OPTIONS="print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}" \
    ctest --output-on-failure --timeout 600 -j"${FLCE_TEST_JOBS:-2}")
fi
