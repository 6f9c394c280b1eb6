#!/bin/bash
# Packed KV transfers on GPUs (issue 12): the device-direct path with the
# pinned UCX 1.22.0, on a machine with 2 or 4 GPUs, from the repo root; the
# implementation of tests/gpu/suite.sh's transfer phase.  UCX with CUDA
# transports: DUET_UCX_CUDA_LIB (its lib directory), default
# .devcarry/ucxcuda (tests/gpu/build_ucx_cuda.sh) when that exists, else the
# system's.  Binaries: as run_gpu_transfer.sh (GXFER_BIN), run_gpu.sh (BIN)
# and disagg_gpu.sh (DUET_BIN) find them; the suite sets all three.
#
#   tests/gpu/run_packed.sh unit bench checksum disagg     # any subset, in order
#
#   unit    test_cuda_kv_copy (the pack/unpack kernel, the KV-store -> pack
#           ordering), test_cuda_kv_crc (the GPU's CRC32C against the host's,
#           and its GB/s), test_cuda_add, test_cuda_engine
#   bench   bench_gpu_transfer --mirror auto (the daemons' choice: packed
#           when P != D) for every pair the GPUs allow (1x1 1x2 2x1; 2x4
#           4x2 with 4 GPUs) at 512-8192 tokens, then the same with
#           DUET_XFER_ARM_DEVICE=1 (the old progress-thread sleep) as the
#           same-run baseline; BENCH_MODES picks others (packed, device;
#           auto-old: GXFER_OLD_BIN, an older build of the bench, default
#           .devcarry/gxfer/bin/bench_gpu_transfer.old, with --mirror auto; auto-event: packs
#           release their layers by events, not launch signals);
#           cudaMemcpyPeer as the reference; BENCH_VARIANTS=spread,affine
#           adds the placement with each decode rank on a sender's GPU
#           (bench_gpu_transfer --variants)
#   checksum  --mirror auto with --checksum (the CRC32C of every slice
#           computed on the GPU on both sides): e2e against `bench` is the
#           cost of transfer.checksum on the direct path; the corrupted-put
#           check at the end must fail by "checksum mismatch"
#   disagg  tests/gpu/disagg_gpu.sh on the direct path (packed: the
#           default there), every layout the GPUs allow
# Logs: $OUT/packed-*.log
set -u
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
U=${DUET_UCX_CUDA_LIB:-$ROOT/.devcarry/ucxcuda}
[ -d "$U" ] || U=
GX=${GXFER_BIN:-} # auto-old replaces it for one mode
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
plans=${BENCH_PLANS:-1x1,1x2,2x1}
[ "$ngpu" -ge 4 ] && [ -z "${BENCH_PLANS:-}" ] && plans=$plans,2x4,4x2
rc=0
for what in "$@"; do
    case $what in
    unit)
        UNIT_TESTS="test_cuda_kv_copy test_cuda_kv_crc test_cuda_add test_cuda_engine" tests/gpu/run_gpu.sh unit \
            2>&1 | tee "${OUT:-/tmp}/packed-unit.log" | grep -E "PASS|FAIL|INFO|passed|failed|===|Error" | tail -40
        ;;
    bench | checksum)
        # auto: what the daemons run (packed when P != D, the direct path
        # when P == D); auto-arm: the same with the progress thread arming
        # UCX while device puts are in flight (the behaviour before the
        # polling fix, DUET_XFER_ARM_DEVICE=1), as the same-run baseline;
        # packed: packing forced for every pair
        crc=()
        modes=${BENCH_MODES:-auto auto-arm}
        if [ "$what" = checksum ]; then
            crc=(--checksum)
            modes=${CHECKSUM_MODES:-auto}
        fi
        for mode in $modes; do
            case $mode in
            auto-arm) mirror=auto; export DUET_XFER_ARM_DEVICE=1 ;;
            auto-old) mirror=auto; unset DUET_XFER_ARM_DEVICE
                export GXFER_BIN=${GXFER_OLD_BIN:-$ROOT/.devcarry/gxfer/bin/bench_gpu_transfer.old} ;;
            auto-event) mirror="auto --layer-done event"; unset DUET_XFER_ARM_DEVICE ;;
            auto-noprog) mirror="auto --progress off"; unset DUET_XFER_ARM_DEVICE ;;
            auto-prog*) mirror="auto --progress ${mode#auto-prog}"; unset DUET_XFER_ARM_DEVICE ;;
            packed-noprog) mirror="packed --layer-done signal --progress off"; unset DUET_XFER_ARM_DEVICE ;;
            packed-prog*) mirror="packed --layer-done signal --progress ${mode#packed-prog}"; unset DUET_XFER_ARM_DEVICE ;;
            *) mirror=$mode; unset DUET_XFER_ARM_DEVICE ;;
            esac
            log=${OUT:-/tmp}/packed-bench-$mode${crc[0]:+-crc}.log
            echo "=== bench_gpu_transfer --mirror $mirror ${crc[*]} ($mode; $plans)"
            DUET_UCX_CUDA_LIB=$U BENCH_TIMEOUT=250 timeout 280 tests/gpu/run_gpu_transfer.sh --mirror $mirror \
                --plans $plans --tokens ${BENCH_TOKENS:-512,1024,4096,8192} --rounds ${BENCH_ROUNDS:-5} \
                --variants ${BENCH_VARIANTS:-spread} "${crc[@]}" > "$log" 2>&1 || rc=1
            grep -vE "^(index|GPU|\s*GPU|CPU|Legend|  [A-Z]|$)" "$log" | \
                grep -E "^spread|^affine|^copy|exit|corrupt|FAIL|error" | head -60
            if [ -n "$GX" ]; then export GXFER_BIN=$GX; else unset GXFER_BIN; fi
        done
        unset DUET_XFER_ARM_DEVICE
        ;;
    disagg)
        DUET_UCX_CUDA_LIB=$U DUET_KV_TRANSFER_PATH=auto timeout 560 tests/gpu/disagg_gpu.sh \
            > "${OUT:-/tmp}/packed-disagg.log" 2>&1 || rc=1
        grep -E "transfer path|packed|ok|FAIL|near-tie|differ|error|cases" "${OUT:-/tmp}/packed-disagg.log" | head -60
        ;;
    *) echo "run_packed.sh: unknown step $what"; rc=2 ;;
    esac
done
exit $rc
