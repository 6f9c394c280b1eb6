# Issue 12: is the early unpack's cost at 1024-2048 tokens the two
# processes sharing a GPU (1x2 and 2x1 on 2 GPUs put a decode rank on a
# prefill rank's GPU)?  1x1 packed (prefill on GPU 0, decode on GPU 1, no
# sharing) with progress every 8 layers and off, twice, alternating.
set -x
nvidia-smi --query-gpu=index,name --format=csv
for r in r1 r2; do
    mkdir -p $OUT/$r
    OUT=$OUT/$r BENCH_PLANS=1x1 BENCH_TOKENS=1024,2048,8192 BENCH_MODES="packed-noprog packed-prog8" \
        tests/gpu/run_packed.sh bench 2>&1 | grep -E "^===|^spread"
done
