# Issue 12, 4x2 at 1024 tokens: where the last ~0.35 ms goes.  The bench's
# per-request timeline (BENCH_TIMELINE=1) and the transfer's trace lines
# (layers taken, flush, notify, notification received) for 4x2 and 2x4,
# 3 rounds; tests/gpu/timeline.py reads the log.
set -x
nvidia-smi --query-gpu=index,name --format=csv
BENCH_TIMELINE=1 DUET_LOG_LEVEL=trace DUET_UCX_CUDA_LIB=$PWD/.devcarry/ucxcuda BENCH_TIMEOUT=200 \
    timeout 250 tests/gpu/run_gpu_transfer.sh --mirror auto --plans ${PLANS:-4x2,2x4} --tokens 1024 \
    --rounds 3 --variants spread > $OUT/timeline.log 2>&1
grep -E "^spread|exit" $OUT/timeline.log
