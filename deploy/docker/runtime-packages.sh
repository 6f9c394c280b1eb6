#!/usr/bin/env bash
# Print the Debian/Ubuntu packages whose shared libraries the given
# binaries load, one per line, sorted: what a runtime image must install
# for them.  Runs in an image's build stage (and in CI against the CI
# build), where the libraries were installed by scripts/install-deps.sh.
#
#   deploy/docker/runtime-packages.sh [--bundled DIR]... BINARY...
#
# --bundled DIR: the shared libraries under DIR ship in the image itself
# (the GPU image copies /opt/ucx, built by scripts/build_ucx.sh, from its
# build stage): a library under DIR is no package's, and every shared
# object under DIR (UCX's transport modules, which UCX dlopens and ldd of
# a binary never shows) is scanned like a binary, so the packages that
# they need (libibverbs1, librdmacm1, ibverbs-providers, ...) are listed.
#
# Fails when a library is missing or belongs to no package (a library the
# runtime image could not get from apt), or when a package is a -dev one.
# The NVIDIA driver's user-space libraries (libcuda.so.1,
# libnvidia-ml.so.1) are the exception: no build stage has them, and the
# NVIDIA container runtime mounts the host driver's copies into a GPU
# container.
set -euo pipefail

bundled=()
while [ $# -gt 0 ]; do
  case $1 in
    --bundled)
      [ $# -ge 2 ] && [ -d "$2" ] || { echo "runtime-packages: --bundled needs a directory" >&2; exit 2; }
      bundled+=("$(cd "$2" && pwd -P)")
      shift 2 ;;
    --) shift; break ;;
    -*) echo "runtime-packages: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
if [ $# -eq 0 ]; then
  echo "usage: $0 [--bundled DIR]... BINARY..." >&2
  exit 2
fi

driver_lib() {
  case $1 in
    libcuda.so.1 | libnvidia-ml.so.1) return 0 ;;
  esac
  return 1
}

# Is this path (or the file it links to) under a --bundled directory?
in_bundled() {
  local p real d
  p=$1
  real=$(readlink -f "$p")
  for d in ${bundled[@]+"${bundled[@]}"}; do
    case "$p" in "$d"/*) return 0 ;; esac
    case "$real" in "$d"/*) return 0 ;; esac
  done
  return 1
}

owner() {
  # dpkg knows a library by the path its package shipped: try the path
  # ldd printed, its merged-/usr twin and the symlink's target
  local p=$1 alt real out
  case "$p" in
    /usr/lib/*) alt=${p#/usr} ;;
    /lib/*) alt=/usr$p ;;
    *) alt=$p ;;
  esac
  real=$(readlink -f "$p")
  for q in "$p" "$alt" "$real"; do
    if out=$(dpkg-query -S "$q" 2>/dev/null); then
      printf '%s\n' "$out" | head -n1 | cut -d: -f1
      return 0
    fi
  done
  return 1
}

# the binaries, then every ELF shared object under the bundled directories
objects=()
for bin in "$@"; do
  if [ ! -x "$bin" ]; then
    echo "runtime-packages: $bin: not an executable" >&2
    exit 1
  fi
  objects+=("$bin")
done
for d in ${bundled[@]+"${bundled[@]}"}; do
  while IFS= read -r -d '' f; do
    [ "$(head -c 4 "$f" | od -An -c | tr -d ' ')" = '177ELF' ] && objects+=("$f")
  done < <(find "$d" -type f \( -name '*.so' -o -name '*.so.*' \) -print0 | sort -z)
done

declare -A seen=()
status=0
for bin in "${objects[@]}"; do
  if ! out=$(ldd "$bin" 2>&1); then
    case "$out" in
      *"not a dynamic executable"*) continue ;; # static: needs no package
    esac
    echo "runtime-packages: $bin: ldd failed: $out" >&2
    status=1
    continue
  fi
  while read -r line; do
    case "$line" in
      *"=> not found"*)
        lib=${line%% *}
        if driver_lib "$lib"; then
          echo "runtime-packages: $bin: $lib: the NVIDIA driver's, mounted by the container runtime" >&2
        else
          echo "runtime-packages: $bin: $lib not found" >&2
          status=1
        fi
        continue ;;
    esac
    path=$(printf '%s\n' "$line" | awk '/=>/ { print $3; next } /^\// { print $1 }')
    [ -n "$path" ] || continue
    case "$path" in
      /usr/local/cuda*)
        # the CUDA toolkit's own libraries (cudart, cuBLAS, NCCL): the GPU
        # image's runtime base provides them, and they are no Debian package
        continue ;;
    esac
    # shipped in the image (--bundled), not installed from a package
    in_bundled "$path" && continue
    if pkg=$(owner "$path"); then
      seen[$pkg]=1
    else
      echo "runtime-packages: $bin: $path belongs to no package" >&2
      status=1
    fi
  done <<< "$out"
done

for pkg in "${!seen[@]}"; do
  case "$pkg" in
    *-dev | *-dev:*)
      echo "runtime-packages: $pkg is a development package" >&2
      status=1 ;;
  esac
done
[ "$status" -eq 0 ] || exit "$status"
printf '%s\n' "${!seen[@]}" | sort
