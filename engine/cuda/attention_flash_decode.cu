/* Flash-decoding over the paged KV cache: the attention of tokens that
 * each bring one query row per head (decode, and prefill of head sizes
 * without a tensor-core kernel), at the speed the KV can be read.
 *
 * One block of DUET__FD_WARPS warps per (token t, KV head, head group,
 * split).  A head group is the GR <= 8 query heads of one KV head that the
 * block scores together, so every K and V row it reads serves all of them.
 * A key row of HD bf16 is read by L = HD / 8 lanes with one 16-byte load
 * each, so a warp reads 32 / L consecutive rows (HND pages keep a head's
 * rows contiguous) per instruction, coalesced; every lane keeps its eight
 * dims of the GR query rows (pre-scaled by log2(e) / sqrt(HD)) and of the
 * GR output rows in registers.  A warp loads ROWS of its row groups (K and
 * V together) before it uses them, so several loads are in flight.
 *
 * Per warp, the online softmax in base 2 over the keys it visits:
 *   m = running max, l = sum 2^(s - m), o = sum 2^(s - m) v
 * reduced over the warp's lanes, then over the block's warps, and -- when
 * the context is split -- over the splits:
 *   M = max_i m_i,  o = sum_i 2^(m_i - M) o_i / sum_i 2^(m_i - M) l_i.
 *
 * Splits: the launch gives the most splits a token may use (chosen from
 * the batch size only, so a recorded graph stays valid as contexts grow);
 * each token uses ceil(keys / DUET__FD_SPLIT_KEYS) of them at most, and a
 * token with one split writes its output directly.  Otherwise each split
 * writes (m, l, o) to scratch, and the last of the token's splits to
 * finish (a counter per (token, KV head, head group), reset by that block)
 * merges them: no second launch. */
#include <math.h>

#include "engine/cuda/attention_flash.cuh"

