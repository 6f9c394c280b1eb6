/* Paged causal attention for many queries per sequence (prefill), on the
 * tensor cores (wmma, bf16 in, float32 accumulate).
 *
 * One block of 4 warps per (tile of 64 query rows of one sequence, query
 * head h); warp w owns rows 16w..16w+15, two lanes per row in the softmax.
 * The next K/V tile is loaded into registers while the current one is
 * used; shared-memory rows are padded against bank conflicts.  Over key tiles of 64 (read
 * through the page table, KV head h / (nq/nkv)):
 *   S = Q K^T                       (wmma, float)
 *   m' = max(m, rowmax(S * scale)), P = e^(S * scale - m'), masked where
 *   key > query position; l = l e^(m - m') + rowsum(P); O = O e^(m - m') + P V
 * and finally out = O / l.  O lives in shared memory as float32, so rows
 * are rescaled by plain threads between the matrix products.  Query row r
 * of the tile is new token t0 + r of its sequence, at position
 * ctx_len - n_new + t0 + r. */
#include <math.h>
#include <mma.h>

#include "engine/cuda/cuda_device.cuh"
#include "engine/cuda/cuda_kernels.h"

using namespace nvcuda;

#define DUET__PF_TILE    DUET__CUDA_ATTN_TILE
#define DUET__PF_THREADS 128

/* Shared-memory row strides, padded by 16 bytes so that the rows of a
 * 16x16 fragment (and the threads of the softmax) fall on different banks;
 * every fragment pointer stays 32-byte aligned. */
template <int HD> struct duet__pf {
    static constexpr int T = DUET__PF_TILE;
    static constexpr int QLD = HD + 8;                         /* Q, K, V: bf16 */
    static constexpr int SLD = T + 4;                          /* S: float */
    static constexpr int PLD = T + 8;                          /* P: bf16 */
    static constexpr int OLD = HD + 4;                         /* O: float */
    static constexpr int NV = T * (HD / 8) / DUET__PF_THREADS; /* K/V vectors per thread */
    static constexpr size_t smem = (size_t)3 * T * QLD * 2 + (size_t)T * SLD * 4 +
                                   (size_t)T * PLD * 2 + (size_t)T * OLD * 4 + (size_t)2 * T * 4;
};

