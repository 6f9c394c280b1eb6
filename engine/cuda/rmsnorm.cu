/* RMSNorm: out[t][i] = in[t][i] / sqrt(mean_i(in[t][i]^2) + eps) * w[i],
 * one block per row, float32 sum of squares.  out may equal in: every
 * thread reads and writes only its own elements.
 *
 * With ADD (the residual add fused in front, duet__cuda_add_rmsnorm):
 * in[t][i] += res[t][i] first (float32 sum rounded to bf16, as the add
 * kernel does), and the norm reads the rounded sums: the same bits as the
 * add kernel followed by this one, one pass over the row fewer. */
#include "engine/cuda/cuda_device.cuh"
#include "engine/cuda/cuda_kernels.h"

template <bool ADD>
static __global__ void duet__rmsnorm_kernel(duet_bf16 *out, duet_bf16 *in, const duet_bf16 *res,
                                            const duet_bf16 *w, int d, float eps, bool vec)
{
    duet__pdl_trigger(); /* a GEMV may follow (cuda_device.cuh) */
    __shared__ float scratch[32];
    duet_bf16 *x = in + (size_t)blockIdx.x * (size_t)d;
    duet_bf16 *y = out + (size_t)blockIdx.x * (size_t)d;
    float ss = 0.0f;

    if (vec) {
        for (int i = threadIdx.x * 8; i < d; i += blockDim.x * 8) {
            float v[8];
            duet__load8(x + i, v);
            if (ADD) {
                float r[8];
                duet__load8(res + (size_t)blockIdx.x * (size_t)d + i, r);
#pragma unroll
                for (int k = 0; k < 8; k++)
                    v[k] += r[k];
                duet__store8(x + i, v);
                duet__load8(x + i, v); /* the rounded sums, as the norm reads them */
            }
#pragma unroll
            for (int k = 0; k < 8; k++)
                ss += v[k] * v[k];
        }
    } else {
        for (int i = threadIdx.x; i < d; i += blockDim.x) {
            if (ADD)
                x[i] = duet__f2bf(duet__bf2f(x[i]) +
                                  duet__bf2f(res[(size_t)blockIdx.x * (size_t)d + i]));
            float v = duet__bf2f(x[i]);
            ss += v * v;
        }
    }
    ss = duet__block_sum(ss, scratch);
    float scale = 1.0f / sqrtf(ss / (float)d + eps);
    if (vec) {
        for (int i = threadIdx.x * 8; i < d; i += blockDim.x * 8) {
            float v[8], g[8];
            duet__load8(x + i, v);
            duet__load8(w + i, g);
#pragma unroll
            for (int k = 0; k < 8; k++)
                v[k] = v[k] * scale * g[k];
            duet__store8(y + i, v);
        }
    } else {
        for (int i = threadIdx.x; i < d; i += blockDim.x)
            y[i] = duet__f2bf(duet__bf2f(x[i]) * scale * duet__bf2f(w[i]));
    }
}

static int duet__rmsnorm_threads(int d, bool vec)
{
    int per = vec ? 8 : 1;
    int threads = (d / per + 31) / 32 * 32;
    return threads < 32 ? 32 : (threads > 1024 ? 1024 : threads);
}

extern "C" duet_status_t duet__cuda_rmsnorm(cudaStream_t s, void *out, const void *in,
                                            const void *w, int n, int d, float eps)
{
    bool vec = d % 8 == 0 && duet__aligned16(out) && duet__aligned16(in) && duet__aligned16(w);
    if (n <= 0)
        return DUET_OK;
    /* in is only read without ADD */
    duet__rmsnorm_kernel<false><<<n, duet__rmsnorm_threads(d, vec), 0, s>>>(
        (duet_bf16 *)out, (duet_bf16 *)in, NULL, (const duet_bf16 *)w, d, eps, vec);
    return DUET__CUDA_LAUNCHED("rmsnorm");
}

extern "C" duet_status_t duet__cuda_add_rmsnorm(cudaStream_t s, void *out, void *x,
                                                const void *res, const void *w, int n, int d,
                                                float eps)
{
    bool vec = d % 8 == 0 && duet__aligned16(out) && duet__aligned16(x) &&
               duet__aligned16(res) && duet__aligned16(w);
    if (n <= 0)
        return DUET_OK;
    duet__rmsnorm_kernel<true><<<n, duet__rmsnorm_threads(d, vec), 0, s>>>(
        (duet_bf16 *)out, (duet_bf16 *)x, (const duet_bf16 *)res, (const duet_bf16 *)w, d, eps,
        vec);
    return DUET__CUDA_LAUNCHED("add_rmsnorm");
}
