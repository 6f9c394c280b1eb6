/* engine/cpu ops (ops_*.c, the attention and rope drivers, the element-wise
 * ops of backend_cpu.c): every kernel family this CPU has (generic, avx2,
 * avx512) against straightforward double-precision references, at sizes
 * that are not multiples of the vector widths.
 *
 * Tolerances (all against a double reference of the same float inputs):
 *  - rmsnorm: |y - ref| <= 4e-6 (|ref| + 1e-6)
 *  - silu_mul (g in [-12, 12]): |o - ref| <= 4e-6 (|ref| + 1e-6)
 *  - rope: |x' - ref| <= 2e-6 (|x1 c| + |x2 s|) with ref from the same
 *    float cosines and sines (the backend's table: cosf/sinf of the float
 *    angle, checked against double within 2e-6 as well)
 *  - add, to_f32, argmax, embed, KV store: exact
 *  - attention (q, K, V uniform in [-1, 1)): |out - ref| <= 2e-5
 * and bit-exactness where the engine relies on it: attention across pool
 * sizes 1/2/3, across batch compositions (a ragged batch, the sequence
 * alone, the sequence decoded one token at a time: the narrow and the wide
 * kernels agree bit for bit), element-wise ops pooled vs inline. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "engine/cpu/backend_cpu.h"
#include "engine/cpu/ops_internal.h"

typedef struct {
    uint64_t s;
} rng_t;

static uint32_t rng_next(rng_t *r)
{
    r->s = r->s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(r->s >> 33);
}

/* Uniform in [-1, 1). */
static float rng_unit(rng_t *r)
{
    return (float)((double)rng_next(r) / 2147483648.0 - 1.0);
}

static void fill(rng_t *r, float *x, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++)
        x[i] = rng_unit(r) * scale;
}

static duet__mm_isa_t g_isa_max;

static int setup(void **state)
{
    (void)state;
    g_isa_max = duet__mm_isa_detect();
    return 0;
}

#define FOR_EACH_ISA(isa)                                                                          \
    for (duet__mm_isa_t isa = DUET__MM_ISA_GENERIC; isa <= g_isa_max;                              \
         isa = (duet__mm_isa_t)(isa + 1))

static const int k_sizes[] = {1, 2, 7, 8, 15, 16, 17, 31, 33, 64, 100, 768, 771, 2048, 2053};
#define N_SIZES ((int)(sizeof(k_sizes) / sizeof(k_sizes[0])))

/* ---- element-wise kernels ---- */

static void test_rmsnorm(void **state)
{
    (void)state;
    rng_t rng = {1};
    float *x = duet_malloc(4096 * sizeof(float)), *w = duet_malloc(4096 * sizeof(float));
    float *y = duet_malloc(4096 * sizeof(float)), *y2 = duet_malloc(4096 * sizeof(float));
    FOR_EACH_ISA(isa)
    {
        const duet__cpu_ops_t *ops = duet__cpu_ops(isa);
        for (int si = 0; si < N_SIZES; si++) {
            int d = k_sizes[si];
            fill(&rng, x, (size_t)d, 3.0f);
            fill(&rng, w, (size_t)d, 1.5f);
            ops->rmsnorm(y, x, w, d, 1e-5f);
            double ss = 0;
            for (int i = 0; i < d; i++)
                ss += (double)x[i] * x[i];
            double sc = 1.0 / sqrt(ss / d + 1e-5);
            for (int i = 0; i < d; i++) {
                double ref = x[i] * sc * w[i];
                if (fabs(y[i] - ref) > 4e-6 * (fabs(ref) + 1e-6))
                    fail_msg("%s rmsnorm d %d [%d]: %g vs %g", ops->name, d, i, y[i], ref);
            }
            /* in place */
            memcpy(y2, x, (size_t)d * sizeof(float));
            ops->rmsnorm(y2, y2, w, d, 1e-5f);
            assert_memory_equal(y2, y, (size_t)d * sizeof(float));
        }
    }
    duet_free(x);
    duet_free(w);
    duet_free(y);
    duet_free(y2);
}

