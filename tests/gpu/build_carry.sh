#!/bin/bash
# Build the cuda backend's test and bench programs on the dev machine and
# stage them for the GPU machine under .devcarry/cuda/ (gitignored), with
# the two shared libraries its image lacks (cJSON, cmocka).  pkg-config is
# limited to those two so the programs need nothing else from Debian.
#
#   tests/gpu/build_carry.sh            then run(carry=[".devcarry/cuda"],
#                                       command="tests/gpu/run_gpu.sh unit ...")
set -eu
cd "$(dirname "$0")/../.."
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
