#!/bin/bash
# Long contexts (issue 27 item 3) on a GPU machine, from the repo root
# (binaries from tests/gpu/build_carry.sh, or BIN=<build dir with the
# programs>, SRC_BUILD=<the build dir itself> for the daemons phase).
# Phases, any subset in order (default: unit compare):
#
#   unit     test_cuda_attention with DUET_TEST_LONG_CONTEXT=1: chunked
#            prefill over 32K tokens of cached context on every tensor-core
#            kernel (fa, mma, wmma), decode at 32K-64K contexts on tensor
#            cores and CUDA cores, each against the cpu backend
#   compare  duet generate --backend cuda against the fp32 cpu backend on a
#            33000-token prompt (tests/gpu/compare_backends.py --long):
#            a tiny llama3-scaled model (original_max_position_embeddings
#            8192, max_position_embeddings 40960), and with FULL=1 the
#            llama-3.2-1b shape with Llama-3.2's own scaling (factor 32);
#            TP 2 too when the machine has two GPUs
#   daemons  tests/integration/daemons/test_long_context.py (CPU daemons:
#            disaggregated, prefix cache, packed in chunks, limits) from
#            SRC_BUILD
#
# Output to stdout and $LOG_FILE when set; exit 1 when a phase failed.
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD
CARRY=$ROOT/.devcarry/cuda
BIN=${BIN:-$CARRY/bin}
export LD_LIBRARY_PATH=$CARRY/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
MODELS=${MODELS:-/tmp/duet-models}
mkdir -p "$MODELS"
[ -n "${LOG_FILE:-}" ] && exec > >(tee -a "$LOG_FILE") 2>&1

step() { echo; echo "=== $* ($(date +%T))"; }
mk() { # name args...
    local d=$MODELS/$1
    shift
    [ -f "$d/config.json" ] || "$BIN/duet" mkmodel --out "$d" "$@" > /dev/null || echo "mkmodel $d FAILED"
}
LLAMA3='{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}'
LLAMA32='{"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}'

rc=0
step "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)

[ $# -eq 0 ] && set -- unit compare
for phase in "$@"; do
case $phase in
unit)
    step "test_cuda_attention, DUET_TEST_LONG_CONTEXT=1"
    if DUET_TEST_LONG_CONTEXT=1 timeout 1800 "$BIN/test_cuda_attention" > /tmp/long_attn.out 2>&1; then
        r=ok
    else
        r=FAIL; rc=1
    fi
    grep -E "32K|decode|rel_l2|FAIL|PASSED|SKIPPED|ERROR" /tmp/long_attn.out | tail -40
    echo "unit: $r"
    ;;
compare)
    mk llama3-tiny-40k --layers 2 --hidden 256 --heads 8 --kv-heads 2 --intermediate 512 \
        --vocab 512 --max-pos 40960 --rope-theta 500000 --rope-scaling "$LLAMA3" --seed 27
    models=$MODELS/llama3-tiny-40k
    if [ "${FULL:-0}" = 1 ]; then
        mk llama-3.2-1b-40k --preset llama-3.2-1b-shape --max-pos 40960 --rope-theta 500000 \
            --rope-scaling "$LLAMA32" --dtype bf16
        models="$models $MODELS/llama-3.2-1b-40k"
    fi
    tp=()
    [ "$gpus" -ge 2 ] && tp=(--tp 2)
    step "compare_backends --long 33000 ${tp[*]}"
    # shellcheck disable=SC2086
    if ! python3 tests/gpu/compare_backends.py "$BIN/duet" $models --tokens 16 --long 33000 "${tp[@]}"; then
        rc=1
    fi
    ;;
daemons)
    step "daemons long_context (cpu backend)"
    if ! /usr/bin/python3 tests/integration/daemons/test_long_context.py "${SRC_BUILD:?set SRC_BUILD}" "$ROOT"; then
        rc=1
    fi
    ;;
*)
    echo "unknown phase $phase (unit compare daemons)"
    rc=1
    ;;
esac
done
exit $rc
