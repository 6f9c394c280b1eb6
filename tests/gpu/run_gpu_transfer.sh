#!/bin/bash
# GPU KV transfer benchmark (issue: CUDA backend, benchmark): bench_gpu_transfer
# between a prefill and a decode process on a 2-GPU machine over the staged
# path the daemons run (device -> pinned host mirror -> UCX shared-memory
# puts -> mirror -> device), next to cudaMemcpyPeer, pinned host<->device
# copies and the host-side put, all measured in the same run.
#
# tests/gpu/suite.sh's transfer phase runs this (through run_packed.sh).
#
#   tests/gpu/run_gpu_transfer.sh --build    build machine: build (build/gxfer),
#                                            stage .devcarry/gxfer/ (binary +
#                                            every library a bare CUDA host
#                                            lacks, UCX modules), run the
#                                            --no-cuda self-tests
#   tests/gpu/run_gpu_transfer.sh [ARGS]     GPU machine; ARGS go to
#                                            bench_gpu_transfer; log in
#                                            $OUT/gpu-transfer.log
#                                            (GXFER_BIN: the binary, default
#                                            .devcarry/gxfer/bin/...)
#   tests/gpu/run_gpu_transfer.sh --mirror device [ARGS]
#                                            the device-direct path (device
#                                            pools registered with UCX, puts
#                                            over cuda_ipc): needs a UCX with
#                                            CUDA transports, e.g.
#                                            DUET_UCX_CUDA_LIB=.devcarry/ucxcuda;
#                                            without one the bench says so and
#                                            exits 0
#
# DUET_UCX_CUDA_LIB=DIR: use the UCX build in DIR (libucp/libuct/libucs/libucm
# .so files, its modules in DIR/ucx) instead of the staged or system one.
set -u
if [ -n "${DUET_UCX_CUDA_LIB:-}" ]; then
    DUET_UCX_CUDA_LIB=$(cd "$DUET_UCX_CUDA_LIB" 2>/dev/null && pwd) || {
        echo "DUET_UCX_CUDA_LIB: no such directory" >&2
        exit 1
    }
    export -n DUET_UCX_CUDA_LIB # UCX warns about UCX_* variables it does not know
fi
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
C=$ROOT/.devcarry/gxfer
# GXFER_BIN: another build of the bench with the same libraries (a same-run
# baseline: run_packed.sh's auto-old mode)
BIN=${GXFER_BIN:-$C/bin/bench_gpu_transfer}

