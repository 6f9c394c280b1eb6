/* Paged causal attention, one block per (token, KV head, split): the
 * decode kernel (one new token per sequence), also used for prefill when
 * the head_dim has no tensor-core kernel.
 *
 * For each of the G = nq/nkv query heads h of KV head g and the token's
 * keys k = 0..pos (split s takes a contiguous range of them):
 *   o_h = sum_k softmax_k(q_h . K_k / sqrt(d)) V_k
 * computed in chunks of CH keys with the running max m and sum l of the
 * online softmax.  With several splits each writes its unnormalised
 * (o, m, l) and duet__attn_combine merges them:
 *   M = max_s m_s,  o = sum_s e^(m_s - M) o_s / sum_s e^(m_s - M) l_s
 * The split count is fixed by the launch, not by the context length, so a
 * recorded launch stays valid as the context grows. */
#include <math.h>

#include "engine/cuda/cuda_device.cuh"
#include "engine/cuda/cuda_kernels.h"

#define DUET__DEC_CH       64 /* keys per chunk */
#define DUET__DEC_ACC      8  /* (head, dim) outputs per thread */
#define DUET__DEC_GREG     8  /* query heads scored per pass over a key row */
#define DUET__DEC_MAX_SMEM (96 * 1024)

static __host__ __device__ size_t duet__dec_smem(int G, int hd)
{
    size_t f = (size_t)G * (size_t)hd + (size_t)G * DUET__DEC_CH + 3u * (size_t)G;
    f = (f + 1) & ~(size_t)1; /* 8-byte alignment for the row offsets */
    return f * sizeof(float) + DUET__DEC_CH * sizeof(size_t);
}

static int duet__dec_threads(int G, int hd)
{
    int pairs = G * hd;
    int t = (pairs + DUET__DEC_ACC - 1) / DUET__DEC_ACC;
    t = (t + 31) / 32 * 32;
    return t < 128 ? 128 : t;
}

