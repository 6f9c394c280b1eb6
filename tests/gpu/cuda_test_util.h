/* Helpers for the cuda backend's unit tests (tests/unit/test_cuda_*.c):
 * the cpu backend is the reference; inputs are drawn at random, rounded to
 * bf16 and given to both backends, so the comparison sees only the cuda
 * backend's arithmetic and its bf16 outputs.  Include after cmocka.h, only
 * when DUET_HAVE_CUDA is defined. */
#ifndef DUET_TESTS_GPU_CUDA_TEST_UTIL_H
#define DUET_TESTS_GPU_CUDA_TEST_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "engine/backend.h"
#include "engine/cuda/backend_cuda.h"
#include "kv/dtype.h"

/* skip() unless a CUDA device is present (CI builds have nvcc, no GPU) */
#define DUET_TEST_NEED_GPU()                                                                       \
    do {                                                                                           \
        if (duet_cuda_device_count() < 1) {                                                        \
            fprintf(stderr, "no CUDA device: skipped\n");                                          \
            skip();                                                                                \
        }                                                                                          \
    } while (0)

typedef struct {
    uint64_t s;
} duet_test_rng_t;

static inline float duet_test_uniform(duet_test_rng_t *g)
{
    g->s = g->s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((g->s >> 40) & 0xffffff) / 16777216.0f; /* [0, 1) */
}

/* x[i] = bf16-representable value uniform in [-scale, scale) */
/* Unscaled RoPE inverse frequencies theta^(-2i/hd), hd <= 1024, into a
 * static table (rope_kv_store's inv_freq argument). */
static inline const float *duet_test_rope_table(int hd, double theta)
{
    static float tab[512];
    for (int i = 0; i < hd / 2; i++)
        tab[i] = (float)(1.0 / pow(theta, (double)(2 * i) / (double)hd));
    return tab;
}

static inline void duet_test_fill(duet_test_rng_t *g, float *x, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++)
        x[i] = duet_bf16_to_f32(duet_f32_to_bf16((2.0f * duet_test_uniform(g) - 1.0f) * scale));
}

static inline void duet_test_to_bf16(const float *x, uint16_t *y, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] = duet_f32_to_bf16(x[i]);
}

static inline void duet_test_from_bf16(const uint16_t *x, float *y, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] = duet_bf16_to_f32(x[i]);
}

/* device bf16 copy of float x[n] */
static inline void *duet_test_dev_bf16(const duet_backend_ops_t *ops, duet_backend_rank_t *r,
                                       const float *x, size_t n)
{
    uint16_t *h = duet_malloc(n * 2 + 2);
    void *d = ops->alloc(r, n * 2 + 2);
    if (h == NULL || d == NULL)
        return NULL;
    duet_test_to_bf16(x, h, n);
    if (ops->upload(r, d, h, n * 2) != DUET_OK)
        d = NULL;
    duet_free(h);
    return d;
}

/* float copy of device bf16 d[n] */
static inline int duet_test_host_f32(const duet_backend_ops_t *ops, duet_backend_rank_t *r,
                                     const void *d, float *x, size_t n)
{
    uint16_t *h = duet_malloc(n * 2 + 2);
    int rc = -1;
    if (h != NULL && ops->download(r, h, d, n * 2) == DUET_OK) {
        duet_test_from_bf16(h, x, n);
        rc = 0;
    }
    duet_free(h);
    return rc;
}

typedef struct {
    double max_err; /* max |got - ref| */
    double max_ref; /* max |ref| */
    double rel_l2;  /* ||got - ref|| / ||ref|| */
    size_t worst;   /* index of max_err */
    size_t bad;     /* elements over the element bound */
    int nan;        /* got has NaN or Inf */
} duet_test_cmp_t;

/* Element bound: |got - ref| <= rtol |ref| + atol_frac * max|ref|, and the
 * whole: rel_l2 <= l2tol.  Prints the measured errors. */
static inline duet_test_cmp_t duet_test_compare(const char *what, const float *got,
                                                const float *ref, size_t n, double rtol,
                                                double atol_frac, double l2tol)
{
    duet_test_cmp_t c = {0};
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (fabs(ref[i]) > c.max_ref)
            c.max_ref = fabs(ref[i]);
    }
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)ref[i]);
        if (!isfinite(got[i]))
            c.nan = 1;
        if (d > c.max_err || !isfinite(d)) {
            c.max_err = d;
            c.worst = i;
        }
        if (!(d <= rtol * fabs(ref[i]) + atol_frac * c.max_ref))
            c.bad++;
        num += d * d;
        den += (double)ref[i] * (double)ref[i];
    }
    c.rel_l2 = den > 0 ? sqrt(num / den) : sqrt(num);
    fprintf(stderr,
            "%-34s n %-8zu max|err| %.3g (at %zu: got %.6g ref %.6g) max|ref| %.3g rel_l2 %.3g "
            "(<= %.3g) over-bound %zu %s\n",
            what, n, c.max_err, c.worst, n ? (double)got[c.worst] : 0.0,
            n ? (double)ref[c.worst] : 0.0, c.max_ref, c.rel_l2, l2tol, c.bad,
            c.nan || c.bad || c.rel_l2 > l2tol ? "FAIL" : "ok");
    return c;
}

