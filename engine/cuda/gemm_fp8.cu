/* FP8 (e4m3) weights: the decode GEMV and the kernels around the cuBLASLt
 * FP8 GEMM (gemm_fp8.c; docs/fp8.md has the design).
 *
 * GEMV: y[t][r] = s[r] * sum_c x[t][c] e4m3(W[r][c]) (+ b[r]) for t < N <=
 * DUET__CUDA_GEMV_MAX_N, modelled on gemv.cu: each warp streams two rows
 * of W with 16-byte loads (16 weights each, several in flight per lane),
 * converts them with the hardware cvt (e4m3x2 -> f16x2, exact) to float and
 * applies them to all N token rows of x (bf16, in L1) with float32
 * accumulation; the row's scale (per channel, or the tensor's scale
 * repeated) multiplies the sum once at the end.  Half the weight bytes of
 * the bf16 GEMV for the same work.  Needs cols % 16 == 0 and 16-byte
 * aligned x and W.  Launched as a programmatic dependent, like gemv.cu.
 *
 * Quantize: one block per token row of x: its amax, sx[t] = amax / 448 and
 * xq[t][c] = e4m3(x[t][c] / sx[t]) (round to nearest even, saturating):
 * per-token activation scales for cuBLASLt's outer-vector scale mode.
 *
 * Rescale: y[t][r] = y[t][r] * s[r] * sx[t] (+ b[r]), for cuBLASLt builds
 * without the outer-vector mode (the GEMM then runs unscaled). */
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "engine/cuda/cuda_device.cuh"
#include "engine/cuda/cuda_kernels.h"

#define DUET__GEMV8_WARPS  8
#define DUET__GEMV8_UNROLL 4
#define DUET__E4M3_MAX     448.0f

/* f[0..15] = the 16 e4m3 of u (exact: every e4m3 is a half) */
static __device__ __forceinline__ void duet__unpack16_e4m3(uint4 u, float *f)
{
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        __half2_raw lo =
            __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w[i] & 0xffffu), __NV_E4M3);
        __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w[i] >> 16), __NV_E4M3);
        float2 a = __half22float2(*reinterpret_cast<const __half2 *>(&lo));
        float2 b = __half22float2(*reinterpret_cast<const __half2 *>(&hi));
        f[4 * i] = a.x;
        f[4 * i + 1] = a.y;
        f[4 * i + 2] = b.x;
        f[4 * i + 3] = b.y;
    }
}

/* xf[0..15] = the 16 bf16 of x0, x1 */
static __device__ __forceinline__ void duet__unpack16_bf16(uint4 x0, uint4 x1, float *xf)
{
    duet__unpack8(x0, xf);
    duet__unpack8(x1, xf + 8);
}

static __device__ __forceinline__ float duet__dot16(const float *x, const float *w)
{
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; i++)
        s += x[i] * w[i];
    return s;
}