template <int HD, int GR>
static __global__ void __launch_bounds__(DUET__FD_WARPS * 32)
    duet__fd_kernel(duet_bf16 *out, const duet_bf16 *qkv, duet__cuda_batch_t b, duet__cuda_kv_t kv,
                    int layer, int nq, int nkv, int hgroups, int splits, int ps_shift, float *part,
                    unsigned *counts, float qscale)
{
    duet__pdl_trigger(); /* the O projection's GEMV may follow (cuda_device.cuh) */
    constexpr int L = HD / 8;                   /* lanes per key row */
    constexpr int KPR = 32 / L;                 /* key rows per warp load */
    constexpr int ROWS = GR <= 4 ? 4 : 2;       /* loads in flight per lane, K and V each */
    constexpr int KPI = KPR * ROWS;             /* keys per warp iteration */
    constexpr int STEP = KPI * DUET__FD_WARPS;  /* keys per block iteration */
    __shared__ duet__fd_smem<HD, GR> sm;

    duet__fd_blk_t k;
    if (!duet__fd_block(&k, b, kv, layer, nq, nkv, hgroups, splits, GR, HD))
        return;
    const int t = k.t, kh = k.kh, h0 = k.h0, gn = k.gn, k_begin = k.k_begin, k_end = k.k_end;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int sub = lane / L, li = lane % L;
    const int32_t *pt = k.pt;
    const int ps = kv.page_size;
    const duet_bf16 *kc = k.kc + li * 8;
    const duet_bf16 *vc = kc + k.plane;

    float q[GR][8], acc[GR][8], m[GR], l[GR];
    const duet_bf16 *qrow =
        qkv + (size_t)t * (size_t)(nq + 2 * nkv) * HD + (size_t)h0 * HD + (size_t)li * 8;
#pragma unroll
    for (int g = 0; g < GR; g++) {
        if (g < gn) {
            duet__load8(qrow + (size_t)g * HD, q[g]);
#pragma unroll
            for (int i = 0; i < 8; i++)
                q[g][i] *= qscale;
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++)
                q[g][i] = 0.0f;
        }
#pragma unroll
        for (int i = 0; i < 8; i++)
            acc[g][i] = 0.0f;
        m[g] = -INFINITY;
        l[g] = 0.0f;
    }

    for (int k0 = k_begin + warp * KPI; k0 < k_end; k0 += STEP) {
        uint4 kr[ROWS], vr[ROWS];
#pragma unroll
        for (int u = 0; u < ROWS; u++) {
            int k = k0 + u * KPR + sub;
            if (k < k_end) {
                size_t off = duet__fd_row(pt, k, ps, ps_shift, nkv, kh, HD);
                kr[u] = __ldg(reinterpret_cast<const uint4 *>(kc + off));
                vr[u] = __ldg(reinterpret_cast<const uint4 *>(vc + off));
            } else {
                kr[u] = make_uint4(0, 0, 0, 0);
                vr[u] = make_uint4(0, 0, 0, 0);
            }
        }
        float s[ROWS][GR];
#pragma unroll
        for (int u = 0; u < ROWS; u++) {
            float kf[8];
            duet__unpack8(kr[u], kf);
#pragma unroll
            for (int g = 0; g < GR; g++) {
                float a = 0.0f;
#pragma unroll
                for (int i = 0; i < 8; i++)
                    a = fmaf(q[g][i], kf[i], a);
#pragma unroll
                for (int o = L / 2; o > 0; o >>= 1)
                    a += __shfl_xor_sync(0xffffffffu, a, o);
                s[u][g] = k0 + u * KPR + sub < k_end ? a : -INFINITY;
            }
        }
#pragma unroll
        for (int g = 0; g < GR; g++) {
            float mx = s[0][g];
#pragma unroll
            for (int u = 1; u < ROWS; u++)
                mx = fmaxf(mx, s[u][g]);
#pragma unroll
            for (int o = L; o < 32; o <<= 1)
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            /* finite: key k0 (u 0, sub 0) is in range */
            float mn = fmaxf(m[g], mx), alpha = exp2f(m[g] - mn);
            m[g] = mn;
            l[g] *= alpha;
#pragma unroll
            for (int i = 0; i < 8; i++)
                acc[g][i] *= alpha;
#pragma unroll
            for (int u = 0; u < ROWS; u++) {
                float p = exp2f(s[u][g] - mn); /* 0 for keys out of range */
                s[u][g] = p;
                l[g] += p;
            }
        }
#pragma unroll
        for (int u = 0; u < ROWS; u++) {
            float vf[8];
            duet__unpack8(vr[u], vf);
#pragma unroll
            for (int g = 0; g < GR; g++) {
#pragma unroll
                for (int i = 0; i < 8; i++)
                    acc[g][i] = fmaf(s[u][g], vf[i], acc[g][i]);
            }
        }
    }

    /* the warp: lanes of one sub saw the same keys; sum over the subs */
#pragma unroll
    for (int g = 0; g < GR; g++) {
#pragma unroll
        for (int o = L; o < 32; o <<= 1) {
            l[g] += __shfl_xor_sync(0xffffffffu, l[g], o);
#pragma unroll
            for (int i = 0; i < 8; i++)
                acc[g][i] += __shfl_xor_sync(0xffffffffu, acc[g][i], o);
        }
        if (sub == 0) {
#pragma unroll
            for (int i = 0; i < 8; i++)
                sm.o[warp][g][li * 8 + i] = acc[g][i];
        }
        if (lane == 0) {
            sm.m[warp][g] = m[g];
            sm.l[warp][g] = l[g];
        }
    }
    __syncthreads();

    duet__fd_finish<HD, GR>(sm, out, part, counts, t, nq, nkv, kh, hgroups, k.hg, h0, gn, k.sp,
                            k.ns, splits);
}

/* Query heads a block scores together for group size G: all of the
 * group up to 8 (the tensor-core kernel always takes 8 rows). */
static int duet__fd_gr(int G, bool mma)
{
    return mma ? 8 : G <= 1 ? 1 : G <= 2 ? 2 : G <= 4 ? 4 : 8;
}

static bool duet__fd_mma(int head_dim, bool tensor_cores)
{
    return tensor_cores && (head_dim == 64 || head_dim == 128);
}

extern "C" int duet__cuda_flash_decode_supported(int nq, int nkv, int head_dim)
{
    if (nkv <= 0 || nq % nkv != 0)
        return 0;
    switch (head_dim) {
    case 8: case 16: case 32: case 64: case 128: case 256:
        return 1;
    default:
        return 0;
    }
}

