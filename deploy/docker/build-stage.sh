#!/usr/bin/env bash
# The build stage of both images (Dockerfile: CUDA on Ubuntu 24.04;
# deploy/docker/Dockerfile.cpu: Debian 12), run from the source tree's root once the
# packages of deploy/docker/build-packages.txt are installed:
#
#   deploy/docker/build-stage.sh CMAKE-ARG...     # one of them -DFLCE_BUILD_CUDA=ON or =OFF
#
# 1. scripts/build.sh into /build with the given CMake arguments (FLCE_JOBS: parallel jobs,
#    default all cores).
# 2. /opt/flce/bin: flce-server and flce-client, stripped, and with -DFLCE_BUILD_CUDA=ON the
#    plugin libflce_cuda.so beside flce-server, where the server looks for it first. ON
#    fails without the plugin (a GPU image without its GPU engine is a mistake); OFF fails
#    with one (a CUDA toolkit picked up by mistake: the CPU image has no CUDA).
# 3. /opt/flce/runtime-packages.txt: the packages that own the libraries these files load
#    (deploy/docker/runtime-packages.sh), which the runtime stage installs
#    (deploy/docker/runtime-stage.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."

cuda=""
for arg in "$@"; do
  case "$arg" in
    -DFLCE_BUILD_CUDA=ON) cuda=on ;;
    -DFLCE_BUILD_CUDA=OFF) cuda=off ;;
  esac
done
if [[ -z "$cuda" ]]; then
  echo "build-stage: say -DFLCE_BUILD_CUDA=ON (GPU image) or -DFLCE_BUILD_CUDA=OFF (CPU image)" >&2
  exit 2
fi

FLCE_BUILD_DIR=/build ./scripts/build.sh "$@"

install -d /opt/flce/bin
install -m 0755 /build/server/flce-server /build/client/cli/flce-client /opt/flce/bin/
plugin="$(find /build -name 'libflce_cuda*.so*' -type f | head -n 1)"
if [[ "$cuda" == on ]]; then
  if [[ -z "$plugin" ]]; then
    echo "build-stage: -DFLCE_BUILD_CUDA=ON built no libflce_cuda.so" >&2
    exit 1
  fi
  install -m 0644 "$plugin" /opt/flce/bin/libflce_cuda.so
elif [[ -n "$plugin" ]]; then
  echo "build-stage: -DFLCE_BUILD_CUDA=OFF built a CUDA plugin after all ($plugin)" >&2
  exit 1
fi
strip --strip-unneeded /opt/flce/bin/flce-server /opt/flce/bin/flce-client
deploy/docker/runtime-packages.sh /opt/flce/bin/* > /opt/flce/runtime-packages.txt
echo "build-stage: /opt/flce/bin: $(cd /opt/flce/bin && echo *)"
echo "build-stage: runtime packages: $(tr '\n' ' ' < /opt/flce/runtime-packages.txt)"