static void test_silu_mul_add(void **state)
{
    (void)state;
    rng_t rng = {2};
    float *g = duet_malloc(4096 * sizeof(float)), *u = duet_malloc(4096 * sizeof(float));
    float *o = duet_malloc(4096 * sizeof(float)), *a = duet_malloc(4096 * sizeof(float));
    FOR_EACH_ISA(isa)
    {
        const duet__cpu_ops_t *ops = duet__cpu_ops(isa);
        for (int si = 0; si < N_SIZES; si++) {
            int m = k_sizes[si];
            fill(&rng, g, (size_t)m, 12.0f);
            fill(&rng, u, (size_t)m, 2.0f);
            if (m > 3) {
                g[0] = 0.0f;
                g[1] = -12.0f;
                g[2] = 12.0f;
            }
            ops->silu_mul(o, g, u, m);
            for (int i = 0; i < m; i++) {
                double ref = g[i] / (1.0 + exp(-(double)g[i])) * u[i];
                if (fabs(o[i] - ref) > 4e-6 * (fabs(ref) + 1e-6))
                    fail_msg("%s silu_mul m %d [%d] g %g: %g vs %g", ops->name, m, i, g[i], o[i],
                             ref);
            }
            /* add: exact */
            memcpy(a, g, (size_t)m * sizeof(float));
            ops->add(a, u, (size_t)m);
            for (int i = 0; i < m; i++)
                assert_true(a[i] == g[i] + u[i]);
        }
    }
    duet_free(g);
    duet_free(u);
    duet_free(o);
    duet_free(a);
}

static void test_rope_kernel(void **state)
{
    (void)state;
    rng_t rng = {3};
    static const int hds[] = {2, 8, 14, 34, 64, 128};
    float x[4 * 128], y[4 * 128], cs[64], sn[64];
    FOR_EACH_ISA(isa)
    {
        const duet__cpu_ops_t *ops = duet__cpu_ops(isa);
        for (size_t hi = 0; hi < sizeof(hds) / sizeof(hds[0]); hi++) {
            int hd = hds[hi], half = hd / 2;
            fill(&rng, x, (size_t)(3 * hd), 2.0f);
            for (int i = 0; i < half; i++) {
                float ang = 37.0f * (float)i / (float)half;
                cs[i] = cosf(ang);
                sn[i] = sinf(ang);
            }
            memcpy(y, x, sizeof(float) * (size_t)(3 * hd));
            ops->rope(y, 3, hd, cs, sn);
            for (int h = 0; h < 3; h++) {
                for (int i = 0; i < half; i++) {
                    double x1 = x[h * hd + i], x2 = x[h * hd + half + i];
                    double r1 = x1 * cs[i] - x2 * sn[i], r2 = x2 * cs[i] + x1 * sn[i];
                    double tol = 2e-6 * (fabs(x1 * cs[i]) + fabs(x2 * sn[i]) + 1e-6);
                    if (fabs(y[h * hd + i] - r1) > tol || fabs(y[h * hd + half + i] - r2) > tol)
                        fail_msg("%s rope hd %d head %d i %d", ops->name, hd, h, i);
                }
            }
        }
    }
}

static void test_to_f32_argmax(void **state)
{
    (void)state;
    rng_t rng = {4};
    uint16_t h[2100];
    float f[2100], ref[2100], x[2100];
    FOR_EACH_ISA(isa)
    {
        const duet__cpu_ops_t *ops = duet__cpu_ops(isa);
        for (int si = 0; si < N_SIZES; si++) {
            int n = k_sizes[si];
            for (int dt = DUET_DTYPE_F32; dt <= DUET_DTYPE_BF16; dt++) {
                for (int i = 0; i < n; i++) {
                    float v = rng_unit(&rng) * 100.0f;
                    h[i] = dt == DUET_DTYPE_F16 ? duet_f32_to_f16(v) : duet_f32_to_bf16(v);
                    x[i] = v;
                }
                const void *src = dt == DUET_DTYPE_F32 ? (const void *)x : (const void *)h;
                duet_dtype_to_f32((duet_dtype_t)dt, src, ref, (size_t)n);
                ops->to_f32((duet_dtype_t)dt, src, f, (size_t)n);
                assert_memory_equal(f, ref, (size_t)n * sizeof(float));
            }
            /* argmax: first maximum, ties and -inf */
            for (int trial = 0; trial < 4; trial++) {
                fill(&rng, x, (size_t)n, 5.0f);
                if (trial == 1 && n > 2) /* a tie: the lower index wins */
                    x[n - 1] = x[n / 2] = 7.0f;
                if (trial == 2)
                    for (int i = 0; i < n; i++)
                        x[i] = -INFINITY;
                if (trial == 3)
                    for (int i = 0; i < n; i++)
                        x[i] = (float)(i % 3);
                float mx;
                int32_t at;
                ops->argmax(x, n, &mx, &at);
                int32_t best = 0;
                for (int i = 1; i < n; i++)
                    if (x[i] > x[best])
                        best = i;
                if (at != best || mx != x[best])
                    fail_msg("%s argmax n %d trial %d: %d (%g) vs %d (%g)", ops->name, n, trial,
                             at, mx, best, x[best]);
            }
        }
    }
}

