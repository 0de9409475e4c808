#!/usr/bin/env bash
# On the device machine (see pack_served.sh; carry .served-dist): a training step at the
# seed shape (65535 x 1024 x 176245, bf16) from PyTorch with hidden on the GPU, through
# messages over TCP loopback, messages through the server's Unix socket, shared memory and
# CUDA IPC (flce-server --device cuda --local-transports=shm,cuda_ipc and its default Unix
# socket), alternated, next to flce_cuda_bench's default plan at that shape in the same session
# (the engine alone, inputs already on the device).
set -u -o pipefail
# The server's default socket (--unix-socket=auto), as a user who gives no flag gets it.
source "$(dirname "$0")/served_seed_step.sh" auto
for run in 1 2; do
  # grpc-tcp-untuned: messages over TCP with glibc's malloc left alone (flce.host_memory)
  for transport in grpc-tcp-untuned grpc-tcp grpc shm cuda_ipc; do
    flags=(--transport grpc)
    [[ $transport == shm || $transport == cuda_ipc ]] && flags=(--transport $transport)
    [[ $transport == grpc-tcp* ]] && flags+=(--tcp-only)
    [[ $transport == *-untuned ]] && flags+=(--no-malloc-tuning)
    timeout 120 "$py" bench/python/bench_step.py --target 127.0.0.1:50091 --device cuda \
      "${flags[@]}" --steps 5 --json "$out/transports.jsonl" 2>&1 | tail -1
  done
done
kill %1; wait
