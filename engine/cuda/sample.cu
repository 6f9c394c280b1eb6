/* Sampling on the device: duet_sample's rule (engine/sampling.c) over rows
 * of logits, so a sampled decode step moves one id per row to the host,
 * not the row's logits, and no host sort runs.
 *
 * The rule, per row: v = logit / temperature; candidates are the ids with
 * v >= max(v) - 80, in the order (v descending, id ascending); keep the
 * first top_k; weight each by exp(v - max(v)); keep the shortest prefix
 * whose weight reaches top_p of the total; draw u in [0, 1) from (seed,
 * output index) and return the first candidate whose running weight
 * exceeds u times the kept total.
 *
 * Weights are fixed point here (exp(v - max) computed in double, rounded
 * to float as the host's expf rounds, times 2^40, rounded), so every sum
 * is an exact integer, independent of the order threads add in: the draw
 * is a function of the logits and (seed, index) alone, on every run and
 * card.  The host sums doubles; the two agree except where a threshold
 * falls within about 2^-40 of the maximum's weight (and an id weighing
 * under 2^-41 of the maximum is never drawn here).
 *
 * No sort.  The logits are bf16, and distinct bf16 values stay distinct
 * (and in order) after the division by the temperature, so the order is
 * that of a 16-bit key of the logit's bits, then the id.  A row is read:
 *  1. for its maximum (and whether every logit is finite);
 *  2. for a histogram of the candidates by the key's high byte: count and
 *     weight (the only pass that computes exp);
 * then each selection (top_k by count, top_p by weight, the draw) picks
 * the high byte from that histogram, reads the row once for a count
 * histogram of the low byte under it (a value's weight is its count
 * times one exp), and where several ids share the chosen value, reads it
 * up to three more times to pick among them by id, a byte at a time.
 * One block per row; lanes of a warp that fall in the same bin add
 * once (warp-aggregated shared atomics). */
#include <math.h>

#include "engine/backend.h"
#include "engine/cuda/cuda_device.cuh"
#include "engine/cuda/cuda_kernels.h"

#define DUET__SAMPLE_THREADS 1024
#define DUET__MASS_ONE       1099511627776.0f /* 2^40 */

typedef unsigned long long duet__u64;

/* One row of the gathered logits: shard q's rows sit at src + q * n * chunk,
 * row i of it at + i * n_vocab(q). */
typedef struct {
    const uint16_t *src;
    int n, vocab, chunk, row;
    float t;  /* temperature */
    float mx; /* max over v */
} duet__row_t;

/* f(id, bf16 bits) for every id of the row, each thread a strided share
 * (16-byte loads where the shard's row allows). */
template <typename F>
static __device__ __forceinline__ void duet__row_each(const duet__row_t &r, F f)
{
    for (int v0 = 0, q = 0; v0 < r.vocab; v0 += r.chunk, q++) {
        int nq = min(r.chunk, r.vocab - v0);
        const uint16_t *x =
            r.src + (size_t)q * (size_t)r.n * (size_t)r.chunk + (size_t)r.row * (size_t)nq;
        if ((nq & 7) == 0 && ((uintptr_t)x & 15) == 0) {
            const uint4 *x8 = reinterpret_cast<const uint4 *>(x);
            for (int j = threadIdx.x; j < (nq >> 3); j += blockDim.x) {
                uint4 u = x8[j];
                const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
                for (int h = 0; h < 4; h++) {
                    f(v0 + 8 * j + 2 * h, w[h] & 0xffffu);
                    f(v0 + 8 * j + 2 * h + 1, w[h] >> 16);
                }
            }
        } else {
            for (int j = threadIdx.x; j < nq; j += blockDim.x)
                f(v0 + j, (uint32_t)x[j]);
        }
    }
}

static __device__ __forceinline__ float duet__bits_f(uint32_t b)
{
    return __uint_as_float(b << 16);
}

/* bf16 bits -> key: ascending key = descending value; -0 is +0 */
static __device__ __forceinline__ uint32_t duet__key(uint32_t b)
{
    if (b == 0x8000u)
        b = 0;
    uint32_t o = (b & 0x8000u) ? (~b & 0xffffu) : (b | 0x8000u);
    return 0xffffu - o;
}

static __device__ __forceinline__ uint32_t duet__key_bits(uint32_t k)
{
    uint32_t o = 0xffffu - k;
    return (o & 0x8000u) ? (o & 0x7fffu) : (~o & 0xffffu);
}

