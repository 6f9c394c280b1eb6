#!/usr/bin/env bash
# Configure and build duet into build/release (or $DUET_BUILD_DIR).
# Installs the Debian dependencies first unless DUET_SKIP_DEPS=1.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
build=${DUET_BUILD_DIR:-build/release}
if [ "${DUET_SKIP_DEPS:-0}" != "1" ]; then
  scripts/install-deps.sh >&2
fi
# DUET_CMAKE_ARGS: extra configure flags (the GPU image passes -DDUET_CUDA=ON).
# The release build has no fault points (common/fault.h): the images and
# production binaries cannot be made to fail on purpose.
# shellcheck disable=SC2086
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DDUET_BUILD_TESTS=OFF \
  -DDUET_FAULT_INJECTION=OFF ${DUET_CMAKE_ARGS:-} >&2
cmake --build "$build" -j "$(nproc 2>/dev/null || echo 2)" >&2
