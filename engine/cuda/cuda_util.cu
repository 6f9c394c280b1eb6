/* Launch checks and per-device kernel set-up. */
#include <stdio.h>

#include "engine/cuda/cuda_kernels.h"

extern "C" duet_status_t duet__cuda_check(cudaError_t err, const char *what, const char *file,
                                          int line)
{
    if (err == cudaSuccess)
        return DUET_OK;
    return duet_error(err == cudaErrorMemoryAllocation ? DUET_ERR_NO_MEMORY : DUET_ERR_INTERNAL,
                      "cuda: %s: %s (%s) at %s:%d", what, cudaGetErrorString(err),
                      cudaGetErrorName(err), file, line);
}

extern "C" duet_status_t duet__cuda_kernels_init(void)
{
    duet_status_t st = duet__cuda_attention_decode_init();
    return st != DUET_OK ? st : duet__cuda_attention_prefill_init();
}
