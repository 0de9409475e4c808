#!/usr/bin/env bash
# On the device machine: a build under test against a reference build, paired in one
# lease. Both are packed with pack_served.sh (DIST_NAME=.served-dist for the build under
# test, DIST_NAME=.ref-dist BUILD_DIR=<the reference's build> COMMIT=<its commit> for the
# reference); carry both.
#   1. (run last) The engine alone: flce_cuda_bench's default plan and its 3-GEMM bound, interleaved
#      rounds, PROCESSES processes per build alternating ref/new/new/ref/...
#   2. The served step at the seed shape through the CLI's bench on loopback (TCP),
#      ROUNDS rounds per build alternating; each round a fresh server of that build.
#   3. Results bitwise: the same inputs through each build's server with
#      --deterministic (every strategy the GPU runs deterministically), grad_input and
#      grad_W compared byte for byte.
# Everything lands in $OUT (before-after.json and the logs).
set -u -o pipefail
out=${OUT:-/tmp/flce-out}
mkdir -p "$out"
PROCESSES=${PROCESSES:-4}
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-5}
SHAPES=${SHAPES:-0,1,2}
for d in .served-dist .ref-dist; do
  [ -x "$d/server/flce-server" ] || tar -xJf "$d/served.tar.xz"
done
new=$(pwd)/.served-dist
ref=$(pwd)/.ref-dist
echo "new $(cat "$new/COMMIT") ref $(cat "$ref/COMMIT")"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
py=$(command -v python3)
unset FLCE_CUDA_PLUGIN  # each server takes the plugin of its own build tree

messages_only() {  # messages_only DIST: the flag that keeps DIST's server in messages (0.16+)
  LD_LIBRARY_PATH=$1/lib:/usr/local/cuda/lib64 "$1/server/flce-server" --helpfull 2>/dev/null |
    grep -q -- '-data_port' && echo --data-port=-1
}
with() {  # with DIST CMD...: CMD with DIST's libraries
  local dist=$1; shift
  LD_LIBRARY_PATH=$dist/lib:/usr/local/cuda/lib64 "$@"
}