static __global__ void duet__attn_decode_kernel(duet_bf16 *out, const duet_bf16 *qkv,
                                                duet__cuda_batch_t b, duet__cuda_kv_t kv, int layer,
                                                int nq, int nkv, int hd, int splits, float *part,
                                                float scale)
{
    extern __shared__ __align__(16) float dsm[];
    const int t = blockIdx.x, kh = blockIdx.y, sp = blockIdx.z;
    const int G = nq / nkv;
    const int tid = threadIdx.x, nthr = blockDim.x;
    const int lane = tid & 31, warp = tid >> 5, nwarps = nthr >> 5;
    float *q_s = dsm;                   /* [G][hd], pre-scaled */
    float *sc_s = q_s + (size_t)G * hd; /* [G][CH] scores, then weights */
    float *m_s = sc_s + (size_t)G * DUET__DEC_CH;
    float *l_s = m_s + G;
    float *a_s = l_s + G; /* rescale factor of the chunk */
    size_t foff = ((size_t)G * hd + (size_t)G * DUET__DEC_CH + 3u * G + 1) & ~(size_t)1;
    size_t *row_s = reinterpret_cast<size_t *>(dsm + foff); /* [CH] K element offsets */

    const int seq = b.seq_of[t];
    const int nkeys = b.positions[t] + 1;
    const int32_t *pt = b.page_table + (size_t)seq * (size_t)b.hdr[2];
    const int ps = kv.page_size;
    const int nch = (nkeys + DUET__DEC_CH - 1) / DUET__DEC_CH;
    const int per = (nch + splits - 1) / splits;
    const int k_begin = sp * per * DUET__DEC_CH;
    const int k_end = min(nkeys, (sp + 1) * per * DUET__DEC_CH);
    const size_t plane = (size_t)kv.n_pages * (size_t)kv.n_kv_heads * (size_t)ps * (size_t)hd;
    const duet_bf16 *cache = (const duet_bf16 *)kv.base;
    const size_t lbase = plane * (size_t)(2 * layer);

    const duet_bf16 *qrow =
        qkv + (size_t)t * (size_t)(nq + 2 * nkv) * hd + (size_t)kh * (size_t)G * hd;
    for (int i = tid; i < G * hd; i += nthr)
        q_s[i] = duet__bf2f(qrow[i]) * scale;
    for (int g = tid; g < G; g += nthr) {
        m_s[g] = -INFINITY;
        l_s[g] = 0.0f;
    }
    float acc[DUET__DEC_ACC];
#pragma unroll
    for (int i = 0; i < DUET__DEC_ACC; i++)
        acc[i] = 0.0f;
    __syncthreads();

    for (int c0 = k_begin; c0 < k_end; c0 += DUET__DEC_CH) {
        const int cn = min(DUET__DEC_CH, k_end - c0);
        /* scores: thread per key */
        for (int j = tid; j < DUET__DEC_CH; j += nthr) {
            if (j < cn) {
                int k = c0 + j;
                size_t off = lbase + (((size_t)pt[k / ps] * (size_t)kv.n_kv_heads + (size_t)kh) *
                                          (size_t)ps +
                                      (size_t)(k % ps)) *
                                         (size_t)hd;
                row_s[j] = off;
                const __nv_bfloat162 *kr = reinterpret_cast<const __nv_bfloat162 *>(cache + off);
                for (int g0 = 0; g0 < G; g0 += DUET__DEC_GREG) {
                    float s[DUET__DEC_GREG];
#pragma unroll
                    for (int gi = 0; gi < DUET__DEC_GREG; gi++)
                        s[gi] = 0.0f;
                    for (int d2 = 0; d2 < hd / 2; d2++) {
                        float2 kf = __bfloat1622float2(kr[d2]);
#pragma unroll
                        for (int gi = 0; gi < DUET__DEC_GREG; gi++) {
                            if (g0 + gi < G) {
                                const float *q = q_s + (size_t)(g0 + gi) * hd + 2 * d2;
                                s[gi] += q[0] * kf.x + q[1] * kf.y;
                            }
                        }
                    }
#pragma unroll
                    for (int gi = 0; gi < DUET__DEC_GREG; gi++) {
                        if (g0 + gi < G)
                            sc_s[(g0 + gi) * DUET__DEC_CH + j] = s[gi];
                    }
                }
            } else {
                for (int g = 0; g < G; g++)
                    sc_s[g * DUET__DEC_CH + j] = -INFINITY;
            }
        }
        __syncthreads();
        /* online softmax: a warp per query head */
        for (int g = warp; g < G; g += nwarps) {
            float *sr = sc_s + g * DUET__DEC_CH;
            float mx = -INFINITY;
            for (int j = lane; j < DUET__DEC_CH; j += 32)
                mx = fmaxf(mx, sr[j]);
            mx = duet__warp_max(mx);
            float m_old = m_s[g], m_new = fmaxf(m_old, mx); /* finite: cn >= 1 */
            float alpha = __expf(m_old - m_new);            /* 0 when m_old = -inf */
            float sum = 0.0f;
            for (int j = lane; j < DUET__DEC_CH; j += 32) {
                float p = j < cn ? __expf(sr[j] - m_new) : 0.0f;
                sr[j] = p;
                sum += p;
            }
            sum = duet__warp_sum(sum);
            if (lane == 0) {
                m_s[g] = m_new;
                l_s[g] = l_s[g] * alpha + sum;
                a_s[g] = alpha;
            }
        }
        __syncthreads();
        /* o = o * alpha + P V: thread per (head, dim) pair */
#pragma unroll
        for (int i = 0; i < DUET__DEC_ACC; i++) {
            int p = tid + i * nthr;
            if (p < G * hd) {
                int g = p / hd, d = p % hd;
                const float *pr = sc_s + g * DUET__DEC_CH;
                const duet_bf16 *vb = cache + plane + d;
                float a = acc[i] * a_s[g];
                for (int j = 0; j < cn; j++)
                    a += pr[j] * duet__bf2f(vb[row_s[j]]);
                acc[i] = a;
            }
        }
        __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < DUET__DEC_ACC; i++) {
        int p = tid + i * nthr;
        if (p < G * hd) {
            int g = p / hd, d = p % hd;
            int h = kh * G + g;
            if (splits == 1) {
                out[((size_t)t * nq + h) * hd + d] = duet__f2bf(acc[i] / l_s[g]);
            } else {
                size_t pi = ((size_t)t * nq + h) * (size_t)splits + (size_t)sp;
                float *po = part + pi * (size_t)(hd + 2);
                po[2 + d] = acc[i];
                if (d == 0) {
                    po[0] = m_s[g];
                    po[1] = l_s[g];
                }
            }
        }
    }
}

