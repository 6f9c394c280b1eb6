#!/usr/bin/env bash
# Run one libFuzzer harness for a fixed time (ctest fuzz.*, scripts/fuzz.sh):
#   run_one.sh HARNESS SECONDS WORKDIR SEEDS_DIR [libFuzzer flags...]
# New inputs go to WORKDIR/corpus, crash/leak/timeout inputs to WORKDIR/.
# Exits non-zero on any finding, and prints the executions and exec/s.
set -euo pipefail
harness=$1 secs=$2 work=$3 seeds=$4
shift 4
mkdir -p "$work/corpus"
# the harnesses write their model files under TMPDIR: a directory of this
# run's (on tmpfs when there is one), removed at the end even after a crash
base=${TMPDIR:-/tmp}
if [ -z "${TMPDIR:-}" ] && [ -d /dev/shm ] && [ -w /dev/shm ]; then
  base=/dev/shm
fi
scratch=$(mktemp -d "$base/duet-fuzz.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
export TMPDIR=$scratch
log="$work/log"
set +e
"$harness" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
  -print_final_stats=1 -artifact_prefix="$work/" "$@" "$work/corpus" "$seeds" >"$log" 2>&1
rc=$?
set -e
runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
echo "$(basename "$harness"): ${runs:-?} executions, ${rate:-?} exec/s (budget ${secs} s), rc $rc"
if [ "$rc" -ne 0 ]; then
  # the report, without libFuzzer's progress lines
  grep -v -E '^#[0-9]+[[:space:]]+(NEW|REDUCE|pulse|INITED|RELOAD)' "$log" | tail -n 60
  ls "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-* 2>/dev/null || true
fi
exit "$rc"
