#!/usr/bin/env bash
# Build the pinned UCX release (1.22.0) with CUDA transports (cuda_copy,
# cuda_ipc) and, where their headers are present, verbs/rdmacm/mlx5 for
# GPUDirect RDMA between nodes.  The GPU build of duet links it; the CPU
# build keeps Debian's UCX.
#
#   scripts/build_ucx.sh --prefix DIR [--source TARBALL] [--cuda DIR] [--jobs N]
#
# Source, first found: --source, $DUET_UCX_SOURCE, the autogen'd release
# export in ../shared/third_party/ (machines without network access), else
# the upstream release tarball, downloaded.  Each is checked against its
# pinned sha256 before anything is unpacked.
#
# Only UCX's libraries and ucx_info are built: UCX's perftest CUDA kernels
# do not build against CUDA 13.  nvml.h comes from the CUDA toolkit or
# Debian's non-free libnvidia-ml-dev (--nvml DIR names another include dir).
set -euo pipefail

UCX_VERSION=1.22.0
UCX_URL=https://github.com/openucx/ucx/releases/download/v$UCX_VERSION/ucx-$UCX_VERSION.tar.gz
UCX_URL_SHA256=258941cddd14ca60d38c0d31b9b09ec1052c901086841011a498da8b55a3cb24
UCX_EXPORT=ucx-$UCX_VERSION-autogen.tar.xz
UCX_EXPORT_SHA256=6fd849991f6eb539702e4bd67dc612b5bea71146725ab25c1313b53d10308cc0

here=$(cd "$(dirname "$0")/.." && pwd)
prefix= source=${DUET_UCX_SOURCE:-} cuda=${CUDA_HOME:-/usr/local/cuda} nvml=
jobs=$(nproc 2>/dev/null || echo 2)
work=${UCX_BUILD_DIR:-/tmp/duet-ucx-$UCX_VERSION}
while [ $# -gt 0 ]; do
  case $1 in
    --prefix) prefix=$2; shift 2 ;;
    --source) source=$2; shift 2 ;;
    --cuda) cuda=$2; shift 2 ;;
    --nvml) nvml=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "build_ucx.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$prefix" ] || { echo "build_ucx.sh: --prefix DIR is required" >&2; exit 2; }
[ -x "$cuda/bin/nvcc" ] || { echo "build_ucx.sh: no CUDA toolkit at $cuda (--cuda DIR)" >&2; exit 1; }

sha_ok() { echo "$2  $1" | sha256sum -c --status; }

mkdir -p "$work"
if [ -z "$source" ] && [ -f "$here/../shared/third_party/$UCX_EXPORT" ]; then
  source=$here/../shared/third_party/$UCX_EXPORT
fi
if [ -z "$source" ]; then
  source=$work/ucx-$UCX_VERSION.tar.gz
  [ -f "$source" ] || curl -fsSL --retry 3 -o "$source" "$UCX_URL"
fi
case $(basename "$source") in
  "$UCX_EXPORT") want=$UCX_EXPORT_SHA256 ;;
  *) want=$UCX_URL_SHA256 ;;
esac
if ! sha_ok "$source" "$want"; then
  echo "build_ucx.sh: $source: sha256 is not the pinned $want" >&2
  exit 1
fi

src=$work/src
rm -rf "$src"
mkdir -p "$src"
tar -xf "$source" -C "$src" --strip-components=1
[ -x "$src/configure" ] || { echo "build_ucx.sh: $source has no configure script" >&2; exit 1; }

# NVML's header: CUDA toolkit, an explicit dir, or the system (libnvidia-ml-dev)
if [ -z "$nvml" ]; then
  for d in "$cuda/include" "$cuda/targets/x86_64-linux/include" /usr/include; do
    [ -f "$d/nvml.h" ] && { nvml=$d; break; }
  done
fi
[ -n "$nvml" ] && [ -f "$nvml/nvml.h" ] || {
  echo "build_ucx.sh: nvml.h not found (CUDA toolkit or libnvidia-ml-dev; --nvml DIR)" >&2
  exit 1
}
nvml_lib=
for d in "$cuda/lib64/stubs" "$cuda/targets/x86_64-linux/lib/stubs" /usr/lib/x86_64-linux-gnu; do
  [ -e "$d/libnvidia-ml.so" ] && { nvml_lib=$d; break; }
done

# RDMA where this machine has its headers (rdma-core's libibverbs-dev, librdmacm-dev)
rdma=(--without-verbs --without-rdmacm --without-mlx5)
if [ -f /usr/include/infiniband/verbs.h ]; then
  rdma=(--with-verbs)
  [ -f /usr/include/rdma/rdma_cma.h ] && rdma+=(--with-rdmacm) || rdma+=(--without-rdmacm)
  [ -f /usr/include/infiniband/mlx5dv.h ] && rdma+=(--with-mlx5) || rdma+=(--without-mlx5)
fi

cd "$src"
./configure --prefix="$prefix" --with-cuda="$cuda" --enable-mt "${rdma[@]}" \
    --without-gdrcopy --without-gda --without-knem --without-xpmem --without-rocm --without-java --without-go \
    --disable-doxygen-doc --enable-optimizations --disable-logging --disable-debug \
    --disable-assertions --disable-params-check --disable-werror \
    CPPFLAGS="-I$nvml" LDFLAGS="-L$cuda/lib64/stubs${nvml_lib:+ -L$nvml_lib}" \
    > "$work/configure.log" 2>&1 || { tail -30 "$work/configure.log" >&2; exit 1; }
grep -E "UCT modules|CUDA modules|IB modules" "$work/configure.log" || true
grep -q "UCT modules:.*cuda" "$work/configure.log" || {
  echo "build_ucx.sh: configure did not enable the cuda transports (see $work/configure.log)" >&2
  exit 1
}
for d in src/ucm src/ucs src/uct src/ucp src/tools/info; do
  make -j"$jobs" -C "$d" install > "$work/make-$(basename "$d").log" 2>&1 ||
    { tail -30 "$work/make-$(basename "$d").log" >&2; exit 1; }
done
# the pkg-config file that duet's CMake looks for
make -C "$src" install-pkgconfigDATA > "$work/make-pkgconfig.log" 2>&1 ||
  { tail -30 "$work/make-pkgconfig.log" >&2; exit 1; }
"$prefix/bin/ucx_info" -v | head -2
echo "build_ucx.sh: UCX $UCX_VERSION installed in $prefix"