template <int N>
static __global__ void __launch_bounds__(DUET__GEMV8_WARPS * 32)
    duet__gemv_fp8_kernel(duet_bf16 *y, const duet_bf16 *x, const uint8_t *W, const float *scale,
                          const duet_bf16 *bias, int rows, int cols)
{
    const int lane = threadIdx.x & 31;
    const int r0 = (blockIdx.x * DUET__GEMV8_WARPS + (threadIdx.x >> 5)) * 2;
    if (r0 >= rows) {
        duet__pdl_wait();
        return;
    }
    const bool two = r0 + 1 < rows;
    const int nv = cols / 16; /* 16-byte weight vectors per row; x has 2 per vector */
    const uint4 *w0 = reinterpret_cast<const uint4 *>(W + (size_t)r0 * cols);
    const uint4 *w1 = two ? w0 + nv : w0;
    const uint4 *xv = reinterpret_cast<const uint4 *>(x);
    for (int v = lane; v < nv && v < 32 * 2 * DUET__GEMV8_UNROLL; v += 32) {
        asm volatile("prefetch.global.L2 [%0];\n" ::"l"(w0 + v));
        asm volatile("prefetch.global.L2 [%0];\n" ::"l"(w1 + v));
    }
    duet__pdl_wait();
    float acc0[N], acc1[N];
#pragma unroll
    for (int t = 0; t < N; t++)
        acc0[t] = acc1[t] = 0.0f;

    int v = lane;
    for (; v + 32 * (DUET__GEMV8_UNROLL - 1) < nv; v += 32 * DUET__GEMV8_UNROLL) {
        uint4 a[DUET__GEMV8_UNROLL], b[DUET__GEMV8_UNROLL];
#pragma unroll
        for (int u = 0; u < DUET__GEMV8_UNROLL; u++) {
            a[u] = __ldcs(w0 + v + 32 * u); /* streamed once: keep L1 for x */
            b[u] = __ldcs(w1 + v + 32 * u);
        }
#pragma unroll
        for (int u = 0; u < DUET__GEMV8_UNROLL; u++) {
            float fa[16], fb[16];
            duet__unpack16_e4m3(a[u], fa);
            duet__unpack16_e4m3(b[u], fb);
#pragma unroll
            for (int t = 0; t < N; t++) {
                const uint4 *xt = xv + (size_t)t * (2 * nv) + 2 * (v + 32 * u);
                float xf[16];
                duet__unpack16_bf16(__ldg(xt), __ldg(xt + 1), xf); /* once for both rows */
                acc0[t] += duet__dot16(xf, fa);
                acc1[t] += duet__dot16(xf, fb);
            }
        }
    }
    for (; v < nv; v += 32) {
        float fa[16], fb[16];
        duet__unpack16_e4m3(__ldcs(w0 + v), fa);
        duet__unpack16_e4m3(__ldcs(w1 + v), fb);
#pragma unroll
        for (int t = 0; t < N; t++) {
            const uint4 *xt = xv + (size_t)t * (2 * nv) + 2 * v;
            float xf[16];
            duet__unpack16_bf16(__ldg(xt), __ldg(xt + 1), xf);
            acc0[t] += duet__dot16(xf, fa);
            acc1[t] += duet__dot16(xf, fb);
        }
    }
#pragma unroll
    for (int t = 0; t < N; t++) {
        acc0[t] = duet__warp_sum(acc0[t]);
        acc1[t] = duet__warp_sum(acc1[t]);
    }
    if (lane == 0) {
        float s0 = scale[r0], s1 = two ? scale[r0 + 1] : 0.0f;
        float b0 = bias != NULL ? duet__bf2f(bias[r0]) : 0.0f;
        float b1 = bias != NULL && two ? duet__bf2f(bias[r0 + 1]) : 0.0f;
#pragma unroll
        for (int t = 0; t < N; t++) {
            y[(size_t)t * rows + r0] = duet__f2bf(acc0[t] * s0 + b0);
            if (two)
                y[(size_t)t * rows + r0 + 1] = duet__f2bf(acc1[t] * s1 + b1);
        }
    }
}

extern "C" int duet__cuda_gemv_fp8_supported(const void *x, const void *w, int n, int rows,
                                             int cols)
{
    return n >= 1 && n <= DUET__CUDA_GEMV_MAX_N && cols % 16 == 0 && rows >= 1 &&
           duet__aligned16(x) && duet__aligned16(w);
}

template <int N>
static cudaError_t duet__gemv_fp8_launch(cudaStream_t s, dim3 grid, bool pdl, duet_bf16 *y,
                                         const duet_bf16 *x, const uint8_t *w, const float *sc,
                                         const duet_bf16 *b, int rows, int cols)
{
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    cfg.gridDim = grid;
    cfg.blockDim = dim3(DUET__GEMV8_WARPS * 32);
    cfg.dynamicSmemBytes = 0;
    cfg.stream = s;
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, duet__gemv_fp8_kernel<N>, y, x, w, sc, b, rows, cols);
}

extern "C" duet_status_t duet__cuda_gemv_fp8(cudaStream_t s, void *y, const void *x, int n,
                                             const void *w, const float *scale, int rows, int cols,
                                             const void *bias, bool pdl)
{
    int per_block = DUET__GEMV8_WARPS * 2;
    dim3 grid((unsigned)((rows + per_block - 1) / per_block));
    duet_bf16 *yy = (duet_bf16 *)y;
    const duet_bf16 *xx = (const duet_bf16 *)x, *bb = (const duet_bf16 *)bias;
    const uint8_t *ww = (const uint8_t *)w;
    cudaError_t e;
    switch (n) {
    case 1:
        e = duet__gemv_fp8_launch<1>(s, grid, pdl, yy, xx, ww, scale, bb, rows, cols);
        break;
    case 2:
        e = duet__gemv_fp8_launch<2>(s, grid, pdl, yy, xx, ww, scale, bb, rows, cols);
        break;
    case 3:
        e = duet__gemv_fp8_launch<3>(s, grid, pdl, yy, xx, ww, scale, bb, rows, cols);
        break;
    case 4:
        e = duet__gemv_fp8_launch<4>(s, grid, pdl, yy, xx, ww, scale, bb, rows, cols);
        break;
    default:
        return duet_error(DUET_ERR_INTERNAL, "cuda fp8 gemv: %d tokens", n);
    }
    return duet__cuda_check(e, "gemv_fp8", __FILE__, __LINE__);
}

