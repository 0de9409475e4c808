#!/usr/bin/env bash
# On the device machine (carry .served-dist, see pack_served.sh): the Compute call's wire
# through messages, over TCP loopback and over a Unix-domain socket: the C++ CLI and
# bench/python/bench_wire.py at the seed's 65535 x 1024 bf16 hidden with a vocabulary-8
# head (the wire alone), then bench/python/trace_wire.py and the CLI at the seed shape
# (when each chunk went up and came down). Results go to $OUT/*.jsonl.
set -u -o pipefail
dist=$(pwd)/.served-dist; [ -x "$dist/server/flce-server" ] || tar -xJf "$dist/served.tar.xz"
out=${OUT:-/tmp/flce-out}
mkdir -p "$out"
export LD_LIBRARY_PATH=$dist/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
cli=$dist/client/cli/flce-client
port=50094
sock=/tmp/flce-wire.sock
"$dist/server/flce-server" --port $port --unix-socket $sock --metrics-port 0 --data-port=-1 --device cuda \
  >"$out/server-wire.log" 2>&1 &
for _ in $(seq 1 300); do "$cli" --target 127.0.0.1:$port health >/dev/null 2>&1 && break; sleep 0.1; done
for target in 127.0.0.1:$port unix:$sock; do
  timeout 300 python3 bench/python/bench_wire.py --target $target --device cuda \
    --variants "${WIRE_VARIANTS:-baseline,forward_only,hidden_on_gpu,max_frame_16mb,connections_2,baseline_again}" \
    --json "$out/wire.jsonl" | cut -c1-240 || echo "bench_wire failed: $?"
  for mode in "" --forward-only; do
    timeout 120 "$cli" --target $target bench --head bench-wire --tokens 65535 --steps 5 $mode |
      sed "s|^{|{\"target\":\"$target\",\"vocab\":8,|" | tee -a "$out/wire-cli.jsonl"
  done
done
for target in 127.0.0.1:$port unix:$sock; do
  timeout 300 python3 bench/python/trace_wire.py --target $target --json "$out/trace.jsonl" |
    cut -c1-200
  timeout 120 "$cli" --target $target bench --head trace --tokens 65535 --steps 5 |
    sed "s|^{|{\"target\":\"$target\",|" | tee -a "$out/wire-cli.jsonl"
done
kill %1; wait
