#!/usr/bin/env bash
# Builds the CPU image (deploy/docker/Dockerfile.cpu) on this Debian 12 machine with
# Debian's own tools, no Docker engine and no image registry, and serves from it:
#
#   1. base images: debian:12 and debian:12-slim made with mmdebstrap from Debian's archive
#      (minbase with merged /usr and the apt/dpkg settings of Debian's official images;
#      slim adds their dpkg path excludes), tagged localhost/debian:12 and
#      localhost/debian:12-slim; the root filesystems are cached as tarballs.
#   2. buildah build --isolation chroot --format docker --pull=never --layers of
#      deploy/docker/Dockerfile.cpu from the repository, tagged localhost/flce:cpu.
#   3. the image's server, started as the image says: its ENTRYPOINT and CMD and USER
#      (from `buildah inspect`), with free ports in place of --port and --metrics-port
#      (the container shares the host's network: chroot isolation has no port mapping),
#      in a buildah container run with --isolation chroot.
#   4. from the host: flce-client health, server-info, describe and a Compute call on the
#      image's embedded demo head (hidden and targets written here); the image's own
#      HEALTHCHECK command inside the container (its 50051 replaced by the port in use);
#      a /metrics scrape; Prometheus (Debian's, 2.42) with deploy/prometheus's
#      configuration and rules (targets pointed at these ports) scraping the server; then
#      SIGTERM and a clean exit of the server.
# Exits non-zero when any step fails. Every step's time is printed, and a summary line.
#
#   scripts/image.sh [--build-only] [--refresh-base] [--context DIR]
#
#   --build-only     build the image, serve nothing
#   --refresh-base   remake the base images (a Debian point release or security update)
#   --context DIR    build context (default: the repository root; .dockerignore applies)
#
# Environment:
#   FLCE_IMAGE_CACHE  cache of base root filesystems and buildah's storage (image layers,
#                     the build's cached steps), default /var/cache/flce-image; clear it
#                     with `rm -rf /var/cache/flce-image /run/flce-image` (then the next
#                     run is cold)
#   FLCE_CLIENT       the host's flce-client; default build/client/cli/flce-client, or
#                     one built into build-image-client (the flce-client target only)
#   FLCE_JOBS         parallel compile jobs in the image build (default: all cores)
#
# Needs root (buildah and mmdebstrap in root mode) and Debian's archive; installs buildah,
# mmdebstrap, prometheus, curl and python3 when missing. docs/OPERATIONS.md, "The CPU
# image", says what this proves for the GPU image and what it cannot.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

build_only=0
refresh_base=0
context="$root"
while (($#)); do
  case "$1" in
    --build-only) build_only=1 ;;
    --refresh-base) refresh_base=1 ;;
    --context) context="$(cd "${2:?--context needs a directory}" && pwd)"; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "usage: $0 [--build-only] [--refresh-base] [--context DIR]" >&2; exit 2 ;;
  esac
  shift
done

cache="${FLCE_IMAGE_CACHE:-/var/cache/flce-image}"
tag=localhost/flce:cpu
dockerfile=deploy/docker/Dockerfile.cpu
t0=$SECONDS
tphase=$SECONDS
times=()
log() { echo "image: $*" >&2; }
die() { echo "image: FAIL: $*" >&2; exit 1; }
phase() {  # phase NAME: closes the phase before, opens NAME
  if [[ -n "${phase_name:-}" ]]; then
    times+=("$phase_name $((SECONDS - tphase))s")
    log "--- $phase_name: $((SECONDS - tphase)) s"
  fi
  phase_name="$1"
  tphase=$SECONDS
  [[ -n "$1" ]] && log "--- $1"
  return 0
}

[[ "$(id -u)" -eq 0 ]] || die "run as root (buildah's chroot isolation and mmdebstrap's root mode need it)"

