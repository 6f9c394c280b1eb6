#!/usr/bin/env bash
# Build the libFuzzer harnesses (fuzz/) with clang + ASan/UBSan and run each
# for a fixed time.  Fails on the first harness that finds a crash, a leak,
# undefined behaviour or a hang; the input is left in build/fuzz/work/<name>/.
#
#   scripts/fuzz.sh                 every harness, 60 s each
#   scripts/fuzz.sh 600             every harness, 600 s each
#   scripts/fuzz.sh 30 tokenizer    only fuzz_tokenizer (names: fuzz/fuzz_*.c)
#
# New inputs accumulate in build/fuzz/work/<name>/corpus (kept between runs);
# the committed seeds in fuzz/corpus/<name>/ are only read.  Extra libFuzzer
# flags: FUZZ_FLAGS="-jobs=2 -workers=2" scripts/fuzz.sh.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
secs=${1:-60}
shift || true
jobs=$(nproc 2>/dev/null || echo 2)

if ! command -v clang >/dev/null 2>&1; then
  echo "fuzz.sh: clang is not installed (scripts/install-deps.sh installs it)" >&2
  exit 1
fi
cmake -S . -B build/fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=Debug -DDUET_WERROR=ON \
  -DDUET_FUZZ=ON -DDUET_CUDA=OFF -DDUET_BUILD_TESTS=OFF -DDUET_BUILD_BENCH=OFF >/dev/null
cmake --build build/fuzz -j "$jobs" --target duet_fuzz

if [ $# -gt 0 ]; then
  names=("$@")
else
  names=()
  for f in fuzz/fuzz_*.c; do
    n=$(basename "$f" .c)
    n=${n#fuzz_}
    [ "$n" = util ] || names+=("$n")
  done
fi
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
for n in "${names[@]}"; do
  # shellcheck disable=SC2086
  fuzz/run_one.sh "build/fuzz/fuzz/fuzz_$n" "$secs" "build/fuzz/work/$n" "fuzz/corpus/$n" \
    ${FUZZ_FLAGS:-}
done
echo "fuzz.sh: no findings (${#names[@]} harnesses, ${secs} s each)"
