/* Flash-decoding on tensor cores, head_dim 64 or 128: the same blocks,
 * splits and merge as attention_flash_decode.cu (attention_flash.cuh), with
 * the two products of a warp's 16 keys done by mma.sync m16n8k16 straight
 * from registers loaded from global memory -- no shared-memory staging,
 * every load 16 bytes and every row read by consecutive lanes.
 *
 * Lane (g = lane/4, c = lane%4) of a warp:
 *  - S = Q.K^T, M = query heads (g; rows 8-15 unused), N = 8 keys per tile
 *    (two tiles: keys k0..k0+7, k0+8..k0+15), K = head_dim in steps of 16.
 *    The dot product does not care in which order dims are summed, so the
 *    fragment's 16 "logical" dims of step j are the actual dims
 *    c*HD/4 + 4j + {0,1,2,3}: a lane supplies dims [c*HD/4, (c+1)*HD/4) of
 *    key k0+g (B) and of query head g (A), loaded as HD/32 16-byte words,
 *    and the fragments are those words in order.
 *  - the online softmax of head g's row: the 4 lanes of a row hold its 16
 *    scores, 2 shuffles give the row max.
 *  - O^T += V^T.P^T, M = 16 dims, N = the 8 heads, K = the 16 keys: P^T
 *    is the S registers as they are (lane (g, c) holds head g's scores of
 *    keys 2c, 2c+1 and 8+2c, 9+2c: the B layout), and V^T (A) for tile w
 *    is, for lane (g, c), keys k0 + 2c + {0, 1, 8, 9} at the dims
 *    g*HD/8 + 2w (row g) and g*HD/8 + 2w + 1 (row g+8): the lane loads dims
 *    [g*HD/8, (g+1)*HD/8) of those 4 keys and pairs the keys' bf16 values
 *    with one byte permute per fragment register.  Its accumulators are
 *    those dims for heads 2c, 2c+1, rescaled by those rows' factors.
 */
#include <math.h>

#include "engine/cuda/attention_flash.cuh"

#define DUET__FDM_GR 8 /* query heads per block: the 8 rows of a fragment a lane group owns */

/* w[0..N) = the N 32-bit words at p (16-byte aligned), or zeros when !in */
template <int N>
static __device__ __forceinline__ void duet__fdm_words(const duet_bf16 *p, bool in, uint32_t *w)
{
#pragma unroll
    for (int i = 0; i < N / 4; i++) {
        uint4 u = in ? __ldg(reinterpret_cast<const uint4 *>(p) + i) : make_uint4(0, 0, 0, 0);
        w[4 * i] = u.x;
        w[4 * i + 1] = u.y;
        w[4 * i + 2] = u.z;
        w[4 * i + 3] = u.w;
    }
}