/* ---- through the backend: a rank with a paged KV pool ---- */

typedef struct {
    duet_backend_rank_t *r;
    duet_kv_layout_t kv;
    float *pool;
} rank_t;

static void rank_open(rank_t *rk, int threads, duet__mm_isa_t isa, int n_layers, int n_pages,
                      int page_size, int nkv, int hd)
{
    duet_backend_rank_opts_t o = {.rank = 0, .tp = 1, .threads = threads, .spin = false};
    o.kv_layout = (duet_kv_layout_t){n_layers, n_pages, page_size, nkv, hd, 4};
    assert_int_equal(duet_backend_cpu.rank_create(&o, &rk->r), DUET_OK);
    duet__cpu_rank_set_isa(rk->r, isa);
    rk->kv = o.kv_layout;
    rk->pool = duet_aligned_alloc(64, duet_kv_total_bytes(&rk->kv));
    assert_non_null(rk->pool);
    duet_backend_cpu.kv_attach(rk->r, rk->pool);
}

static void rank_close(rank_t *rk)
{
    duet_backend_cpu.rank_destroy(rk->r);
    duet_aligned_free(rk->pool);
}

/* A batch of n_seqs sequences: sequence s has ctx[s] tokens of context, of
 * which the last n_new[s] are in the batch; its pages are a shuffled set. */
typedef struct {
    duet_batch_desc_t d;
    int32_t tokens[512], positions[512], slots[512], q_start[17], ctx_len[16];
    int32_t page_table[16 * 64];
} batch_t;

static void batch_make(batch_t *b, int n_seqs, const int *ctx, const int *n_new,
                       const int32_t *pages, int page_stride, int page_size)
{
    int t = 0;
    memset(b, 0, sizeof(*b));
    b->q_start[0] = 0;
    for (int s = 0; s < n_seqs; s++) {
        for (int i = 0; i < page_stride; i++)
            b->page_table[s * page_stride + i] = pages[s * page_stride + i];
        for (int i = 0; i < n_new[s]; i++, t++) {
            int pos = ctx[s] - n_new[s] + i;
            b->positions[t] = pos;
            b->slots[t] = pages[s * page_stride + pos / page_size] * page_size + pos % page_size;
            b->tokens[t] = (t * 7 + 3) % 50;
        }
        b->q_start[s + 1] = t;
        b->ctx_len[s] = ctx[s];
        if (ctx[s] > b->d.max_ctx)
            b->d.max_ctx = ctx[s];
    }
    b->d.n_tokens = t;
    b->d.n_seqs = n_seqs;
    b->d.tokens = b->tokens;
    b->d.positions = b->positions;
    b->d.slots = b->slots;
    b->d.q_start = b->q_start;
    b->d.ctx_len = b->ctx_len;
    b->d.page_table = b->page_table;
    b->d.page_stride = page_stride;
}

/* Double-precision causal attention of the batch's query rows. */
static void attention_ref(const rank_t *rk, const batch_t *b, const float *qkv, int nq, int nkv,
                          int hd, int layer, double *out)
{
    int stride = (nq + 2 * nkv) * hd, group = nq / nkv;
    double *w = malloc(sizeof(double) * 4096);
    for (int s = 0; s < b->d.n_seqs; s++) {
        const int32_t *pt = b->page_table + s * b->d.page_stride;
        for (int t = b->q_start[s]; t < b->q_start[s + 1]; t++) {
            int npos = b->positions[t] + 1;
            for (int h = 0; h < nq; h++) {
                const float *q = qkv + (size_t)t * stride + (size_t)h * hd;
                double mx = -INFINITY, sum = 0;
                for (int p = 0; p < npos; p++) {
                    const float *k = (const float *)((const char *)rk->pool +
                                                     duet_kv_offset(&rk->kv, layer, 0,
                                                                    pt[p / rk->kv.page_size],
                                                                    h / group)) +
                                     (size_t)(p % rk->kv.page_size) * hd;
                    double dot = 0;
                    for (int d = 0; d < hd; d++)
                        dot += (double)q[d] * k[d];
                    w[p] = dot / sqrt((double)hd);
                    mx = fmax(mx, w[p]);
                }
                for (int p = 0; p < npos; p++) {
                    w[p] = exp(w[p] - mx);
                    sum += w[p];
                }
                double *o = out + ((size_t)t * nq + h) * hd;
                for (int d = 0; d < hd; d++)
                    o[d] = 0;
                for (int p = 0; p < npos; p++) {
                    const float *v = (const float *)((const char *)rk->pool +
                                                     duet_kv_offset(&rk->kv, layer, 1,
                                                                    pt[p / rk->kv.page_size],
                                                                    h / group)) +
                                     (size_t)(p % rk->kv.page_size) * hd;
                    for (int d = 0; d < hd; d++)
                        o[d] += w[p] / sum * v[d];
                }
            }
        }
    }
    free(w);
}

