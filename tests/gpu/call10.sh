# Issue 12, 4 GPUs, after the bench ends each send as the daemons do (not
# after a stream synchronize of every prefill rank): every pair the GPUs
# allow as the daemons run it (auto) and with progress off, then the 4x2 /
# 2x4 timeline again.
set -x
nvidia-smi --query-gpu=index,name --format=csv
BENCH_TOKENS=512,1024,4096,8192 BENCH_MODES="auto auto-noprog" tests/gpu/run_packed.sh bench 2>&1 |
    grep -E "^===|^spread|corrupt|exit"
PLANS=4x2,2x4 bash tests/gpu/call9.sh 2>&1 | grep -E "^spread"