# 2. the served step and 3. deterministic results, a fresh server per round
"$py" - "$out" <<'PY'
import sys, numpy as np
o = sys.argv[1]
rng = np.random.default_rng(3)
w = (rng.standard_normal((176245, 1024), dtype=np.float32) / 32).astype(np.float32)
np.save(f"{o}/w.npy", (w.view(np.uint32) >> 16).astype(np.uint16))  # bf16 bits
h = rng.standard_normal((3001, 1024), dtype=np.float32)
np.save(f"{o}/h.npy", (h.view(np.uint32) >> 16).astype(np.uint16))
t = rng.integers(0, 176245, size=3001).astype(np.int64); t[rng.random(3001) < 0.05] = -100
np.save(f"{o}/t.npy", t)
PY
port=50080
serve() {  # serve DIST NAME ROUND
  local dist=$1 name=$2 round=$3
  port=$((port + 1))  # a port of its own: nothing can answer for another build's server
  LD_LIBRARY_PATH=$dist/lib:/usr/local/cuda/lib64 "$dist/server/flce-server" --port $port \
    --metrics-port 0 --device cuda --unix-socket=none $(messages_only "$dist") \
    >"$out/server-$name-$round.log" 2>&1 &
  local pid=$!
  local cl=("$dist/client/cli/flce-client" --target "127.0.0.1:$port")
  for _ in $(seq 1 300); do with "$dist" "${cl[@]}" health >/dev/null 2>&1 && break; sleep 0.1; done
  with "$dist" "${cl[@]}" server-info >"$out/server-info-$name-$round.json" 2>&1
  with "$dist" "${cl[@]}" load-weight --head seed --weight "$out/w.npy" --dtype bf16 \
    >"$out/load-$name-$round.json" 2>&1
  with "$dist" "${cl[@]}" bench --head seed --tokens 65535 --steps "${STEPS:-5}" --warmup 2 \
    >"$out/served-$name-$round.json" 2>"$out/served-$name-$round.err"
  echo "served $name round $round rc=$?: $(head -c 300 "$out/served-$name-$round.json")"
  if [[ $round == 1 ]]; then
    for strategy in chunked vocab_split fuse_mn; do
      with "$dist" "${cl[@]}" compute --head seed --session "d-$strategy" --dtype bf16 \
        --hidden "$out/h.npy" --targets "$out/t.npy" --strategy "$strategy" --deterministic \
        --out-grad-input "$out/gx-$name-$strategy.npy" >"$out/compute-$name-$strategy.json" 2>&1
      with "$dist" "${cl[@]}" fetch-grad --head seed --session "d-$strategy" \
        --out "$out/gw-$name-$strategy.npy" >/dev/null 2>&1
    done
  fi
  kill $pid; wait $pid 2>/dev/null
  echo "  served by pid $pid: $(grep -o '"version": *"[^"]*"' "$out/server-info-$name-$round.json")"
}
for r in $(seq 1 "$ROUNDS"); do
  if (( r % 2 )); then serve "$ref" ref "$r"; serve "$new" new "$r"
  else serve "$new" new "$r"; serve "$ref" ref "$r"; fi
done

# 1. the engine alone
for p in $(seq 1 "$PROCESSES"); do
  if (( p % 2 )); then order="ref new"; else order="new ref"; fi
  for which in $order; do
    dist=$ref; [[ $which == new ]] && dist=$new
    with "$dist" "$dist/bench/cuda/flce_cuda_bench" --shapes="$SHAPES" --strategies=chunked \
      --stages=0 --interleave --runs=9 --out="$out/engine-$which-$p.json" \
      --commit="$(cat "$dist/COMMIT")" >"$out/engine-$which-$p.log" 2>&1
    echo "engine $which process $p rc=$?"
  done
done


"$py" - "$out" <<'PY'
import glob, hashlib, json, os, statistics, sys
o = sys.argv[1]
res = {"engine": {}, "served": {}, "bitwise": {}}
for which in ("ref", "new"):
    per_shape = {}
    for f in sorted(glob.glob(f"{o}/engine-{which}-*.json")):
        try:
            d = json.load(open(f))
        except Exception as e:
            res["engine"].setdefault("errors", []).append(f"{f}: {e}"); continue
        for r in (d.get("records", []) if isinstance(d, dict) else d):
            key = f'{r.get("BT")}x{r.get("H")}x{r.get("V")}'
            if r.get("strategy") == "chunked" and r.get("ms") is not None:
                per_shape.setdefault(key, {"ms": [], "bound_ratio": []})
                per_shape[key]["ms"].append(r["ms"])
                if r.get("ratio") is not None:
                    per_shape[key]["bound_ratio"].append(r["ratio"])
    res["engine"][which] = {k: {"median_ms_per_process": v["ms"],
                                "median_ms": statistics.median(v["ms"]) if v["ms"] else None,
                                "bound_ratio_per_process": v["bound_ratio"]}
                            for k, v in per_shape.items()}
for which in ("ref", "new"):
    steps = []
    for f in sorted(glob.glob(f"{o}/served-{which}-*.json")):
        try:
            steps.append(json.load(open(f)))
        except Exception as e:
            steps.append({"error": str(e)})
    res["served"][which] = steps
for f in sorted(glob.glob(f"{o}/gx-new-*.npy")) + sorted(glob.glob(f"{o}/gw-new-*.npy")):
    g = f.replace("-new-", "-ref-")
    def digest(p):
        return hashlib.sha256(open(p, "rb").read()).hexdigest() if os.path.exists(p) else None
    res["bitwise"][os.path.basename(f).replace("-new", "")] = {
        "new": digest(f), "ref": digest(g), "equal": digest(f) is not None and digest(f) == digest(g)}
json.dump(res, open(f"{o}/before-after.json", "w"), indent=1)
print(json.dumps(res["bitwise"], indent=1))
print(json.dumps({k: {s: v.get("median_ms") for s, v in d.items()} for k, d in res["engine"].items()}, indent=1))
PY
rm -f "$out"/*.npy
# One archive: the machine sends back a few files only.
tar -C "$out" -czf /tmp/before-after-logs.tgz --exclude=before-after.json . && mv /tmp/before-after-logs.tgz "$out/"