/* Run the backend's attention on batch b; out[n][nq * hd]. */
static void attention_run(rank_t *rk, const batch_t *b, const float *qkv, int nq, int nkv, int hd,
                          int layer, float *out)
{
    assert_int_equal(duet_backend_cpu.batch_prepare(rk->r, &b->d), DUET_OK);
    assert_int_equal(duet_backend_cpu.attention(rk->r, out, qkv, b->d.n_tokens, nq, nkv, hd, layer),
                     DUET_OK);
}

static void check_attention(int hd, int page_size, int nkv, int group, uint64_t seed)
{
    enum { NSEQ = 5 };
    const int nq = nkv * group, stride = (nq + 2 * nkv) * hd;
    /* ragged: a long prefill, a chunk continuing a context, decodes, a
     * one-token prompt */
    const int ctx[NSEQ] = {70, 45, 33, 1, 17}, n_new[NSEQ] = {70, 20, 1, 1, 17};
    int page_stride = 80 / page_size + 1, n_pages = NSEQ * page_stride + 3, n = 0;
    int32_t *pages = malloc(sizeof(int32_t) * (size_t)(NSEQ * page_stride));
    rng_t rng = {seed};
    batch_t *b = malloc(sizeof(batch_t)), *b1 = malloc(sizeof(batch_t));
    for (int s = 0; s < NSEQ; s++)
        n += n_new[s];
    /* pages: a permutation, so that page ids are not positions */
    for (int i = 0; i < NSEQ * page_stride; i++)
        pages[i] = i;
    for (int i = NSEQ * page_stride - 1; i > 0; i--) {
        int j = (int)(rng_next(&rng) % (uint32_t)(i + 1));
        int32_t tmp = pages[i];
        pages[i] = pages[j];
        pages[j] = tmp;
    }
    batch_make(b, NSEQ, ctx, n_new, pages, page_stride, page_size);
    float *qkv = malloc(sizeof(float) * (size_t)n * stride);
    float *out = malloc(sizeof(float) * (size_t)n * nq * hd);
    float *first = malloc(sizeof(float) * (size_t)n * nq * hd);
    float *one = malloc(sizeof(float) * (size_t)n * nq * hd);
    double *ref = malloc(sizeof(double) * (size_t)n * nq * hd);
    fill(&rng, qkv, (size_t)n * stride, 1.0f);

    FOR_EACH_ISA(isa)
    {
        for (int threads = 1; threads <= 3; threads++) {
            rank_t rk;
            rank_open(&rk, threads, isa, 2, n_pages, page_size, nkv, hd);
            rng_t kr = {seed * 31 + 7};
            fill(&kr, rk.pool, duet_kv_total_bytes(&rk.kv) / sizeof(float), 1.0f);
            attention_run(&rk, b, qkv, nq, nkv, hd, 1, out);
            if (threads == 1) {
                attention_ref(&rk, b, qkv, nq, nkv, hd, 1, ref);
                for (size_t i = 0; i < (size_t)n * nq * hd; i++) {
                    if (fabs(out[i] - ref[i]) > 2e-5)
                        fail_msg("%s hd %d page %d kv %d group %d: out[%zu] %g vs %g",
                                 rk.r->ops->name, hd, page_size, nkv, group, i, out[i], ref[i]);
                }
                memcpy(first, out, sizeof(float) * (size_t)n * nq * hd);
                /* each sequence alone, then each token alone (decode):
                 * bit for bit what the ragged batch gave */
                for (int s = 0; s < NSEQ; s++) {
                    int t0 = b->q_start[s];
                    size_t row = (size_t)nq * hd;
                    batch_make(b1, 1, &ctx[s], &n_new[s], pages + s * page_stride, page_stride,
                               page_size);
                    attention_run(&rk, b1, qkv + (size_t)t0 * stride, nq, nkv, hd, 1, one);
                    if (memcmp(one, first + t0 * row, row * (size_t)n_new[s] * sizeof(float)))
                        fail_msg("%s hd %d page %d kv %d group %d: seq %d alone differs",
                                 rk.r->ops->name, hd, page_size, nkv, group, s);
                    for (int i = 0; i < n_new[s]; i++) {
                        int c = ctx[s] - n_new[s] + i + 1, one_tok = 1;
                        batch_make(b1, 1, &c, &one_tok, pages + s * page_stride, page_stride,
                                   page_size);
                        attention_run(&rk, b1, qkv + (size_t)(t0 + i) * stride, nq, nkv, hd, 1,
                                      one);
                        if (memcmp(one, first + (t0 + i) * row, row * sizeof(float)))
                            fail_msg("%s hd %d page %d kv %d group %d: seq %d token %d decoded "
                                     "differs",
                                     rk.r->ops->name, hd, page_size, nkv, group, s, i);
                    }
                }
            } else if (memcmp(out, first, sizeof(float) * (size_t)n * nq * hd) != 0) {
                fail_msg("%s hd %d page %d kv %d group %d: %d threads differ", rk.r->ops->name, hd,
                         page_size, nkv, group, threads);
            }
            rank_close(&rk);
        }
    }
    free(pages);
    free(b);
    free(b1);
    free(qkv);
    free(out);
    free(first);
    free(one);
    free(ref);
}

