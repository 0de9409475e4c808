#!/usr/bin/env bash
# On the device machine (see pack_served.sh; carry .served-dist): the Python client's
# Hugging Face and asynchronous-call tests (transformers is installed there, not here),
# against servers on the CPU engine and on the GPU, then the micro-batch pipelining example
# at the seed shape on the GPU, a body that sleeps and a body that computes.
set -u -o pipefail
dist=$(pwd)/.served-dist; [ -x "$dist/server/flce-server" ] || tar -xJf "$dist/served.tar.xz"
out=${OUT:-/tmp/flce-out}
mkdir -p "$out"
export LD_LIBRARY_PATH=$dist/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export FLCE_SERVER_BIN=$dist/server/flce-server
py=$(command -v python3)
"$py" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())" | tee "$out/versions.txt"
"$py" -c "import accelerate; print('accelerate', accelerate.__version__)" 2>&1 | tail -1 | tee -a "$out/versions.txt"
for device in cpu cuda; do
  (cd tests/python && FLCE_TEST_SERVER_DEVICE=$device timeout 240 "$py" -m pytest -q -p no:cacheprovider -rs \
     test_hf.py test_submit.py) >"$out/pytest-$device-server.log" 2>&1
  echo "pytest ($device server) rc=$?: $(tail -1 "$out/pytest-$device-server.log")"
done
"$dist/server/flce-server" --port 50081 --metrics-port 0 --data-port=-1 --device cuda >"$out/server.log" 2>&1 &
for body in sleep compute; do
  timeout 150 "$py" client/python/examples/pipelined_micro_batches.py --target 127.0.0.1:50081 \
    --vocab 176245 --hidden 1024 --tokens 8192 --micro-batches 8 --steps 5 --body $body \
    --device cuda | tee "$out/pipelined-$body.json"
done
kill %1; wait
