/* Paged causal attention for many queries per sequence (prefill and
 * chunked prefill over cached pages), FlashAttention-2 style on the tensor
 * cores (mma.sync m16n8k16, bf16 in, float32 accumulate); the default
 * prefill kernel (DUET_CUDA_ATTN=fa).  docs/gpu.md "Prefill attention".
 *
 * One block of 4 warps per (query head, tile of 64 query rows of one
 * sequence); warp w owns rows 16w..16w+15 and keeps them in registers from
 * start to end: its Q fragments (loaded once with ldmatrix), its S = Q K^T
 * and P, its O and the row statistics m, l.  Over key tiles of 64:
 *   - the next tile's K and V rows are copied global -> shared with
 *     cp.async (16 bytes each, through the page table) while this one is
 *     used: two stages, so loads overlap the matrix products;
 *   - K fragments with ldmatrix, V fragments with ldmatrix.trans (no
 *     scalar shared loads);
 *   - the causal mask is applied only on the tiles that cross a row's
 *     position, and a warp skips the tiles after its last row's position;
 *   - softmax in base 2 (scale * log2 e folded into one multiply).
 * Blocks take the longest tiles first (the tile order reversed), and the
 * query heads of one tile are neighbours in the launch order, so the heads
 * that share a KV head (GQA) read its K/V tile while it is in L2.
 *
 * Every row sees key 0, so a row's running maximum is finite after the
 * first tile: no -inf guards are needed after it. */
#include <math.h>

#include "engine/cuda/cuda_device.cuh"
#include "engine/cuda/cuda_kernels.h"

#define DUET__FA_T       DUET__CUDA_ATTN_TILE /* query rows per block = keys per tile */
#define DUET__FA_THREADS 128

template <int HD> struct duet__fa {
    static constexpr int T = DUET__FA_T;
    static constexpr int LD = HD + 8; /* row stride (bf16): ldmatrix rows on distinct banks */
    static constexpr int RV = HD / 8; /* 16-byte chunks per row */
    static constexpr int CH = T * RV / DUET__FA_THREADS; /* chunks per thread per tile */
    static constexpr size_t smem = (size_t)5 * T * LD * 2; /* Q, then K and V of 2 stages */
};

template <int HD>
static __device__ __forceinline__ void duet__fa_load(duet_bf16 *Ks, duet_bf16 *Vs,
                                                     const duet_bf16 *kbase,
                                                     const duet_bf16 *vbase, const int32_t *pt,
                                                     int ps, int nkvh, int kh, int k0, int kmax,
                                                     int tid)
{
    typedef duet__fa<HD> L;
#pragma unroll
    for (int it = 0; it < L::CH; it++) {
        int i = tid + it * DUET__FA_THREADS, r = i / L::RV, c = (i % L::RV) * 8;
        int k = k0 + r;
        bool valid = k <= kmax;
        int kk = valid ? k : kmax;
        size_t off =
            (((size_t)pt[kk / ps] * (size_t)nkvh + (size_t)kh) * (size_t)ps + (size_t)(kk % ps)) *
                HD +
            (size_t)c;
        duet__cp16(Ks + r * L::LD + c, kbase + off, valid);
        duet__cp16(Vs + r * L::LD + c, vbase + off, valid);
    }
}

