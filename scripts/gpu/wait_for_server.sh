# Sourced by the device machine's scripts that start flce-server themselves
# (run_policy.sh, run_server_malloc.sh, run_data_plane.sh).
wait_for_server() {  # wait_for_server CLI TARGET: until TARGET answers health, at most 30 s
  local cli=$1 target=$2
  for _ in $(seq 1 300); do
    "$cli" --target "$target" health >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "flce-server at $target did not answer within 30 s" >&2
  return 1
}
