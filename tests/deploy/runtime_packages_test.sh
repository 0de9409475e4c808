#!/usr/bin/env bash
# deploy.runtime_packages: deploy/docker/runtime-packages.sh must exit 0 on the built
# binaries AND name the gRPC runtime package. ctest's PASS_REGULAR_EXPRESSION alone ignores
# the exit status (a run killed after its first line of output would still pass), so the
# status and the output are both checked here.
#
#   tests/deploy/runtime_packages_test.sh SCRIPT ELF-FILE...
set -uo pipefail
script="$1"
shift
out="$("$script" "$@")"
rc=$?
printf '%s\n' "$out"
if ((rc != 0)); then
  echo "runtime_packages_test: $script exited with $rc" >&2
  exit 1
fi
if ! grep -q 'libgrpc' <<<"$out"; then
  echo "runtime_packages_test: no libgrpc package in the output" >&2
  exit 1
fi
echo "runtime_packages_test: ok"
