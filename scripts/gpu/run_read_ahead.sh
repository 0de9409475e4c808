#!/usr/bin/env bash
# On the device machine (see pack_served.sh; carry .served-dist): the seed-shape training
# step from PyTorch (hidden on the GPU) through messages, over TCP loopback and through the
# server's Unix socket, against servers that read a Compute call's hidden ahead of the
# engine by 8 MiB (two of the client's 4 MiB messages: what the server did before
# --compute-read-ahead-mb) and by 32 MiB, alternated, next to flce_cuda_bench's default plan.
set -u -o pipefail
sock=/tmp/flce-read-ahead.sock
source "$(dirname "$0")/served_seed_step.sh" "$sock"
kill %1; wait
for run in 1 2; do
  for mb in 8 32; do
    "$dist/server/flce-server" --port 50091 --metrics-port 0 --device cuda --unix-socket="$sock" \
      --compute-read-ahead-mb=$mb >>"$out/server-read-ahead-$mb.log" 2>&1 &
    for _ in $(seq 1 300); do "$dist/client/cli/flce-client" --target 127.0.0.1:50091 health >/dev/null 2>&1 && break; sleep 0.1; done
    for path in tcp socket; do
      flags=(--transport grpc)
      [[ $path == tcp ]] && flags+=(--tcp-only)
      echo "read-ahead $mb MiB, $path:"
      timeout 120 "$py" client/python/bench_step.py --target 127.0.0.1:50091 --device cuda \
        "${flags[@]}" --steps 5 --json "$out/read-ahead-$mb.jsonl" 2>&1 | tail -1
    done
    kill %1; wait
  done
done
