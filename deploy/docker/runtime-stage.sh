#!/usr/bin/env bash
# The runtime stage of both images, as root, before the binaries are copied in:
#
#   runtime-stage.sh RUNTIME-PACKAGES-FILE
#
# 1. Installs the packages the build stage listed (deploy/docker/build-stage.sh: those
#    that own the libraries flce-server, flce-client and the plugin load: gRPC, protobuf,
#    Abseil, prometheus-cpp, civetweb, OpenBLAS, ...), nothing to build with, and drops
#    apt's lists again.
# 2. The unprivileged system user "flce" (home /var/lib/flce), /heads owned by it (the
#    default --head-root: mount safetensors files there), and /usr/local/bin links to
#    /opt/flce/bin/flce-server and flce-client.
set -euo pipefail
if (($# != 1)) || [[ ! -f "$1" ]]; then
  echo "usage: $0 RUNTIME-PACKAGES-FILE" >&2
  exit 2
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update
xargs -a "$1" apt-get install -y --no-install-recommends
rm -rf /var/lib/apt/lists/*

groupadd --system flce
useradd --system --gid flce --home-dir /var/lib/flce --create-home --shell /usr/sbin/nologin flce
install -d -o flce -g flce /heads
ln -s /opt/flce/bin/flce-server /usr/local/bin/flce-server
ln -s /opt/flce/bin/flce-client /usr/local/bin/flce-client