template <int HD>
static __global__ void __launch_bounds__(DUET__PF_THREADS)
    duet__attn_prefill_kernel(duet_bf16 *out, const duet_bf16 *qkv, duet__cuda_batch_t b,
                              duet__cuda_kv_t kv, int layer, int nq, int nkv, float scale)
{
    typedef duet__pf<HD> L;
    constexpr int T = L::T, QLD = L::QLD, SLD = L::SLD, PLD = L::PLD, OLD = L::OLD;
    constexpr int RV = HD / 8; /* 16-byte vectors per row */
    extern __shared__ __align__(128) unsigned char smem[];
    duet_bf16 *Qs = reinterpret_cast<duet_bf16 *>(smem);
    duet_bf16 *Ks = Qs + T * QLD;
    duet_bf16 *Vs = Ks + T * QLD;
    float *Ss = reinterpret_cast<float *>(Vs + T * QLD);
    duet_bf16 *Ps = reinterpret_cast<duet_bf16 *>(Ss + T * SLD);
    float *Os = reinterpret_cast<float *>(Ps + T * PLD);
    float *Ms = Os + T * OLD;
    float *Ls = Ms + T;

    const int tile = blockIdx.x, h = blockIdx.y;
    const int seq = b.tiles[2 * tile], t0 = b.tiles[2 * tile + 1];
    const int qs = b.q_start[seq], n_new = b.q_start[seq + 1] - qs;
    const int pos0 = b.ctx_len[seq] - n_new;
    const int rows = min(T, n_new - t0);
    const int kh = h / (nq / nkv);
    const int ps = kv.page_size, nkvh = kv.n_kv_heads;
    const size_t qkv_ld = (size_t)(nq + 2 * nkv) * HD;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int32_t *pt = b.page_table + (size_t)seq * (size_t)b.hdr[2];
    const size_t plane = (size_t)kv.n_pages * (size_t)nkvh * (size_t)ps * HD;
    const duet_bf16 *kbase = (const duet_bf16 *)kv.base + plane * (size_t)(2 * layer);
    const duet_bf16 *vbase = kbase + plane;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    const int kmax = pos0 + t0 + rows - 1; /* last key any row of the tile sees */
    uint4 kreg[L::NV], vreg[L::NV];        /* the next K/V tile, in flight */

    for (int i = tid; i < T * RV; i += DUET__PF_THREADS) {
        int r = i / RV, c = (i % RV) * 8;
        uint4 v = zero;
        if (r < rows)
            v = *reinterpret_cast<const uint4 *>(qkv + (size_t)(qs + t0 + r) * qkv_ld +
                                                 (size_t)h * HD + c);
        *reinterpret_cast<uint4 *>(Qs + r * QLD + c) = v;
    }
    for (int i = tid; i < T * OLD; i += DUET__PF_THREADS)
        Os[i] = 0.0f;
    if (tid < T) {
        Ms[tid] = -INFINITY;
        Ls[tid] = 0.0f;
    }

#define DUET__PF_LOAD(k0_)                                                                         \
    _Pragma("unroll") for (int it = 0; it < L::NV; it++)                                           \
    {                                                                                              \
        int i = tid + it * DUET__PF_THREADS, r = i / RV, c = (i % RV) * 8, k = (k0_) + r;          \
        kreg[it] = vreg[it] = zero;                                                                \
        if (k <= kmax) {                                                                           \
            size_t off = (((size_t)pt[k / ps] * (size_t)nkvh + (size_t)kh) * (size_t)ps +          \
                          (size_t)(k % ps)) *                                                      \
                             HD +                                                                  \
                         (size_t)c;                                                                \
            kreg[it] = *reinterpret_cast<const uint4 *>(kbase + off);                              \
            vreg[it] = *reinterpret_cast<const uint4 *>(vbase + off);                              \
        }                                                                                          \
    }
    DUET__PF_LOAD(0)

    for (int k0 = 0; k0 <= kmax; k0 += T) {
        __syncthreads(); /* the previous tile's K/V are no longer read */
#pragma unroll
        for (int it = 0; it < L::NV; it++) {
            int i = tid + it * DUET__PF_THREADS, r = i / RV, c = (i % RV) * 8;
            *reinterpret_cast<uint4 *>(Ks + r * QLD + c) = kreg[it];
            *reinterpret_cast<uint4 *>(Vs + r * QLD + c) = vreg[it];
        }
        __syncthreads();
        if (k0 + T <= kmax) { /* the next tile's loads overlap this tile's math */
            DUET__PF_LOAD(k0 + T)
        }

        /* S rows of this warp = Q K^T */
        {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> sacc[T / 16];
#pragma unroll
            for (int j = 0; j < T / 16; j++)
                wmma::fill_fragment(sacc[j], 0.0f);
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
                wmma::load_matrix_sync(a, Qs + warp * 16 * QLD + kk * 16, QLD);
#pragma unroll
                for (int j = 0; j < T / 16; j++) {
                    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> kb;
                    wmma::load_matrix_sync(kb, Ks + j * 16 * QLD + kk * 16, QLD);
                    wmma::mma_sync(sacc[j], a, kb, sacc[j]);
                }
            }
#pragma unroll
            for (int j = 0; j < T / 16; j++)
                wmma::store_matrix_sync(Ss + warp * 16 * SLD + j * 16, sacc[j], SLD,
                                        wmma::mem_row_major);
        }
        __syncwarp();

        /* online softmax: two lanes per row, interleaved columns c = 2i + half */
        {
            const int r = warp * 16 + (lane >> 1), half = lane & 1;
            const int lim = r < rows ? pos0 + t0 + r - k0 : -1; /* keys c <= lim visible */
            float *srow = Ss + r * SLD;
            duet_bf16 *prow = Ps + r * PLD;
            float v[T / 2], mx = -INFINITY;
#pragma unroll
            for (int i = 0; i < T / 2; i++) {
                int c = 2 * i + half;
                v[i] = c <= lim ? srow[c] * scale : -INFINITY;
                mx = fmaxf(mx, v[i]);
            }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            float m_old = Ms[r], m_new = fmaxf(m_old, mx);
            float alpha = 1.0f, sum = 0.0f;
            if (m_new != -INFINITY) {
                alpha = __expf(m_old - m_new);
#pragma unroll
                for (int i = 0; i < T / 2; i++) {
                    float p = __expf(v[i] - m_new);
                    sum += p;
                    prow[2 * i + half] = duet__f2bf(p);
                }
            } else {
#pragma unroll
                for (int i = 0; i < T / 2; i++)
                    prow[2 * i + half] = duet__f2bf(0.0f);
            }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            float *orow = Os + r * OLD;
            for (int d = half; d < HD; d += 2)
                orow[d] *= alpha;
            __syncwarp();
            if (half == 0) {
                Ms[r] = m_new;
                Ls[r] = Ls[r] * alpha + sum;
            }
        }
        __syncwarp();

        /* O rows of this warp += P V */
#pragma unroll
        for (int j = 0; j < HD / 16; j++) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> o;
            wmma::load_matrix_sync(o, Os + warp * 16 * OLD + j * 16, OLD, wmma::mem_row_major);
#pragma unroll
            for (int kk = 0; kk < T / 16; kk++) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> vb;
                wmma::load_matrix_sync(a, Ps + warp * 16 * PLD + kk * 16, PLD);
                wmma::load_matrix_sync(vb, Vs + kk * 16 * QLD + j * 16, QLD);
                wmma::mma_sync(o, a, vb, o);
            }
            wmma::store_matrix_sync(Os + warp * 16 * OLD + j * 16, o, OLD, wmma::mem_row_major);
        }
        __syncwarp();
    }
