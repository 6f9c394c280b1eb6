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

/* v[0..7] = the eight bf16 of u */
static __device__ __forceinline__ void duet__unpack8(uint4 u, float *v)
{
    const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&u);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 f = __bfloat1622float2(h[i]);
        v[2 * i] = f.x;
        v[2 * i + 1] = f.y;
    }
}

/* v[0..7] = p[0..7]; p 16-byte aligned */
static __device__ __forceinline__ void duet__load8(const duet_bf16 *p, float *v)
{
    duet__unpack8(*reinterpret_cast<const uint4 *>(p), v);
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

/* D += A.B, mma.sync m16n8k16, bf16 in, float32 accumulate; fragments in the
 * PTX layout: lane (g = lane/4, t = lane%4) holds A rows g, g+8 and B/C
 * column g / columns 2t, 2t+1. */
static __device__ __forceinline__ void duet__mma16816(float *c, uint32_t a0, uint32_t a1,
                                                      uint32_t a2, uint32_t a3, uint32_t b0,
                                                      uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* Four 8x8 bf16 matrices from shared memory into fragments: lanes 8i..8i+7
 * give the row addresses of matrix i; lane (g, t) receives row g, columns
 * 2t, 2t+1 of each (with trans: column g, rows 2t, 2t+1). */
static __device__ __forceinline__ void duet__ldsm_x4(uint32_t *r, const void *p)
{
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

static __device__ __forceinline__ void duet__ldsm_x4_trans(uint32_t *r, const void *p)
{
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

/* 16 bytes global -> shared without passing through registers (sm_80+);
 * valid = false writes 16 zero bytes (src is not read, but must be a
 * mapped address).  Groups: commit, then wait until at most n are in flight. */
static __device__ __forceinline__ void duet__cp16(void *dst, const void *src, bool valid)
{
    uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
                 "r"(valid ? 16 : 0));
}

static __device__ __forceinline__ void duet__cp_commit(void)
{
    asm volatile("cp.async.commit_group;\n" ::);
}

template <int N> static __device__ __forceinline__ void duet__cp_wait(void)
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* Programmatic dependent launch (sm_90): a kernel that feeds a GEMV
 * triggers at its start, so the GEMV (launched with the PDL attribute,
 * gemv.cu) gets its blocks resident and its first weight rows in flight
 * during this kernel's last wave; the GEMV waits (duet__pdl_wait) for this
 * kernel to complete, and its memory to be visible, before it reads its
 * input.  Both are no-ops for launches without the attribute. */
static __device__ __forceinline__ void duet__pdl_trigger(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::);
#endif
}

static __device__ __forceinline__ void duet__pdl_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

static __device__ __forceinline__ uint32_t duet__pack2f(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

/* The two rows an attention warp's mma accumulators hold for lane (g, t):
 * row g in o[j][0..1], row g + 8 in o[j][2..3], columns 8j + 2t, 2t + 1;
 * each divided by its softmax sum (la, lb) and stored as bf16 at pa / pb
 * (NULL: that row is past the tile's end). */
template <int HD>
static __device__ __forceinline__ void duet__mma_rows_store(duet_bf16 *pa, duet_bf16 *pb,
                                                            const float (*o)[4], float la,
                                                            float lb, int t4)
{
    if (pa != NULL) {
        float inv = 1.0f / la;
#pragma unroll
        for (int j = 0; j < HD / 8; j++)
            *reinterpret_cast<uint32_t *>(pa + j * 8 + 2 * t4) =
                duet__pack2f(o[j][0] * inv, o[j][1] * inv);
    }
    if (pb != NULL) {
        float inv = 1.0f / lb;
#pragma unroll
        for (int j = 0; j < HD / 8; j++)
            *reinterpret_cast<uint32_t *>(pb + j * 8 + 2 * t4) =
                duet__pack2f(o[j][2] * inv, o[j][3] * inv);
    }
}

#endif