static void test_attention(void **state)
{
    (void)state;
    static const int hds[] = {8, 64, 128};
    uint64_t seed = 100;
    for (size_t hi = 0; hi < sizeof(hds) / sizeof(hds[0]); hi++) {
        for (int ps = 1; ps <= 16; ps *= 16) {
            for (int group = 1; group <= 8; group++)
                check_attention(hds[hi], ps, group % 2 ? 1 : 2, group, seed++);
        }
    }
    /* head_dim not a multiple of any vector width, pages of 5 */
    check_attention(20, 5, 2, 3, seed++);
    check_attention(36, 16, 1, 5, seed++);
}

/* head_rmsnorm (Qwen3's q_norm / k_norm): each q head and k head of the
 * qkv rows normalised over head_dim with its own weights, v untouched,
 * against a float64 computation. */
static void test_head_rmsnorm(void **state)
{
    (void)state;
    static const int hds[] = {8, 20, 64, 128};
    rng_t rng = {21};
    for (size_t hi = 0; hi < sizeof(hds) / sizeof(hds[0]); hi++) {
        int hd = hds[hi], nq = 4, nkv = 2, n = 9;
        size_t stride = (size_t)(nq + 2 * nkv) * (size_t)hd, nw = (size_t)n * stride;
        float *x = malloc(sizeof(float) * nw), *src = malloc(sizeof(float) * nw);
        float *w = malloc(sizeof(float) * 2 * (size_t)hd);
        fill(&rng, src, nw, 2.0f);
        fill(&rng, w, 2 * (size_t)hd, 0.5f);
        for (int i = 0; i < 2 * hd; i++)
            w[i] += 1.0f;
        FOR_EACH_ISA(isa)
        {
            for (int threads = 1; threads <= 2; threads++) {
                rank_t rk;
                void *qw, *kw;
                rank_open(&rk, threads, isa, 1, 4, 4, nkv, hd);
                assert_int_equal(
                    duet_backend_cpu.vector_create(rk.r, w, DUET_DTYPE_F32, 0, hd, &qw), 0);
                assert_int_equal(
                    duet_backend_cpu.vector_create(rk.r, w, DUET_DTYPE_F32, hd, hd, &kw), 0);
                memcpy(x, src, sizeof(float) * nw);
                assert_int_equal(
                    duet_backend_cpu.head_rmsnorm(rk.r, x, n, nq, nkv, hd, qw, kw, 1e-6f), 0);
                for (int t = 0; t < n; t++) {
                    for (int h = 0; h < nq + 2 * nkv; h++) {
                        const float *in = src + (size_t)t * stride + (size_t)h * (size_t)hd;
                        const float *got = x + (size_t)t * stride + (size_t)h * (size_t)hd;
                        const float *g = h < nq ? w : w + hd;
                        double ss = 0;
                        for (int i = 0; i < hd; i++)
                            ss += (double)in[i] * in[i];
                        double sc = 1.0 / sqrt(ss / hd + 1e-6);
                        for (int i = 0; i < hd; i++) {
                            double want = h < nq + nkv ? in[i] * sc * g[i] : in[i];
                            if (fabs(got[i] - want) > 1e-5 * (1 + fabs(want)))
                                fail_msg("head_rmsnorm hd %d t %d h %d i %d: %g vs %g", hd, t, h, i,
                                         got[i], want);
                        }
                    }
                }
                duet_backend_cpu.free(rk.r, qw);
                duet_backend_cpu.free(rk.r, kw);
                rank_close(&rk);
            }
        }
        free(x);
        free(src);
        free(w);
    }
}

/* rope_kv_store with a scaled table and an attention factor: the result
 * is the plain rotation with the table's angles, times the factor; a new
 * table (another model's) replaces the cached one. */