# ------------------------------------------------------------------ host tools --
phase "host packages"
want=(buildah mmdebstrap curl python3)
((build_only)) || want+=(prometheus)
missing=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  if [[ " ${missing[*]} " == *" prometheus "* ]] && [[ -d /run/systemd/system ]]; then
    systemctl disable --now prometheus >/dev/null 2>&1 || true  # this script runs its own
  fi
fi

mkdir -p "$cache/rootfs" "$cache/storage"
# One run at a time per cache: a second waits for the first.
exec 9>"$cache/lock"
flock -n 9 || { log "another scripts/image.sh holds $cache/lock; waiting"; flock 9; }
# buildah's storage in the cache; its run-time state (locks, mounts) under /run, one
# directory per cache.
storage=(--root "$cache/storage" --runroot "/run/flce-image/$(printf %s "$cache" | sha256sum | cut -c1-8)"
         --storage-driver overlay)
bah() { buildah "${storage[@]}" "$@"; }
# Containers an interrupted run left behind (this storage is this script's alone, and the
# lock says that no other run uses it now).
bah rm --all >/dev/null 2>&1 || true

work="$(mktemp -d /tmp/flce-image.XXXXXX)"
ctr=""
server_pid=""
prom_pid=""
cleanup() {
  local rc=$?
  set +e
  if [[ -n "$prom_pid" ]] && kill -0 "$prom_pid" 2>/dev/null; then
    kill "$prom_pid"; wait "$prom_pid" 2>/dev/null
  fi
  if [[ -n "$server_pid" ]] && kill -0 "$server_pid" 2>/dev/null; then
    # buildah run and the server under it: one process group (setsid).
    kill -TERM -- "-$server_pid" 2>/dev/null
    for _ in $(seq 40); do kill -0 "$server_pid" 2>/dev/null || break; sleep 1; done
    kill -KILL -- "-$server_pid" 2>/dev/null
    wait "$server_pid" 2>/dev/null
  fi
  [[ -n "$ctr" ]] && bah rm "$ctr" >/dev/null 2>&1
  if ((rc)) && [[ -s "$work/server.log" ]]; then
    echo "image: the server's log:" >&2; tail -n 40 "$work/server.log" >&2
  fi
  if ((rc)) && [[ -s "$work/prometheus.log" ]]; then
    echo "image: Prometheus' log:" >&2; tail -n 20 "$work/prometheus.log" >&2
  fi
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ----------------------------------------------------------------- base images --
# What Debian's official images are made of (debuerreotype): minbase, merged /usr, apt
# sources for bookworm, -updates and -security, apt/dpkg settings for containers; slim
# adds dpkg path excludes for documentation, man pages and translations (copyright files
# and locale.alias kept). The recipe's hash names the cached tarballs and labels the
# images, so that a changed recipe makes new ones.
phase "base images"
sources="$work/debian.sources"
cat > "$sources" <<'EOF'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
# mmdebstrap's customize hooks run with the root filesystem's directory as $1.
customize='set -e; r="$1"
rm -f "$r"/etc/apt/sources.list "$r"/etc/apt/sources.list.d/*
cp "'"$sources"'" "$r/etc/apt/sources.list.d/debian.sources"
printf "#!/bin/sh\nexit 101\n" > "$r/usr/sbin/policy-rc.d"; chmod 0755 "$r/usr/sbin/policy-rc.d"
echo force-unsafe-io > "$r/etc/dpkg/dpkg.cfg.d/docker-apt-speedup"
c="\"rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true\";"
printf "DPkg::Post-Invoke { %s };\nAPT::Update::Post-Invoke { %s };\nDir::Cache::pkgcache \"\";\nDir::Cache::srcpkgcache \"\";\n" "$c" "$c" > "$r/etc/apt/apt.conf.d/docker-clean"
echo "Acquire::GzipIndexes \"true\";" > "$r/etc/apt/apt.conf.d/docker-gzip-indexes"
echo "Acquire::Languages \"none\";" > "$r/etc/apt/apt.conf.d/docker-no-languages"
echo "Apt::AutoRemove::SuggestsImportant \"false\";" > "$r/etc/apt/apt.conf.d/docker-autoremove-suggests"
rm -f "$r/etc/resolv.conf" "$r/etc/hostname"'
# (mmdebstrap itself empties the apt lists, the apt cache and /tmp afterwards. A hook must
# leave $1/tmp alone: mmdebstrap's apt configuration lives there, and without it the
# cleanup's `apt-get update` would empty the host's apt lists instead of the image's.)
# slim: dpkg's path excludes (kept in the image as /etc/dpkg/dpkg.cfg.d/docker, as in
# Debian's slim image, so that packages installed later leave those files out too), and
# what the bootstrap had extracted before dpkg read them, deleted.
slim_excludes=(/usr/share/doc/'*' /usr/share/groff/'*' /usr/share/info/'*' /usr/share/linda/'*'
               /usr/share/lintian/overrides/'*' /usr/share/locale/'*' /usr/share/man/'*')
slim_includes=(/usr/share/doc/'*'/copyright /usr/share/locale/locale.alias)
slim_cfg="$work/dpkg-slim.cfg"
{ printf 'path-exclude %s\n' "${slim_excludes[@]}"; printf 'path-include %s\n' "${slim_includes[@]}"; } > "$slim_cfg"
slim_hook='set -e; r="$1"
cp "'"$slim_cfg"'" "$r/etc/dpkg/dpkg.cfg.d/docker"; rm -f "$r/etc/dpkg/dpkg.cfg.d/99mmdebstrap"
find "$r/usr/share/doc" -mindepth 1 -not -type d -not -name copyright -delete
find "$r/usr/share/doc" -mindepth 1 -depth -type d -empty -delete
for d in groff info linda lintian/overrides man; do [ ! -d "$r/usr/share/$d" ] || find "$r/usr/share/$d" -mindepth 1 -delete; done
find "$r/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} +'
recipe_hash="$( { cat "$sources" "$slim_cfg"; echo "$customize$slim_hook"; } | sed "s|$work|WORK|g" | sha256sum | cut -c1-12)"
make_base() {  # make_base 12|12-slim
  local variant="$1" tar="$cache/rootfs/debian-$1-$recipe_hash.tar" image="localhost/debian:$1"
  local have
  have="$(bah inspect --type image --format '{{.Docker.Config.Labels}}' "$image" 2>/dev/null || true)"
  if ((!refresh_base)) && [[ "$have" == *"flce.base-recipe:$recipe_hash"* ]]; then
    log "$image: cached (recipe $recipe_hash)"
    return
  fi
  if ((refresh_base)) || [[ ! -s "$tar" ]]; then
    local args=(--variant=minbase --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
                --customize-hook="$customize")
    if [[ "$variant" == *-slim ]]; then
      local p
      for p in "${slim_excludes[@]}"; do args+=(--dpkgopt="path-exclude=$p"); done
      for p in "${slim_includes[@]}"; do args+=(--dpkgopt="path-include=$p"); done
      args+=(--customize-hook="$slim_hook")
    fi
    log "mmdebstrap bookworm ($variant) -> $tar"
    rm -f "$tar.tmp"
    nice -n 19 mmdebstrap --quiet --format=tar "${args[@]}" bookworm "$tar.tmp" "$sources" \
      > "$work/mmdebstrap.log" 2>&1 \
      || { tail -n 30 "$work/mmdebstrap.log" >&2; die "mmdebstrap failed for debian:$variant"; }
    mv "$tar.tmp" "$tar"
  else
    log "$image: from the cached $tar"
  fi
  local c
  c="$(bah from --pull=never scratch)"
  bah add "$c" "$tar" / >/dev/null
  # apt's binary caches, written by mmdebstrap's last `apt-get update`, after the hooks
  # (the images' apt settings keep apt from writing them again).
  local mnt
  mnt="$(bah mount "$c")"
  rm -f "$mnt"/var/cache/apt/*.bin
  bah umount "$c" >/dev/null
  bah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --cmd '["bash"]' --label "flce.base-recipe=$recipe_hash" \
    --label "flce.base=mmdebstrap bookworm $variant, made by scripts/image.sh" "$c"
  bah commit --quiet --format docker --rm "$c" "$image" >/dev/null
  log "$image: $(bah images --format '{{.Size}}' "$image")"
}
for f in "$cache"/rootfs/debian-*.tar; do  # tarballs of another recipe, or all to refresh
  [[ -e "$f" ]] || continue
  if ((refresh_base)) || [[ "$f" != *"-$recipe_hash.tar" ]]; then rm -f "$f"; fi
done
make_base 12
make_base 12-slim

# ----------------------------------------------------------------------- build --
phase "image build"
log "buildah build -f $dockerfile $context -> $tag"
build_args=()
[[ -n "${FLCE_JOBS:-}" ]] && build_args+=(--build-arg "FLCE_JOBS=$FLCE_JOBS")
nice -n 19 buildah "${storage[@]}" \
  build --isolation chroot --format docker --pull=never --layers \
  ${build_args[@]+"${build_args[@]}"} -f "$context/$dockerfile" -t "$tag" "$context" \
  > "$work/build.log" 2>&1 || { tail -n 60 "$work/build.log" >&2; die "buildah build failed"; }
grep -E 'STEP [0-9]+/[0-9]+:|^build-stage:|Using cache' "$work/build.log" | sed 's/^/  /' >&2 || true
# The build stage tagged too (every step cached: a second or two), so that pruning what no
# tag holds keeps it: the next build of unchanged sources is then all cached. Pruned:
# earlier images and build stages, and images of an earlier base recipe.
bah build --isolation chroot --format docker --pull=never --layers --quiet \
  ${build_args[@]+"${build_args[@]}"} --target build -f "$context/$dockerfile" -t "$tag-build" \
  "$context" > /dev/null 2>&1 || die "tagging the build stage failed"
for _ in $(seq 20); do
  [[ -n "$(bah rmi --prune 2>/dev/null)" ]] || break
done
size="$(bah images --format '{{.Size}}' "$tag")"
bah inspect --type image "$tag" > "$work/inspect.json"
python3 - "$work/inspect.json" > "$work/config.sh" <<'EOF'
import json, shlex, sys
img = json.load(open(sys.argv[1]))
cfg = img["Docker"]["config"]
def arr(name, v):
    print(f"{name}=(" + " ".join(shlex.quote(x) for x in (v or [])) + ")")
arr("entrypoint", cfg.get("Entrypoint"))
arr("cmd", cfg.get("Cmd"))
print("user=" + shlex.quote(cfg.get("User") or ""))
print("workdir=" + shlex.quote(cfg.get("WorkingDir") or ""))
arr("healthcheck", (cfg.get("Healthcheck") or {}).get("Test"))
arr("exposed", sorted((cfg.get("ExposedPorts") or {}).keys()))
layers = img["Docker"].get("rootfs", {}).get("diff_ids") or []
print(f"layers={len(layers)}")
EOF
entrypoint=(); cmd=(); healthcheck=(); exposed=(); user=""; workdir=""; layers=0
# shellcheck disable=SC1091
source "$work/config.sh"
log "$tag: $size, $layers layers; USER ${user:-root}, ENTRYPOINT ${entrypoint[*]}, CMD ${cmd[*]}"
log "  HEALTHCHECK ${healthcheck[*]:-none}; EXPOSE ${exposed[*]}"
[[ -n "$user" && "${user%%:*}" != root && "${user%%:*}" != 0 ]] || die "the image runs as root"
((${#healthcheck[@]})) || die "the image has no HEALTHCHECK (built without --format docker?)"
if ((build_only)); then
  phase ""
  log "summary: ${times[*]}; total $((SECONDS - t0)) s; $tag $size"
  exit 0
fi

# ---------------------------------------------------------------------- serve --
# The host's flce-client, copied (a rebuild of build/ while this runs does not swap it).
client_src="${FLCE_CLIENT:-$root/build/client/cli/flce-client}"
if [[ ! -x "$client_src" ]]; then
  phase "host flce-client"
  log "no host flce-client at $client_src: building the flce-client target into build-image-client"
  mapfile -t build_packages < <(sed -e 's/#.*//' "$root/deploy/docker/build-packages.txt" | xargs -n1)
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${build_packages[@]}" >/dev/null
  nice -n 19 cmake -S "$root" -B "$root/build-image-client" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DFLCE_BUILD_TESTS=OFF -DFLCE_BUILD_BENCH=OFF -DFLCE_BUILD_CUDA=OFF >/dev/null
  nice -n 19 ninja -C "$root/build-image-client" flce-client >/dev/null
  client_src="$root/build-image-client/client/cli/flce-client"
fi
phase "serve"
cp "$client_src" "$work/flce-client"
client() { "$work/flce-client" --target "127.0.0.1:$grpc_port" --timeout-s 20 "$@"; }

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
grpc_port="$(free_port)"
metrics_port="$(free_port)"
while [[ "$metrics_port" == "$grpc_port" ]]; do metrics_port="$(free_port)"; done
prom_port="$(free_port)"
while [[ "$prom_port" == "$grpc_port" || "$prom_port" == "$metrics_port" ]]; do prom_port="$(free_port)"; done

# The image's CMD with its ports replaced (both "--port 50051" and "--port=50051" forms).
args=()
for ((i = 0; i < ${#cmd[@]}; i++)); do
  a="${cmd[i]}"
  case "$a" in
    --port) args+=("$a" "$grpc_port"); i=$((i + 1)) ;;
    --port=*) args+=("--port=$grpc_port") ;;
    --metrics-port) args+=("$a" "$metrics_port"); i=$((i + 1)) ;;
    --metrics-port=*) args+=("--metrics-port=$metrics_port") ;;
    *) args+=("$a") ;;
  esac