extern "C" int duet__cuda_flash_decode_blocks(int n, int nq, int nkv, int head_dim,
                                              bool tensor_cores)
{
    int G = nq / nkv, gr = duet__fd_gr(G, duet__fd_mma(head_dim, tensor_cores));
    return n * nkv * ((G + gr - 1) / gr);
}

extern "C" size_t duet__cuda_flash_decode_scratch(int n, int nq, int head_dim, int splits)
{
    return splits > 1
               ? (size_t)n * (size_t)nq * (size_t)splits * (size_t)(head_dim + 2) * sizeof(float)
               : 0;
}

/* The CUDA-core kernel for head_dim hd and group gr. */
typedef void (*duet__fd_fn)(duet_bf16 *, const duet_bf16 *, duet__cuda_batch_t, duet__cuda_kv_t,
                            int, int, int, int, int, int, float *, unsigned *, float);

template <int HD> static duet__fd_fn duet__fd_pick_gr(int gr)
{
    return gr == 1   ? duet__fd_kernel<HD, 1>
           : gr == 2 ? duet__fd_kernel<HD, 2>
           : gr == 4 ? duet__fd_kernel<HD, 4>
                     : duet__fd_kernel<HD, 8>;
}

static duet__fd_fn duet__fd_pick(int hd, int gr)
{
    switch (hd) {
    case 8: return duet__fd_pick_gr<8>(gr);
    case 16: return duet__fd_pick_gr<16>(gr);
    case 32: return duet__fd_pick_gr<32>(gr);
    case 64: return duet__fd_pick_gr<64>(gr);
    case 128: return duet__fd_pick_gr<128>(gr);
    default: return duet__fd_pick_gr<256>(gr);
    }
}

extern "C" int duet__cuda_flash_decode_resident(int nq, int nkv, int head_dim, bool tensor_cores)
{
    bool mma = duet__fd_mma(head_dim, tensor_cores);
    int b = 0;
    if (mma)
        b = duet__fd_mma_resident(head_dim);
    else
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &b, duet__fd_pick(head_dim, duet__fd_gr(nq / nkv, false)), DUET__FD_WARPS * 32, 0);
    cudaGetLastError();
    return b > 0 ? b : 1;
}

extern "C" duet_status_t duet__cuda_flash_decode(cudaStream_t s, void *out, const void *qkv,
                                                 duet__cuda_batch_t b, duet__cuda_kv_t kv,
                                                 int layer, int n, int nq, int nkv, int head_dim,
                                                 bool tensor_cores, int splits, float *part,
                                                 unsigned *counts)
{
    if (n <= 0)
        return DUET_OK;
    if (!duet__cuda_flash_decode_supported(nq, nkv, head_dim) || splits < 1 ||
        splits > DUET__CUDA_FD_MAX_SPLITS || (splits > 1 && (part == NULL || counts == NULL)))
        return duet_error(DUET_ERR_UNSUPPORTED,
                          "cuda flash decode: %d query heads over %d kv heads, head_dim %d, "
                          "%d splits",
                          nq, nkv, head_dim, splits);
    bool mma = duet__fd_mma(head_dim, tensor_cores);
    int G = nq / nkv, gr = duet__fd_gr(G, mma), hgroups = (G + gr - 1) / gr;
    int ps = kv.page_size, ps_shift = -1;
    if (ps > 0 && (ps & (ps - 1)) == 0)
        for (ps_shift = 0; (1 << ps_shift) < ps; ps_shift++)
            ;
    dim3 grid((unsigned)n, (unsigned)(nkv * hgroups), (unsigned)splits);
    duet_bf16 *o = (duet_bf16 *)out;
    const duet_bf16 *x = (const duet_bf16 *)qkv;
    if (mma) {
        duet__fd_mma_launch(s, grid, head_dim, o, x, b, kv, layer, nq, nkv, hgroups, splits,
                            ps_shift, part, counts);
        return DUET__CUDA_LAUNCHED("flash decode attention (tensor cores)");
    }
    duet__fd_pick(head_dim, gr)<<<grid, DUET__FD_WARPS * 32, 0, s>>>(
        o, x, b, kv, layer, nq, nkv, hgroups, splits, ps_shift, part, counts,
        DUET__FD_LOG2E / sqrtf((float)head_dim));
    return DUET__CUDA_LAUNCHED("flash decode attention");
}
