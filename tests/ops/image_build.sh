#!/usr/bin/env bash
# ctest ops.image.build: scripts/images.sh --cpu (the CPU image from
# deploy/docker/cpu.Dockerfile, with a debootstrap-made base where no
# registry answers), then a smoke run of the image.  Exit 77 (SKIP) with
# the reason when this host cannot build or run containers.
set -uo pipefail
src=${1:?usage: image_build.sh SOURCE_DIR}
cd "$src"
skip() { echo "SKIP: $*"; exit 77; }

command -v podman >/dev/null 2>&1 ||
  { command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; } ||
  skip "no container engine (apt-get install podman runc iptables; scripts/install-deps.sh does)"
[ "$(id -u)" -eq 0 ] || sudo -n true 2>/dev/null ||
  skip "making the base image with debootstrap needs root or passwordless sudo"
# shellcheck source=scripts/lib/containers.sh
. scripts/lib/containers.sh
engine=$(duet_engine) || skip "no usable container engine"
[ "$engine" = podman ] && duet_podman_conf

scripts/images.sh --base-only
rc=$?
[ "$rc" -eq 3 ] && skip "the CPU Dockerfile's base images can neither be pulled nor made here (see above)"
[ "$rc" -eq 0 ] || exit "$rc"
# can this host run a container at all (cgroups, runtime, ulimits)?
if ! out=$("$engine" run --rm --network none docker.io/library/debian:12.11 true 2>&1); then
  skip "$engine cannot run containers here: $out"
fi
scripts/images.sh --cpu || exit 1
tag=$(sed -n 's/^project(duet VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
image=duet-cpu:${tag:-0.1.0}
for exe in duet-router duet-prefill duet-decode duet duet-client; do
  "$engine" run --rm --network none --read-only "$image" "$exe" --help >/dev/null 2>&1 ||
    { "$engine" run --rm --network none "$image" "$exe" --help; echo "FAIL: $exe --help in $image"; exit 1; }
done
user=$("$engine" image inspect --format '{{.Config.User}}' "$image")
[ "$user" = 10001:10001 ] || { echo "FAIL: $image runs as '$user', not 10001:10001"; exit 1; }
echo "PASS: $image built and runs as $user"
