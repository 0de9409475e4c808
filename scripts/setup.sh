#!/usr/bin/env bash
# Installs what flce needs to build, test and run on Debian 12 (as root, or with sudo).
# Idempotent: packages already present are left alone. The prometheus package is
# installed for its promtool (the deployment checks); a Prometheus server it would
# start is stopped and disabled again when this script installed it.
# clang and libclang-rt-14-dev build the fuzzer (scripts/fuzz.sh: libFuzzer, ASan, UBSan);
# llvm brings llvm-symbolizer, which turns sanitizer reports into file:line stacks.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"

# The build packages: deploy/docker/build-packages.txt, the list the images' build stages
# install (compilers, CMake, gRPC, protobuf, Abseil, prometheus-cpp, OpenBLAS, ...).
mapfile -t build_packages < <(sed -e 's/#.*//' "$root/deploy/docker/build-packages.txt" | xargs -n1)
# Then what the tests, benchmarks, fuzzer, deployment checks and Python client need.
packages=(
  "${build_packages[@]}"
  curl openssl prometheus docker-compose
  libgtest-dev libgmock-dev libbenchmark-dev
  clang libclang-rt-14-dev llvm
  python3 python3-venv python3-numpy python3-grpcio python3-protobuf python3-torch python3-pytest python3-wheel
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "flce setup: installing ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  if [[ " ${missing[*]} " == *" prometheus "* ]] && [ -d /run/systemd/system ]; then
    $SUDO systemctl disable --now prometheus >/dev/null 2>&1 || true
    echo "flce setup: the prometheus package's server was disabled (only promtool is needed)" >&2
  fi
else
  echo "flce setup: all packages present" >&2
fi

if [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "flce setup: CUDA toolkit found ($(/usr/local/cuda/bin/nvcc --version | tail -1)); the CUDA engine plugin will be built" >&2
else
  echo "flce setup: no CUDA toolkit at /usr/local/cuda; building the CPU engine only" >&2
fi
