#!/bin/bash
# Where a GPU step's time goes, per kernel, from the repo root on a GPU
# machine (binaries from tests/gpu/build_carry.sh, or BIN=<build dir>).
# Runs bench_gpu under Nsight Compute (ncu, from the CUDA toolkit) with
# profiling switched on only around one timed decode step per (batch, ctx)
# or one timed prefill per prompt (DUET_BENCH_PROFILE in bench_gpu), and
# prints each kernel's time (gpu__time_duration: every kernel serialized,
# so the sum is the step's GPU time without launch gaps or overlap; caches
# and clocks as in a normal run):
#
#   tests/gpu/profile.sh decode llama-3-8b-shape 1,64 16    # batches, ctx
#   tests/gpu/profile.sh prefill llama-3-8b-shape 8192      # prompt lengths
#
# Graphs are off for the run (DUET_CUDA_GRAPHS=0) so that every kernel is
# seen by name.  Models are made with duet mkmodel (max_position 16384)
# under $MODELS.
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD
CARRY=$ROOT/.devcarry/cuda
BIN=${BIN:-$CARRY/bin}
export LD_LIBRARY_PATH=$CARRY/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
MODELS=${MODELS:-/tmp/duet-models}
OUTDIR=${OUTDIR:-/tmp/duet-profile}
mkdir -p "$MODELS" "$OUTDIR"

mode=${1:?decode|prefill}
preset=${2:?model preset}
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu \
    /opt/nvidia/nsight-compute/ncu 2> /dev/null | head -1)
if [ -z "$NCU" ]; then
    echo "ncu not found: install Nsight Compute (CUDA toolkit) to profile"
    exit 2
fi
d=$MODELS/$preset-16k
[ -f "$d/config.json" ] || "$BIN/duet" mkmodel --out "$d" --preset "$preset" --dtype bf16 \
    --max-pos 16384 > /dev/null || exit 1
case $mode in
decode)
    args=(--batches "${3:-1,64}" --ctx "${4:-16}" --decode 4 --prompts 16 --reps 1)
    ;;
prefill)
    args=(--batches 1 --ctx 16 --decode 1 --prompts "${3:-8192}" --reps 1)
    ;;
*)
    echo "mode: decode or prefill" >&2
    exit 2
    ;;
esac
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
csv=$OUTDIR/$mode-$preset.csv
DUET_CUDA_GRAPHS=0 DUET_BENCH_PROFILE=$mode "$NCU" --profile-from-start off \
    --cache-control none --clock-control none --metrics gpu__time_duration.sum --csv --print-units base --log-file "$csv" \
    "$BIN/bench_gpu" --model "$d" "${args[@]}" 2>&1 | grep -E "tok/s|GEMM|copy" | head -40
exec python3 "$ROOT/tests/gpu/profile_sum.py" "$csv"