if [ "${1:-}" = "--build" ]; then
    set -e
    B=$ROOT/build/gxfer
    cmake -S "$ROOT" -B "$B" -DDUET_CUDA=ON -DCMAKE_BUILD_TYPE=Release -DDUET_BUILD_TESTS=OFF \
        -DDUET_WERROR=ON -DCMAKE_CUDA_COMPILER_LAUNCHER="$ROOT/tests/gpu/nvcc_launcher.sh" >/dev/null
    cmake --build "$B" -j2 --target bench_gpu_transfer
    rm -rf "$C"
    mkdir -p "$C/bin" "$C/lib"
    cp "$B/bench/bench_gpu_transfer" "$C/bin/"
    strip "$C"/bin/*
    # every library it loads that is not glibc's or CUDA's (the GPU host has
    # those, newer)
    for lib in $(ldd "$BIN" | awk '/=> \//{print $3}' | sort -u); do
        case "$(basename "$lib")" in
        libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | ld-linux*) ;;
        libcuda.so.* | libcudart.so.* | libcublas*.so.* | libnccl.so.*) ;;
        libstdc++.so.* | libgcc_s.so.*) ;;
        *) cp -L "$lib" "$C/lib/" ;;
        esac
    done
    cp -rL /usr/lib/x86_64-linux-gnu/ucx "$C/lib/ucx"
    du -sh "$C"
    echo "self-test (--no-cuda: host memory for the device pools)"
    "$BIN" --no-cuda --tokens 512,1024 --rounds 1 >/dev/null
    if "$BIN" --no-cuda --tokens 512 --rounds 1 --plans 1x1 --variants same --corrupt-put 10 \
        >/dev/null 2>&1; then
        echo "a corrupted put passed verification"
        exit 1
    fi
    # checksums (the CPU's on host pools): a clean run passes, a corrupted
    # put fails by its checksum
    "$BIN" --no-cuda --checksum --tokens 512 --rounds 1 --plans 1x1,1x2,2x1 --variants same \
        >/dev/null
    if "$BIN" --no-cuda --checksum --tokens 512 --rounds 1 --plans 1x1 --variants same \
        --corrupt-put 10 >"$C/corrupt.log" 2>&1 || ! grep -q "checksum mismatch" "$C/corrupt.log"; then
        echo "--checksum: a corrupted put was not caught by its checksum"
        cat "$C/corrupt.log"
        exit 1
    fi
    rm -f "$C/corrupt.log"
    # --mirror device needs the GPU: refused with --no-cuda (usage, exit 2)
    set +e
    "$BIN" --no-cuda --mirror device --tokens 512 --rounds 1 >/dev/null 2>&1
    rc=$?
    set -e
    if [ $rc -ne 2 ]; then
        echo "--mirror device --no-cuda: exit $rc, want 2 (usage)"
        exit 1
    fi
    echo "self-test ok"
    exit 0
fi

export LD_LIBRARY_PATH=$C/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
UCX_DESC="the system's"
if [ -d "$C/lib/ucx" ]; then # the staged Debian UCX (run_gpu_transfer.sh --build)
    export UCX_MODULE_DIR=$C/lib/ucx
    UCX_DESC="staged Debian 1.13, no CUDA transports"
fi
if [ -n "${DUET_UCX_CUDA_LIB:-}" ]; then
    # ahead of the staged or system libraries
    export LD_LIBRARY_PATH=$DUET_UCX_CUDA_LIB:$LD_LIBRARY_PATH
    export UCX_MODULE_DIR=$DUET_UCX_CUDA_LIB/ucx
    # UCX 1.13: puts from device memory need the new protocols
    export UCX_PROTO_ENABLE=${UCX_PROTO_ENABLE:-y}
    UCX_DESC="DUET_UCX_CUDA_LIB"
fi
DEVICE=0
MIRROR=
for a in "$@"; do
    [ "${prev:-}" = --mirror ] && MIRROR=$a
    prev=$a
done
case $MIRROR in device | packed | auto) DEVICE=1 ;; esac
LOG=${OUT:+$OUT/gpu-transfer.log}
LOG=${LOG:-/dev/null}
exec > >(tee -a "$LOG") 2>&1
W=$(mktemp -d)

echo "# $(date -u +%FT%TZ) $(hostname)"
nvidia-smi --query-gpu=index,name,driver_version,pci.bus_id,memory.total,pcie.link.gen.max,pcie.link.width.max \
    --format=csv
nvidia-smi topo -m
echo "# CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; $(free -g | awk '/Mem/{print $2}') GiB"
df -h /dev/shm | tail -1
echo "# UCX modules from ${UCX_MODULE_DIR:-the default directory} ($UCX_DESC)"
if [ -x "${DUET_UCX_CUDA_LIB:-/nonexistent}/bin/ucx_info" ]; then
    echo "# DUET_UCX_CUDA_LIB $DUET_UCX_CUDA_LIB: $("$DUET_UCX_CUDA_LIB/bin/ucx_info" -v | head -1 | sed 's/^# *//'); \
transports: $("$DUET_UCX_CUDA_LIB/bin/ucx_info" -d 2>/dev/null | awk '/Transport:/{printf "%s ", $3}')"
fi

timeout "${BENCH_TIMEOUT:-140}" "$BIN" "$@"
rc=$?
echo "# bench_gpu_transfer exit $rc"

# the checker itself, on the CUDA path: a corrupted put must fail the run
# -- on the staged path by the byte verification; on the direct path
# (--mirror device or packed) with checksums on, by the receiver's CRC
# computed on the GPU ("checksum mismatch"), before the bytes are compared
# (spread needs two GPUs: one GPU runs it as "same")
VAR=spread
[ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')" -ge 2 ] || VAR=same
CARGS=()
[ $DEVICE = 1 ] && CARGS=(--mirror "$MIRROR" --checksum)
if timeout 25 "$BIN" --tokens 512 --rounds 1 --plans 1x1 --variants $VAR --corrupt-put 10 \
    "${CARGS[@]}" >"$W/corrupt.log" 2>&1; then
    echo "# corrupted put${CARGS[*]:+ (${CARGS[*]})}: NOT detected (verification broken)"
    rc=1
elif [ $DEVICE = 1 ] && ! grep -q "checksum mismatch" "$W/corrupt.log"; then
    echo "# corrupted put (${CARGS[*]}): failed, but not by its checksum: $(grep -m1 'decode rank' "$W/corrupt.log")"
    rc=1
else
    why='decode rank'
    [ $DEVICE = 1 ] && why='checksum mismatch'
    echo "# corrupted put${CARGS[*]:+ (${CARGS[*]})}: detected, as it must be: $(grep -m1 "$why" "$W/corrupt.log")"
fi

if [ $rc -ne 0 ] && [ $DEVICE = 0 ]; then
    # diagnosis: the same path with the mirror registered instead of
    # allocated by UCX (shared-memory limits on the host?)
    timeout 30 "$BIN" --mirror registered --tokens 512 --rounds 2 --plans 1x1
fi
rm -rf "$W"
exit $rc