template <int HD>
static __global__ void __launch_bounds__(DUET__FA_THREADS, 2)
    duet__attn_prefill_fa(duet_bf16 *out, const duet_bf16 *qkv, duet__cuda_batch_t b,
                          duet__cuda_kv_t kv, int layer, int n_tiles, int nq, int nkv,
                          float scale_log2)
{
    typedef duet__fa<HD> L;
    constexpr int T = L::T, LD = L::LD, RV = L::RV;
    extern __shared__ __align__(128) unsigned char smem[];
    duet_bf16 *Qs = reinterpret_cast<duet_bf16 *>(smem);
    duet_bf16 *Ks0 = Qs + T * LD; /* stage s: K at Ks0 + 2s T LD, V right after */

    const int h = blockIdx.x, tile = n_tiles - 1 - (int)blockIdx.y;
    const int seq = b.tiles[2 * tile], t0 = b.tiles[2 * tile + 1];
    const int qs = b.q_start[seq], n_new = b.q_start[seq + 1] - qs;
    const int pos0 = b.ctx_len[seq] - n_new + t0; /* position of the tile's row 0 */
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
    const int kmax = pos0 + rows - 1; /* the last key any row of the tile sees */
    const int n_kt = kmax / T + 1;
    /* this warp's rows: positions pos0 + 16 warp + g (A) and + 8 (B); rows
     * past the tile's end compute on zero queries and are not stored */
    const int wfirst = pos0 + warp * 16;
    const int wlast = pos0 + min(warp * 16 + 15, rows - 1);
    const int posA = wfirst + g, posB = posA + 8;
    const bool wact = warp * 16 < rows;

    for (int i = tid; i < T * RV; i += DUET__FA_THREADS) {
        int r = i / RV, c = (i % RV) * 8;
        bool valid = r < rows;
        duet__cp16(Qs + r * LD + c, qkv + (size_t)(qs + t0 + (valid ? r : 0)) * qkv_ld +
                                        (size_t)h * HD + c,
                   valid);
    }
    duet__fa_load<HD>(Ks0, Ks0 + T * LD, kbase, vbase, pt, ps, nkvh, kh, 0, kmax, tid);
    duet__cp_commit();
    duet__cp_wait<0>();
    __syncthreads();

    uint32_t qf[HD / 16][4];
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++)
        duet__ldsm_x4(qf[kk], Qs + (warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD +
                                  kk * 16 + (lane >> 4) * 8);
    float o[HD / 8][4];
#pragma unroll
    for (int j = 0; j < HD / 8; j++)
        o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float mA = -INFINITY, mB = -INFINITY, lA = 0.0f, lB = 0.0f;

    for (int kt = 0; kt < n_kt; kt++) {
        const int k0 = kt * T;
        if (kt + 1 < n_kt) {
            duet_bf16 *Kn = Ks0 + ((kt + 1) & 1) * 2 * T * LD;
            duet__fa_load<HD>(Kn, Kn + T * LD, kbase, vbase, pt, ps, nkvh, kh, k0 + T, kmax, tid);
            duet__cp_commit();
            duet__cp_wait<1>();
        } else {
            duet__cp_wait<0>();
        }
        __syncthreads(); /* tile kt has landed for every thread */
        const duet_bf16 *Ks = Ks0 + (kt & 1) * 2 * T * LD, *Vs = Ks + T * LD;

        if (wact && k0 <= wlast) { /* warp-uniform: a row of this warp sees the tile */
            float s[T / 8][4];
#pragma unroll
            for (int j = 0; j < T / 8; j++)
                s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
#pragma unroll
                for (int jp = 0; jp < T / 16; jp++) {
                    uint32_t kf[4];
                    duet__ldsm_x4(kf, Ks + (jp * 16 + (lane & 7) + (lane >> 4) * 8) * LD +
                                          kk * 16 + ((lane >> 3) & 1) * 8);
                    duet__mma16816(s[2 * jp], qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3], kf[0],
                                   kf[1]);
                    duet__mma16816(s[2 * jp + 1], qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3],
                                   kf[2], kf[3]);
                }
            }
            const bool mask = k0 + T - 1 > wfirst;
            float mxA = mA, mxB = mB;
#pragma unroll
            for (int j = 0; j < T / 8; j++) {
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    int key = k0 + j * 8 + 2 * t4 + e;
                    float a = s[j][e] * scale_log2, c = s[j][2 + e] * scale_log2;
                    s[j][e] = mask && key > posA ? -INFINITY : a;
                    s[j][2 + e] = mask && key > posB ? -INFINITY : c;
                    mxA = fmaxf(mxA, s[j][e]);
                    mxB = fmaxf(mxB, s[j][2 + e]);
                }
            }
            mxA = fmaxf(mxA, __shfl_xor_sync(0xffffffffu, mxA, 1));
            mxA = fmaxf(mxA, __shfl_xor_sync(0xffffffffu, mxA, 2));
            mxB = fmaxf(mxB, __shfl_xor_sync(0xffffffffu, mxB, 1));
            mxB = fmaxf(mxB, __shfl_xor_sync(0xffffffffu, mxB, 2));
            const float alA = exp2f(mA - mxA), alB = exp2f(mB - mxB); /* 0 on the first tile */
            mA = mxA;
            mB = mxB;
            float sumA = 0.0f, sumB = 0.0f;