/* One block of head_dim threads per (token, query head). */
static __global__ void duet__attn_combine(duet_bf16 *out, const float *part, int nq, int hd,
                                          int splits)
{
    const int t = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
    const float *p = part + ((size_t)t * nq + h) * (size_t)splits * (size_t)(hd + 2);
    float M = -INFINITY;
    for (int s = 0; s < splits; s++)
        M = fmaxf(M, p[(size_t)s * (hd + 2)]);
    float L = 0.0f, o = 0.0f;
    for (int s = 0; s < splits; s++) {
        const float *ps = p + (size_t)s * (hd + 2);
        if (ps[1] > 0.0f) {
            float w = __expf(ps[0] - M);
            L += w * ps[1];
            if (d < hd)
                o += w * ps[2 + d];
        }
    }
    if (d < hd)
        out[((size_t)t * nq + h) * hd + d] = duet__f2bf(o / L);
}

extern "C" size_t duet__cuda_attention_decode_scratch(int n, int nq, int head_dim, int splits)
{
    return splits > 1
               ? (size_t)n * (size_t)nq * (size_t)splits * (size_t)(head_dim + 2) * sizeof(float)
               : 0;
}

extern "C" int duet__cuda_attention_decode_supported(int nq, int nkv, int head_dim)
{
    int G = nkv > 0 ? nq / nkv : 0;
    return G >= 1 && head_dim >= 2 && head_dim % 2 == 0 && head_dim <= 1024 &&
           G * head_dim <= 1024 * DUET__DEC_ACC &&
           duet__dec_smem(G, head_dim) <= DUET__DEC_MAX_SMEM;
}

extern "C" duet_status_t duet__cuda_attention_decode_init(void)
{
    return duet__cuda_check(cudaFuncSetAttribute(duet__attn_decode_kernel,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 DUET__DEC_MAX_SMEM),
                            "attention decode smem limit", __FILE__, __LINE__);
}

extern "C" duet_status_t duet__cuda_attention_decode(cudaStream_t s, void *out, const void *qkv,
                                                     duet__cuda_batch_t b, duet__cuda_kv_t kv,
                                                     int layer, int n, int nq, int nkv,
                                                     int head_dim, int splits, float *part)
{
    int G = nq / nkv;
    duet_status_t st;
    if (n <= 0)
        return DUET_OK;
    if (!duet__cuda_attention_decode_supported(nq, nkv, head_dim) || splits < 1 ||
        splits > DUET__CUDA_ATTN_MAX_SPLITS)
        return duet_error(DUET_ERR_UNSUPPORTED,
                          "cuda attention: %d query heads over %d kv heads, head_dim %d, %d splits",
                          nq, nkv, head_dim, splits);
    dim3 grid((unsigned)n, (unsigned)nkv, (unsigned)splits);
    duet__attn_decode_kernel<<<grid, duet__dec_threads(G, head_dim), duet__dec_smem(G, head_dim),
                               s>>>((duet_bf16 *)out, (const duet_bf16 *)qkv, b, kv, layer, nq, nkv,
                                    head_dim, splits, part, 1.0f / sqrtf((float)head_dim));
    if ((st = DUET__CUDA_LAUNCHED("attention decode")) != DUET_OK || splits == 1)
        return st;
    int threads = (head_dim + 31) / 32 * 32;
    duet__attn_combine<<<dim3((unsigned)n, (unsigned)nq), threads, 0, s>>>((duet_bf16 *)out, part,
                                                                           nq, head_dim, splits);
    return DUET__CUDA_LAUNCHED("attention combine");
}
