#!/usr/bin/env bash
# A trainer on another machine, simulated: flce-server and bench/python/bench_step.py in two
# network namespaces joined by a veth pair, each end shaped to RATE with tbf, and with
# DELAY_MS each way of netem delay where the kernel has netem (said when it has not). The
# link is checked with iperf3 (one way, and both ways at once), then the training step in
# messages is measured at each shape with 1 and 4 connections (flce.Client(connections=N)),
# and on the data plane (flce-server --data-port; DATA_PLANE=0 leaves it out).
# Needs root (ip netns), iperf3, and a built tree (BUILD_DIR, default build/).
#   RATE=2gbit SHAPES="16384:1024:8" DEVICE=cpu scripts/bench_shaped_link.sh out.jsonl
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
out=${1:-/tmp/shaped-link.jsonl}
RATE=${RATE:-2gbit}
DELAY_MS=${DELAY_MS:-0.1}
SHAPES=${SHAPES:-"16384:1024:8"}  # tokens:hidden:vocab ...
CONNECTIONS=${CONNECTIONS:-"1 4"}
DEVICE=${DEVICE:-cpu}
STEPS=${STEPS:-4}
srv=flce-link-srv cli=flce-link-cli
cleanup() {
  [[ -n "${server:-}" ]] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null
  [[ -n "${iperf:-}" ]] && kill "$iperf" 2>/dev/null
  ip netns del $srv 2>/dev/null || true
  ip netns del $cli 2>/dev/null || true
}
trap cleanup EXIT
cleanup
ip netns add $srv && ip netns add $cli
ip link add veth-srv netns $srv type veth peer name veth-cli netns $cli
ip -n $srv addr add 10.77.0.1/24 dev veth-srv && ip -n $cli addr add 10.77.0.2/24 dev veth-cli
for ns in $srv $cli; do ip -n $ns link set lo up; done
ip -n $srv link set veth-srv up && ip -n $cli link set veth-cli up
delay="none"
for pair in "$srv veth-srv" "$cli veth-cli"; do
  read -r ns dev <<<"$pair"
  if ip netns exec "$ns" tc qdisc add dev "$dev" root handle 1: netem delay "${DELAY_MS}ms" \
       2>/dev/null; then
    ip netns exec "$ns" tc qdisc add dev "$dev" parent 1: handle 2: tbf rate "$RATE" \
      burst 4mb latency 50ms
    delay="${DELAY_MS}ms each way"
  else
    ip netns exec "$ns" tc qdisc add dev "$dev" root tbf rate "$RATE" burst 4mb latency 50ms
  fi
done
[[ $delay == none ]] && echo "this kernel has no netem: the link is rate-limited only, no delay"
ip netns exec $srv iperf3 -s -p 5301 >/dev/null 2>&1 &
iperf=$!
sleep 0.5
link() {  # link MODE ARGS...: iperf3 from the client's side, GB/s each way
  ip netns exec $cli iperf3 -c 10.77.0.1 -p 5301 -t 3 "${@:2}" -J | python3 -c '
import json, sys
e = json.load(sys.stdin)["end"]
row = {"link": sys.argv[1], "rate": sys.argv[2], "delay": sys.argv[3]}
for k in ("sum_sent", "sum_received_bidir_reverse"):
    if k in e: row[k + "_gb_per_s"] = round(e[k]["bits_per_second"] / 8e9, 4)
print(json.dumps(row))' "$1" "$RATE" "$delay" | tee -a "$out"
}
link up
link both --bidir
kill $iperf; iperf=""
ip netns exec $srv "$build/server/flce-server" --host 10.77.0.1 --port 50099 \
  --metrics-port 0 --device "$DEVICE" --unix-socket none --local-transports none \
  --data-port 50100 \
  >/tmp/flce-shaped-server.log 2>&1 &
server=$!
for _ in $(seq 1 100); do
  ip netns exec $cli "$build/client/cli/flce-client" --target 10.77.0.1:50099 health \
    >/dev/null 2>&1 && break
  sleep 0.1
done
for shape in $SHAPES; do
  IFS=: read -r n h v <<<"$shape"
  for c in $CONNECTIONS; do
    ip netns exec $cli /usr/bin/python3 "$root/bench/python/bench_step.py" \
      --target 10.77.0.1:50099 --tokens "$n" --hidden "$h" --vocab "$v" --device "$DEVICE" \
      --tcp-only --connections "$c" --data-plane off --steps "$STEPS" --json "$out.step" |
      tail -1
  done
  if [[ ${DATA_PLANE:-1} == 1 ]]; then
    ip netns exec $cli /usr/bin/python3 "$root/bench/python/bench_step.py" \
      --target 10.77.0.1:50099 --tokens "$n" --hidden "$h" --vocab "$v" --device "$DEVICE" \
      --tcp-only --data-plane on --steps "$STEPS" --json "$out.step" | tail -1
  fi
done
python3 - "$out.step" "$RATE" "$delay" <<'PY' | tee -a "$out"
import json, re, sys
rate = sys.argv[2]
m = re.fullmatch(r"([\d.]+)([kmg]?)bit", rate)
bytes_per_s = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)] / 8
for line in open(sys.argv[1]):
    r = json.loads(line)
    wire_ms = r["tokens"] * r["hidden"] * 2 / bytes_per_s * 1e3  # bf16 hidden, each way
    bound = max(r["engine_ms"], wire_ms)
    print(json.dumps({"rate": rate, "delay": sys.argv[3], "tokens": r["tokens"],
                      "hidden": r["hidden"], "vocab": r["vocab"],
                      "connections": r["connections"], "transport": r["transport"],
                      "wall_ms": round(r["wall_ms"], 1),
                      "engine_ms": round(r["engine_ms"], 1), "wire_ms_each_way": round(wire_ms, 1),
                      "over_bound": round(r["wall_ms"] / bound, 3)}))
PY
rm -f "$out.step"
