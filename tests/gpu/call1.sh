set -x
nvidia-smi --query-gpu=index,name --format=csv
nvcc -O2 -arch=sm_90 -o /tmp/launch_probe tests/gpu/launch_probe.cu -lpthread && /tmp/launch_probe --bytes 2097152 --rounds 21 | tee $OUT/probe.log
/tmp/launch_probe --bytes 65536 --rounds 21 | tee -a $OUT/probe.log
BENCH_TOKENS=1024,4096 BENCH_MODES=auto tests/gpu/run_packed.sh bench 2>&1 | tail -20
cp /tmp/packed-bench-auto.log $OUT/ 2>/dev/null; ls $OUT