#define DUET_TEST_ASSERT_CLOSE(what, got, ref, n, rtol, atol_frac, l2tol)                          \
    do {                                                                                           \
        duet_test_cmp_t c_ = duet_test_compare(what, got, ref, n, rtol, atol_frac, l2tol);         \
        assert_int_equal(c_.nan, 0);                                                               \
        assert_int_equal(c_.bad, 0);                                                               \
        assert_true(c_.rel_l2 <= (l2tol));                                                         \
    } while (0)

/* A batch: sequence s brings n_new[s] tokens at positions start[s]..;
 * its pages are perm[s * stride + i] of a fixed permutation of the pool
 * (the same for every call with the same stride), so a later batch of the
 * same sequences continues in the same pages. */
typedef struct {
    duet_batch_desc_t d;
    int32_t *tokens, *positions, *slots, *q_start, *ctx_len, *page_table;
} duet_test_batch_t;

static inline void duet_test_batch_make(duet_test_batch_t *b, int n_seqs, const int *n_new,
                                        const int *start, int page_size, int n_pages, int stride,
                                        int vocab)
{
    int n = 0, max_ctx = 0;
    int32_t *perm = duet_malloc((size_t)n_pages * sizeof(int32_t));
    for (int s = 0; s < n_seqs; s++)
        n += n_new[s];
    memset(b, 0, sizeof(*b));
    b->tokens = duet_malloc((size_t)n * sizeof(int32_t));
    b->positions = duet_malloc((size_t)n * sizeof(int32_t));
    b->slots = duet_malloc((size_t)n * sizeof(int32_t));
    b->q_start = duet_malloc((size_t)(n_seqs + 1) * sizeof(int32_t));
    b->ctx_len = duet_malloc((size_t)n_seqs * sizeof(int32_t));
    b->page_table = duet_calloc((size_t)n_seqs * (size_t)stride, sizeof(int32_t));
    assert_true(perm && b->tokens && b->positions && b->slots && b->q_start && b->ctx_len &&
                b->page_table);
    assert_true(n_seqs * stride <= n_pages);
    for (int i = 0; i < n_pages; i++)
        perm[i] = i;
    for (int i = n_pages - 1; i > 0; i--) { /* fixed shuffle */
        int j = (int)((uint64_t)(i * 2654435761u) % (uint64_t)(i + 1));
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int s = 0, t = 0; s < n_seqs; s++) {
        int ctx = start[s] + n_new[s];
        assert_true((ctx + page_size - 1) / page_size <= stride);
        b->q_start[s] = t;
        b->ctx_len[s] = ctx;
        max_ctx = ctx > max_ctx ? ctx : max_ctx;
        for (int i = 0; i < stride; i++)
            b->page_table[s * stride + i] = perm[s * stride + i];
        for (int k = 0; k < n_new[s]; k++, t++) {
            int pos = start[s] + k;
            b->tokens[t] = (int32_t)((pos * 7919u + (unsigned)s * 104729u) % (unsigned)vocab);
            b->positions[t] = pos;
            b->slots[t] = b->page_table[s * stride + pos / page_size] * page_size + pos % page_size;
        }
    }
    b->q_start[n_seqs] = n;
    b->d = (duet_batch_desc_t){n,          n_seqs,     b->tokens,     b->positions, b->slots,
                               b->q_start, b->ctx_len, b->page_table, stride,       max_ctx};
    duet_free(perm);
}

static inline void duet_test_batch_free(duet_test_batch_t *b)
{
    duet_free(b->tokens);
    duet_free(b->positions);
    duet_free(b->slots);
    duet_free(b->q_start);
    duet_free(b->ctx_len);
    duet_free(b->page_table);
}

/* A cpu and a cuda rank over the same KV layout (elem sizes 4 and 2). */
typedef struct {
    duet_backend_rank_t *cpu, *gpu;
    void *kv_cpu, *kv_gpu;
    duet_kv_layout_t kv;
} duet_test_pair_t;

static inline void duet_test_pair_open(duet_test_pair_t *p, duet_kv_layout_t kv)
{
    duet_backend_rank_opts_t o = {.rank = 0, .tp = 1, .threads = 2, .spin = false, .device = 0};
    memset(p, 0, sizeof(*p));
    p->kv = kv;
    o.kv_layout = kv;
    o.kv_layout.elem_size = 4;
    assert_int_equal(duet_backend_cpu.rank_create(&o, &p->cpu), DUET_OK);
    o.kv_layout.elem_size = 2;
    assert_int_equal(duet_backend_cuda.rank_create(&o, &p->gpu), DUET_OK);
    if (kv.n_layers > 0) {
        duet_kv_layout_t k4 = kv, k2 = kv;
        k4.elem_size = 4;
        k2.elem_size = 2;
        p->kv_cpu = duet_backend_cpu.alloc(p->cpu, duet_kv_total_bytes(&k4));
        p->kv_gpu = duet_backend_cuda.alloc(p->gpu, duet_kv_total_bytes(&k2));
        assert_non_null(p->kv_cpu);
        assert_non_null(p->kv_gpu);
        memset(p->kv_cpu, 0, duet_kv_total_bytes(&k4));
        duet_backend_cpu.kv_attach(p->cpu, p->kv_cpu);
        duet_backend_cuda.kv_attach(p->gpu, p->kv_gpu);
    }
}

static inline void duet_test_pair_close(duet_test_pair_t *p)
{
    duet_backend_cpu.free(p->cpu, p->kv_cpu);
    duet_backend_cuda.free(p->gpu, p->kv_gpu);
    duet_backend_cpu.rank_destroy(p->cpu);
    duet_backend_cuda.rank_destroy(p->gpu);
}

#endif
