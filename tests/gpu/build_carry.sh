#!/bin/bash
# Build here, run there: build the cuda backend's test and bench programs
# on a build machine (CUDA toolkit, no GPU needed) and stage them under
# .devcarry/cuda/ (gitignored) with the two shared libraries a bare CUDA
# host may lack (cJSON, cmocka).  pkg-config is limited to those two so the
# programs need nothing else from Debian.  Copy .devcarry/cuda into the GPU
# machine's checkout; tests/gpu/suite.sh uses it when there is no build tree.
#
#   tests/gpu/build_carry.sh            then, on the GPU machine:
#                                       tests/gpu/suite.sh unit compare bench
set -eu
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
C=$ROOT/.devcarry/cuda
B=$ROOT/build/cuda-gpu
mkdir -p "$C/pc" "$C/bin" "$C/lib"
ln -sf /usr/lib/x86_64-linux-gnu/pkgconfig/libcjson.pc "$C/pc/"
ln -sf /usr/lib/x86_64-linux-gnu/pkgconfig/cmocka.pc "$C/pc/"
PKG_CONFIG_LIBDIR=$C/pc cmake -S "$ROOT" -B "$B" -DDUET_WERROR=ON -DDUET_CUDA=ON \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER_LAUNCHER="$ROOT/tests/gpu/nvcc_launcher.sh" \
    > /dev/null
tests=$(cd "$ROOT/tests/unit" && ls test_cuda_*.c | sed 's/\.c$//')
cmake --build "$B" -j2 --target duet bench_gpu bench_attention $tests
rm -f "$C"/bin/*
cp "$B/tools/duet" "$B/bench/bench_gpu" "$B/bench/bench_attention" "$C/bin/"
for t in $tests; do cp "$B/tests/$t" "$C/bin/"; done
strip "$C"/bin/*
cp -L /usr/lib/x86_64-linux-gnu/libcjson.so.1 /usr/lib/x86_64-linux-gnu/libcmocka.so.0 "$C/lib/"
du -sh "$C"
