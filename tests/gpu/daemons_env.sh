# Sourced by the GPU scripts that run the daemons (disagg_gpu.sh,
# ttft_tax.sh), from the repo root: the carried binaries and libraries
# (tests/gpu/build_carry_daemons.sh -> .devcarry/daemons) and, with
# DUET_UCX_CUDA_LIB (a UCX build with CUDA transports, e.g. .devcarry/ucxcuda
# from tests/gpu/build_ucx_cuda.sh), that UCX ahead of the carried one, so the
# daemons put straight between device pools (transfer path ucx-cuda-direct).
# Sets ROOT, C, BIN, NGPU and CARD (the GPU model, for the logs).
ROOT=$PWD
C=$ROOT/.devcarry/daemons
BIN=${DUET_BIN:-$C/bin} # DUET_BIN: another directory holding the same binaries
export LD_LIBRARY_PATH=$C/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export UCX_MODULE_DIR=$C/lib/ucx
if [ -n "${DUET_UCX_CUDA_LIB:-}" ]; then
    export LD_LIBRARY_PATH=$DUET_UCX_CUDA_LIB:$LD_LIBRARY_PATH
    export UCX_MODULE_DIR=$DUET_UCX_CUDA_LIB/ucx
fi
export NCCL_NVLS_ENABLE=0
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
