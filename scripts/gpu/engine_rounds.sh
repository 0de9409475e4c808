# Sourced by the scripts that set a served measurement beside the engine alone
# (run_default_local.sh, run_pieces.sh). Needs $dist, $out, $commit, $ROUNDS,
# $SHAPES ("INDEX:TOKENS:HIDDEN:VOCAB ...", INDEX into flce_cuda_bench's
# --shapes) and a function `served INDEX ROUND N H V`.
engine() {  # engine INDEX ROUND: flce_cuda_bench's default plan at the shape
  "$dist/bench/cuda/flce_cuda_bench" --shapes="$1" --strategies=auto --runs=5 \
    --out="$out/engine-$1-$2.json" --commit="$commit" 2>&1 | tail -3
}
# ROUNDS rounds over SHAPES, numbered from FIRST_ROUND (default 1); the engine first in odd
# rounds, last in even ones.
engine_rounds() {
  local round shape index n h v
  local first=${FIRST_ROUND:-1}
  for round in $(seq "$first" $((first + ROUNDS - 1))); do
    for shape in $SHAPES; do
      IFS=: read -r index n h v <<<"$shape"
      if (( round % 2 )); then
        engine "$index" "$round"; served "$index" "$round" "$n" "$h" "$v"
      else
        served "$index" "$round" "$n" "$h" "$v"; engine "$index" "$round"
      fi
    done
  done
}