#define DUET__QUANT_THREADS 256

/* one block per row t; cols % 8 == 0, x 16-byte aligned */
static __global__ void __launch_bounds__(DUET__QUANT_THREADS)
    duet__fp8_quant_rows_kernel(uint8_t *xq, float *sx, const duet_bf16 *x, int cols)
{
    __shared__ float scratch[32];
    const int t = blockIdx.x, nv = cols / 8;
    const uint4 *xr = reinterpret_cast<const uint4 *>(x + (size_t)t * cols);
    float m = 0.0f, f[8];

    for (int v = threadIdx.x; v < nv; v += blockDim.x) {
        duet__unpack8(xr[v], f);
#pragma unroll
        for (int i = 0; i < 8; i++)
            m = fmaxf(m, fabsf(f[i]));
    }
    m = duet__warp_max(m);
    if ((threadIdx.x & 31) == 0)
        scratch[threadIdx.x >> 5] = m;
    __syncthreads();
    m = (threadIdx.x & 31) < (blockDim.x >> 5) ? scratch[threadIdx.x & 31] : 0.0f;
    m = duet__warp_max(m);              /* every warp: the row's amax */
    const float s = m / DUET__E4M3_MAX; /* 0 for an all-zero row: every q is 0 */
    if (threadIdx.x == 0)
        sx[t] = s;
    uint2 *qr = reinterpret_cast<uint2 *>(xq + (size_t)t * cols);
    for (int v = threadIdx.x; v < nv; v += blockDim.x) {
        duet__unpack8(xr[v], f);
        uint32_t q[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float2 a = s > 0.0f ? make_float2(f[4 * h] / s, f[4 * h + 1] / s) : make_float2(0, 0);
            float2 b =
                s > 0.0f ? make_float2(f[4 * h + 2] / s, f[4 * h + 3] / s) : make_float2(0, 0);
            uint32_t lo = __nv_cvt_float2_to_fp8x2(a, __NV_SATFINITE, __NV_E4M3);
            uint32_t hi = __nv_cvt_float2_to_fp8x2(b, __NV_SATFINITE, __NV_E4M3);
            q[h] = (lo & 0xffffu) | (hi << 16);
        }
        qr[v] = make_uint2(q[0], q[1]);
    }
}

extern "C" duet_status_t duet__cuda_fp8_quant_rows(cudaStream_t s, void *xq, float *sx,
                                                   const void *x, int n, int cols)
{
    if (cols % 8 != 0 || !duet__aligned16(x))
        return duet_error(DUET_ERR_INTERNAL, "cuda fp8 quantize: %d columns", cols);
    duet__fp8_quant_rows_kernel<<<n, DUET__QUANT_THREADS, 0, s>>>((uint8_t *)xq, sx,
                                                                  (const duet_bf16 *)x, cols);
    return DUET__CUDA_LAUNCHED("fp8_quant_rows");
}

static __global__ void duet__fp8_rescale_kernel(duet_bf16 *y, const float *sw, const float *sx,
                                                const duet_bf16 *bias, int rows)
{
    const int t = blockIdx.y;
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows)
        return;
    duet_bf16 *p = y + (size_t)t * rows + r;
    float v = duet__bf2f(*p) * (sw[r] * sx[t]);
    if (bias != NULL)
        v += duet__bf2f(bias[r]);
    *p = duet__f2bf(v);
}

extern "C" duet_status_t duet__cuda_fp8_rescale(cudaStream_t s, void *y, const float *sw,
                                                const float *sx, const void *bias, int n, int rows)
{
    dim3 grid((unsigned)((rows + 255) / 256), (unsigned)n);
    duet__fp8_rescale_kernel<<<grid, 256, 0, s>>>((duet_bf16 *)y, sw, sx, (const duet_bf16 *)bias,
                                                  rows);
    return DUET__CUDA_LAUNCHED("fp8_rescale");
}
