#!/bin/bash
# Build the pinned UCX (scripts/build_ucx.sh: 1.22.0 with cuda_copy and
# cuda_ipc) on a build machine without a GPU and stage its libraries under
# .devcarry/ucxcuda/ (gitignored) for the GPU machine, where the daemons
# and bench_gpu_transfer then put KV straight between device pools
# (transfer path ucx-cuda-direct).  Neither Debian's UCX nor the GPU hosts'
# have CUDA transports (docs/gpu.md).  Needs root (apt) and the CUDA
# toolkit in /usr/local/cuda; ~10 minutes on 2 cores.
#
#   tests/gpu/build_ucx_cuda.sh
#   then on the GPU machine: DUET_UCX_CUDA_LIB=$PWD/.devcarry/ucxcuda tests/gpu/disagg_gpu.sh
#
# NVML's header and library come from Debian's non-free libnvidia-ml-dev /
# libnvidia-ml1, unpacked here only (not installed); at run time the GPU
# host's driver provides libnvidia-ml.so.1 and libcuda.so.1.
set -eu
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
W=${UCX_BUILD_DIR:-/tmp/duet-ucx-cuda}
OUTDIR=$ROOT/.devcarry/ucxcuda
mkdir -p "$W"

if ! ls "$W"/libnvidia-ml-dev_*.deb > /dev/null 2>&1; then
    LIST=/etc/apt/sources.list.d/duet-nvml.sources
    trap 'rm -f "$LIST"; apt-get update -qq >/dev/null 2>&1 || true' EXIT
    cat > "$LIST" <<'SRC'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
    apt-get update -qq
    (cd "$W" && apt-get download -qq libnvidia-ml-dev libnvidia-ml1)
    rm -f "$LIST"
fi
rm -rf "$W/nvml"
mkdir -p "$W/nvml"
for d in "$W"/libnvidia-ml-dev_*.deb "$W"/libnvidia-ml1_*.deb; do dpkg-deb -x "$d" "$W/nvml"; done
NVML_LIB=$(dirname "$(find "$W/nvml" -name 'libnvidia-ml.so.1' | head -1)")
ln -sf libnvidia-ml.so.1 "$NVML_LIB/libnvidia-ml.so"

LIBRARY_PATH=$NVML_LIB UCX_BUILD_DIR=$W/build scripts/build_ucx.sh --prefix "$W/inst" \
    --nvml "$W/nvml/usr/include"

rm -rf "$OUTDIR"
mkdir -p "$OUTDIR/ucx" "$OUTDIR/bin"
for l in ucm ucs uct ucp; do cp -L "$W/inst/lib/lib$l.so.0" "$OUTDIR/"; done
cp -L "$W"/inst/lib/ucx/*.so.0 "$OUTDIR/ucx/"
cp "$W/inst/bin/ucx_info" "$OUTDIR/bin/"
strip "$OUTDIR"/*.so.0 "$OUTDIR"/ucx/*.so.0 "$OUTDIR/bin/ucx_info"
ls "$OUTDIR/ucx"
du -sh "$OUTDIR"