template <int HD>
static __global__ void __launch_bounds__(DUET__FD_WARPS * 32)
    duet__fdm_kernel(duet_bf16 *out, const duet_bf16 *qkv, duet__cuda_batch_t b, duet__cuda_kv_t kv,
                     int layer, int nq, int nkv, int hgroups, int splits, int ps_shift,
                     float *part, unsigned *counts, float qscale)
{
    duet__pdl_trigger(); /* the O projection's GEMV may follow (cuda_device.cuh) */
    constexpr int QW = HD / 8;    /* 32-bit words of q and of a key row per lane */
    constexpr int KS = HD / 16;   /* k-steps of S */
    constexpr int VW = HD / 16;   /* 32-bit words of a V row per lane */
    constexpr int STEP = 16 * DUET__FD_WARPS;
    __shared__ duet__fd_smem<HD, DUET__FDM_GR> sm;

    duet__fd_blk_t blk;
    if (!duet__fd_block(&blk, b, kv, layer, nq, nkv, hgroups, splits, DUET__FDM_GR, HD))
        return;
    const int t = blk.t, kh = blk.kh, h0 = blk.h0, gn = blk.gn;
    const int k_begin = blk.k_begin, k_end = blk.k_end;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, c = lane & 3;
    const int32_t *pt = blk.pt;
    const int ps = kv.page_size;
    const duet_bf16 *kc = blk.kc, *vc = kc + blk.plane;

    uint32_t qf[QW];
    duet__fdm_words<QW>(qkv + (size_t)t * (size_t)(nq + 2 * nkv) * HD + (size_t)(h0 + g) * HD +
                            c * (HD / 4),
                        g < gn, qf);
    float acc[VW][4]; /* O^T tile w: dims g*HD/8 + 2w (+1), heads 2c, 2c+1 */
#pragma unroll
    for (int i = 0; i < VW; i++)
        acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
    float m = -INFINITY, l = 0.0f;

    /* pages of 16 or more: a warp's 16 keys (from a multiple of 16) share
     * one page, looked up once */
    const bool one_page = ps_shift >= 4;
    for (int k0 = k_begin + warp * 16; k0 < k_end; k0 += STEP) {
        uint32_t kw[2][QW], vw[4][VW];
        size_t pbase = 0; /* the page's row 0 for this KV head */
        if (one_page) {
            pbase = ((size_t)pt[k0 >> ps_shift] * (size_t)nkv + (size_t)kh) * (size_t)ps * HD -
                    (size_t)(k0 & ~(ps - 1)) * HD;
            /* the warp's next 16 keys into L2 while these are used */
            int kn = k0 + STEP;
            if (kn < k_end) {
                size_t nb = ((size_t)pt[kn >> ps_shift] * (size_t)nkv + (size_t)kh) * (size_t)ps *
                                HD +
                            (size_t)(kn & (ps - 1)) * HD;
                /* 16 rows of K and of V: 2 * 16 * HD * 2 bytes, a line per lane */
                constexpr int LINES = 16 * HD * 2 / 128;
                if (lane < LINES) {
                    asm volatile("prefetch.global.L2 [%0];" ::"l"(kc + nb + (size_t)lane * 64));
                    asm volatile("prefetch.global.L2 [%0];" ::"l"(vc + nb + (size_t)lane * 64));
                }
            }
        }
        auto row = [&](int k) -> size_t { /* key k's row; 0 (not read) out of range */
            return k >= k_end  ? 0
                   : one_page ? pbase + (size_t)k * HD
                              : duet__fd_row(pt, k, ps, ps_shift, nkv, kh, HD);
        };
#pragma unroll
        for (int tt = 0; tt < 2; tt++) {
            int k = k0 + 8 * tt + g;
            duet__fdm_words<QW>(kc + row(k) + c * (HD / 4), k < k_end, kw[tt]);
        }
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int k = k0 + 2 * c + (j & 1) + 8 * (j >> 1);
            duet__fdm_words<VW>(vc + row(k) + g * (HD / 8), k < k_end, vw[j]);
        }

        /* S: head g, keys k0 + 8tt + 2c + {0, 1} in s[tt][0..1] */
        float s[2][4];
#pragma unroll
        for (int tt = 0; tt < 2; tt++) {
            s[tt][0] = s[tt][1] = s[tt][2] = s[tt][3] = 0.0f;
#pragma unroll
            for (int j = 0; j < KS; j++)
                duet__mma16816(s[tt], qf[2 * j], 0u, qf[2 * j + 1], 0u, kw[tt][2 * j],
                               kw[tt][2 * j + 1]);
        }
        float mx = -INFINITY;
#pragma unroll
        for (int tt = 0; tt < 2; tt++) {
#pragma unroll
            for (int e = 0; e < 2; e++) {
                int k = k0 + 8 * tt + 2 * c + e;
                s[tt][e] = k < k_end ? s[tt][e] * qscale : -INFINITY;
                mx = fmaxf(mx, s[tt][e]);
            }
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        /* finite: key k0 is in range */
        float mn = fmaxf(m, mx), alpha = exp2f(m - mn);
        m = mn;
        float p[2][2];
#pragma unroll
        for (int tt = 0; tt < 2; tt++) {
            p[tt][0] = exp2f(s[tt][0] - mn);
            p[tt][1] = exp2f(s[tt][1] - mn);
        }
        l = l * alpha + (p[0][0] + p[0][1]) + (p[1][0] + p[1][1]);
        /* O^T += V^T.P^T: this lane accumulates heads 2c, 2c+1 (their rescale
         * factors from rows 2c, 2c+1) */
        float a0 = __shfl_sync(0xffffffffu, alpha, 8 * c), a1 = __shfl_sync(0xffffffffu, alpha, 8 * c + 4);
        uint32_t pb0 = duet__pack2f(p[0][0], p[0][1]), pb1 = duet__pack2f(p[1][0], p[1][1]);
#pragma unroll
        for (int w = 0; w < VW; w++) {
            acc[w][0] *= a0;
            acc[w][1] *= a1;
            acc[w][2] *= a0;
            acc[w][3] *= a1;
            duet__mma16816(acc[w], __byte_perm(vw[0][w], vw[1][w], 0x5410),
                           __byte_perm(vw[0][w], vw[1][w], 0x7632),
                           __byte_perm(vw[2][w], vw[3][w], 0x5410),
                           __byte_perm(vw[2][w], vw[3][w], 0x7632), pb0, pb1);
        }
    }

    /* the warp: a row's 4 lanes summed different keys into l */
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
#pragma unroll
    for (int w = 0; w < VW; w++) {
        int d = g * (HD / 8) + 2 * w;
        sm.o[warp][2 * c][d] = acc[w][0];
        sm.o[warp][2 * c + 1][d] = acc[w][1];
        sm.o[warp][2 * c][d + 1] = acc[w][2];
        sm.o[warp][2 * c + 1][d + 1] = acc[w][3];
    }
    if (c == 0) {
        sm.m[warp][g] = m;
        sm.l[warp][g] = l;
    }
    __syncthreads();
    duet__fd_finish<HD, DUET__FDM_GR>(sm, out, part, counts, t, nq, nkv, kh, hgroups, blk.hg, h0,
                                      gn, blk.sp, blk.ns, splits);
}

void duet__fd_mma_launch(cudaStream_t s, dim3 grid, int head_dim, duet_bf16 *out,
                         const duet_bf16 *qkv, duet__cuda_batch_t b, duet__cuda_kv_t kv, int layer,
                         int nq, int nkv, int hgroups, int splits, int ps_shift, float *part,
                         unsigned *counts)
{
    float qscale = DUET__FD_LOG2E / sqrtf((float)head_dim);
    if (head_dim == 64)
        duet__fdm_kernel<64><<<grid, DUET__FD_WARPS * 32, 0, s>>>(
            out, qkv, b, kv, layer, nq, nkv, hgroups, splits, ps_shift, part, counts, qscale);
    else
        duet__fdm_kernel<128><<<grid, DUET__FD_WARPS * 32, 0, s>>>(
            out, qkv, b, kv, layer, nq, nkv, hgroups, splits, ps_shift, part, counts, qscale);
}

int duet__fd_mma_resident(int head_dim)
{
    int b = 0;
    if (head_dim == 64)
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, duet__fdm_kernel<64>,
                                                      DUET__FD_WARPS * 32, 0);
    else
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, duet__fdm_kernel<128>,
                                                      DUET__FD_WARPS * 32, 0);
    return b;
}
