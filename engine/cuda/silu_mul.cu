/* SwiGLU: out[t][i] = silu(gu[t][i]) * gu[t][m + i], silu(g) = g / (1 + e^-g). */
#include "engine/cuda/cuda_device.cuh"
#include "engine/cuda/cuda_kernels.h"

static __device__ __forceinline__ float duet__silu(float g)
{
    return g / (1.0f + expf(-g));
}

/* eight elements per thread; m % 8 == 0 */
static __global__ void duet__silu_mul_vec(duet_bf16 *out, const duet_bf16 *gu, size_t total8, int m)
{
    duet__pdl_trigger(); /* a GEMV may follow (cuda_device.cuh) */
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total8;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t e = i * 8, t = e / (size_t)m, c = e % (size_t)m;
        const duet_bf16 *g = gu + t * 2u * (size_t)m + c;
        float gv[8], uv[8];
        duet__load8(g, gv);
        duet__load8(g + m, uv);
#pragma unroll
        for (int k = 0; k < 8; k++)
            gv[k] = duet__silu(gv[k]) * uv[k];
        duet__store8(out + e, gv);
    }
}

static __global__ void duet__silu_mul_scalar(duet_bf16 *out, const duet_bf16 *gu, size_t total,
                                             int m)
{
    duet__pdl_trigger(); /* a GEMV may follow (cuda_device.cuh) */
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x) {
        size_t t = e / (size_t)m, c = e % (size_t)m;
        const duet_bf16 *g = gu + t * 2u * (size_t)m + c;
        out[e] = duet__f2bf(duet__silu(duet__bf2f(g[0])) * duet__bf2f(g[m]));
    }
}

static int duet__grid(size_t work, int threads)
{
    size_t b = (work + (size_t)threads - 1) / (size_t)threads;
    return b > 65535u ? 65535 : (b < 1 ? 1 : (int)b);
}

extern "C" duet_status_t duet__cuda_silu_mul(cudaStream_t s, void *out, const void *gu, int n,
                                             int m)
{
    size_t total = (size_t)n * (size_t)m;
    if (total == 0)
        return DUET_OK;
    if (m % 8 == 0 && duet__aligned16(out) && duet__aligned16(gu))
        duet__silu_mul_vec<<<duet__grid(total / 8, 256), 256, 0, s>>>(
            (duet_bf16 *)out, (const duet_bf16 *)gu, total / 8, m);
    else
        duet__silu_mul_scalar<<<duet__grid(total, 256), 256, 0, s>>>(
            (duet_bf16 *)out, (const duet_bf16 *)gu, total, m);
    return DUET__CUDA_LAUNCHED("silu_mul");
}
