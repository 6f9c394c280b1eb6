# Issue 12: the TTFT tax as the issue defines it (router + P/D daemons
# against router + colocated decode, bench-serve TTFT p50), 8B shape.
# TTFT_LAYOUTS=p1d2 or p2d4.
set -x
nvidia-smi --query-gpu=index,name --format=csv
DUET_UCX_CUDA_LIB=$PWD/.devcarry/ucxcuda timeout ${TTFT_TIMEOUT:-540} tests/gpu/ttft_tax.sh > $OUT/ttft-tax-${TTFT_LAYOUTS:-all}.log 2>&1
grep -vE "^# 20" $OUT/ttft-tax-${TTFT_LAYOUTS:-all}.log | tail -20
