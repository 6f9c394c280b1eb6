# syntax=docker/dockerfile:1
# duet GPU image: duet-prefill, duet-decode (cuda backend) and duet-router.
#
#   docker build -f deploy/docker/gpu.Dockerfile -t duet-gpu:0.1.0 .
#
# The build stage runs the scripts CI runs (scripts/install-deps.sh,
# scripts/build.sh: a release build, fault injection compiled out); the
# final stage is CUDA's runtime image plus the
# packages of the shared libraries the binaries load, found by
# deploy/docker/runtime-packages.sh in the build stage.
#
# UCX: not Ubuntu's (1.16, no CUDA transports) but the pinned UCX 1.22.0
# that scripts/build_ucx.sh builds into /opt/ucx with cuda_copy + cuda_ipc
# (KV puts between the GPUs of one node, deploy/k8s/overlays/p1d2-same-node)
# and the verbs/rdmacm/mlx5 transports (GPUDirect RDMA between nodes).  The
# script downloads the upstream release tarball and checks its pinned
# sha256 before unpacking it.  The daemons are linked against it and the
# final stage carries its libraries and ucx_info, registered with ldconfig
# (not LD_LIBRARY_PATH: the cap_ipc_lock copies below run in secure-execution
# mode, where the loader ignores it).  docs/deploy-gpu.md has the details.
#
# Not built here: the development machine has no Docker engine and no
# network access to the release URL.  tests/deploy checks this file
# statically (tests/deploy/lib/dockerfile.mjs).

FROM nvidia/cuda:13.0.2-devel-ubuntu24.04 AS build
ARG DEBIAN_FRONTEND=noninteractive
WORKDIR /src
COPY scripts/install-deps.sh scripts/install-deps.sh
# DUET_DEPS_OPS=0: not the container/Prometheus test tools (podman, ...)
RUN DUET_DEPS_OPS=0 scripts/install-deps.sh && rm -rf /var/lib/apt/lists/*
# UCX before the sources, so a source change does not rebuild it.  rdma-core's
# headers make build_ucx.sh build the verbs, rdmacm and mlx5 transports;
# nvml.h and the libnvidia-ml stub are the devel image's cuda-nvml-dev
# (/usr/local/cuda/include, lib64/stubs), where build_ucx.sh looks.
COPY scripts/build_ucx.sh scripts/build_ucx.sh
RUN apt-get update \
 && apt-get install -y --no-install-recommends --no-upgrade \
      curl ca-certificates libibverbs-dev librdmacm-dev cuda-nvml-dev-13-0 \
 && rm -rf /var/lib/apt/lists/* \
 && scripts/build_ucx.sh --prefix /opt/ucx \
 && ls /opt/ucx/lib/ucx/libuct_cuda.so /opt/ucx/lib/ucx/libuct_ib.so \
      /opt/ucx/lib/ucx/libuct_ib_mlx5.so /opt/ucx/lib/ucx/libuct_rdmacm.so \
 && rm -rf /tmp/duet-ucx-* \
 && echo /opt/ucx/lib > /etc/ld.so.conf.d/000-duet-ucx.conf && ldconfig
COPY . .
# the cuda backend is required here (configure fails without nvcc); the
# ldd checks make sure it was linked, and linked against /opt/ucx's UCX
# (pkg-config finds /opt/ucx's ucx.pc first; CMake records /opt/ucx/lib as
# the binaries' run path) rather than Ubuntu's libucx-dev
RUN PKG_CONFIG_PATH=/opt/ucx/lib/pkgconfig DUET_SKIP_DEPS=1 DUET_BUILD_DIR=build/image \
      DUET_CMAKE_ARGS=-DDUET_CUDA=ON scripts/build.sh \
 && ldd build/image/prefill/duet-prefill | grep -q libcublas \
 && ldd build/image/prefill/duet-prefill | grep -q '=> /opt/ucx/lib/libucp.so' \
 && ldd build/image/decode/duet-decode | grep -q '=> /opt/ucx/lib/libucp.so' \
 && mkdir -p /out/bin /out/ucx/lib/ucx /out/ucx/bin \
 && install -m 0755 build/image/prefill/duet-prefill build/image/decode/duet-decode \
      build/image/router/duet-router build/image/tools/duet build/image/tools/duet-client \
      /out/bin/ \
 && strip /out/bin/* \
 && cp -a /opt/ucx/lib/*.so.* /out/ucx/lib/ \
 && cp -a /opt/ucx/lib/ucx/*.so.* /out/ucx/lib/ucx/ \
 && cp -a /opt/ucx/bin/ucx_info /out/ucx/bin/ \
 && deploy/docker/runtime-packages.sh --bundled /opt/ucx /out/bin/* /opt/ucx/bin/ucx_info \
      > /out/runtime-packages.txt \
 && cat /out/runtime-packages.txt

FROM nvidia/cuda:13.0.2-runtime-ubuntu24.04
LABEL org.opencontainers.image.title="duet-gpu" \
      org.opencontainers.image.description="duet disaggregated prefill/decode serving (CUDA)"
ARG DEBIAN_FRONTEND=noninteractive
COPY --from=build /out/runtime-packages.txt /usr/local/share/duet/runtime-packages.txt
# UCX 1.22.0 with CUDA and RDMA transports: libraries, transport modules and
# ucx_info (on the PATH for troubleshooting: ucx_info -v, ucx_info -d)
COPY --from=build /out/ucx/ /opt/ucx/
# ibverbs-providers: the NIC drivers libibverbs loads (mlx5 and others);
# libcap2-bin: setcap below, getcap
RUN apt-get update \
 && xargs -a /usr/local/share/duet/runtime-packages.txt \
      apt-get install -y --no-install-recommends --no-upgrade ibverbs-providers libcap2-bin \
 && rm -rf /var/lib/apt/lists/* \
 && echo /opt/ucx/lib > /etc/ld.so.conf.d/000-duet-ucx.conf && ldconfig \
 && ln -s /opt/ucx/bin/ucx_info /usr/local/bin/ucx_info \
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