#undef DUET__PF_LOAD

    for (int rr = 0; rr < 16; rr++) {
        const int r = warp * 16 + rr;
        if (r >= rows)
            break;
        float inv = 1.0f / Ls[r];
        duet_bf16 *o = out + (size_t)(qs + t0 + r) * (size_t)nq * HD + (size_t)h * HD;
        for (int d = lane; d < HD; d += 32)
            o[d] = duet__f2bf(Os[r * OLD + d] * inv);
    }
}

/* The same attention with the accumulators in registers (mma.sync
 * m16n8k16, bf16 in, float32 accumulate): each warp keeps its 16 rows of
 * S, P and O in the documented fragment layout, lane (g = lane/4,
 * t = lane%4) holding rows g and g+8, columns 2t, 2t+1 of every 8-wide
 * block.  Row statistics need only the 4 lanes of a row (2 shuffles); P
 * feeds the P.V product straight from the S registers; shared memory holds
 * only Q, K and V, so more blocks fit per SM. */
static __device__ __forceinline__ uint32_t duet__ld32(const duet_bf16 *p)
{
    return *reinterpret_cast<const uint32_t *>(p);
}


static __device__ __forceinline__ uint32_t duet__pack2h(duet_bf16 lo, duet_bf16 hi)
{
    return (uint32_t)__bfloat16_as_ushort(lo) | ((uint32_t)__bfloat16_as_ushort(hi) << 16);
}

template <int HD> struct duet__pfm {
    static constexpr int T = DUET__PF_TILE;
    static constexpr int LD = HD + 8;
    static constexpr int NV = T * (HD / 8) / DUET__PF_THREADS;
    static constexpr size_t smem = (size_t)3 * T * LD * 2;
};

