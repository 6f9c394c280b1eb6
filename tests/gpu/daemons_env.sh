# Sourced by the GPU scripts that run the daemons (disagg_gpu.sh,
# ttft_tax.sh, serve_gpu.sh), from the repo root.  Binaries: DUET_BIN, a
# directory holding duet, duet-client, duet-prefill, duet-decode and
# duet-router (tests/gpu/suite.sh links them there from a build tree), or
# else .devcarry/daemons (tests/gpu/build_carry_daemons.sh: built on another
# machine, with the shared libraries a bare CUDA host lacks).  With
# DUET_UCX_CUDA_LIB (a UCX build with CUDA transports: its lib directory,
# e.g. .devcarry/ucxcuda from tests/gpu/build_ucx_cuda.sh) that UCX goes
# ahead of the system's, so the daemons put straight between device pools
# (transfer path ucx-cuda-direct).
# Sets ROOT, C, BIN, NGPU and CARD (the GPU model, for the logs).
# shellcheck shell=bash disable=SC2034 # the sourcing script uses these
ROOT=$PWD
C=$ROOT/.devcarry/daemons
BIN=${DUET_BIN:-$C/bin} # DUET_BIN: another directory holding the same binaries
export LD_LIBRARY_PATH=$C/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
# the staged UCX's transport modules, when there are staged binaries
[ -d "$C/lib/ucx" ] && export UCX_MODULE_DIR=$C/lib/ucx
if [ -n "${DUET_UCX_CUDA_LIB:-}" ]; then
    export LD_LIBRARY_PATH=$DUET_UCX_CUDA_LIB:$LD_LIBRARY_PATH
    export UCX_MODULE_DIR=$DUET_UCX_CUDA_LIB/ucx
fi
export NCCL_NVLS_ENABLE=0
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
