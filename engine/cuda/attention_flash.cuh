/* What the two flash-decoding kernels share (attention_flash_decode.cu on
 * CUDA cores, attention_flash_decode_mma.cu on tensor cores): the split
 * rule, the paged row address, and the end of a block -- merging its
 * warps' online-softmax states, then writing the output or, when the
 * token's context is split, this split's state and, in the last split to
 * finish, the merge of all of them.
 *
 * States are in base 2: m = running max of the scaled scores, l = sum of
 * 2^(s - m), o = sum of 2^(s - m) v; two merge as
 *   M = max(m1, m2),  l = 2^(m1-M) l1 + 2^(m2-M) l2,  o likewise. */
#ifndef DUET_ENGINE_CUDA_ATTENTION_FLASH_CUH
#define DUET_ENGINE_CUDA_ATTENTION_FLASH_CUH

#include "engine/cuda/cuda_device.cuh"
#include "engine/cuda/cuda_kernels.h"

#define DUET__FD_WARPS      4
#define DUET__FD_SPLIT_KEYS 128 /* fewest keys a split is given */
#define DUET__FD_LOG2E      1.4426950408889634f

/* The keys [*kb, *ke) of split sp of a token with `keys` keys when the
 * launch allows `splits`; returns the splits the token uses (a block with
 * sp at or past it has nothing to do).  Splits start at multiples of 16, so
 * the 16 keys a warp takes at a time sit in one page of 16 or more. */
static __device__ __forceinline__ int duet__fd_split(int keys, int splits, int sp, int *kb,
                                                     int *ke)
{
    int ns = (keys + DUET__FD_SPLIT_KEYS - 1) / DUET__FD_SPLIT_KEYS;
    ns = ns < splits ? ns : splits;
    int per = ((keys + ns - 1) / ns + 15) & ~15;
    ns = (keys + per - 1) / per;
    *kb = sp * per;
    *ke = min(keys, *kb + per);
    return ns;
}

/* Element offset of key k's row of KV head kh inside one K or V plane
 * (ps_shift = log2(ps) for a power-of-two page size, else -1). */
static __device__ __forceinline__ size_t duet__fd_row(const int32_t *pt, int k, int ps,
                                                      int ps_shift, int nkv, int kh, int hd)
{
    int pg, in;
    if (ps_shift >= 0) {
        pg = k >> ps_shift;
        in = k & (ps - 1);
    } else {
        pg = k / ps;
        in = k - pg * ps;
    }
    return (((size_t)pt[pg] * (size_t)nkv + (size_t)kh) * (size_t)ps + (size_t)in) * (size_t)hd;
}

/* What a block works on: token t, query heads h0..h0+gn-1 (head group hg
 * of KV head kh, GR heads a group), keys [k_begin, k_end) = split sp of
 * the ns the token uses; its page-table row and the layer's K plane (V is
 * `plane` elements further). */
typedef struct {
    int t, kh, hg, sp, h0, gn, ns, k_begin, k_end;
    const int32_t *pt;
    const duet_bf16 *kc;
    size_t plane;
} duet__fd_blk_t;

/* The block's work; false when its split has none. */
static __device__ __forceinline__ bool duet__fd_block(duet__fd_blk_t *k, duet__cuda_batch_t b,
                                                      duet__cuda_kv_t kv, int layer, int nq,
                                                      int nkv, int hgroups, int splits, int gr,
                                                      int hd)
{
    const int G = nq / nkv;
    k->t = blockIdx.x;
    k->kh = blockIdx.y / hgroups;
    k->hg = blockIdx.y % hgroups;
    k->sp = blockIdx.z;
    k->h0 = k->kh * G + k->hg * gr;
    k->gn = min(gr, G - k->hg * gr);
    k->ns = duet__fd_split(b.positions[k->t] + 1, splits, k->sp, &k->k_begin, &k->k_end);
    if (k->sp >= k->ns)
        return false;
    k->pt = b.page_table + (size_t)b.seq_of[k->t] * (size_t)b.hdr[2];
    k->plane = (size_t)kv.n_pages * (size_t)nkv * (size_t)kv.page_size * (size_t)hd;
    k->kc = (const duet_bf16 *)kv.base + k->plane * (size_t)(2 * layer);
    return true;
}

/* Every warp's state for the block's GR heads. */
template <int HD, int GR> struct duet__fd_smem {
    float o[DUET__FD_WARPS][GR][HD];
    float m[DUET__FD_WARPS][GR], l[DUET__FD_WARPS][GR];
    float w[GR][DUET__CUDA_FD_MAX_SPLITS]; /* the merge: each split's weight */
    int last;
};

