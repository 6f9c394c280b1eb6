# Issue 12: where the cost of a mid-transfer announcement goes at 1024-2048
# tokens: progress every 8 layers with decode unpacking early, the same
# announcements with everything unpacked at the end
# (BENCH_PROGRESS_NO_UNPACK=1), and no progress; twice, alternating.
set -x
nvidia-smi --query-gpu=index,name --format=csv
for r in r1 r2; do
    mkdir -p $OUT/$r $OUT/$r-nounpack
    OUT=$OUT/$r BENCH_PLANS=1x2,2x1 BENCH_TOKENS=1024,2048,8192 BENCH_MODES="auto-noprog auto-prog8" \
        tests/gpu/run_packed.sh bench 2>&1 | grep -E "^===|^spread"
    BENCH_PROGRESS_NO_UNPACK=1 OUT=$OUT/$r-nounpack BENCH_PLANS=1x2,2x1 BENCH_TOKENS=1024,2048,8192 \
        BENCH_MODES="auto-prog8" tests/gpu/run_packed.sh bench 2>&1 | grep -E "^===|^spread"
done
