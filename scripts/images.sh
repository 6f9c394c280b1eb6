#!/usr/bin/env bash
# Build duet's container images from deploy/docker/*.Dockerfile with podman
# (preferred) or docker, print each image's size and the packages it
# carries.
#
#   scripts/images.sh                 the CPU image, then the GPU image where
#                                     its base images can be had
#   scripts/images.sh --cpu           the CPU image only
#   scripts/images.sh --gpu           the GPU image only
#   scripts/images.sh --base-only     only make sure the CPU Dockerfile's
#                                     base images exist
#   options: --tag TAG (default: the project version, 0.1.0)
#            --refresh-base (make the debootstrap base again)
#
# The Dockerfiles stay standard (docker build -f deploy/docker/cpu.Dockerfile
# -t duet-cpu:0.1.0 . works wherever Docker Hub answers).  Where a base
# image (FROM debian:12.11, debian:12.11-slim) can neither be found locally
# nor pulled, this script makes it: debootstrap --variant=minbase bookworm
# from the Debian mirror (DUET_DEBIAN_MIRROR, default the host's or
# deb.debian.org), imported and tagged with the name the Dockerfile uses
# (docker.io/library/debian:12.11; the -slim one also drops documentation,
# man pages and locales as Debian's slim images do).  The root file
# systems are cached as tarballs under $DUET_CACHE/images (default
# ~/.cache/duet), so a later run or a fresh engine store does not
# debootstrap again; an engine that already holds the images reuses its
# layers.  debootstrap runs as root (sudo otherwise).
#
# The GPU image's bases (nvidia/cuda:*-ubuntu24.04) carry NVIDIA's CUDA
# packages, which cannot be made from a distribution mirror; its build
# stage also downloads the UCX release.  Where neither a registry nor
# NVIDIA's package repository is reachable the GPU build is skipped with
# the reason (exit 0); tests/deploy checks that Dockerfile statically.
#
# Exit status: 0 built (or GPU skipped with a reason), 1 a build failed,
# 3 the CPU base images could not be had (no engine, no debootstrap, no root).
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
# shellcheck source=scripts/lib/containers.sh
. "$here/scripts/lib/containers.sh"

want_cpu=1
want_gpu=1
base_only=0
refresh=0
tag=$(sed -n 's/^project(duet VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
tag=${tag:-0.1.0}
while [ $# -gt 0 ]; do
  case $1 in
    --cpu) want_cpu=1; want_gpu=0 ;;
    --gpu) want_cpu=0; want_gpu=1 ;;
    --base-only) base_only=1; want_gpu=0 ;;
    --refresh-base) refresh=1 ;;
    --tag) tag=$2; shift ;;
    -h | --help) sed -n '2,36p' "$0"; exit 0 ;;
    *) echo "images: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

engine=$(duet_engine) || exit 3
[ "$engine" = podman ] && duet_podman_conf
cache="$(duet_cache_dir)/images"
mkdir -p "$cache"
log() { echo "images: $*" >&2; }

sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"

mirror() {
  if [ -n "${DUET_DEBIAN_MIRROR:-}" ]; then
    echo "$DUET_DEBIAN_MIRROR"
    return
  fi
  local m
  m=$(sed -n 's/^URIs: *\(http[^ ]*debian\/*\)$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n1)
  [ -n "$m" ] || m=$(awk '$1 == "deb" && $3 == "bookworm" { print $2; exit }' /etc/apt/sources.list 2>/dev/null)
  echo "${m:-http://deb.debian.org/debian}"
}

have_image() { "$engine" image inspect "$1" >/dev/null 2>&1; }

# The Dockerfile's base images (FROM lines naming no earlier stage).
bases_of() {
  awk 'toupper($1) == "FROM" {
         img = ""; for (i = 2; i <= NF; i++) if ($i !~ /^--/) { img = $i; break }
         if (!(img in stage)) print img
         for (i = 2; i < NF; i++) if (toupper($i) == "AS") stage[$(i + 1)] = 1
       }' "$1" | awk '!seen[$0]++'
}

# The fully qualified name Docker gives a short one.
qualify() {
  case $1 in
    */*/*) echo "$1" ;;
    *.*/* | localhost/*) echo "$1" ;;
    */*) echo "docker.io/$1" ;;
    *) echo "docker.io/library/$1" ;;
  esac
}

