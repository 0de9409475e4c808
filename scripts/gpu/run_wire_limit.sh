#!/usr/bin/env bash
# On the device machine (carry .served-dist, see pack_served.sh): the host's own TCP
# loopback limit and the Compute call's wire alone, in one lease, so that the wire's
# figures in docs/perf/python.md can be read against what the host itself carries.
# 1. iperf3 (Debian's, packed beside flce-server): 1, 2 and 4 connections, one way and both
#    ways at once (--bidir), kernel-tuned socket buffers as gRPC's are, 5 s each.
# 2. bench/python/bench_wire.py (a vocabulary-8 head: the engine's part is negligible) at
#    the three shapes of the wire issue, over TCP loopback and the Unix socket, one
#    connection and several, hidden on the GPU; the CLI's bench beside it.
# Results go to $OUT/iperf.jsonl, $OUT/wire.jsonl and $OUT/wire-cli.jsonl.
set -u -o pipefail
dist=$(pwd)/.served-dist; [ -x "$dist/server/flce-server" ] || tar -xJf "$dist/served.tar.xz"
out=${OUT:-/tmp/flce-out}
mkdir -p "$out"
export LD_LIBRARY_PATH=$dist/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
cli=$dist/client/cli/flce-client
iperf=$dist/bin/iperf3
if [ -x "$iperf" ]; then
  "$iperf" -s -p 5299 >"$out/iperf-server.log" 2>&1 &
  iperf_pid=$!
  sleep 1
  for p in 1 2 4; do
    for mode in "" --bidir -R; do
      "$iperf" -c 127.0.0.1 -p 5299 -t 5 -P $p $mode -J >/tmp/iperf.json 2>&1 &&
        python3 "$(dirname "$0")/iperf_row.py" "$p" "${mode:-up}" /tmp/iperf.json |
        tee -a "$out/iperf.jsonl"
    done
  done
  kill $iperf_pid
else
  echo "no iperf3 in $dist/bin: pack_served.sh packs /usr/bin/iperf3 when it is installed"
fi
port=50095
sock=/tmp/flce-wire-limit.sock
for shape in 65535x1024 8192x4096 32768x4096; do
  tokens=${shape%x*} hidden=${shape#*x}
  "$dist/server/flce-server" --port $port --unix-socket $sock --metrics-port 0 --data-port=-1 --device cuda \
    --local-transports=none >"$out/server-wire-$shape.log" 2>&1 &
  server=$!
  for _ in $(seq 1 300); do "$cli" --target 127.0.0.1:$port health >/dev/null 2>&1 && break; sleep 0.1; done
  for target in 127.0.0.1:$port unix:$sock; do
    timeout 200 python3 bench/python/bench_wire.py --target $target --device cuda \
      --tokens $tokens --hidden $hidden \
      --variants "${WIRE_VARIANTS:-baseline,forward_only,hidden_on_gpu,connections_2,connections_4,baseline_again}" \
      --json "$out/wire.jsonl" | cut -c1-240 || echo "bench_wire failed: $?"
    for mode in "" --forward-only; do
      timeout 100 "$cli" --target $target bench --head bench-wire --tokens $tokens --steps 5 $mode |
        sed "s|^{|{\"target\":\"$target\",\"vocab\":8,|" | tee -a "$out/wire-cli.jsonl"
    done
  done
  kill $server; wait $server
done