#pragma unroll
            for (int j = 0; j < T / 8; j++) {
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    s[j][e] = exp2f(s[j][e] - mA);
                    s[j][2 + e] = exp2f(s[j][2 + e] - mB);
                    sumA += s[j][e];
                    sumB += s[j][2 + e];
                }
            }
            lA = lA * alA + sumA; /* per-lane partial sums: reduced over the row at the end */
            lB = lB * alB + sumB;
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
#pragma unroll
                for (int jp = 0; jp < HD / 16; jp++) {
                    uint32_t vf[4];
                    duet__ldsm_x4_trans(vf, Vs + (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) *
                                                     LD +
                                                 jp * 16 + (lane >> 4) * 8);
                    duet__mma16816(o[2 * jp], a0, a1, a2, a3, vf[0], vf[1]);
                    duet__mma16816(o[2 * jp + 1], a0, a1, a2, a3, vf[2], vf[3]);
                }
            }
        }
        __syncthreads(); /* every warp is done with tile kt before its stage is refilled */
    }

    lA += __shfl_xor_sync(0xffffffffu, lA, 1);
    lA += __shfl_xor_sync(0xffffffffu, lA, 2);
    lB += __shfl_xor_sync(0xffffffffu, lB, 1);
    lB += __shfl_xor_sync(0xffffffffu, lB, 2);
    const int rA = warp * 16 + g, rB = rA + 8;
    duet_bf16 *row0 = out + (size_t)(qs + t0) * (size_t)nq * HD + (size_t)h * HD;
    duet__mma_rows_store<HD>(rA < rows ? row0 + (size_t)rA * nq * HD : NULL,
                             rB < rows ? row0 + (size_t)rB * nq * HD : NULL, o, lA, lB, t4);
}

extern "C" duet_status_t duet__cuda_attention_prefill_fa_init(void)
{
    duet_status_t st = duet__cuda_check(
        cudaFuncSetAttribute(duet__attn_prefill_fa<64>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)duet__fa<64>::smem),
        "attention prefill smem limit", __FILE__, __LINE__);
    if (st != DUET_OK)
        return st;
    return duet__cuda_check(cudaFuncSetAttribute(duet__attn_prefill_fa<128>,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 (int)duet__fa<128>::smem),
                            "attention prefill smem limit", __FILE__, __LINE__);
}

extern "C" duet_status_t duet__cuda_attention_prefill_fa(cudaStream_t s, void *out,
                                                         const void *qkv, duet__cuda_batch_t b,
                                                         duet__cuda_kv_t kv, int layer,
                                                         int n_tiles, int nq, int nkv,
                                                         int head_dim)
{
    dim3 grid((unsigned)nq, (unsigned)n_tiles);
    float scale_log2 = 1.4426950408889634f / sqrtf((float)head_dim);
    if (n_tiles <= 0)
        return DUET_OK;
    if (head_dim == 64)
        duet__attn_prefill_fa<64><<<grid, DUET__FA_THREADS, duet__fa<64>::smem, s>>>(
            (duet_bf16 *)out, (const duet_bf16 *)qkv, b, kv, layer, n_tiles, nq, nkv, scale_log2);
    else if (head_dim == 128)
        duet__attn_prefill_fa<128><<<grid, DUET__FA_THREADS, duet__fa<128>::smem, s>>>(
            (duet_bf16 *)out, (const duet_bf16 *)qkv, b, kv, layer, n_tiles, nq, nkv, scale_log2);
    else
        return duet_error(DUET_ERR_UNSUPPORTED, "cuda prefill attention: head_dim %d", head_dim);
    return DUET__CUDA_LAUNCHED("attention prefill");
}
