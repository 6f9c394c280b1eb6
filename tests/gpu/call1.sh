# One device call of the progress-messages work (issue 12): GPU unit tests,
# then the bench with and without progress, alternating.
set -x
nvidia-smi --query-gpu=index,name --format=csv
tests/gpu/run_packed.sh unit 2>&1 | tail -40
cp /tmp/packed-unit.log $OUT/ 2>/dev/null
BENCH_MODES="auto auto-noprog" tests/gpu/run_packed.sh bench 2>&1 | tail -40
mkdir -p $OUT/detail
BENCH_IMPORT_DETAIL=1 BENCH_TOKENS=1024,8192 BENCH_ROUNDS=3 BENCH_MODES="auto" \
    OUT=$OUT/detail tests/gpu/run_packed.sh bench > /dev/null 2>&1
grep -h "import detail" $OUT/detail/*.log 2>/dev/null | sort | uniq -c | head -20
ls $OUT
