#!/usr/bin/env bash
# On the device machine, with .small-dist carried (pack_small_bench.sh): the small and odd
# problems, this build and the reference build alternated (ref, this, this, ref, ...), each
# result in $OUT/small-<which>-<round>.json. ROUNDS (default 2) and RUNS (calls per shape,
# default 21) set the sample; SHAPES (BTxHxV,...) times those shapes instead of the twelve
# (a shape listed twice is timed twice in a row: the first time warms a process up);
# FORWARD=1 times calls without a backward (flce_small_bench --forward).
set -u -o pipefail
dist=$(pwd)/.small-dist; [ -d "$dist/this" ] || tar -xJf "$dist/small.tar.xz"
out=${OUT:-/tmp/flce-out}
mkdir -p "$out"
export LD_LIBRARY_PATH=$dist/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
rc=0
for round in $(seq 1 "${ROUNDS:-2}"); do
  order="ref this"; (( round % 2 == 0 )) && order="this ref"
  for which in $order; do
    [ -d "$dist/$which" ] || continue
    echo "== $which ($(cat "$dist/$which/COMMIT")), round $round"
    "$dist/$which/flce_small_bench" --plugin="$dist/$which/libflce_cuda.so" --runs="${RUNS:-21}" \
      --label="$which $(cat "$dist/$which/COMMIT")" --out="$out/small-$which-$round.json" \
      ${SHAPES:+--shapes="$SHAPES"} ${FORWARD:+--forward} || rc=1
  done
done
exit $rc