/* a candidate value's weight, in units of 2^-40 of the maximum's */
static __device__ __forceinline__ duet__u64 duet__weight(const duet__row_t &r, uint32_t k)
{
    float v = __fdiv_rn(duet__bits_f(duet__key_bits(k)), r.t);
    return __float2ull_rn((float)exp((double)(v - r.mx)) * DUET__MASS_ONE);
}

typedef struct {
    /* pass 2: the candidates by the key's high byte */
    uint32_t cnt1[256];
    duet__u64 mass1[256];
    /* a selection's pass */
    uint32_t cnt[256];
    uint32_t one_id[256];
    duet__u64 w[256];
    duet__u64 below_c, below_m, rem, at_m;
    uint32_t prefix, mask, key;
    int bin, done, id;
} duet__smem_t;

/* The result of a selection: the id, the count and weight of the
 * candidates before it, and its own weight. */
typedef struct {
    int32_t id;
    duet__u64 below_c, below_m, at_m;
} duet__pick_t;

/* Lanes of a warp add what falls in one bin once: the count, and one id
 * of the bin's (the id when the bin ends with one element).  bin < 0:
 * nothing. */
static __device__ __forceinline__ void duet__warp_count(uint32_t *cnt, uint32_t *one_id, int bin,
                                                        uint32_t id)
{
    unsigned peers = __match_any_sync(__activemask(), bin);
    if (bin >= 0 && (__ffs(peers) - 1) == (int)(threadIdx.x & 31)) {
        atomicAdd(&cnt[bin], (uint32_t)__popc(peers));
        one_id[bin] = id;
    }
}

/* ... and the sum of their weights */
static __device__ __forceinline__ void duet__warp_count_mass(uint32_t *cnt, duet__u64 *mass,
                                                             int bin, duet__u64 m)
{
    unsigned act = __activemask();
    unsigned peers = __match_any_sync(act, bin);
    duet__u64 sum = 0;
    for (int src = 0; src < 32; src++) { /* (an inactive lane is no peer) */
        duet__u64 v = __shfl_sync(act, m, src);
        if ((peers >> src) & 1u)
            sum += v;
    }
    if (bin >= 0 && (__ffs(peers) - 1) == (int)(threadIdx.x & 31)) {
        atomicAdd(&cnt[bin], (uint32_t)__popc(peers));
        atomicAdd(&mass[bin], sum);
    }
}

static __device__ __forceinline__ void duet__clear(duet__smem_t *s)
{
    for (int b = threadIdx.x; b < 256; b += blockDim.x) {
        s->cnt[b] = 0;
        s->one_id[b] = 0xffffffffu;
    }
}

/* The first candidate in (key, id) order where the running count (by_mass
 * false) or weight reaches target (1 <= target <= the candidates' total). */
