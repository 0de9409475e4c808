#!/usr/bin/env bash
# Prints, one a line, the Debian/Ubuntu packages that own the shared libraries the given
# ELF files load (ldd), leaving out the C/C++ runtime and CUDA's own libraries, which
# every nvidia/cuda runtime image already has. The Dockerfile's build stage runs it on
# flce-server, flce-client and libflce_cuda.so; the runtime stage installs its output.
#
#   deploy/docker/runtime-packages.sh BINARY... > runtime-packages.txt
set -euo pipefail
if (($# == 0)); then
  echo "usage: $0 ELF-FILE..." >&2
  exit 2
fi

# Libraries that come with the base image (glibc, libstdc++, libgcc) or with CUDA's
# runtime image (cudart, cuBLAS, cuBLASLt, NCCL, the driver's libcuda; anything under
# /usr/local/cuda).
skip='/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt|libnccl|libnvidia-[^/]*)\.so'

libs=()
for elf in "$@"; do
  if ldd "$elf" | grep -q 'not found'; then
    echo "runtime-packages: $elf has unresolved libraries:" >&2
    ldd "$elf" | grep 'not found' >&2
    exit 1
  fi
  while read -r lib; do
    [[ -n "$lib" ]] && libs+=("$lib")
  done < <(ldd "$elf" | awk '/=>/ && $3 ~ /^\// {print $3}' | grep -v -E "$skip" \
             | grep -v '^/usr/local/cuda' || true)
done

((${#libs[@]})) || exit 0
for lib in $(printf '%s\n' "${libs[@]}" | sort -u); do
  # dpkg may register /usr/lib/... or /lib/... (merged /usr): match on the file name,
  # and follow symlinks so that libfoo.so.1 -> libfoo.so.1.2.3 finds its owner.
  real="$(readlink -f "$lib")"
  owner=""
  for candidate in "$lib" "$real"; do
    owner="$(dpkg-query -S "*/$(basename "$candidate")" 2>/dev/null | grep -v '^diversion' \
             | head -n 1 | sed 's/: .*//; s/,.*//; s/:.*//' || true)"
    [[ -n "$owner" ]] && break
  done
  if [[ -z "$owner" ]]; then
    echo "runtime-packages: no package owns $lib" >&2
    exit 1
  fi
  echo "$owner"
done | sort -u
