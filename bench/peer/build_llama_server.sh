#!/usr/bin/env bash
# Build llama.cpp's llama-server (CPU only) from a source tree that the caller
# brought here (a checkout or `git archive` of llama.cpp). Nothing of llama.cpp
# is kept in this repository; this script only drives its own CMake build.
#
#   bench/peer/build_llama_server.sh SRC_DIR [BUILD_DIR]
#
# BUILD_DIR defaults to SRC_DIR/build-duet-peer. The binary ends up at
# BUILD_DIR/bin/llama-server; the script prints its path and `--version`.
# Environment: JOBS (default 2), NICE (default 10: the build is long on a
# 2-core machine and should not starve other work), LLAMA_COMMIT (the source
# commit, for a tree without .git such as a `git archive`; llama-server then
# reports "version: 0 (unknown)", so the commit is kept beside the binary in
# BUILD_DIR/bin/llama-server.commit, which bench/serve_peer.py reports).
set -euo pipefail

if [[ $# -lt 1 || $# -gt 2 ]]; then
    echo "usage: $0 LLAMA_CPP_SRC_DIR [BUILD_DIR]" >&2
    exit 2
fi
src=$(cd "$1" && pwd)
build=${2:-$src/build-duet-peer}
jobs=${JOBS:-2}
nice_level=${NICE:-10}

if [[ ! -f "$src/CMakeLists.txt" || ! -d "$src/ggml" ]]; then
    echo "$0: $src does not look like a llama.cpp source tree (no CMakeLists.txt or ggml/)" >&2
    exit 2
fi

# Only what llama-server needs: CPU backend, no libcurl (no model download),
# no tests, native SIMD for this machine (the benchmark runs where it is built).
nice -n "$nice_level" cmake -S "$src" -B "$build" \
    -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF \
    -DGGML_NATIVE=ON \
    -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=ON \
    -DLLAMA_BUILD_SERVER=ON
nice -n "$nice_level" cmake --build "$build" --target llama-server -j "$jobs"

bin=$build/bin/llama-server
commit=${LLAMA_COMMIT:-}
if [[ -z "$commit" && -e "$src/.git" ]]; then
    commit=$(git -C "$src" rev-parse HEAD 2>/dev/null || true)
fi
echo "${commit:-unknown}" > "$build/bin/llama-server.commit"
"$bin" --version 2>&1 | sed 's/^/llama-server: /'
echo "$bin"