done
[[ " ${args[*]} " == *" $grpc_port "* || " ${args[*]} " == *"=$grpc_port "* ]] \
  || die "the image's CMD (${cmd[*]}) has no --port to move off 50051"

ctr="$(bah from --pull=never --name "flce-image-$$" "$tag")"
log "container $ctr: ${entrypoint[*]} ${args[*]} as $user (host network)"
setsid buildah "${storage[@]}" \
  run --isolation chroot --user "$user" ${workdir:+--workingdir "$workdir"} "$ctr" -- \
  "${entrypoint[@]}" "${args[@]}" > "$work/server.log" 2>&1 &
server_pid=$!

# Ready: the health service answers SERVING (the image's start period is 60 s).
for i in $(seq 120); do
  if client health > "$work/health.json" 2>/dev/null; then break; fi
  kill -0 "$server_pid" 2>/dev/null || die "the image's server exited: $(tail -n 5 "$work/server.log")"
  ((i < 120)) || die "the image's server did not become healthy within 60 s"
  sleep 0.5
done
log "health: $(cat "$work/health.json")"
log "the server's log begins: $(head -n 2 "$work/server.log" | tr '\n' ' ')"
client server-info > "$work/info.json" || die "server-info failed: $(cat "$work/info.json")"
client describe --head demo > "$work/describe.json" || die "describe --head demo failed: $(cat "$work/describe.json")"

