/* Device helpers shared by the kernel files: bf16 <-> float in groups of
 * eight (one 16-byte access), warp and block reductions. */
#ifndef DUET_ENGINE_CUDA_CUDA_DEVICE_CUH
#define DUET_ENGINE_CUDA_CUDA_DEVICE_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

typedef __nv_bfloat16 duet_bf16;

static __device__ __forceinline__ float duet__bf2f(duet_bf16 x)
{
    return __bfloat162float(x);
}

static __device__ __forceinline__ duet_bf16 duet__f2bf(float x)
{
    return __float2bfloat16_rn(x);
}

/* v[0..7] = p[0..7]; p 16-byte aligned */
static __device__ __forceinline__ void duet__load8(const duet_bf16 *p, float *v)
{
    uint4 u = *reinterpret_cast<const uint4 *>(p);
    const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&u);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 f = __bfloat1622float2(h[i]);
        v[2 * i] = f.x;
        v[2 * i + 1] = f.y;
    }
}

static __device__ __forceinline__ void duet__store8(duet_bf16 *p, const float *v)
{
    uint4 u;
    __nv_bfloat162 *h = reinterpret_cast<__nv_bfloat162 *>(&u);
#pragma unroll
    for (int i = 0; i < 4; i++)
        h[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
    *reinterpret_cast<uint4 *>(p) = u;
}

static __device__ __forceinline__ float duet__warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ float duet__warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32); every thread gets it.
 * scratch: 32 floats of shared memory. */
static __device__ __forceinline__ float duet__block_sum(float v, float *scratch)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = duet__warp_sum(v);
    __syncthreads();
    if (lane == 0)
        scratch[warp] = v;
    __syncthreads();
    v = lane < nw ? scratch[lane] : 0.0f;
    return duet__warp_sum(v);
}

static __host__ __device__ __forceinline__ bool duet__aligned16(const void *p)
{
    return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

#endif
