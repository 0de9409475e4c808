#!/usr/bin/env bash
# Builds flce_fuzz_compute (clang: libFuzzer + ASan + UBSan, tests/fuzz) into
# ${FLCE_FUZZ_BUILD_DIR:-build-fuzz} and runs it over tests/fuzz/corpus.
#
#   scripts/fuzz.sh                  a fixed, repeatable run (-runs=300000 -seed=1): what CI runs
#   scripts/fuzz.sh --runs 1000000   more inputs
#   scripts/fuzz.sh --time 600       for ten minutes
#   scripts/fuzz.sh -- ARGS          extra libFuzzer flags (e.g. -- -max_len=65536)
#
# Inputs the fuzzer finds interesting go to build-fuzz/corpus and are kept
# from one --runs/--time run to the next (the committed seeds are left alone);
# the fixed run starts from the seeds alone, so that it is the same every time.
# A crash, leak or timeout is saved under build-fuzz/findings/ and makes the
# script exit non-zero. Replay one with
#   FLCE_FUZZ_VERBOSE=1 build-fuzz/tests/fuzz/flce_fuzz_compute build-fuzz/findings/crash-...
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${FLCE_FUZZ_BUILD_DIR:-$root/build-fuzz}"
runs=300000
seconds=""
fixed=1
extra=()
while (($#)); do
  case "$1" in
    --runs) runs="$2"; fixed=0; shift 2 ;;
    --time) seconds="$2"; fixed=0; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "usage: $0 [--runs N | --time SECONDS] [-- libFuzzer args]" >&2; exit 2 ;;
  esac
done

cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DFLCE_BUILD_FUZZ=ON \
  -DFLCE_BUILD_TESTS=OFF -DFLCE_BUILD_BENCH=OFF -DFLCE_BUILD_CUDA=OFF >/dev/null
ninja -C "$build" -j"${FLCE_JOBS:-$(nproc)}" flce_fuzz_compute

corpus="$build/corpus"
if ((fixed)); then
  corpus="$build/corpus-fixed"
  rm -rf "$corpus"
fi
mkdir -p "$corpus" "$build/findings"
args=(-seed=1 -timeout=60 -rss_limit_mb=4096 -print_final_stats=1
      -artifact_prefix="$build/findings/")
if [[ -n "$seconds" ]]; then args+=(-max_total_time="$seconds"); else args+=(-runs="$runs"); fi
# The first directory receives new inputs; the committed seeds are read only.
UBSAN_OPTIONS="print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}" \
  "$build/tests/fuzz/flce_fuzz_compute" "${args[@]}" ${extra[@]+"${extra[@]}"} \
  "$corpus" "$root/tests/fuzz/corpus"
