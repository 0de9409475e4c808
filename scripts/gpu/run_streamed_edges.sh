#!/usr/bin/env bash
# On the device machine (see pack_served.sh; carry .served-dist): the seed-shape training
# step from PyTorch (hidden on the GPU) through messages, over TCP loopback and through the
# server's Unix socket, against a server whose calls in messages take small first and last
# token chunks (the default) and one without (FLCE_CUDA_STREAMED_EDGES=0), alternated,
# next to flce_cuda_bench's default plan at that shape.
set -u -o pipefail
sock=/tmp/flce-edges.sock
source "$(dirname "$0")/served_seed_step.sh" "$sock"
kill %1; wait
for run in 1 2; do
  for edges in 0 1; do
    FLCE_CUDA_STREAMED_EDGES=$edges "$dist/server/flce-server" --port 50091 --metrics-port 0 \
      --device cuda --unix-socket="$sock" >>"$out/server-edges-$edges.log" 2>&1 &
    for _ in $(seq 1 300); do "$dist/client/cli/flce-client" --target 127.0.0.1:50091 health >/dev/null 2>&1 && break; sleep 0.1; done
    for path in tcp socket; do
      flags=(--transport grpc)
      [[ $path == tcp ]] && flags+=(--tcp-only)
      echo "edges $edges, $path:"
      timeout 120 "$py" client/python/bench_step.py --target 127.0.0.1:50091 --device cuda \
        "${flags[@]}" --steps 5 --json "$out/edges-$edges.jsonl" 2>&1 | tail -1
    done
    kill %1; wait
  done
done
