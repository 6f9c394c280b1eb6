#!/usr/bin/env bash
# Print the Debian/Ubuntu packages whose shared libraries the given
# binaries load, one per line, sorted: what a runtime image must install
# for them.  Runs in an image's build stage (and in CI against the CI
# build), where the libraries were installed by scripts/install-deps.sh.
#
#   deploy/docker/runtime-packages.sh build/release/prefill/duet-prefill ...
#
# Fails when a library is missing or belongs to no package (a library the
# runtime image could not get from apt), or when a package is a -dev one.
set -euo pipefail

if [ $# -eq 0 ]; then
  echo "usage: $0 BINARY..." >&2
  exit 2
fi

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

declare -A seen=()
status=0
for bin in "$@"; do
  if [ ! -x "$bin" ]; then
    echo "runtime-packages: $bin: not an executable" >&2
    exit 1
  fi
  while read -r line; do
    case "$line" in
      *"=> not found"*)
        echo "runtime-packages: $bin: ${line%% *} not found" >&2
        status=1
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
    if pkg=$(owner "$path"); then
      seen[$pkg]=1
    else
      echo "runtime-packages: $bin: $path belongs to no package" >&2
      status=1
    fi
  done < <(ldd "$bin")
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