template <int HD>
static __global__ void __launch_bounds__(DUET__PF_THREADS)
    duet__attn_prefill_mma(duet_bf16 *out, const duet_bf16 *qkv, duet__cuda_batch_t b,
                           duet__cuda_kv_t kv, int layer, int nq, int nkv, float scale)
{
    typedef duet__pfm<HD> L;
    constexpr int T = L::T, LD = L::LD, RV = HD / 8;
    extern __shared__ __align__(128) unsigned char smem[];
    duet_bf16 *Qs = reinterpret_cast<duet_bf16 *>(smem);
    duet_bf16 *Ks = Qs + T * LD;
    duet_bf16 *Vs = Ks + T * LD;

    const int tile = blockIdx.x, h = blockIdx.y;
    const int seq = b.tiles[2 * tile], t0 = b.tiles[2 * tile + 1];
    const int qs = b.q_start[seq], n_new = b.q_start[seq + 1] - qs;
    const int pos0 = b.ctx_len[seq] - n_new;
    const int rows = min(T, n_new - t0);
    const int kh = h / (nq / nkv);
    const int ps = kv.page_size, nkvh = kv.n_kv_heads;
    const size_t qkv_ld = (size_t)(nq + 2 * nkv) * HD;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t4 = lane & 3;
    const int32_t *pt = b.page_table + (size_t)seq * (size_t)b.hdr[2];
    const size_t plane = (size_t)kv.n_pages * (size_t)nkvh * (size_t)ps * HD;
    const duet_bf16 *kbase = (const duet_bf16 *)kv.base + plane * (size_t)(2 * layer);
    const duet_bf16 *vbase = kbase + plane;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    const int kmax = pos0 + t0 + rows - 1;
    const int rA = warp * 16 + g, rB = rA + 8;         /* this lane's two rows */
    const int lastA = rA < rows ? pos0 + t0 + rA : -1; /* last visible key of each row */
    const int lastB = rB < rows ? pos0 + t0 + rB : -1;

    for (int i = tid; i < T * RV; i += DUET__PF_THREADS) {
        int r = i / RV, c = (i % RV) * 8;
        uint4 v = zero;
        if (r < rows)
            v = *reinterpret_cast<const uint4 *>(qkv + (size_t)(qs + t0 + r) * qkv_ld +
                                                 (size_t)h * HD + c);
        *reinterpret_cast<uint4 *>(Qs + r * LD + c) = v;
    }
    float o[HD / 8][4];
#pragma unroll
    for (int j = 0; j < HD / 8; j++)
        o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float mA = -INFINITY, mB = -INFINITY, lA = 0.0f, lB = 0.0f;

    for (int k0 = 0; k0 <= kmax; k0 += T) {
        __syncthreads(); /* every warp is done with the previous K/V (and Q is stored) */
        {
            uint4 kr[L::NV], vr[L::NV];
#pragma unroll
            for (int it = 0; it < L::NV; it++) {
                int i = tid + it * DUET__PF_THREADS, r = i / RV, c = (i % RV) * 8, k = k0 + r;
                kr[it] = vr[it] = zero;
                if (k <= kmax) {
                    size_t off = (((size_t)pt[k / ps] * (size_t)nkvh + (size_t)kh) * (size_t)ps +
                                  (size_t)(k % ps)) *
                                     HD +
                                 (size_t)c;
                    kr[it] = *reinterpret_cast<const uint4 *>(kbase + off);
                    vr[it] = *reinterpret_cast<const uint4 *>(vbase + off);
                }
            }
#pragma unroll
            for (int it = 0; it < L::NV; it++) {
                int i = tid + it * DUET__PF_THREADS, r = i / RV, c = (i % RV) * 8;
                *reinterpret_cast<uint4 *>(Ks + r * LD + c) = kr[it];
                *reinterpret_cast<uint4 *>(Vs + r * LD + c) = vr[it];
            }
        }
        __syncthreads();

        float s[T / 8][4];
#pragma unroll
        for (int j = 0; j < T / 8; j++)
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            const duet_bf16 *qa = Qs + rA * LD + kk * 16 + 2 * t4;
            const duet_bf16 *qb = Qs + rB * LD + kk * 16 + 2 * t4;
            uint32_t a0 = duet__ld32(qa), a1 = duet__ld32(qb), a2 = duet__ld32(qa + 8),
                     a3 = duet__ld32(qb + 8);
#pragma unroll
            for (int j = 0; j < T / 8; j++) {
                const duet_bf16 *kp = Ks + (j * 8 + g) * LD + kk * 16 + 2 * t4;
                duet__mma16816(s[j], a0, a1, a2, a3, duet__ld32(kp), duet__ld32(kp + 8));
            }
        }

        float mxA = -INFINITY, mxB = -INFINITY;
#pragma unroll
        for (int j = 0; j < T / 8; j++) {
#pragma unroll
            for (int e = 0; e < 2; e++) {
                int key = k0 + j * 8 + 2 * t4 + e;
                s[j][e] = key <= lastA ? s[j][e] * scale : -INFINITY;
                s[j][2 + e] = key <= lastB ? s[j][2 + e] * scale : -INFINITY;
                mxA = fmaxf(mxA, s[j][e]);
                mxB = fmaxf(mxB, s[j][2 + e]);
            }
        }
        mxA = fmaxf(mxA, __shfl_xor_sync(0xffffffffu, mxA, 1));
        mxA = fmaxf(mxA, __shfl_xor_sync(0xffffffffu, mxA, 2));
        mxB = fmaxf(mxB, __shfl_xor_sync(0xffffffffu, mxB, 1));
        mxB = fmaxf(mxB, __shfl_xor_sync(0xffffffffu, mxB, 2));
        float nA = fmaxf(mA, mxA), nB = fmaxf(mB, mxB);
        float alA = nA == -INFINITY ? 1.0f : __expf(mA - nA);
        float alB = nB == -INFINITY ? 1.0f : __expf(mB - nB);
        float sumA = 0.0f, sumB = 0.0f;
#pragma unroll
        for (int j = 0; j < T / 8; j++) {
#pragma unroll
            for (int e = 0; e < 2; e++) {
                s[j][e] = nA == -INFINITY ? 0.0f : __expf(s[j][e] - nA);
                s[j][2 + e] = nB == -INFINITY ? 0.0f : __expf(s[j][2 + e] - nB);
                sumA += s[j][e];
                sumB += s[j][2 + e];
            }
        }
        sumA += __shfl_xor_sync(0xffffffffu, sumA, 1);
        sumA += __shfl_xor_sync(0xffffffffu, sumA, 2);
        sumB += __shfl_xor_sync(0xffffffffu, sumB, 1);
        sumB += __shfl_xor_sync(0xffffffffu, sumB, 2);
        lA = lA * alA + sumA;
        lB = lB * alB + sumB;
        mA = nA;
        mB = nB;
#pragma unroll
        for (int j = 0; j < HD / 8; j++) {
            o[j][0] *= alA;
            o[j][1] *= alA;
            o[j][2] *= alB;
            o[j][3] *= alB;
        }
#pragma unroll
        for (int kk = 0; kk < T / 16; kk++) {
            uint32_t a0 = duet__pack2f(s[2 * kk][0], s[2 * kk][1]);
            uint32_t a1 = duet__pack2f(s[2 * kk][2], s[2 * kk][3]);
            uint32_t a2 = duet__pack2f(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            uint32_t a3 = duet__pack2f(s[2 * kk + 1][2], s[2 * kk + 1][3]);
            const duet_bf16 *vp = Vs + (kk * 16 + 2 * t4) * LD + g;
#pragma unroll
            for (int j = 0; j < HD / 8; j++) {
                const duet_bf16 *v = vp + j * 8;
                duet__mma16816(o[j], a0, a1, a2, a3, duet__pack2h(v[0], v[LD]),
                               duet__pack2h(v[8 * LD], v[9 * LD]));
            }
        }
    }

    duet_bf16 *row0 = out + (size_t)(qs + t0) * (size_t)nq * HD + (size_t)h * HD;
    duet__mma_rows_store<HD>(rA < rows ? row0 + (size_t)rA * nq * HD : NULL,
                             rB < rows ? row0 + (size_t)rB * nq * HD : NULL, o, lA, lB, t4);
}

