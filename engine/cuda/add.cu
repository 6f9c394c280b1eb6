/* Residual add: x[i] = x[i] + y[i], float32 sum rounded to bf16. */
#include "engine/cuda/cuda_device.cuh"
#include "engine/cuda/cuda_kernels.h"

static __global__ void duet__add_vec(duet_bf16 *x, const duet_bf16 *y, size_t count8)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count8;
         i += (size_t)gridDim.x * blockDim.x) {
        float a[8], b[8];
        duet__load8(x + i * 8, a);
        duet__load8(y + i * 8, b);
#pragma unroll
        for (int k = 0; k < 8; k++)
            a[k] += b[k];
        duet__store8(x + i * 8, a);
    }
}

static __global__ void duet__add_scalar(duet_bf16 *x, const duet_bf16 *y, size_t count)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] = duet__f2bf(duet__bf2f(x[i]) + duet__bf2f(y[i]));
}

extern "C" duet_status_t duet__cuda_add(cudaStream_t s, void *x, const void *y, size_t count)
{
    if (count == 0)
        return DUET_OK;
    bool vec = count % 8 == 0 && duet__aligned16(x) && duet__aligned16(y);
    size_t work = vec ? count / 8 : count;
    size_t blocks = (work + 255) / 256;
    int grid = blocks > 65535u ? 65535 : (int)blocks;
    if (vec)
        duet__add_vec<<<grid, 256, 0, s>>>((duet_bf16 *)x, (const duet_bf16 *)y, work);
    else
        duet__add_scalar<<<grid, 256, 0, s>>>((duet_bf16 *)x, (const duet_bf16 *)y, work);
    return DUET__CUDA_LAUNCHED("add");
}
