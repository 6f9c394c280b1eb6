# Issue 12, final figures of this change on 2 GPUs: the bench as the
# daemons run it (auto: progress every 8 layers; where a decode rank shares
# a sender's GPU -- 1x2 and 2x1 here -- only from 512 MiB of KV) against
# progress off; 1x1 packed on separate GPUs with and without progress;
# the TTFT tax (8B shape, P1xD2); the daemons with checksums on.
set -x
nvidia-smi --query-gpu=index,name --format=csv
BENCH_MODES="auto auto-noprog" tests/gpu/run_packed.sh bench 2>&1 | grep -E "^===|^spread|^# spread"
BENCH_PLANS=1x1 BENCH_TOKENS=1024,2048,4096,8192 BENCH_MODES="packed-prog8 packed-noprog" \
    tests/gpu/run_packed.sh bench 2>&1 | grep -E "^===|^spread"
DUET_UCX_CUDA_LIB=$PWD/.devcarry/ucxcuda timeout 300 tests/gpu/ttft_tax.sh > $OUT/ttft-tax.log 2>&1
grep -vE "^# 20" $OUT/ttft-tax.log | tail -12
DUET_TRANSFER_CHECKSUM=true tests/gpu/run_packed.sh disagg 2>&1 | tail -3
grep -E "early unpacks|bootstrapped|case\(s\) differ" $OUT/packed-disagg.log | head -20
