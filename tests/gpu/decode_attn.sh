#!/bin/bash
# Decode attention at serving contexts on a GPU machine, from the repo root
# (binaries from tests/gpu/build_carry.sh, or BIN=<build dir with the
# programs>).  Phases, any subset in order:
#
#   unit     test_cuda_attention (flash-decoding and the other kernels vs the
#            cpu backend, contexts to 16K) and test_cuda_engine (graphs vs
#            eager), then compute-sanitizer memcheck on test_cuda_attention
#   kernel   bench_attention (the kernel alone: flash-decoding on tensor cores,
#            on CUDA cores, and the legacy per-token kernel)
#            next to PyTorch's scaled_dot_product_attention (tests/gpu/
#            attn_peer.py: cuDNN, flash) on the same shapes:
#            llama-3-8b (32/8 heads, head_dim 128), llama-3.2-1b (32/8, 64)
#   sweep    bench_attention (tensor cores) for split targets of 2..32 blocks/SM
#   model    bench_gpu decode of both shapes at ctx 16,1024,4096,8192 x batch
#            1,16,64: the fraction of the HBM roofline (DUET_CUDA_DECODE_ATTN
#            =legacy too with LEGACY=1); models with max_position 16384 so
#            that ctx 8192 plus the decoded tokens fit; VARIANTS="A=x B=y" adds a
#            run per setting (the same bench with that one environment change)
#
# Every section starts with the card's name; output to stdout and $LOG_FILE
# when set.
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

rc=0
step "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

for phase in "$@"; do
case $phase in
unit)
    for t in test_cuda_attention test_cuda_engine; do
        step "$t"
        if timeout 600 "$BIN/$t" > /tmp/$t.out 2>&1; then r=ok; else r=FAIL; rc=1; fi
        grep -E "rel_l2|graphs|equal|FAIL|PASSED|SKIPPED|ERROR" /tmp/$t.out | tail -60
        echo "--- $t: $r"
    done
    step "compute-sanitizer memcheck test_cuda_attention"
    if [ "${SANITIZE:-1}" = 0 ]; then
        echo "skipped (SANITIZE=0)"
    elif command -v compute-sanitizer > /dev/null; then
        timeout 900 compute-sanitizer --tool memcheck --leak-check no "$BIN/test_cuda_attention" 2>&1 |
            grep -E "ERROR SUMMARY|Invalid|out of bounds|PASSED|FAILED" | head -8
    else
        echo "compute-sanitizer not found"
    fi
    ;;
kernel)
    for shape in "32/8 128" "32/8 64"; do
        set -- $shape
        step "bench_attention heads $1 head_dim $2"
        timeout 300 "$BIN/bench_attention" --heads "$1" --head-dim "$2" --batches 1,16,64 \
            --ctx 1024,4096,8192 --variants flash,cores,legacy
        step "attn_peer (PyTorch SDPA) heads $1 head_dim $2"
        if python3 -c "import torch" 2> /dev/null; then
            PYTHONUNBUFFERED=1 timeout 300 python3 -W ignore tests/gpu/attn_peer.py --heads "$1" \
                --head-dim "$2" --batches 1,16,64 --ctx 1024,4096,8192
        else
            echo "skipped: python3 has no torch"
        fi
    done
    ;;
sweep)
    # the split target (blocks per SM) of flash-decoding, tensor cores
    for nb in ${SWEEP_BLOCKS:-1 2 3 4 8}; do
        for shape in "32/8 128" "32/8 64"; do
            set -- $shape
            step "bench_attention heads $1 head_dim $2, DUET_CUDA_FD_BLOCKS=$nb"
            DUET_CUDA_FD_BLOCKS=$nb timeout 120 "$BIN/bench_attention" --heads "$1" --head-dim "$2" \
                --batches 1,16,64 --ctx 1024,4096,8192 --variants flash
        done
    done
    ;;
mergesweep)
    # the split rule's cost per split (the last block's merge reads every split)
    for mc in ${SWEEP_MERGE:-0 0.005 0.01 0.02}; do
        step "bench_attention heads 32/8 head_dim 128, DUET_CUDA_FD_MERGE_COST=$mc"
        DUET_CUDA_FD_MERGE_COST=$mc timeout 120 "$BIN/bench_attention" --heads 32/8 --head-dim 128 \
            --batches 1,16,64 --ctx 1024,4096,8192 --variants flash
    done
    ;;
model)
    mk llama-1b-16k --preset llama-3.2-1b-shape --dtype bf16 --max-pos 16384
    mk llama-8b-16k --preset llama-3-8b-shape --dtype bf16 --max-pos 16384
    for m in llama-8b-16k llama-1b-16k; do
        step "bench_gpu $m decode at serving contexts"
        timeout 500 "$BIN/bench_gpu" --model "$MODELS/$m" --ctx 16,1024,4096,8192 \
            --batches 1,16,64 --decode 64 --prompts 512,8192 --reps 2
        for v in ${VARIANTS:-}; do # baselines in the same run, e.g. DUET_CUDA_GEMM_TUNE=0
            step "bench_gpu $m decode at serving contexts, $v"
            env "$v" timeout 500 "$BIN/bench_gpu" --model "$MODELS/$m" --ctx 16,1024,4096,8192 \
                --batches 1,16,64 --decode 64 --prompts 512,8192 --reps 2
        done
        if [ "${LEGACY:-0}" = 1 ]; then
            step "bench_gpu $m, DUET_CUDA_DECODE_ATTN=legacy"
            DUET_CUDA_DECODE_ATTN=legacy timeout 500 "$BIN/bench_gpu" --model "$MODELS/$m" \
                --ctx 1024,4096 --batches 1,16,64 --decode 32 --prompts 512 --reps 1
        fi
    done
    ;;
*)
    echo "unknown phase $phase"
    ;;
esac
done
step "done"
exit $rc
