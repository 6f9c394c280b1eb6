# Progress granularity on 2 GPUs (issue 12): the packed pairs with progress
# off, every 4, 8 and 16 layers, twice, alternating.
set -x
nvidia-smi --query-gpu=index,name --format=csv
for r in r1 r2; do
    mkdir -p $OUT/$r
    OUT=$OUT/$r BENCH_PLANS=1x2,2x1 BENCH_TOKENS=1024,2048,4096,8192 \
        BENCH_MODES="auto-noprog auto-prog4 auto-prog8 auto-prog16" \
        tests/gpu/run_packed.sh bench 2>&1 | grep -E "^===|^spread"
done