/* The block's end, after every warp wrote its state into sm and a
 * __syncthreads(): token t, query heads h0..h0+gn-1 (head group hg of KV
 * head kh), split sp of the ns it uses (launch: `splits`). */
template <int HD, int GR>
static __device__ void duet__fd_finish(duet__fd_smem<HD, GR> &sm, duet_bf16 *out, float *part,
                                       unsigned *counts, int t, int nq, int nkv, int kh,
                                       int hgroups, int hg, int h0, int gn, int sp, int ns,
                                       int splits)
{
    const bool split = ns > 1;
    for (int p = threadIdx.x; p < gn * HD; p += DUET__FD_WARPS * 32) {
        int g = p / HD, d = p % HD;
        float M = sm.m[0][g];
#pragma unroll
        for (int w = 1; w < DUET__FD_WARPS; w++)
            M = fmaxf(M, sm.m[w][g]);
        float lsum = 0.0f, o = 0.0f;
#pragma unroll
        for (int w = 0; w < DUET__FD_WARPS; w++) {
            float e = exp2f(sm.m[w][g] - M); /* 0 for a warp without keys */
            lsum += e * sm.l[w][g];
            o += e * sm.o[w][g][d];
        }
        size_t h = (size_t)t * nq + (size_t)(h0 + g);
        if (!split) {
            out[h * HD + d] = duet__f2bf(o / lsum);
        } else {
            float *po = part + (h * (size_t)splits + (size_t)sp) * (size_t)(HD + 2);
            po[2 + d] = o;
            if (d == 0) {
                po[0] = M;
                po[1] = lsum;
            }
        }
    }
    if (!split)
        return;

    /* the last split of this token to finish merges the splits */
    unsigned *cnt = counts + ((size_t)t * nkv + kh) * hgroups + hg;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0)
        sm.last = atomicAdd(cnt, 1u) == (unsigned)(ns - 1);
    __syncthreads();
    if (!sm.last)
        return;
    __threadfence();
    /* each split's weight 2^(m_i - M) / L, then o = sum_i weight_i o_i */
    for (int p = threadIdx.x; p < gn * ns; p += DUET__FD_WARPS * 32) {
        int g = p / ns, i = p % ns;
        sm.w[g][i] = __ldcg(part + (((size_t)t * nq + (size_t)(h0 + g)) * (size_t)splits + i) *
                                       (size_t)(HD + 2));
    }
    __syncthreads();
    if (threadIdx.x < gn) {
        int g = threadIdx.x;
        const float *ph = part + ((size_t)t * nq + (size_t)(h0 + g)) * (size_t)splits * (HD + 2);
        float M = -INFINITY, L = 0.0f;
        for (int i = 0; i < ns; i++)
            M = fmaxf(M, sm.w[g][i]);
        for (int i = 0; i < ns; i++) {
            sm.w[g][i] = exp2f(sm.w[g][i] - M);
            L += sm.w[g][i] * __ldcg(ph + (size_t)i * (HD + 2) + 1);
        }
        for (int i = 0; i < ns; i++)
            sm.w[g][i] /= L;
    }
    __syncthreads();
    for (int p = threadIdx.x; p < gn * HD; p += DUET__FD_WARPS * 32) {
        int g = p / HD, d = p % HD;
        size_t h = (size_t)t * nq + (size_t)(h0 + g);
        const float *ph = part + h * (size_t)splits * (size_t)(HD + 2) + 2 + d;
        float o = 0.0f;
#pragma unroll 8
        for (int i = 0; i < ns; i++)
            o += sm.w[g][i] * __ldcg(ph + (size_t)i * (HD + 2));
        out[h * HD + d] = duet__f2bf(o);
    }
    if (threadIdx.x == 0)
        *cnt = 0u;
}

/* The tensor-core kernel (attention_flash_decode_mma.cu), head_dim 64 or
 * 128, up to 8 query heads per block. */
void duet__fd_mma_launch(cudaStream_t s, dim3 grid, int head_dim, duet_bf16 *out,
                         const duet_bf16 *qkv, duet__cuda_batch_t b, duet__cuda_kv_t kv, int layer,
                         int nq, int nkv, int hgroups, int splits, int ps_shift, float *part,
                         unsigned *counts);
/* Its blocks resident per SM (the occupancy calculator; 0 on error). */
int duet__fd_mma_resident(int head_dim);

#endif