static void test_rope_scaled(void **state)
{
    (void)state;
    int nq = 2, nkv = 1, hd = 16, n = 5, ps = 4;
    size_t stride = (size_t)(nq + 2 * nkv) * (size_t)hd;
    float src[5 * 64], x[5 * 64], tab[8];
    int ctx[1] = {30}, n_new[1] = {5};
    int32_t pages[8] = {1, 0, 2, 3, 4, 5, 6, 7};
    batch_t *b = calloc(1, sizeof(batch_t));
    rng_t rng = {5};
    fill(&rng, src, (size_t)n * stride, 1.0f);
    batch_make(b, 1, ctx, n_new, pages, 8, ps);
    for (int round = 0; round < 2; round++) {
        float m = round == 0 ? 1.25f : 1.0f;
        for (int i = 0; i < hd / 2; i++)
            tab[i] = (float)(1.0 / pow(1e4, 2.0 * i / hd) / (round == 0 ? 3.0 : 1.0));
        rank_t rk;
        rank_open(&rk, 1, g_isa_max, 1, 8, ps, nkv, hd);
        assert_int_equal(duet_backend_cpu.batch_prepare(rk.r, &b->d), DUET_OK);
        for (int again = 0; again < 2; again++) { /* a second table on the same rank */
            if (again)
                for (int i = 0; i < hd / 2; i++)
                    tab[i] *= 0.5f;
            memcpy(x, src, sizeof(float) * (size_t)n * stride);
            assert_int_equal(duet_backend_cpu.rope_kv_store(rk.r, x, n, nq, nkv, hd, tab, m, 0),
                             DUET_OK);
            for (int t = 0; t < n; t++) {
                for (int h = 0; h < nq + nkv; h++) {
                    const float *in = src + (size_t)t * stride + (size_t)h * hd;
                    const float *got = x + (size_t)t * stride + (size_t)h * hd;
                    for (int i = 0; i < hd / 2; i++) {
                        double a = (double)((float)b->positions[t] * tab[i]);
                        double r1 = m * (in[i] * cos(a) - in[i + hd / 2] * sin(a));
                        double r2 = m * (in[i + hd / 2] * cos(a) + in[i] * sin(a));
                        if (fabs(got[i] - r1) > 1e-5 || fabs(got[i + hd / 2] - r2) > 1e-5)
                            fail_msg("scaled rope round %d t %d h %d i %d", round, t, h, i);
                    }
                }
            }
        }
        rank_close(&rk);
    }
    free(b);
}

/* rope_kv_store: rotated q/k in place, k/v in the pages at the slots; the
 * angle table made by the first layer is reused by the next. */
static void test_rope_kv_store(void **state)
{
    (void)state;
    const int nq = 6, nkv = 2, hd = 64, ps = 16, stride = (nq + 2 * nkv) * hd;
    const int ctx[3] = {300, 40, 9}, n_new[3] = {300, 3, 9};
    int32_t pages[3 * 20];
    batch_t *b = malloc(sizeof(batch_t));
    rng_t rng = {9};
    for (int i = 0; i < 60; i++)
        pages[i] = 59 - i;
    batch_make(b, 3, ctx, n_new, pages, 20, ps);
    int n = b->d.n_tokens;
    float *src = malloc(sizeof(float) * (size_t)n * stride);
    float *x = malloc(sizeof(float) * (size_t)n * stride);
    float *first = malloc(sizeof(float) * (size_t)n * stride);
    fill(&rng, src, (size_t)n * stride, 1.0f);
    FOR_EACH_ISA(isa)
    {
        for (int threads = 1; threads <= 2; threads++) {
            rank_t rk;
            rank_open(&rk, threads, isa, 2, 60, ps, nkv, hd);
            assert_int_equal(duet_backend_cpu.batch_prepare(rk.r, &b->d), DUET_OK);
            for (int layer = 0; layer < 2; layer++) {
                float theta = 10000.0f, tab[512];
                for (int i = 0; i < hd / 2; i++)
                    tab[i] = (float)(1.0 / pow(theta, 2.0 * i / hd));
                memcpy(x, src, sizeof(float) * (size_t)n * stride);
                assert_int_equal(
                    duet_backend_cpu.rope_kv_store(rk.r, x, n, nq, nkv, hd, tab, 1.0f, layer),
                    DUET_OK);
                for (int t = 0; t < n; t++) {
                    double pos = b->positions[t];
                    for (int h = 0; h < nq + nkv; h++) {
                        const float *in = src + (size_t)t * stride + (size_t)h * hd;
                        const float *got = x + (size_t)t * stride + (size_t)h * hd;
                        for (int i = 0; i < hd / 2; i++) {
                            double fr = 1.0 / pow(theta, 2.0 * i / hd);
                            double a = (double)(float)((float)pos * (float)fr);
                            double c = cos(a), s = sin(a);
                            double r1 = in[i] * c - in[i + hd / 2] * s;
                            double r2 = in[i + hd / 2] * c + in[i] * s;
                            double tol = 4e-6 * (fabs(in[i]) + fabs(in[i + hd / 2]));
                            if (fabs(got[i] - r1) > tol || fabs(got[i + hd / 2] - r2) > tol)
                                fail_msg("rope t %d h %d i %d: %g %g vs %g %g", t, h, i, got[i],
                                         got[i + hd / 2], r1, r2);
                        }
                    }
                    /* k and v at the token's slot */
                    int page = b->slots[t] / ps, off = b->slots[t] % ps;
                    for (int h = 0; h < nkv; h++) {
                        const float *kd = (const float *)((const char *)rk.pool +
                                                          duet_kv_offset(&rk.kv, layer, 0, page,
                                                                         h)) +
                                          (size_t)off * hd;
                        const float *vd = (const float *)((const char *)rk.pool +
                                                          duet_kv_offset(&rk.kv, layer, 1, page,
                                                                         h)) +
                                          (size_t)off * hd;
                        assert_memory_equal(kd, x + (size_t)t * stride + (size_t)(nq + h) * hd,
                                            hd * sizeof(float));
                        assert_memory_equal(vd,
                                            src + (size_t)t * stride +
                                                (size_t)(nq + nkv + h) * hd,
                                            hd * sizeof(float));
                    }
                }
                if (layer == 0 && threads == 1)
                    memcpy(first, x, sizeof(float) * (size_t)n * stride);
                else /* the table's second use and other pool sizes: same bits */
                    assert_memory_equal(first, x, sizeof(float) * (size_t)n * stride);
            }
            rank_close(&rk);
        }
    }
    free(b);
    free(src);
    free(x);
    free(first);
}