# Debian 12 root file systems as tarballs: debian-bookworm.tar (minbase,
# the official image's apt sources) and debian-bookworm-slim.tar.
make_rootfs_tars() {
  local full="$cache/debian-bookworm.tar" slim="$cache/debian-bookworm-slim.tar"
  if [ "$refresh" = 0 ] && [ -s "$full" ] && [ -s "$slim" ]; then
    log "debootstrap base cached: $full"
    return 0
  fi
  command -v debootstrap >/dev/null 2>&1 || { log "debootstrap is not installed (apt-get install debootstrap)"; return 3; }
  if [ -n "$sudo" ] && ! sudo -n true 2>/dev/null; then
    log "debootstrap needs root (or passwordless sudo)"
    return 3
  fi
  local dir m t0
  m=$(mirror)
  dir=$(mktemp -d "$cache/rootfs.XXXXXX")
  t0=$(date +%s)
  log "debootstrap --variant=minbase bookworm from $m"
  if ! nice $sudo debootstrap --variant=minbase bookworm "$dir" "$m" > "$cache/debootstrap.log" 2>&1; then
    tail -n 20 "$cache/debootstrap.log" >&2
    $sudo rm -rf "$dir"
    log "debootstrap failed (log: $cache/debootstrap.log)"
    return 3
  fi
  # apt sources as the official image has them (updates and security too)
  $sudo rm -f "$dir/etc/apt/sources.list"
  $sudo tee "$dir/etc/apt/sources.list.d/debian.sources" > /dev/null <<EOT
Types: deb
URIs: $m
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOT
  $sudo rm -rf "$dir"/var/lib/apt/lists/* "$dir"/var/cache/apt/*.bin "$dir"/var/cache/apt/archives/*.deb \
    "$dir"/var/log/* "$dir"/tmp/*
  : | $sudo tee "$dir/etc/hostname" > /dev/null
  $sudo tar -C "$dir" --numeric-owner -cf "$full.tmp" .
  # slim: what Debian's -slim images leave out, and dpkg told to keep it out
  $sudo tee "$dir/etc/dpkg/dpkg.cfg.d/docker" > /dev/null <<'EOT'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
EOT
  $sudo find "$dir/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
  $sudo rm -rf "$dir"/usr/share/man/* "$dir"/usr/share/info/* "$dir"/usr/share/locale/* \
    "$dir"/usr/share/groff/* "$dir"/usr/share/lintian/*
  $sudo tar -C "$dir" --numeric-owner -cf "$slim.tmp" .
  $sudo rm -rf "$dir"
  $sudo chown "$(id -u):$(id -g)" "$full.tmp" "$slim.tmp"
  mv "$full.tmp" "$full"
  mv "$slim.tmp" "$slim"
  log "debootstrap base made in $(($(date +%s) - t0)) s: $full, $slim"
}

# Make sure the base image NAME exists: local, pulled, or made.
ensure_base() {
  local name=$1 fq tarball
  fq=$(qualify "$name")
  if [ "$refresh" = 0 ] && { have_image "$fq" || have_image "$name"; }; then
    log "base $name: present"
    return 0
  fi
  if [ "$refresh" = 0 ] && [ "${DUET_IMAGES_NO_PULL:-0}" != 1 ] &&
    timeout 60 "$engine" pull -q "$fq" > /dev/null 2>&1; then
    log "base $name: pulled"
    return 0
  fi
  case $fq in
    docker.io/library/debian:12*-slim | docker.io/library/debian:bookworm*-slim) tarball=debian-bookworm-slim.tar ;;
    docker.io/library/debian:12* | docker.io/library/debian:bookworm*) tarball=debian-bookworm.tar ;;
    *)
      log "base $name: cannot be pulled, and only Debian 12 bases can be made here (debootstrap)"
      return 3 ;;
  esac
  make_rootfs_tars || return $?
  "$engine" import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["bash"]' "$cache/$tarball" "$fq" > /dev/null
  log "base $name: made with debootstrap, tagged $fq"
}

# Print size, runtime packages and every installed package of IMAGE.
describe() {
  local image=$1 size n
  size=$("$engine" image inspect --format '{{.Size}}' "$image")
  echo "== $image: $((size / 1000000)) MB ($size bytes)"
  echo "-- runtime packages (deploy/docker/runtime-packages.sh of the binaries):"
  "$engine" run --rm --entrypoint cat "$image" /usr/local/share/duet/runtime-packages.txt | paste -sd' ' | fold -s -w 100
  n=$("$engine" run --rm --entrypoint dpkg-query "$image" -W -f '${Package}\n' | wc -l)
  echo "-- all $n installed packages (name=version):"
  "$engine" run --rm --entrypoint dpkg-query "$image" -W -f '${Package}=${Version}\n' | paste -sd' ' | fold -s -w 100
  echo "-- binaries:"
  "$engine" run --rm --entrypoint ls "$image" -l /usr/local/bin | awk 'NR > 1 { print "   " $5, $NF }'
}

build() {
  local dockerfile=$1 image=$2 t0 args=()
  t0=$(date +%s)
  args=(-f "$dockerfile" -t "$image")
  if [ "$engine" = podman ]; then
    # podman 4.3 does not read <Dockerfile>.dockerignore by itself
    [ -f "$dockerfile.dockerignore" ] && args+=(--ignorefile "$dockerfile.dockerignore")
    args+=(--pull=missing --layers)
    # podman build does not apply containers.conf's default_ulimits to RUN
    args+=(--ulimit "nofile=$(duet_ulimit n)" --ulimit "nproc=$(duet_ulimit u)")
  fi
  log "$engine build ${args[*]} ."
  if ! nice "$engine" build "${args[@]}" .; then
    log "build of $image failed"
    return 1
  fi
  log "$image built in $(($(date +%s) - t0)) s"
}

status=0
if [ "$want_cpu" = 1 ]; then
  for b in $(bases_of deploy/docker/cpu.Dockerfile); do
    ensure_base "$b" || exit 3
  done
  if [ "$base_only" = 0 ]; then
    build deploy/docker/cpu.Dockerfile "duet-cpu:$tag" || exit 1
    describe "duet-cpu:$tag"
  fi
fi

if [ "$want_gpu" = 1 ]; then
  missing=()
  for b in $(bases_of deploy/docker/gpu.Dockerfile); do
    ensure_base "$b" 2>/dev/null || missing+=("$b")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    why="its base images ${missing[*]} are not present and cannot be pulled"
    if ! curl -s -o /dev/null -m 10 https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64/; then
      why="$why; they cannot be made here either: the CUDA 13 packages they carry come from NVIDIA's repository (developer.download.nvidia.com), which is unreachable"
    else
      why="$why; making them (Ubuntu 24.04 + NVIDIA's CUDA packages) is not automated here"
    fi
    echo "images: GPU image not built: $why.  deploy/docker/gpu.Dockerfile is checked statically (ctest -R deploy.manifests)."
  else
    build deploy/docker/gpu.Dockerfile "duet-gpu:$tag" || status=1
    [ "$status" = 0 ] && describe "duet-gpu:$tag"
  fi
fi
exit "$status"