extern "C" int duet__cuda_attention_prefill_supported(int head_dim)
{
    return head_dim == 64 || head_dim == 128;
}

extern "C" duet_status_t duet__cuda_attention_prefill_init(void)
{
    duet_status_t st = duet__cuda_check(
        cudaFuncSetAttribute(duet__attn_prefill_mma<64>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)duet__pfm<64>::smem),
        "attention prefill smem limit", __FILE__, __LINE__);
    if (st == DUET_OK)
        st = duet__cuda_check(cudaFuncSetAttribute(duet__attn_prefill_mma<128>,
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   (int)duet__pfm<128>::smem),
                              "attention prefill smem limit", __FILE__, __LINE__);
    if (st == DUET_OK)
        st = duet__cuda_attention_prefill_fa_init();
    if (st != DUET_OK)
        return st;
    st = duet__cuda_check(cudaFuncSetAttribute(duet__attn_prefill_kernel<64>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)duet__pf<64>::smem),
                          "attention prefill smem limit", __FILE__, __LINE__);
    if (st != DUET_OK)
        return st;
    return duet__cuda_check(cudaFuncSetAttribute(duet__attn_prefill_kernel<128>,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 (int)duet__pf<128>::smem),
                            "attention prefill smem limit", __FILE__, __LINE__);
}