/* The element-wise backend ops, small (inline on the rank thread) and large
 * (split across the pool): the kernel's result for every row. */
static void test_backend_rows(void **state)
{
    (void)state;
    static const int ns[] = {1, 3, 16, 70};
    const int d = 771, vocab = 50;
    rng_t rng = {11};
    float *x = malloc(sizeof(float) * 70 * 2 * d), *y = malloc(sizeof(float) * 70 * 2 * d);
    float *w = malloc(sizeof(float) * d), *ref = malloc(sizeof(float) * 70 * 2 * d);
    float *tab = malloc(sizeof(float) * (size_t)vocab * d);
    uint16_t *tab16 = malloc(sizeof(uint16_t) * (size_t)vocab * d);
    fill(&rng, w, (size_t)d, 1.0f);
    fill(&rng, tab, (size_t)vocab * d, 1.0f);
    for (int i = 0; i < vocab * d; i++)
        tab16[i] = duet_f32_to_f16(tab[i]);
    FOR_EACH_ISA(isa)
    {
        for (int threads = 1; threads <= 3; threads += 2) {
            rank_t rk;
            rank_open(&rk, threads, isa, 1, 4, 16, 1, 8);
            const duet__cpu_ops_t *ops = rk.r->ops;
            for (size_t ni = 0; ni < sizeof(ns) / sizeof(ns[0]); ni++) {
                int n = ns[ni];
                batch_t *b = malloc(sizeof(batch_t));
                int ctx = n, zero = 0;
                (void)zero;
                int32_t pages[8] = {0, 1, 2, 3, 0, 0, 0, 0};
                batch_make(b, 1, &ctx, &ctx, pages, 8, 16);
                assert_int_equal(duet_backend_cpu.batch_prepare(rk.r, &b->d), DUET_OK);

                fill(&rng, x, (size_t)n * 2 * d, 4.0f);
                assert_int_equal(duet_backend_cpu.rmsnorm(rk.r, y, x, w, n, d, 1e-6f), DUET_OK);
                for (int t = 0; t < n; t++)
                    ops->rmsnorm(ref + (size_t)t * d, x + (size_t)t * d, w, d, 1e-6f);
                assert_memory_equal(y, ref, sizeof(float) * (size_t)n * d);

                assert_int_equal(duet_backend_cpu.silu_mul(rk.r, y, x, n, d), DUET_OK);
                for (int t = 0; t < n; t++)
                    ops->silu_mul(ref + (size_t)t * d, x + (size_t)t * 2 * d,
                                  x + (size_t)t * 2 * d + d, d);
                assert_memory_equal(y, ref, sizeof(float) * (size_t)n * d);

                memcpy(y, x, sizeof(float) * (size_t)n * d);
                assert_int_equal(duet_backend_cpu.add(rk.r, y, x + (size_t)n * d, (size_t)n * d),
                                 DUET_OK);
                for (size_t i = 0; i < (size_t)n * d; i++)
                    assert_true(y[i] == x[i] + x[(size_t)n * d + i]);

                duet_weight_t *emb;
                for (int dt = 0; dt < 2; dt++) {
                    assert_int_equal(duet_backend_cpu.embedding_create(
                                         rk.r, dt ? (const void *)tab16 : (const void *)tab,
                                         dt ? DUET_DTYPE_F16 : DUET_DTYPE_F32, vocab, d, &emb),
                                     DUET_OK);
                    assert_int_equal(duet_backend_cpu.embed(rk.r, y, emb, n, d), DUET_OK);
                    for (int t = 0; t < n; t++) {
                        for (int i = 0; i < d; i++) {
                            size_t at = (size_t)b->tokens[t] * d + i;
                            float e = dt ? duet_f16_to_f32(tab16[at]) : tab[at];
                            assert_true(y[(size_t)t * d + i] == e);
                        }
                    }
                    duet_backend_cpu.weight_destroy(rk.r, emb);
                }

                float mx[70];
                int32_t idx[70];
                assert_int_equal(duet_backend_cpu.argmax_rows(rk.r, mx, idx, x, n, d, 2 * d),
                                 DUET_OK);
                for (int t = 0; t < n; t++) {
                    const float *row = x + (size_t)t * 2 * d;
                    int32_t best = 0;
                    for (int i = 1; i < d; i++)
                        if (row[i] > row[best])
                            best = i;
                    assert_int_equal(idx[t], best);
                    assert_true(mx[t] == row[best]);
                }
                free(b);
            }
            rank_close(&rk);
        }
    }
    free(x);
    free(y);
    free(w);
    free(ref);
    free(tab);
    free(tab16);
}

