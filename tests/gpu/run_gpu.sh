#!/bin/bash
# The cuda backend's checks and benchmarks on a GPU machine, from the repo
# root: the implementation of tests/gpu/suite.sh's unit, compare and bench
# phases (run it through the suite: it finds the binaries and names the
# log).  BIN: a directory holding duet, bench_gpu and the test_cuda_*
# programs (the suite links them there from a build tree); default
# .devcarry/cuda/bin, where tests/gpu/build_carry.sh stages them with the
# two libraries a bare CUDA host may lack (cJSON, cmocka).
#
#   tests/gpu/run_gpu.sh unit compare bench hf tp2      # any subset, in order
#
#   unit     every tests/unit/test_cuda_* program (kernels vs the cpu backend,
#            engine vs cpu, graphs, nccl when 2 GPUs); UNIT_TESTS="test_cuda_x ..."
#            picks some, in that order
#   compare  tests/gpu/compare_backends.py: stories260K + synthetic models,
#            cuda vs fp32 cpu logits and greedy tokens; COMPARE_TP=2 or 2,4
#            also TP=2 (and 4) over NCCL against TP=1
#   bench    bench_gpu on llama-3.2-1b-shape and llama-3-8b-shape (bf16)
#   attn     bench_gpu prefill with each tensor-core attention kernel
#   gemvoff  bench_gpu decode with DUET_CUDA_GEMV=0 (cuBLASLt for n <= 4 too)
#   fp8      FP8: test_cuda_matmul_fp8 (unit runs it too, and test_cuda_engine's
#            FP8 checkpoints), hf_fp8.py (transformers on the dequantized
#            checkpoints vs duet cpu and cuda), then bench_gpu on the llama-3-8b-shape bf16 checkpoint and its
#            FP8 quantization (mkmodel --fp8 channel) in the same run: decode
#            tok/s ratio per batch, prefill TFLOP/s against cuBLASLt FP8
#   hf       tests/gpu/hf_peer.py on the same two models (transformers peer)
#   tp2      TP=2 over NCCL: compare --tp 2, and bench_gpu at TP 1 and 2 (both shapes)
#   tp4      TP=2 and TP=4 over NCCL (4 GPUs): compare --tp 2,4
#   tpscale  bench_gpu on llama-3-8b-shape at TP 1, 2, 4 (as many as there
#            are GPUs), prompts 512 and 8192
#   sanitize compute-sanitizer memcheck on the kernel tests
#
# Output: stdout, and $OUT/log when OUT is set.  Exit status: 0 when every
# phase passed (benchmarks pass when they ran), 1 otherwise.
set -u
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
CARRY=$ROOT/.devcarry/cuda
BIN=${BIN:-$CARRY/bin}
export LD_LIBRARY_PATH=$CARRY/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0
MODELS=${MODELS:-/tmp/duet-models}
LOG=${OUT:+$OUT/log}
LOG=${LOG:-/dev/null}
mkdir -p "$MODELS"
exec > >(tee -a "$LOG") 2>&1
rc=0

step() { echo; echo "=== $* ($(date +%T))"; }
mk() { # name args...
    local d=$MODELS/$1
    shift
    [ -f "$d/config.json" ] || "$BIN/duet" mkmodel --out "$d" "$@" > /dev/null || echo "mkmodel $d FAILED"
}

step "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
nproc

for phase in "$@"; do
case $phase in
unit)
    step "unit tests"
    pass=0; fail=0
    for t in ${UNIT_TESTS:-"$BIN"/test_cuda_*}; do
        [ -x "$t" ] || t=$BIN/$t
        # the nccl test waits out deadlines on purpose: a short leash
        case $t in *comm_nccl*) lim=150 ;; *) lim=300 ;; esac
        if timeout $lim "$t" > /tmp/unit.out 2>&1; then
            pass=$((pass + 1)); r=ok
        else
            fail=$((fail + 1)); r=FAIL
        fi
        grep -E "rel_l2|argmax|graphs|equal|nccl|tp2|tp4|divergence|init|all_reduce|skipped|recording|INFO|FAIL|PASSED|SKIPPED|ERROR|error" /tmp/unit.out | tail -80
        echo "--- $(basename "$t"): $r"
    done
    echo "unit: $pass passed, $fail failed"
    [ "$fail" = 0 ] || rc=1
    ;;
sanitize)
    step "compute-sanitizer memcheck"
    for t in attention rope_kv_store matmul embed argmax gather_rows rmsnorm silu_mul add; do
        echo "--- $t"
        timeout 300 compute-sanitizer --tool memcheck --leak-check no "$BIN/test_cuda_$t" 2>&1 |
            grep -E "ERROR SUMMARY|Invalid|out of bounds|PASSED|FAILED" | head -8
    done
    ;;