extern "C" duet_status_t duet__cuda_attention_prefill(cudaStream_t s, void *out, const void *qkv,
                                                      duet__cuda_batch_t b, duet__cuda_kv_t kv,
                                                      int layer, int n_tiles, int nq, int nkv,
                                                      int head_dim, int variant)
{
    dim3 grid((unsigned)n_tiles, (unsigned)nq);
    float scale = 1.0f / sqrtf((float)head_dim);
    if (n_tiles <= 0)
        return DUET_OK;
    if (variant == DUET__CUDA_ATTN_FA)
        return duet__cuda_attention_prefill_fa(s, out, qkv, b, kv, layer, n_tiles, nq, nkv,
                                               head_dim);
    if (variant == DUET__CUDA_ATTN_MMA && head_dim == 64)
        duet__attn_prefill_mma<64><<<grid, DUET__PF_THREADS, duet__pfm<64>::smem, s>>>(
            (duet_bf16 *)out, (const duet_bf16 *)qkv, b, kv, layer, nq, nkv, scale);
    else if (variant == DUET__CUDA_ATTN_MMA && head_dim == 128)
        duet__attn_prefill_mma<128><<<grid, DUET__PF_THREADS, duet__pfm<128>::smem, s>>>(
            (duet_bf16 *)out, (const duet_bf16 *)qkv, b, kv, layer, nq, nkv, scale);
    else if (head_dim == 64)
        duet__attn_prefill_kernel<64><<<grid, DUET__PF_THREADS, duet__pf<64>::smem, s>>>(
            (duet_bf16 *)out, (const duet_bf16 *)qkv, b, kv, layer, nq, nkv, scale);
    else if (head_dim == 128)
        duet__attn_prefill_kernel<128><<<grid, DUET__PF_THREADS, duet__pf<128>::smem, s>>>(
            (duet_bf16 *)out, (const duet_bf16 *)qkv, b, kv, layer, nq, nkv, scale);
    else
        return duet_error(DUET_ERR_UNSUPPORTED, "cuda prefill attention: head_dim %d", head_dim);
    return DUET__CUDA_LAUNCHED("attention prefill");
}
