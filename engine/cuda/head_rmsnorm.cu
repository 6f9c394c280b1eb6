/* Per-head RMSNorm of the q and k heads of qkv[n][(nq + 2 nkv) d] (Qwen3's
 * q_norm / k_norm, before RoPE), in place:
 *   x[h][i] = x[h][i] / sqrt(mean_i(x[h][i]^2) + eps) * w[i]
 * with w = qw for the nq q heads, kw for the nkv k heads; v untouched.
 * One warp per head (float32 sum of squares, a warp reduction), 4 heads per
 * block; the element math is the rmsnorm kernel's (x * scale * w, rounded
 * to bf16 once). */
#include "engine/cuda/cuda_device.cuh"
#include "engine/cuda/cuda_kernels.h"

#define DUET__HN_WARPS 4

static __global__ void duet__head_rmsnorm_kernel(duet_bf16 *qkv, const duet_bf16 *qw,
                                                 const duet_bf16 *kw, int n, int nq, int nkv,
                                                 int hd, float eps)
{
    int heads = nq + nkv;
    long g = (long)blockIdx.x * DUET__HN_WARPS + (long)(threadIdx.x / 32);
    int lane = threadIdx.x % 32;
    if (g >= (long)n * heads)
        return;
    int t = (int)(g / heads), h = (int)(g % heads);
    duet_bf16 *x = qkv + (size_t)t * (size_t)(nq + 2 * nkv) * (size_t)hd + (size_t)h * (size_t)hd;
    const duet_bf16 *w = h < nq ? qw : kw;
    float ss = 0.0f;
    for (int i = lane; i < hd; i += 32) {
        float v = duet__bf2f(x[i]);
        ss += v * v;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        ss += __shfl_xor_sync(0xffffffffu, ss, o);
    float scale = 1.0f / sqrtf(ss / (float)hd + eps);
    for (int i = lane; i < hd; i += 32)
        x[i] = duet__f2bf(duet__bf2f(x[i]) * scale * duet__bf2f(w[i]));
}

extern "C" duet_status_t duet__cuda_head_rmsnorm(cudaStream_t s, void *qkv, const void *qw,
                                                 const void *kw, int n, int nq, int nkv,
                                                 int head_dim, float eps)
{
    long heads = (long)n * (long)(nq + nkv);
    if (heads <= 0)
        return DUET_OK;
    unsigned blocks = (unsigned)((heads + DUET__HN_WARPS - 1) / DUET__HN_WARPS);
    duet__head_rmsnorm_kernel<<<blocks, DUET__HN_WARPS * 32, 0, s>>>(
        (duet_bf16 *)qkv, (const duet_bf16 *)qw, (const duet_bf16 *)kw, n, nq, nkv, head_dim, eps);
    return DUET__CUDA_LAUNCHED("head_rmsnorm");
}