compare|tp2|tp4)
    mk synth-gqa64 --layers 4 --hidden 512 --heads 8 --kv-heads 2 --intermediate 1024 --vocab 1000 --dtype bf16 --seed 3
    mk synth-mqa128-f32 --layers 3 --hidden 512 --heads 4 --kv-heads 1 --head-dim 128 --intermediate 768 --vocab 1000 --seed 4
    mk synth-qwen2-hd32 --arch qwen2 --layers 3 --hidden 256 --heads 8 --kv-heads 2 --intermediate 512 --vocab 1000 --dtype bf16 --seed 5
    step "compare backends ($phase)"
    extra=""
    [ -n "${COMPARE_TP:-}" ] && extra="--tp $COMPARE_TP"
    [ "$phase" = tp2 ] && extra="--tp 2"
    [ "$phase" = tp4 ] && extra="--tp 2,4"
    # shellcheck disable=SC2086 # $extra is "--tp N" or nothing
    timeout 900 python3 tests/gpu/compare_backends.py "$BIN/duet" models/stories260K \
        "$MODELS/synth-gqa64" "$MODELS/synth-mqa128-f32" "$MODELS/synth-qwen2-hd32" --tokens 64 $extra ||
        rc=1
    if [ "$phase" = tp2 ]; then
        mk llama-1b --preset llama-3.2-1b-shape --dtype bf16
        mk llama-8b --preset llama-3-8b-shape --dtype bf16
        for m in llama-1b llama-8b; do
            for tp in 1 2; do
                step "bench_gpu $m tp $tp"
                timeout 200 "$BIN/bench_gpu" --model "$MODELS/$m" --tp $tp --prompts 512,8192 --reps 2
            done
        done
    fi
    ;;
bench)
    mk llama-1b --preset llama-3.2-1b-shape --dtype bf16
    mk llama-8b --preset llama-3-8b-shape --dtype bf16
    for m in llama-1b llama-8b; do
        step "bench_gpu $m"
        timeout 400 "$BIN/bench_gpu" --model "$MODELS/$m" --reps 3
    done
    step "bench_gpu llama-1b without graphs"
    DUET_CUDA_GRAPHS=0 timeout 200 "$BIN/bench_gpu" --model "$MODELS/llama-1b" --prompts 512 --reps 1
    ;;
attn)
    mk llama-1b --preset llama-3.2-1b-shape --dtype bf16
    mk llama-8b --preset llama-3-8b-shape --dtype bf16
    for m in llama-1b llama-8b; do
        for v in fa mma wmma; do
            step "bench_gpu $m prefill, DUET_CUDA_ATTN=$v"
            DUET_CUDA_ATTN=$v timeout 300 "$BIN/bench_gpu" --model "$MODELS/$m" --batches 1 --decode 16 --reps 3
        done
    done
    ;;
gemvoff)
    mk llama-1b --preset llama-3.2-1b-shape --dtype bf16
    mk llama-8b --preset llama-3-8b-shape --dtype bf16
    for m in llama-1b llama-8b; do
        step "bench_gpu $m decode with cuBLASLt for every n (DUET_CUDA_GEMV=0)"
        DUET_CUDA_GEMV=0 timeout 300 "$BIN/bench_gpu" --model "$MODELS/$m" --prompts 512 --reps 1
    done
    ;;
fp8)
    mk llama-8b --preset llama-3-8b-shape --dtype bf16
    mk llama-8b-fp8 --preset llama-3-8b-shape --dtype bf16 --fp8 channel
    mk llama-8b-fp8t --preset llama-3-8b-shape --dtype bf16 --fp8 tensor
    step "test_cuda_matmul_fp8"
    timeout 300 "$BIN/test_cuda_matmul_fp8" || rc=1
    if python3 -c "import torch, transformers" 2>/dev/null; then
        mk fp8-ct-ch --layers 4 --hidden 512 --heads 8 --kv-heads 2 --intermediate 1024 \
            --vocab 1000 --dtype bf16 --fp8 channel --seed 81
        mk fp8-vllm-t --layers 4 --hidden 512 --heads 8 --kv-heads 2 --intermediate 1024 \
            --vocab 1000 --dtype bf16 --fp8 tensor --fp8-format fp8 --seed 82
        mk fp8-qwen3-fbgemm --arch qwen3 --layers 4 --hidden 512 --heads 8 --kv-heads 2 \
            --head-dim 64 --intermediate 1024 --vocab 1000 --dtype bf16 --tied --fp8 channel \
            --fp8-format fbgemm --seed 83
        step "hf_fp8.py: duet cpu and cuda on FP8 checkpoints vs transformers (dequantized)"
        timeout 900 python3 tests/gpu/hf_fp8.py "$BIN/duet" "$MODELS/fp8-ct-ch" \
            "$MODELS/fp8-vllm-t" "$MODELS/fp8-qwen3-fbgemm" || rc=1
    else
        echo "# hf_fp8.py skipped: python3 has no torch + transformers"
    fi
    step "bench_gpu llama-8b bf16 vs fp8 (per channel)"
    timeout 600 "$BIN/bench_gpu" --model "$MODELS/llama-8b" --model "$MODELS/llama-8b-fp8" \
        --batches 1,16,64 --prompts 512,2048,8192 --reps 3 || rc=1
    step "bench_gpu llama-8b fp8 per tensor"
    timeout 300 "$BIN/bench_gpu" --model "$MODELS/llama-8b-fp8t" --batches 1 --prompts 2048 \
        --reps 2 || rc=1
    ;;
tpscale)
    mk llama-8b --preset llama-3-8b-shape --dtype bf16
    ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
    for tp in 1 2 4; do
        [ "$tp" -le "$ngpu" ] || break
        step "bench_gpu llama-8b tp $tp"
        timeout 300 "$BIN/bench_gpu" --model "$MODELS/llama-8b" --tp $tp --prompts 512,8192 --reps 2 || rc=1
    done
    ;;
hf)
    mk llama-1b --preset llama-3.2-1b-shape --dtype bf16
    mk llama-8b --preset llama-3-8b-shape --dtype bf16
    for m in llama-1b llama-8b; do
        step "hf_peer $m"
        PYTHONUNBUFFERED=1 timeout 500 python3 tests/gpu/hf_peer.py --model "$MODELS/$m" --reps 3
    done
    ;;
*)
    echo "unknown phase $phase"
    rc=2
    ;;
esac
done
step "done"
exit $rc
