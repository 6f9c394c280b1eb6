#!/bin/bash
# Build UCX 1.13.1 (Debian's version, from Debian's source package) with
# CUDA transports (cuda_copy, cuda_ipc) on the dev machine and stage its
# libraries under .devcarry/ucxcuda/ (gitignored) for the GPU machine, where
# the daemons then put KV straight between device pools (transfer path
# ucx-cuda-direct).  Neither Debian's UCX nor the GPU hosts' have CUDA
# transports (tests/gpu/NOTES.md).  Needs root (apt) and the CUDA toolkit
# in /usr/local/cuda; ~10 minutes on 2 cores.
#
#   tests/gpu/build_ucx_cuda.sh
#   then on the GPU machine: DUET_UCX_CUDA_LIB=$PWD/.devcarry/ucxcuda tests/gpu/disagg_gpu.sh
#
# UCX's CUDA support needs NVML's header and library at build time: both
# come from Debian's non-free libnvidia-ml-dev / libnvidia-ml1 packages,
# unpacked here only (not installed); at run time the GPU host's driver
# provides libnvidia-ml.so.1 and libcuda.so.1.  Only UCX's libraries are
# built (its test programs do not compile against CUDA 13's cuCtxCreate).
set -eu
cd "$(dirname "$0")/../.."
ROOT=$PWD
W=${UCX_BUILD_DIR:-/tmp/duet-ucx-cuda}
OUTDIR=$ROOT/.devcarry/ucxcuda
mkdir -p "$W"
cd "$W"

LIST=/etc/apt/sources.list.d/duet-ucx-build.sources
trap 'rm -f "$LIST"; apt-get update -qq >/dev/null 2>&1 || true' EXIT
cat > "$LIST" <<'EOF'
Types: deb deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main contrib non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
apt-get update -qq
apt-get install -y -qq autoconf automake libtool pkg-config > /dev/null
[ -d ucx-1.13.1 ] || apt-get source -qq --download-only ucx=1.13.1-1
[ -d ucx-1.13.1 ] || tar xf ucx_1.13.1.orig.tar.xz
ls libnvidia-ml-dev_*.deb > /dev/null 2>&1 || apt-get download -qq libnvidia-ml-dev libnvidia-ml1
rm -f "$LIST"
mkdir -p nvml
for d in libnvidia-ml-dev_*.deb libnvidia-ml1_*.deb; do dpkg-deb -x "$d" nvml; done
NVML_LIB=$(dirname "$(find "$W/nvml" -name 'libnvidia-ml.so.1' | head -1)")

cd ucx-1.13.1
[ -d debian ] || cp -r debian.upstream debian # autogen wants debian/*
[ -x configure ] || ./autogen.sh > "$W/autogen.log" 2>&1
./configure --prefix="$W/inst" --with-cuda=/usr/local/cuda --without-verbs --without-rdmacm \
    --without-knem --without-xpmem --without-rocm --without-java --without-go \
    --disable-doxygen-doc --enable-optimizations --disable-logging --disable-debug \
    --disable-assertions --disable-params-check --disable-werror \
    CPPFLAGS="-I$W/nvml/usr/include" LDFLAGS="-L/usr/local/cuda/lib64/stubs -L$NVML_LIB" \
    > "$W/configure.log" 2>&1
grep -E "UCT modules" "$W/configure.log"
for d in src/ucm src/ucs src/uct src/ucp src/tools/info; do
    make -j"$(nproc)" -C "$d" install > "$W/make-$(basename "$d").log" 2>&1
done

rm -rf "$OUTDIR"
mkdir -p "$OUTDIR/ucx" "$OUTDIR/bin"
for l in ucm ucs uct ucp; do cp -L "$W/inst/lib/lib$l.so.0" "$OUTDIR/"; done
cp -L "$W"/inst/lib/ucx/*.so.0 "$OUTDIR/ucx/"
cp "$W/inst/bin/ucx_info" "$OUTDIR/bin/"
strip "$OUTDIR"/*.so.0 "$OUTDIR"/ucx/*.so.0 "$OUTDIR/bin/ucx_info"
ls "$OUTDIR/ucx"
du -sh "$OUTDIR"
