#!/usr/bin/env bash
# On the device machine, with .small-dist carried (pack_small_bench.sh): the small and odd
# problems, this build and the reference build alternated (ref, this, ref, this), each
# result in $OUT/small-<which>-<round>.json.
set -u -o pipefail
dist=$(pwd)/.small-dist; [ -d "$dist/this" ] || tar -xJf "$dist/small.tar.xz"
out=${OUT:-/tmp/flce-out}
mkdir -p "$out"
export LD_LIBRARY_PATH=$dist/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
rc=0
for round in 1 2; do
  for which in ref this; do
    [ -d "$dist/$which" ] || continue
    echo "== $which ($(cat "$dist/$which/COMMIT")), round $round"
    "$dist/$which/flce_small_bench" --plugin="$dist/$which/libflce_cuda.so" --runs=21 \
      --label="$which $(cat "$dist/$which/COMMIT")" --out="$out/small-$which-$round.json" || rc=1
  done
done
exit $rc