# Started as the image says: the server runs as the image's user, with its environment.
spid="$(pgrep -g "$server_pid" -x flce-server || true)"
[[ -n "$spid" ]] || die "no flce-server process under buildah run ($server_pid)"
want_uid="$(bah run --isolation chroot "$ctr" -- id -u "${user%%:*}")"
have_uid="$(awk '/^Uid:/ {print $2}' "/proc/$spid/status")"
[[ "$have_uid" == "$want_uid" ]] || die "the server runs as uid $have_uid, the image's user ${user%%:*} is $want_uid"
tr '\0' '\n' < "/proc/$spid/environ" | grep -qx 'OPENBLAS_THREAD_TIMEOUT=4' \
  || die "the server's environment lacks the image's OPENBLAS_THREAD_TIMEOUT=4"
log "flce-server (pid $spid) runs as ${user%%:*} (uid $have_uid) with the image's environment"

# A Compute call on the demo head: hidden (N, H) fp32 and targets int32 with some -100,
# written as .npy by Python's standard library (no numpy needed here).
python3 - "$work" "$work/describe.json" > "$work/expect.json" <<'EOF'
import json, random, struct, sys
work, describe = sys.argv[1], json.load(open(sys.argv[2]))
def field(*names):
    for n in names:
        for d in (describe, describe.get("head", {})):
            if isinstance(d, dict) and n in d:
                return int(d[n])
    raise SystemExit(f"describe names no {names}: {describe}")
