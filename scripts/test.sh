#!/usr/bin/env bash
# The test command: install dependencies, build with -Werror (the CUDA
# backend too when nvcc is present), run every test, then build the unit
# tests with ASan/UBSan and run them.
#
#   scripts/test.sh            everything
#   scripts/test.sh -R regex   only tests matching regex (ctest -R)
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
jobs=$(nproc 2>/dev/null || echo 2)

if [ "${DUET_SKIP_DEPS:-0}" != "1" ]; then
  scripts/install-deps.sh
fi

# Tests that skipped (exit 77) and the reason each printed ("SKIP: ...").
print_skips() {
  local log=$1/Testing/Temporary/LastTest.log
  [ -f "$log" ] || return 0
  awk '/^[0-9]+\/[0-9]+ Testing: / { name = $3 }
       /^SKIP/ && name != "" { print "test.sh: skipped " name ": " $0; name = "" }' "$log"
}

cmake -S . -B build/ci -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDUET_WERROR=ON
cmake --build build/ci -j "$jobs"
# ctest -L ops: the container image and Prometheus tests (tests/ops).
# Tests labelled known_issue reproduce an open bug and are left out
# (DUET_RUN_KNOWN_ISSUES=1 runs them): each is named here and in docs/.
# Tests labelled bench are benchmark smokes of minutes (bench/chaos_soak.py)
# and are left out too (DUET_RUN_BENCH=1 runs them; ctest -L bench alone).
rc=0
left_out=(known_issue)
if [ "${DUET_RUN_KNOWN_ISSUES:-0}" = "1" ]; then
  left_out=()
else
  echo "test.sh: left out (known issues, docs/deploy.md):" \
    $(cd build/ci && ctest -N -L known_issue -FA '.*' | sed -n 's/^ *Test *#[0-9]*: //p')
fi
[ "${DUET_RUN_BENCH:-0}" = "1" ] || left_out+=(bench)
known=()
if [ "${#left_out[@]}" -gt 0 ]; then
  known=(-LE "^($(IFS='|'; echo "${left_out[*]}"))\$")
fi
(cd build/ci && ctest --output-on-failure --timeout 900 -j 1 "${known[@]}" "$@") || rc=$?
print_skips build/ci
[ "$rc" -eq 0 ] || exit "$rc"

if [ "${DUET_SKIP_SANITIZE:-0}" != "1" ]; then
  cmake -S . -B build/asan -DCMAKE_BUILD_TYPE=Debug -DDUET_WERROR=ON -DDUET_SANITIZE=ON \
    -DDUET_CUDA=OFF -DDUET_BUILD_BENCH=OFF
  cmake --build build/asan -j "$jobs"
  (cd build/asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --output-on-failure --timeout 900 -L unit "$@")
fi

# The fuzz smoke: every libFuzzer harness (fuzz/) for DUET_FUZZ_SECONDS
# (10 s) under ASan/UBSan, from its committed seeds; a crash, leak, UB
# report or hang fails the run (ctest label fuzz; scripts/fuzz.sh runs
# them longer).
if [ "${DUET_SKIP_FUZZ:-0}" != "1" ]; then
  cmake -S . -B build/fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=Debug -DDUET_WERROR=ON \
    -DDUET_FUZZ=ON -DDUET_CUDA=OFF -DDUET_BUILD_TESTS=OFF -DDUET_BUILD_BENCH=OFF
  cmake --build build/fuzz -j "$jobs" --target duet_fuzz
  (cd build/fuzz && ctest --output-on-failure -L fuzz "$@")
fi
echo "test.sh: all tests passed"
