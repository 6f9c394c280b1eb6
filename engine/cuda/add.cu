/* Residual add x[i] = x[i] + y[i], and bias add x[t][j] = x[t][j] + b[j]:
 * one kernel that reads y at i % period (period = count for the residual,
 * d for a bias broadcast over rows); float32 sum rounded to bf16. */
#include "engine/cuda/cuda_device.cuh"
#include "engine/cuda/cuda_kernels.h"

static __global__ void duet__add_vec(duet_bf16 *x, const duet_bf16 *y, size_t count8,
                                     size_t period8)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count8;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t j = period8 == count8 ? i : i % period8;
        float a[8], b[8];
        duet__load8(x + i * 8, a);
        duet__load8(y + j * 8, b);
#pragma unroll
        for (int k = 0; k < 8; k++)
            a[k] += b[k];
        duet__store8(x + i * 8, a);
    }
}

static __global__ void duet__add_scalar(duet_bf16 *x, const duet_bf16 *y, size_t count,
                                        size_t period)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t j = period == count ? i : i % period;
        x[i] = duet__f2bf(duet__bf2f(x[i]) + duet__bf2f(y[j]));
    }
}

/* x[i] += y[i % period] for i < count (period divides count) */
static duet_status_t duet__add_launch(cudaStream_t s, void *x, const void *y, size_t count,
                                      size_t period)
{
    if (count == 0)
        return DUET_OK;
    bool vec = period % 8 == 0 && duet__aligned16(x) && duet__aligned16(y);
    size_t work = vec ? count / 8 : count;
    size_t blocks = (work + 255) / 256;
    int grid = blocks > 65535u ? 65535 : (int)blocks;
    if (vec)
        duet__add_vec<<<grid, 256, 0, s>>>((duet_bf16 *)x, (const duet_bf16 *)y, work, period / 8);
    else
        duet__add_scalar<<<grid, 256, 0, s>>>((duet_bf16 *)x, (const duet_bf16 *)y, work, period);
    return DUET__CUDA_LAUNCHED("add");
}

extern "C" duet_status_t duet__cuda_add(cudaStream_t s, void *x, const void *y, size_t count)
{
    return duet__add_launch(s, x, y, count, count);
}

extern "C" duet_status_t duet__cuda_add_bias(cudaStream_t s, void *x, const void *bias, int n,
                                             int d)
{
    if (n <= 0 || d <= 0)
        return DUET_OK;
    return duet__add_launch(s, x, bias, (size_t)n * (size_t)d, (size_t)d);
}