V, H = field("vocab", "vocab_size", "V"), field("hidden", "hidden_size", "H")
N = 64
def save(path, descr, shape, data):
    header = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, repr(tuple(shape)))
    header += " " * ((64 - (10 + len(header) + 1) % 64) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + data)
r = random.Random(0)
save(f"{work}/h.npy", "<f4", (N, H), struct.pack(f"<{N * H}f", *(r.gauss(0, 1) for _ in range(N * H))))
t = [r.randrange(V) if i % 8 else -100 for i in range(N)]
save(f"{work}/t.npy", "<i4", (N,), struct.pack(f"<{N}i", *t))
print(json.dumps({"tokens": N, "hidden": H, "n_valid": sum(x != -100 for x in t)}))
EOF
client compute --head demo --session image-smoke --hidden "$work/h.npy" --targets "$work/t.npy" \
  --out-grad-input "$work/gx.npy" > "$work/compute.json" \
  || die "compute on the image's server failed: $(cat "$work/compute.json")"
log "compute: $(cat "$work/compute.json")"
python3 - "$work" <<'EOF' || die "the Compute call's result is wrong"
import json, math, os, sys
w = sys.argv[1]
out, exp, info = (json.load(open(f"{w}/{n}.json")) for n in ("compute", "expect", "info"))
ok = True
def check(cond, msg):
    global ok
    if not cond:
        print(f"image: FAIL: {msg}", file=sys.stderr); ok = False