/* The allocations of a batch (the RoPE table, the attention items) fail
 * cleanly and leave the rank usable. */
static void test_out_of_memory(void **state)
{
    (void)state;
    const int nq = 4, nkv = 2, hd = 16, stride = (nq + 2 * nkv) * hd;
    const int ctx[2] = {40, 7}, n_new[2] = {40, 2};
    int32_t pages[2 * 4] = {0, 1, 2, 3, 4, 5, 6, 7};
    batch_t *b = malloc(sizeof(batch_t));
    float *qkv = calloc((size_t)42 * stride, sizeof(float));
    float *out = malloc(sizeof(float) * 42 * nq * hd);
    rank_t rk;
    long live;

    batch_make(b, 2, ctx, n_new, pages, 4, 16);
    rank_open(&rk, 2, duet__cpu_ops_isa(), 1, 8, 16, nkv, hd);
    live = duet_alloc_live();
    duet_alloc_fail_after(0);
    assert_int_equal(duet_backend_cpu.batch_prepare(rk.r, &b->d), DUET_ERR_NO_MEMORY);
    duet_alloc_fail_after(-1);
    assert_int_equal(duet_alloc_live(), live);
    assert_int_equal(duet_backend_cpu.batch_prepare(rk.r, &b->d), DUET_OK);
    duet_alloc_fail_after(0);
    assert_int_equal(duet_backend_cpu.attention(rk.r, out, qkv, 42, nq, nkv, hd, 0),
                     DUET_ERR_NO_MEMORY);
    float tab[512];
    for (int i = 0; i < hd / 2; i++)
        tab[i] = (float)(1.0 / pow(1e4, 2.0 * i / hd));
    assert_int_equal(duet_backend_cpu.rope_kv_store(rk.r, qkv, 42, nq, nkv, hd, tab, 1.0f, 0),
                     DUET_ERR_NO_MEMORY);
    duet_alloc_fail_after(-1);
    assert_int_equal(duet_backend_cpu.rope_kv_store(rk.r, qkv, 42, nq, nkv, hd, tab, 1.0f, 0),
                     DUET_OK);
    assert_int_equal(duet_backend_cpu.attention(rk.r, out, qkv, 42, nq, nkv, hd, 0), DUET_OK);
    rank_close(&rk);
    free(b);
    free(qkv);
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rmsnorm),      cmocka_unit_test(test_silu_mul_add),
        cmocka_unit_test(test_rope_kernel),  cmocka_unit_test(test_to_f32_argmax),
        cmocka_unit_test(test_attention),    cmocka_unit_test(test_rope_kv_store),
        cmocka_unit_test(test_head_rmsnorm), cmocka_unit_test(test_rope_scaled),
        cmocka_unit_test(test_backend_rows), cmocka_unit_test(test_out_of_memory),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
