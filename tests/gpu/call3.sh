# Issue 12, progress messages where they pay (auto: from 512 MiB of KV):
# GPU unit tests (the queued unpack), the bench as the daemons run it (auto)
# against progress off and progress forced every 8 layers, alternating;
# then disaggregated daemons with progress on every request and checksums.
set -x
nvidia-smi --query-gpu=index,name --format=csv
tests/gpu/run_packed.sh unit 2>&1 | grep -E "queued unpack|passed|failed" | tail -5
cp /tmp/packed-unit.log $OUT/ 2>/dev/null
BENCH_MODES="auto auto-noprog auto-prog8" tests/gpu/run_packed.sh bench 2>&1 | grep -E "^===|^spread"
DUET_KV_TRANSFER_PROGRESS=1 DUET_TRANSFER_CHECKSUM=true tests/gpu/run_packed.sh disagg 2>&1 | tail -30
grep -E "early unpacks|cases|differ" $OUT/packed-disagg.log | head -20
