#!/usr/bin/env bash
# The main job: build duet and generate a story with the shipped
# stories260K model (greedy).  Extra arguments go to `duet generate`.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
scripts/build.sh
build=${DUET_BUILD_DIR:-build/release}
exec "$build/tools/duet" generate --model models/stories260K \
  --prompt "Once upon a time" --max-tokens 200 "$@"
