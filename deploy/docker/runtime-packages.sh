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
  # ldd runs once and its output is read from a variable: no pipe that a reader closes
  # early (grep -q, awk's exit), whose writer would die of SIGPIPE under pipefail.
  if ! deps="$(ldd "$elf")"; then
    echo "runtime-packages: cannot read the libraries of $elf" >&2
    exit 1
  fi
  if grep -q 'not found' <<<"$deps"; then
    echo "runtime-packages: $elf has unresolved libraries:" >&2
    grep 'not found' <<<"$deps" >&2
    exit 1
  fi
  while read -r lib; do
    [[ -n "$lib" ]] && libs+=("$lib")
  done < <(awk '/=>/ && $3 ~ /^\// {print $3}' <<<"$deps" | grep -v -E "$skip" \
             | grep -v '^/usr/local/cuda' || true)
done

((${#libs[@]})) || exit 0
# Owners from dpkg's file lists, in one pass. Each library is looked up by its path and,
# through symlinks, its real file's path, each with and without a leading /usr (merged
# /usr: dpkg may have registered /lib/... or /usr/lib/...).
variants() {
  local p
  for p in "$1" "$(readlink -f "$1")"; do
    p="${p#/usr}"
    printf '%s\n' "$p" "/usr$p"
  done
}
mapfile -t unique < <(printf '%s\n' "${libs[@]}" | sort -u)
patterns="$(for lib in "${unique[@]}"; do variants "$lib"; done | sort -u)"
owners="$(grep -H -x -F -f <(printf '%s\n' "$patterns") /var/lib/dpkg/info/*.list || true)"
for lib in "${unique[@]}"; do
  owner=""
  while read -r v; do
    # A here-string, not a pipe: awk exits at the first match, and a printf still writing
    # into the closed pipe would die of SIGPIPE (141), which pipefail makes fatal.
    owner="$(awk -F: -v v="$v" '$NF == v { print $1; exit }' <<<"$owners")"
    [[ -n "$owner" ]] && break
  done < <(variants "$lib")
  if [[ -z "$owner" ]]; then
    echo "runtime-packages: no package owns $lib" >&2
    exit 1
  fi
  owner="$(basename "$owner" .list)"
  echo "${owner%%:*}"
done | sort -u
