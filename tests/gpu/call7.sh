# Issue 12 on 4 GPUs: the 4x2 and 2x4 pairs at 1024-8192 tokens with the
# bench's spread placement (decode on the last D GPUs) against affine (each
# rank of the smaller side on a peer's GPU), as the daemons run them (auto)
# and with progress every 8 layers.
set -x
nvidia-smi --query-gpu=index,name --format=csv
BENCH_PLANS=4x2,2x4 BENCH_TOKENS=1024,2048,8192 BENCH_VARIANTS=spread,affine \
    BENCH_MODES="auto auto-prog8" tests/gpu/run_packed.sh bench 2>&1 | grep -E "^===|^spread|^affine|^# (spread|affine)|ranks on"
