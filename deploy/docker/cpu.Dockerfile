# syntax=docker/dockerfile:1
# duet CPU image (Debian 12): duet-prefill, duet-decode (cpu backend) and duet-router.
#
#   docker build -f deploy/docker/cpu.Dockerfile -t duet-cpu:0.1.0 .
#   scripts/images.sh --cpu      (podman or docker; makes the debian:12.11
#                                 bases with debootstrap where no registry answers)
#
# The build stage runs the scripts CI runs (scripts/install-deps.sh with
# only the build's packages, scripts/build.sh: a release build without the
# benchmarks, fault injection compiled out); the final stage is Debian 12 slim plus the
# packages of the shared libraries the binaries load, found by
# deploy/docker/runtime-packages.sh in the build stage.

FROM debian:12.11 AS build
ARG DEBIAN_FRONTEND=noninteractive
WORKDIR /src
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN DUET_DEPS_PROFILE=build scripts/install-deps.sh && rm -rf /var/lib/apt/lists/*
COPY . .
RUN DUET_SKIP_DEPS=1 DUET_BUILD_DIR=build/image DUET_CMAKE_ARGS=-DDUET_BUILD_BENCH=OFF scripts/build.sh \
 && mkdir -p /out/bin \
 && install -m 0755 build/image/prefill/duet-prefill build/image/decode/duet-decode \
      build/image/router/duet-router build/image/tools/duet build/image/tools/duet-client \
      /out/bin/ \
 && strip /out/bin/* \
 && deploy/docker/runtime-packages.sh /out/bin/* > /out/runtime-packages.txt \
 && cat /out/runtime-packages.txt

FROM debian:12.11-slim
LABEL org.opencontainers.image.title="duet-cpu" \
      org.opencontainers.image.description="duet disaggregated prefill/decode serving (CPU)"
ARG DEBIAN_FRONTEND=noninteractive
COPY --from=build /out/runtime-packages.txt /usr/local/share/duet/runtime-packages.txt
# ucx-utils: ucx_info for troubleshooting; libcap2-bin: setcap below, getcap
RUN apt-get update \
 && xargs -a /usr/local/share/duet/runtime-packages.txt \
      apt-get install -y --no-install-recommends --no-upgrade ucx-utils libcap2-bin \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 duet \
 && useradd --system --uid 10001 --gid duet --home-dir /nonexistent \
      --shell /usr/sbin/nologin duet
COPY --from=build /out/bin/ /usr/local/bin/
# Copies of the daemons with CAP_IPC_LOCK as a file capability, for RDMA
# memory registration by the non-root user (deploy/k8s/components/rdma)
RUN mkdir -p /usr/local/libexec/duet/ipc-lock \
 && cp /usr/local/bin/duet-prefill /usr/local/bin/duet-decode /usr/local/libexec/duet/ipc-lock/ \
 && setcap cap_ipc_lock+ep /usr/local/libexec/duet/ipc-lock/duet-prefill \
 && setcap cap_ipc_lock+ep /usr/local/libexec/duet/ipc-lock/duet-decode
# a small model so a fresh deployment answers; mount real checkpoints at /models
COPY models/stories260K /models/stories260K
USER 10001:10001
WORKDIR /
CMD ["duet-router", "--help"]
