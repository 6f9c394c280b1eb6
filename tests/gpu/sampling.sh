#!/bin/bash
# Sampling on the device (engine/cuda/sample.cu) and the checkpoint paths
# (RoPE scaling, Qwen3) on a GPU host, with the binaries of a build tree
# (BIN=build/cuda-gpu/...) or those tests/gpu/build_carry.sh staged.
#
#   tests/gpu/sampling.sh [unit] [bench] [hf]
#   unit   test_cuda_sample (device draws = duet_sample's, draw for draw;
#          memcheck clean where compute-sanitizer is installed),
#          and the kernels the checkpoint work touched (rope_kv_store with
#          scaled frequency tables, head_rmsnorm, the engine)
#   bench  bench_gpu decode on the 1B and 8B shapes at ctx 1024, batch
#          1/16/64: greedy (device argmax), sampled on the device
#          (temperature 1, top_p 0.9), sampled on the host
#          (DUET_CUDA_SAMPLING=host), same run
#   hf     tests/gpu/hf_logits.py --cuda: transformers' logits for every
#          architecture and RoPE scaling type against duet cpu and cuda
set -u
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
CARRY=$ROOT/.devcarry/cuda
BIN=${BIN:-$CARRY/bin}
export LD_LIBRARY_PATH=$CARRY/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
MODELS=${MODELS:-/tmp/duet-models}
mkdir -p "$MODELS"
rc=0
step() { echo; echo "=== $* ($(date +%T))"; }
mk() {
    local d=$MODELS/$1
    shift
    [ -f "$d/config.json" ] || "$BIN/duet" mkmodel --out "$d" "$@" > /dev/null || echo "mkmodel $d FAILED"
}
step "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
phases=${*:-unit bench hf}
for phase in $phases; do
case $phase in
unit)
    for t in test_cuda_sample test_cuda_argmax test_cuda_rope_kv_store test_cuda_rmsnorm \
        test_cuda_engine; do
        step "$t"
        "$BIN/$t" > /tmp/duet-$t.log 2>&1 || { echo "FAILED: $t"; rc=1; }
        tail -25 /tmp/duet-$t.log
    done
    if command -v compute-sanitizer > /dev/null; then
        step "compute-sanitizer memcheck test_cuda_sample"
        (set -o pipefail
         compute-sanitizer --tool memcheck --error-exitcode 1 "$BIN/test_cuda_sample" 2>&1 |
             tail -5) || rc=1
    fi ;;
bench)
    mk llama-1b --preset llama-3.2-1b-shape --dtype bf16
    mk llama-8b --preset llama-3-8b-shape --dtype bf16
    for m in llama-1b llama-8b; do
        common=(--model "$MODELS/$m" --ctx 1024 --batches 1,16,64 --prompts 512 --reps 1)
        step "$m greedy"
        "$BIN/bench_gpu" "${common[@]}" --decode 64 | grep -E "bench_gpu|decode batch" || rc=1
        step "$m sampled on the device (temperature 1, top_p 0.9)"
        "$BIN/bench_gpu" "${common[@]}" --decode 64 --temperature 1 --top-p 0.9 |
            grep -E "sampling|decode batch" || rc=1
        step "$m sampled on the host"
        DUET_CUDA_SAMPLING=host "$BIN/bench_gpu" "${common[@]}" --decode 8 --temperature 1 \
            --top-p 0.9 | grep -E "sampling|decode batch" || rc=1
    done ;;
hf)
    step "transformers logits vs duet cpu and cuda"
    python3 tests/gpu/hf_logits.py "$BIN/duet" --cuda || rc=1 ;;
esac
done
exit $rc