check(math.isfinite(out.get("loss", float("nan"))) and out["loss"] > 0, f"loss {out.get('loss')}")
check(out.get("n_valid") == exp["n_valid"], f"n_valid {out.get('n_valid')}, want {exp['n_valid']}")
check(str(out.get("strategy_used", "")).startswith("cpu"), f"strategy_used {out.get('strategy_used')} (CPU engine expected)")
size = os.path.getsize(f"{w}/gx.npy")
check(size >= exp["tokens"] * exp["hidden"] * 4, f"grad_input file of {size} bytes")
check("cpu" in json.dumps(info).lower(), f"server-info names no CPU engine: {info}")
sys.exit(0 if ok else 1)
EOF

# The image's HEALTHCHECK command, inside the container, as the image's user.
hc=()
case "${healthcheck[0]}" in
  CMD) hc=("${healthcheck[@]:1}") ;;
  CMD-SHELL) hc=(/bin/sh -c "${healthcheck[*]:1}") ;;
  *) die "HEALTHCHECK ${healthcheck[*]}: neither CMD nor CMD-SHELL" ;;
esac
hc=("${hc[@]//:50051/:$grpc_port}")
bah run --isolation chroot --user "$user" "$ctr" -- "${hc[@]}" > "$work/hc.json" 2>&1 \
  || die "the image's HEALTHCHECK (${hc[*]}) failed: $(cat "$work/hc.json")"