static __device__ duet__pick_t duet__select(const duet__row_t &r, uint32_t kthr, int id_shift0,
                                            bool by_mass, duet__u64 target, duet__smem_t *s)
{
    /* the high byte, from pass 2's histogram */
    if (threadIdx.x == 0) {
        duet__u64 run = 0, bc = 0, bm = 0;
        int b = 0, last = 0;
        for (; b < 256; b++) {
            duet__u64 h = by_mass ? s->mass1[b] : (duet__u64)s->cnt1[b];
            if (s->cnt1[b] == 0)
                continue;
            last = b;
            if (run + h >= target)
                break;
            run += h;
            bc += s->cnt1[b];
            bm += s->mass1[b];
        }
        if (b == 256) { /* (not reached: the last candidate) */
            b = last;
            bc -= s->cnt1[b];
            bm -= s->mass1[b];
        }
        s->bin = b;
        s->below_c = bc;
        s->below_m = bm;
    }
    duet__clear(s);
    __syncthreads();
    /* the low byte: count per value under it */
    const uint32_t hi = (uint32_t)s->bin;
    duet__row_each(r, [&](int id, uint32_t bits) {
        uint32_t k = duet__key(bits);
        duet__warp_count(s->cnt, s->one_id, (k >> 8) == hi && k <= kthr ? (int)(k & 255) : -1,
                         (uint32_t)id);
    });
    __syncthreads();
    for (int b = threadIdx.x; b < 256; b += blockDim.x)
        s->w[b] = s->cnt[b] != 0 ? duet__weight(r, (hi << 8) | b) : 0;
    __syncthreads();
    if (threadIdx.x == 0) {
        duet__u64 bc = s->below_c, bm = s->below_m, run = by_mass ? bm : bc;
        int b = 0, last = 0;
        for (; b < 256; b++) {
            duet__u64 h = by_mass ? s->w[b] * s->cnt[b] : (duet__u64)s->cnt[b];
            if (s->cnt[b] == 0)
                continue;
            last = b;
            if (run + h >= target)
                break;
            run += h;
            bc += s->cnt[b];
            bm += s->w[b] * s->cnt[b];
        }
        if (b == 256) {
            b = last;
            run -= by_mass ? s->w[b] * s->cnt[b] : (duet__u64)s->cnt[b];
            bc -= s->cnt[b];
            bm -= s->w[b] * s->cnt[b];
        }
        /* the rem-th of the ids holding this value (1 <= rem <= cnt) */
        duet__u64 m = s->w[b];
        duet__u64 rem = by_mass ? (target - run + m - 1) / m : target - run;
        if (rem < 1)
            rem = 1;
        if (rem > s->cnt[b])
            rem = s->cnt[b];
        s->key = (hi << 8) | (uint32_t)b;
        s->below_c = bc + (rem - 1);
        s->below_m = bm + (rem - 1) * m;
        s->at_m = m;
        s->rem = rem;
        s->done = s->cnt[b] == 1;
        s->id = (int)s->one_id[b];
        s->prefix = 0;
        s->mask = 0;
    }
    __syncthreads();
    /* ties: the rem-th id among those holding the value, a byte at a time */
    for (int shift = id_shift0; !s->done && shift >= 0; shift -= 8) {
        duet__clear(s);
        __syncthreads();
        const uint32_t key = s->key, prefix = s->prefix, mask = s->mask;
        duet__row_each(r, [&](int id, uint32_t bits) {
            bool in = duet__key(bits) == key && ((uint32_t)id & mask) == prefix;
            duet__warp_count(s->cnt, s->one_id, in ? (int)(((uint32_t)id >> shift) & 255) : -1,
                             (uint32_t)id);
        });
        __syncthreads();
        if (threadIdx.x == 0) {
            duet__u64 run = 0;
            int b = 0;
            for (; b < 255; b++) {
                if (s->cnt[b] != 0 && run + s->cnt[b] >= s->rem)
                    break;
                run += s->cnt[b];
            }
            s->rem -= run;
            s->prefix |= (uint32_t)b << shift;
            s->mask |= 255u << shift;
            s->id = (int)s->one_id[b];
            s->done = s->cnt[b] == 1 || shift == 0;
        }
        __syncthreads();
    }
    duet__pick_t p;
    p.id = s->id;
    p.below_c = s->below_c;
    p.below_m = s->below_m;
    p.at_m = s->at_m;
    __syncthreads(); /* s is reused by the next selection */
    return p;
}

/* ceil(p * total) for p in (0, 1], exactly */
static __device__ duet__u64 duet__ceil_frac(float p, duet__u64 total)
{
    uint32_t b = __float_as_uint(p);
    int ex = (int)((b >> 23) & 0xff);
    duet__u64 mant = ex == 0 ? (b & 0x7fffffu) : ((b & 0x7fffffu) | 0x800000u);
    int sh = ex == 0 ? 149 : 150 - ex; /* p = mant / 2^sh */
    unsigned __int128 prod = (unsigned __int128)mant * total;
    if (sh >= 128)
        return prod != 0 ? 1 : 0;
    unsigned __int128 q = prod >> sh;
    if ((q << sh) != prod)
        q++;
    return (duet__u64)q;
}

static __device__ __forceinline__ duet__u64 duet__clamp(duet__u64 t, duet__u64 total)
{
    return t < 1 ? 1 : t > total ? total : t;
}

