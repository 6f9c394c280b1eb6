/* Skinny dense layer for decode: y[t][r] = sum_c x[t][c] W[r][c] (+ b[r])
 * for t < N <= DUET__CUDA_GEMV_MAX_N tokens, float32 accumulation.
 *
 * Reading W once is the whole cost, so each warp streams two rows of W
 * with 16-byte loads (several in flight per lane) and applies them to all
 * N token rows of x, which stay in L1 (they are shared by every warp); the
 * two rows halve those x reads per weight byte.  Needs cols % 8 == 0 and
 * 16-byte aligned x, W and y rows (the caller falls back to cuBLASLt).
 *
 * Launched as a programmatic dependent (cuda_device.cuh): the kernel
 * before it triggers at its start, so this one's blocks become resident
 * during that kernel's last wave and ask L2 for their first weight rows
 * (which no kernel writes) before waiting for it to complete; only then
 * is x read.  DUET_CUDA_GEMV_PDL=0 launches it plainly. */
#include "engine/cuda/cuda_device.cuh"
#include "engine/cuda/cuda_kernels.h"

#define DUET__GEMV_WARPS  8
#define DUET__GEMV_UNROLL 4

static __device__ __forceinline__ float duet__dot8(const float *a, uint4 b)
{
    const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&b);
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 f = __bfloat1622float2(h[i]);
        s += a[2 * i] * f.x + a[2 * i + 1] * f.y;
    }
    return s;
}

template <int N>
static __global__ void __launch_bounds__(DUET__GEMV_WARPS * 32)
    duet__gemv_kernel(duet_bf16 *y, const duet_bf16 *x, const duet_bf16 *W, const duet_bf16 *bias,
                      int rows, int cols)
{
    const int lane = threadIdx.x & 31;
    const int r0 = (blockIdx.x * DUET__GEMV_WARPS + (threadIdx.x >> 5)) * 2;
    if (r0 >= rows) {
        duet__pdl_wait();
        return;
    }
    const bool two = r0 + 1 < rows;
    const int nv = cols / 8;
    const uint4 *w0 = reinterpret_cast<const uint4 *>(W + (size_t)r0 * cols);
    const uint4 *w1 = two ? w0 + nv : w0;
    const uint4 *xv = reinterpret_cast<const uint4 *>(x);
    for (int v = lane; v < nv && v < 32 * 2 * DUET__GEMV_UNROLL; v += 32) {
        asm volatile("prefetch.global.L2 [%0];\n" ::"l"(w0 + v));
        asm volatile("prefetch.global.L2 [%0];\n" ::"l"(w1 + v));
    }
    duet__pdl_wait();
    float acc0[N], acc1[N];
#pragma unroll
    for (int t = 0; t < N; t++)
        acc0[t] = acc1[t] = 0.0f;

    int v = lane;
    for (; v + 32 * (DUET__GEMV_UNROLL - 1) < nv; v += 32 * DUET__GEMV_UNROLL) {
        uint4 a[DUET__GEMV_UNROLL], b[DUET__GEMV_UNROLL];
#pragma unroll
        for (int u = 0; u < DUET__GEMV_UNROLL; u++) {
            a[u] = __ldcs(w0 + v + 32 * u); /* streamed once: keep L1 for x */
            b[u] = __ldcs(w1 + v + 32 * u);
        }
#pragma unroll
        for (int u = 0; u < DUET__GEMV_UNROLL; u++) {
#pragma unroll
            for (int t = 0; t < N; t++) {
                float xf[8];
                duet__unpack8(__ldg(xv + (size_t)t * nv + v + 32 * u), xf);
                acc0[t] += duet__dot8(xf, a[u]);
                acc1[t] += duet__dot8(xf, b[u]);
            }
        }
    }
    for (; v < nv; v += 32) {
        uint4 a = __ldcs(w0 + v), b = __ldcs(w1 + v);
#pragma unroll
        for (int t = 0; t < N; t++) {
            float xf[8];
            duet__unpack8(__ldg(xv + (size_t)t * nv + v), xf);
            acc0[t] += duet__dot8(xf, a);
            acc1[t] += duet__dot8(xf, b);
        }
    }
#pragma unroll
    for (int t = 0; t < N; t++) {
        acc0[t] = duet__warp_sum(acc0[t]);
        acc1[t] = duet__warp_sum(acc1[t]);
    }
    if (lane == 0) {
        float b0 = bias != NULL ? duet__bf2f(bias[r0]) : 0.0f;
        float b1 = bias != NULL && two ? duet__bf2f(bias[r0 + 1]) : 0.0f;
#pragma unroll
        for (int t = 0; t < N; t++) {
            y[(size_t)t * rows + r0] = duet__f2bf(acc0[t] + b0);
            if (two)
                y[(size_t)t * rows + r0 + 1] = duet__f2bf(acc1[t] + b1);
        }
    }
}

extern "C" int duet__cuda_gemv_supported(const void *y, const void *x, const void *w, int n,
                                         int rows, int cols)
{
    (void)y;
    return n >= 1 && n <= DUET__CUDA_GEMV_MAX_N && cols % 8 == 0 && rows >= 1 &&
           duet__aligned16(x) && duet__aligned16(w);
}

template <int N>
static cudaError_t duet__gemv_launch(cudaStream_t s, dim3 grid, bool pdl, duet_bf16 *y,
                                     const duet_bf16 *x, const duet_bf16 *w, const duet_bf16 *b,
                                     int rows, int cols)
{
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    cfg.gridDim = grid;
    cfg.blockDim = dim3(DUET__GEMV_WARPS * 32);
    cfg.dynamicSmemBytes = 0;
    cfg.stream = s;
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, duet__gemv_kernel<N>, y, x, w, b, rows, cols);
}

extern "C" duet_status_t duet__cuda_gemv(cudaStream_t s, void *y, const void *x, int n,
                                         const void *w, int rows, int cols, const void *bias,
                                         bool pdl)
{
    int per_block = DUET__GEMV_WARPS * 2;
    dim3 grid((unsigned)((rows + per_block - 1) / per_block));
    duet_bf16 *yy = (duet_bf16 *)y;
    const duet_bf16 *xx = (const duet_bf16 *)x, *ww = (const duet_bf16 *)w,
                    *bb = (const duet_bf16 *)bias;
    cudaError_t e;
    switch (n) {
    case 1:
        e = duet__gemv_launch<1>(s, grid, pdl, yy, xx, ww, bb, rows, cols);
        break;
    case 2:
        e = duet__gemv_launch<2>(s, grid, pdl, yy, xx, ww, bb, rows, cols);
        break;
    case 3:
        e = duet__gemv_launch<3>(s, grid, pdl, yy, xx, ww, bb, rows, cols);
        break;
    case 4:
        e = duet__gemv_launch<4>(s, grid, pdl, yy, xx, ww, bb, rows, cols);
        break;
    default:
        return duet_error(DUET_ERR_INTERNAL, "cuda gemv: %d tokens", n);
    }
    return duet__cuda_check(e, "gemv", __FILE__, __LINE__);
}