log "HEALTHCHECK in the container: $(tr -d '\n' < "$work/hc.json")"

# /metrics from the host: the Compute call counted.
curl -fsS "http://127.0.0.1:$metrics_port/metrics" > "$work/metrics.txt" || die "no /metrics on $metrics_port"
grep -E '^flce_requests_total\{.*rpc="Compute".*\} 1$' "$work/metrics.txt" | grep -q 'code="OK"' \
  || die "/metrics counts no OK Compute: $(grep '^flce_requests_total' "$work/metrics.txt")"
grep -q '^flce_build_info{' "$work/metrics.txt" || die "/metrics has no flce_build_info"
log "/metrics: $(grep -c '^flce_' "$work/metrics.txt") flce_ series, the Compute call counted"

# Prometheus with deploy/prometheus's configuration and rules, its targets pointed here.
mkdir -p "$work/prometheus/rules" "$work/tsdb"
cp "$root"/deploy/prometheus/rules/*.yml "$work/prometheus/rules/"
sed -e "s|flce-server:9464|127.0.0.1:$metrics_port|" -e "s|localhost:9090|127.0.0.1:$prom_port|" \
    -e "s|/etc/prometheus/rules/|$work/prometheus/rules/|" \
    "$root/deploy/prometheus/prometheus.yml" > "$work/prometheus/prometheus.yml"
grep -q "127.0.0.1:$metrics_port" "$work/prometheus/prometheus.yml" \
  || die "deploy/prometheus/prometheus.yml no longer names flce-server:9464"
prometheus --config.file="$work/prometheus/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
  --web.listen-address="127.0.0.1:$prom_port" > "$work/prometheus.log" 2>&1 &
prom_pid=$!
prom_query() {  # the first value of an instant query, or nothing
  curl -fsS --get "http://127.0.0.1:$prom_port/api/v1/query" --data-urlencode "query=$1" 2>/dev/null \
    | python3 -c 'import json, sys; r = json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else "")' 2>/dev/null || true
}
for i in $(seq 60); do
  up="$(prom_query 'up{job="flce"}')"
  computes="$(prom_query 'sum(flce_requests_total{job="flce",rpc="Compute",code="OK"})')"
  [[ "$up" == 1 && "$computes" == 1 ]] && break
  kill -0 "$prom_pid" 2>/dev/null || die "Prometheus exited"
  ((i < 60)) || die "Prometheus did not scrape the server within 60 s (up=$up, Compute OK=$computes)"
  sleep 1
done
rules="$(curl -fsS "http://127.0.0.1:$prom_port/api/v1/rules" | python3 -c '
import json, sys
print(" ".join(r["name"] for g in json.load(sys.stdin)["data"]["groups"] for r in g["rules"]))')"
[[ "$rules" == *FlceScrapeMissing* ]] || die "Prometheus loaded no flce alert rules: $rules"
log "Prometheus $(prometheus --version 2>&1 | awk 'NR==1{print $3}'): up{job=\"flce\"} = 1, Compute OK = 1; rules: $rules"
kill "$prom_pid"; wait "$prom_pid" 2>/dev/null || true; prom_pid=""

# SIGTERM to the server (not to buildah run above it): it drains and exits 0, and buildah
# run passes that status on.
kill -TERM "$spid"
for i in $(seq 45); do kill -0 "$server_pid" 2>/dev/null || break; sleep 1; done
if kill -0 "$server_pid" 2>/dev/null; then die "the image's server did not stop within 45 s of SIGTERM"; fi
status=0; wait "$server_pid" || status=$?
server_pid=""
((status == 0)) || die "the image's server exited with $status after SIGTERM"
log "the server stopped on SIGTERM (exit 0)"

phase ""
log "summary: ${times[*]}; total $((SECONDS - t0)) s; $tag $size"
log "ok: the CPU image built and served a Compute call"
