#!/bin/bash
# Build here, run there: build duet's daemons and tools with the cuda
# backend on a build machine and stage them under .devcarry/daemons/
# (gitignored), with every shared library a bare CUDA host lacks (gRPC,
# protobuf-c, UCX and its transport modules, cJSON...): such a host has
# CUDA, cuBLAS and NCCL but none of duet's Debian dependencies.  Copy
# .devcarry/daemons into the GPU machine's checkout; tests/gpu/suite.sh uses
# it when there is no build tree.
#
#   tests/gpu/build_carry_daemons.sh   then, on the GPU machine:
#                                      tests/gpu/suite.sh disagg ttft serve
set -eu
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
C=$ROOT/.devcarry/daemons
B=$ROOT/build/cuda-daemons
rm -rf "$C"
mkdir -p "$C/bin" "$C/lib"
cmake -S "$ROOT" -B "$B" -DDUET_CUDA=ON -DCMAKE_BUILD_TYPE=Release -DDUET_BUILD_TESTS=OFF \
    -DCMAKE_CUDA_COMPILER_LAUNCHER="$ROOT/tests/gpu/nvcc_launcher.sh" > /dev/null
cmake --build "$B" -j2 --target duet duet-prefill duet-decode duet-client duet-router
cp "$B/tools/duet" "$B/tools/duet-client" "$B/prefill/duet-prefill" "$B/decode/duet-decode" \
    "$B/router/duet-router" \
    "$C/bin/"
strip "$C"/bin/*
# every library they load that is not glibc's or CUDA's (the GPU host has
# those, newer)
for lib in $(ldd "$C"/bin/* | awk '/=> \//{print $3}' | sort -u); do
    case "$(basename "$lib")" in
    libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | ld-linux*) ;;
    libcuda.so.* | libcudart.so.* | libcublas*.so.* | libnccl.so.*) ;;
    libstdc++.so.* | libgcc_s.so.*) ;;
    *) cp -L "$lib" "$C/lib/" ;;
    esac
done
cp -rL /usr/lib/x86_64-linux-gnu/ucx "$C/lib/ucx"
du -sh "$C"