static __global__ void __launch_bounds__(DUET__SAMPLE_THREADS)
    duet__sample_kernel(int32_t *out, const uint16_t *src, int n, int vocab, int chunk,
                        const duet_sample_row_t *rows)
{
    __shared__ duet__smem_t s;
    __shared__ uint32_t s_key[32], s_id[32];
    __shared__ uint32_t s_kthr, s_best_key, s_best_id;
    const duet_sample_row_t p = rows[blockIdx.x];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    duet__row_t r = {src, n, vocab, chunk, (int)blockIdx.x, p.temperature, 0.0f};

    /* pass 1: finite?  the maximum (the lowest key) and its lowest id */
    uint32_t bk = 0xffffffffu, bi = 0xffffffffu;
    int bad = 0;
    duet__row_each(r, [&](int id, uint32_t bits) {
        if ((bits & 0x7f80u) == 0x7f80u) {
            bad = 1;
            return;
        }
        uint32_t k = duet__key(bits);
        if (k < bk || (k == bk && (uint32_t)id < bi)) {
            bk = k;
            bi = (uint32_t)id;
        }
    });
    if (__syncthreads_or(bad)) {
        if (threadIdx.x == 0)
            out[blockIdx.x] = DUET_SAMPLE_NONFINITE;
        return;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        uint32_t k2 = __shfl_xor_sync(0xffffffffu, bk, o), i2 = __shfl_xor_sync(0xffffffffu, bi, o);
        if (k2 < bk || (k2 == bk && i2 < bi)) {
            bk = k2;
            bi = i2;
        }
    }
    if (lane == 0) {
        s_key[warp] = bk;
        s_id[warp] = bi;
    }
    for (int b = threadIdx.x; b < 256; b += blockDim.x) {
        s.cnt1[b] = 0;
        s.mass1[b] = 0;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        bk = 0xffffffffu;
        bi = 0xffffffffu;
        for (int w = 0; w < nw; w++)
            if (s_key[w] < bk || (s_key[w] == bk && s_id[w] < bi)) {
                bk = s_key[w];
                bi = s_id[w];
            }
        s_best_key = bk;
        s_best_id = bi;
        /* the last key (descending value) that is a candidate:
         * v >= max(v) - 80 holds from the maximum down to there */
        if (p.temperature > 0.0f && p.top_k != 1) {
            float mx = __fdiv_rn(duet__bits_f(duet__key_bits(bk)), p.temperature);
            uint32_t lo = bk, hi = 0x10000u; /* cand(lo), !cand(hi) */
            while (hi - lo > 1) {
                uint32_t mid = (lo + hi) / 2;
                float v = __fdiv_rn(duet__bits_f(duet__key_bits(mid)), p.temperature);
                if (v >= mx - 80.0f)
                    lo = mid;
                else
                    hi = mid;
            }
            s_kthr = lo;
        }
    }
    __syncthreads();
    if (!(p.temperature > 0.0f) || p.top_k == 1) {
        if (threadIdx.x == 0)
            out[blockIdx.x] = (int32_t)s_best_id;
        return;
    }
    r.mx = __fdiv_rn(duet__bits_f(duet__key_bits(s_best_key)), p.temperature);
    const uint32_t kthr = s_kthr;

    /* pass 2: the candidates by the key's high byte, count and weight */
    duet__row_each(r, [&](int id, uint32_t bits) {
        (void)id;
        uint32_t k = duet__key(bits);
        bool c = k <= kthr;
        duet__warp_count_mass(s.cnt1, s.mass1, c ? (int)(k >> 8) : -1,
                              c ? duet__weight(r, k) : 0ull);
    });
    __syncthreads();
    duet__u64 cnt = 0, total = 0;
    for (int b = 0; b < 256; b++) {
        cnt += s.cnt1[b];
        total += s.mass1[b];
    }
    if (cnt == 1) {
        if (threadIdx.x == 0)
            out[blockIdx.x] = (int32_t)s_best_id;
        return;
    }
    const int id_shift0 = vocab > 1 ? (31 - __clz(vocab - 1)) & ~7 : 0;
    if (p.top_k > 0 && (duet__u64)p.top_k < cnt) {
        duet__pick_t k = duet__select(r, kthr, id_shift0, false, (duet__u64)p.top_k, &s);
        total = k.below_m + k.at_m;
    }
    if (p.top_p < 1.0f) {
        duet__pick_t k = duet__select(r, kthr, id_shift0, true,
                                      duet__clamp(duet__ceil_frac(p.top_p, total), total), &s);
        total = k.below_m + k.at_m;
    }
    /* the first candidate whose running weight exceeds u * total */
    duet__u64 t = (duet__u64)(((unsigned __int128)p.u53 * total) >> 53) + 1;
    duet__pick_t k = duet__select(r, kthr, id_shift0, true, duet__clamp(t, total), &s);
    if (threadIdx.x == 0)
        out[blockIdx.x] = k.id;
}

extern "C" duet_status_t duet__cuda_sample_rows(cudaStream_t s, int32_t *out, const void *src,
                                                int n, int vocab, int chunk,
                                                const duet_sample_row_t *rows)
{
    if (n <= 0)
        return DUET_OK;
    duet__sample_kernel<<<n, DUET__SAMPLE_THREADS, 0, s>>>(out, (const uint16_t *)src, n, vocab,
                                                           chunk, rows);
    return DUET__CUDA_LAUNCHED("sample_rows");
}
