/* engine/cpu/matmul: every kernel family this CPU has (generic, avx2,
 * avx512) against a double-precision reference, over batch sizes that hit
 * the bandwidth and the GEMM paths and shapes that are not multiples of the
 * tile sizes; F32/F16/BF16 storage; bias; strided x and y; pool sizes; TP
 * shard packing; dtype conversion at pack time; bit-exact invariance across
 * thread counts, strides, batch composition and AVX2 vs AVX-512.
 *
 * Tolerance: |y - ref| <= 1e-5 * (sum_k |x_k w_k| + |bias|), where ref is
 * computed in double from the weights as rounded to the storage dtype (so
 * the bound is about f32 accumulation only, for every storage dtype). */
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
#include "engine/cpu/matmul.h"
#include "engine/cpu/matmul_internal.h"

#define TOL 1e-5

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

static float round_to(duet_dtype_t dt, float v)
{
    if (dt == DUET_DTYPE_F16)
        return duet_f16_to_f32(duet_f32_to_f16(v));
    if (dt == DUET_DTYPE_BF16)
        return duet_bf16_to_f32(duet_f32_to_bf16(v));
    return v;
}

static duet_cpu_pool_t *g_pool[4]; /* sizes 1, 2, 3 (index = size) */
static duet__mm_isa_t g_isa_max;

static int setup(void **state)
{
    (void)state;
    for (int t = 1; t <= 3; t++) {
        if (duet_cpu_pool_create(t, false, "mm", &g_pool[t]) != DUET_OK)
            return -1;
    }
    g_isa_max = duet__mm_isa_detect();
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    for (int t = 1; t <= 3; t++)
        duet_cpu_pool_destroy(g_pool[t]);
    return 0;
}

/* ref[i][j] = sum_k x[i][k] w[j][k] (double), mag[i][j] = sum |x w|. */
static void reference(int n, int m, int k, const float *x, size_t ldx, const float *wf, double *ref,
                      double *mag)
{
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < m; j++) {
            double s = 0, a = 0;
            for (int kk = 0; kk < k; kk++) {
                double p = (double)x[(size_t)i * ldx + kk] * wf[(size_t)j * k + kk];
                s += p;
                a += fabs(p);
            }
            ref[(size_t)i * m + j] = s;
            mag[(size_t)i * m + j] = a;
        }
    }
}

/* Checks y against the reference (plus bias) within TOL; returns the worst
 * error / bound ratio. */
static double check_ref(const char *what, int n, int m, const float *y, size_t ldy,
                        const double *ref, const double *mag, const float *bias)
{
    double worst = 0;
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < m; j++) {
            double r = ref[(size_t)i * m + j] + (bias != NULL ? bias[j] : 0.0);
            double bound =
                TOL * (mag[(size_t)i * m + j] + (bias != NULL ? fabs(bias[j]) : 0.0)) + 1e-30;
            double err = fabs((double)y[(size_t)i * ldy + j] - r);
            if (!(err <= bound))
                fail_msg("%s: y[%d][%d] = %.9g, reference %.9g, error %.3g > bound %.3g", what, i,
                         j, (double)y[(size_t)i * ldy + j], r, err, bound);
            if (err / bound > worst)
                worst = err / bound;
        }
    }
    return worst;
}

#define CANARY 12345.5f

/* y rows have ldy >= m; columns [m, ldy) and rows beyond n hold CANARY. */
static float *alloc_y(int n, size_t ldy)
{
    float *y = duet_malloc(((size_t)n + 1) * ldy * sizeof(float));
    assert_non_null(y);
    for (size_t i = 0; i < ((size_t)n + 1) * ldy; i++)
        y[i] = CANARY;
    return y;
}

static void check_canary(const char *what, int n, int m, const float *y, size_t ldy)
{
    for (size_t i = 0; i < ((size_t)n + 1) * ldy; i++) {
        if ((int)(i / ldy) >= n || (int)(i % ldy) >= m) {
            if (y[i] != CANARY)
                fail_msg("%s: wrote outside y at row %zu col %zu", what, i / ldy, i % ldy);
        }
    }
}

/* x with row stride ldx >= k; the padding is NaN so that reading it shows. */
static float *make_x(rng_t *rng, int n, int k, size_t ldx)
{
    float *x = duet_malloc((size_t)n * ldx * sizeof(float) + 64);
    assert_non_null(x);
    for (int i = 0; i < n; i++) {
        for (size_t kk = 0; kk < ldx; kk++)
            x[(size_t)i * ldx + kk] = (int)kk < k ? rng_unit(rng) : NAN;
    }
    return x;
}

static void copy_rows(float *dst, size_t ldd, const float *src, size_t lds, int n, int m)
{
    for (int i = 0; i < n; i++)
        memcpy(dst + (size_t)i * ldd, src + (size_t)i * lds, (size_t)m * sizeof(float));
}

static int rows_equal(const float *a, size_t lda, const float *b, size_t ldb, int n, int m)
{
    for (int i = 0; i < n; i++) {
        if (memcmp(a + (size_t)i * lda, b + (size_t)i * ldb, (size_t)m * sizeof(float)) != 0)
            return 0;
    }
    return 1;
}

static const int ns[] = {1, 2, 3, 7, 16, 17, 64, 130, 513};
static const duet_dtype_t store_dts[] = {DUET_DTYPE_F32, DUET_DTYPE_F16, DUET_DTYPE_BF16};

/* One (m, k) shape: every store dtype, every n, every ISA, pool sizes 1-3,
 * with bias + strides and without. */
static void run_shape(int m, int k, const int *nlist, int nn)
{
    rng_t rng = {(uint64_t)m * 7919 + (uint64_t)k};
    float *w = duet_malloc((size_t)m * k * sizeof(float));
    float *wf = duet_malloc((size_t)m * k * sizeof(float));
    float *bias = duet_malloc((size_t)m * sizeof(float));
    double worst = 0;

    assert_non_null(w);
    assert_non_null(wf);
    assert_non_null(bias);
    for (size_t i = 0; i < (size_t)m * k; i++)
        w[i] = rng_unit(&rng);
    for (int j = 0; j < m; j++)
        bias[j] = rng_unit(&rng) * 4;

    for (size_t d = 0; d < sizeof(store_dts) / sizeof(store_dts[0]); d++) {
        duet_dtype_t dt = store_dts[d];
        duet_cpu_weight_t pw;
        assert_int_equal(duet_cpu_weight_pack(w, DUET_DTYPE_F32, k, 0, m, 0, k, dt, &pw), DUET_OK);
        assert_int_equal(pw.rows, m);
        assert_int_equal(pw.cols, k);
        assert_int_equal(pw.dtype, dt);
        for (size_t i = 0; i < (size_t)m * k; i++)
            wf[i] = round_to(dt, w[i]);

        for (int ni = 0; ni < nn; ni++) {
            int n = nlist[ni];
            size_t ldx = (size_t)k + 5, ldy = (size_t)m + 3;
            float *x = make_x(&rng, n, k, ldx);
            float *xt = duet_malloc((size_t)n * k * sizeof(float) + 64);
            double *ref = duet_malloc((size_t)n * m * sizeof(double));
            double *mag = duet_malloc((size_t)n * m * sizeof(double));
            float *first[2][2] = {{NULL}}; /* [variant][generic | simd] */
            assert_non_null(xt);
            assert_non_null(ref);
            assert_non_null(mag);
            copy_rows(xt, (size_t)k, x, ldx, n, k);
            reference(n, m, k, x, ldx, wf, ref, mag);

            for (int isa = 0; isa <= (int)g_isa_max; isa++) {
                for (int t = 1; t <= 3; t++) {
                    for (int v = 0; v < 2; v++) {
                        /* v = 0: tight x and y, no bias; v = 1: strided, bias. */
                        char what[160];
                        size_t ly = v ? ldy : (size_t)m;
                        float *y = alloc_y(n, ly);
                        snprintf(what, sizeof(what), "%s m %d k %d n %d %s threads %d %s",
                                 duet__mm_isa_name((duet__mm_isa_t)isa), m, k, n,
                                 duet_dtype_name(dt), t, v ? "strided+bias" : "tight");
                        duet__cpu_matmul_isa((duet__mm_isa_t)isa, g_pool[t], y, ly, v ? x : xt,
                                             v ? ldx : (size_t)k, n, &pw, v ? bias : NULL);
                        double r = check_ref(what, n, m, y, ly, ref, mag, v ? bias : NULL);
                        if (r > worst)
                            worst = r;
                        check_canary(what, n, m, y, ly);
                        /* Bit-identical for every thread count and stride;
                         * AVX2 and AVX-512 agree bit for bit too. */
                        int fam = isa == DUET__MM_ISA_GENERIC ? 0 : 1;
                        if (first[v][fam] == NULL) {
                            first[v][fam] = duet_malloc((size_t)n * m * sizeof(float));
                            assert_non_null(first[v][fam]);
                            copy_rows(first[v][fam], (size_t)m, y, ly, n, m);
                        } else if (!rows_equal(first[v][fam], (size_t)m, y, ly, n, m)) {
                            fail_msg("%s: differs bitwise from the first run of its family", what);
                        }
                        duet_free(y);
                    }
                }
            }
            for (int v = 0; v < 2; v++) {
                for (int f = 0; f < 2; f++)
                    duet_free(first[v][f]);
            }
            duet_free(mag);
            duet_free(ref);
            duet_free(xt);
            duet_free(x);
        }
        duet_cpu_weight_free(&pw);
    }
    print_message("m %d k %d: worst error / bound %.3f\n", m, k, worst);
    duet_free(bias);
    duet_free(wf);
    duet_free(w);
}

static void test_matmul_small_shapes(void **state)
{
    (void)state;
    static const int shapes[][2] = {{1, 1}, {3, 17}, {17, 3}, {64, 64}, {100, 100}, {1000, 17}};
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
        run_shape(shapes[s][0], shapes[s][1], ns, (int)(sizeof(ns) / sizeof(ns[0])));
}

static void test_matmul_model_shapes(void **state)
{
    (void)state;
    /* k = 1000: three full k blocks and a partial one; m = 768 = 24 panels. */
    run_shape(768, 1000, ns, (int)(sizeof(ns) / sizeof(ns[0])));
    /* m = 33: one full panel plus one column. */
    run_shape(33, 768, ns, (int)(sizeof(ns) / sizeof(ns[0])));
}

/* Long k: x no longer fits the bandwidth path's scratch for n = 64, so the
 * GEMM path runs with a small n; n = 3 still streams. */
static void test_matmul_long_k(void **state)
{
    (void)state;
    static const int nl[] = {3, 64, 65};
    run_shape(70, 8200, nl, 3);
}

/* Row i of a batch equals the same row computed alone or in another batch. */
static void test_matmul_batch_invariance(void **state)
{
    (void)state;
    const int m = 300, k = 700, n = 130;
    rng_t rng = {99};
    float *w = duet_malloc((size_t)m * k * sizeof(float));
    float *bias = duet_malloc((size_t)m * sizeof(float));
    float *x = make_x(&rng, n, k, (size_t)k);
    float *yall = alloc_y(n, (size_t)m), *ypart = alloc_y(n, (size_t)m);
    assert_non_null(w);
    assert_non_null(bias);
    for (size_t i = 0; i < (size_t)m * k; i++)
        w[i] = rng_unit(&rng);
    for (int j = 0; j < m; j++)
        bias[j] = rng_unit(&rng);
    for (size_t d = 0; d < 3; d++) {
        duet_cpu_weight_t pw;
        assert_int_equal(duet_cpu_weight_pack(w, DUET_DTYPE_F32, k, 0, m, 0, k, store_dts[d], &pw),
                         DUET_OK);
        for (int isa = 0; isa <= (int)g_isa_max; isa++) {
            duet__cpu_matmul_isa((duet__mm_isa_t)isa, g_pool[2], yall, (size_t)m, x, (size_t)k, n,
                                 &pw, bias);
            /* The same rows in batches of 1, 5, 16, 40, 69 (both paths). */
            static const int chunks[] = {1, 5, 16, 40, 69};
            for (size_t c = 0; c < sizeof(chunks) / sizeof(chunks[0]); c++) {
                for (int i0 = 0; i0 < n; i0 += chunks[c]) {
                    int cn = n - i0 < chunks[c] ? n - i0 : chunks[c];
                    duet__cpu_matmul_isa((duet__mm_isa_t)isa, g_pool[3], ypart + (size_t)i0 * m,
                                         (size_t)m, x + (size_t)i0 * k, (size_t)k, cn, &pw, bias);
                }
                if (!rows_equal(yall, (size_t)m, ypart, (size_t)m, n, m))
                    fail_msg("%s %s: batch of %d differs from batch of %d",
                             duet__mm_isa_name((duet__mm_isa_t)isa), duet_dtype_name(store_dts[d]),
                             chunks[c], n);
            }
        }
        duet_cpu_weight_free(&pw);
    }
    duet_free(ypart);
    duet_free(yall);
    duet_free(x);
    duet_free(bias);
    duet_free(w);
}

/* Worker grids with both row groups and panel groups (pool sizes 4, 5). */
static void test_matmul_worker_grid(void **state)
{
    (void)state;
    const int m = 200, k = 300;
    rng_t rng = {5};
    float *w = duet_malloc((size_t)m * k * sizeof(float));
    duet_cpu_weight_t pw;
    assert_non_null(w);
    for (size_t i = 0; i < (size_t)m * k; i++)
        w[i] = rng_unit(&rng);
    assert_int_equal(duet_cpu_weight_pack(w, DUET_DTYPE_F32, k, 0, m, 0, k, DUET_DTYPE_F32, &pw),
                     DUET_OK);
    for (int t = 4; t <= 5; t++) {
        duet_cpu_pool_t *pool = NULL;
        assert_int_equal(duet_cpu_pool_create(t, false, "g", &pool), DUET_OK);
        static const int nl[] = {65, 100, 513};
        for (size_t ni = 0; ni < 3; ni++) {
            int n = nl[ni];
            float *x = make_x(&rng, n, k, (size_t)k);
            float *y1 = alloc_y(n, (size_t)m), *yt = alloc_y(n, (size_t)m);
            for (int isa = 0; isa <= (int)g_isa_max; isa++) {
                duet__cpu_matmul_isa((duet__mm_isa_t)isa, g_pool[1], y1, (size_t)m, x, (size_t)k, n,
                                     &pw, NULL);
                duet__cpu_matmul_isa((duet__mm_isa_t)isa, pool, yt, (size_t)m, x, (size_t)k, n, &pw,
                                     NULL);
                if (!rows_equal(y1, (size_t)m, yt, (size_t)m, n, m))
                    fail_msg("threads %d n %d %s: differs from 1 thread", t, n,
                             duet__mm_isa_name((duet__mm_isa_t)isa));
                check_canary("grid", n, m, yt, (size_t)m);
            }
            duet_free(yt);
            duet_free(y1);
            duet_free(x);
        }
        duet_cpu_pool_destroy(pool);
    }
    duet_cpu_weight_free(&pw);
    duet_free(w);
}

/* Values spread over many binades (within F16's finite range) so that
 * conversions round. */
static float wide_value(rng_t *rng)
{
    int e = (int)(rng_next(rng) % 36) - 20;
    return ldexpf(rng_unit(rng), e);
}

static void fill_src(void *src, duet_dtype_t dt, const float *v, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        if (dt == DUET_DTYPE_F32)
            ((float *)src)[i] = v[i];
        else if (dt == DUET_DTYPE_F16)
            ((uint16_t *)src)[i] = duet_f32_to_f16(v[i]);
        else
            ((uint16_t *)src)[i] = duet_f32_to_bf16(v[i]);
    }
}

/* Every source x storage dtype pair: reading W back through the matmul with
 * x = identity (one exact product per output) gives exactly the source
 * value converted once to the storage dtype (round to nearest even). */
static void test_matmul_pack_conversions(void **state)
{
    (void)state;
    const int m = 37, k = 19;
    rng_t rng = {77};
    float v[37 * 19], x[19 * 19];
    char src[37 * 19 * 4];
    memset(x, 0, sizeof(x));
    for (int i = 0; i < k; i++)
        x[i * k + i] = 1.0f;
    for (int i = 0; i < m * k; i++)
        v[i] = wide_value(&rng);
    for (int sd = 0; sd < 3; sd++) {
        duet_dtype_t sdt = store_dts[sd];
        fill_src(src, sdt, v, (size_t)m * k);
        for (int dd = 0; dd < 3; dd++) {
            duet_dtype_t ddt = store_dts[dd];
            duet_cpu_weight_t pw;
            float y[19 * 37], srcval[1];
            assert_int_equal(duet_cpu_weight_pack(src, sdt, k, 0, m, 0, k, ddt, &pw), DUET_OK);
            for (int isa = 0; isa <= (int)g_isa_max; isa++) {
                duet__cpu_matmul_isa((duet__mm_isa_t)isa, g_pool[1], y, (size_t)m, x, (size_t)k, k,
                                     &pw, NULL);
                for (int j = 0; j < m; j++) {
                    for (int kk = 0; kk < k; kk++) {
                        duet_dtype_to_f32(sdt, src + ((size_t)j * k + kk) * duet_dtype_size(sdt),
                                          srcval, 1);
                        float want = round_to(ddt, srcval[0]);
                        /* == : a product with 1 cannot keep the sign of a zero weight */
                        if (!(want == y[(size_t)kk * m + j]))
                            fail_msg("%s -> %s (%s): W[%d][%d] = %.9g, want %.9g",
                                     duet_dtype_name(sdt), duet_dtype_name(ddt),
                                     duet__mm_isa_name((duet__mm_isa_t)isa), j, kk,
                                     (double)y[(size_t)kk * m + j], (double)want);
                    }
                }
            }
            duet_cpu_weight_free(&pw);
        }
    }
}

/* TP shards: packing a row or column block of a bigger matrix equals packing
 * that block copied out; a row shard's output is the matching slice of the
 * full output bit for bit; column shards' outputs sum to the full output. */
static void test_matmul_shards(void **state)
{
    (void)state;
    const int R = 100, C = 300, n = 16;
    rng_t rng = {123};
    float *v = duet_malloc((size_t)R * C * sizeof(float));
    char *src = duet_malloc((size_t)R * C * 4);
    char *blk = duet_malloc((size_t)R * C * 4);
    float *x = make_x(&rng, 130, C, (size_t)C);
    float *yfull = alloc_y(130, (size_t)R), *ys = alloc_y(130, (size_t)R),
          *ys2 = alloc_y(130, (size_t)R);
    assert_non_null(v);
    assert_non_null(src);
    assert_non_null(blk);
    for (size_t i = 0; i < (size_t)R * C; i++)
        v[i] = rng_unit(&rng);

    for (int sd = 0; sd < 3; sd++) {
        duet_dtype_t sdt = store_dts[sd];
        size_t es = duet_dtype_size(sdt);
        fill_src(src, sdt, v, (size_t)R * C);
        for (int dd = 0; dd < 3; dd++) {
            duet_dtype_t ddt = store_dts[dd];
            duet_cpu_weight_t full;
            assert_int_equal(duet_cpu_weight_pack(src, sdt, C, 0, R, 0, C, ddt, &full), DUET_OK);
            static const int blocks[][4] = {
                /* row0, rows, col0, cols */
                {32, 40, 0, 300}, {7, 50, 0, 300},  {99, 1, 0, 300},  {0, 100, 100, 150},
                {0, 100, 13, 77}, {0, 100, 299, 1}, {3, 61, 17, 200},
            };
            for (size_t b = 0; b < sizeof(blocks) / sizeof(blocks[0]); b++) {
                int row0 = blocks[b][0], rows = blocks[b][1], col0 = blocks[b][2],
                    cols = blocks[b][3];
                duet_cpu_weight_t sh, ref;
                for (int r = 0; r < rows; r++)
                    memcpy(blk + (size_t)r * cols * es, src + (((size_t)row0 + r) * C + col0) * es,
                           (size_t)cols * es);
                assert_int_equal(
                    duet_cpu_weight_pack(src, sdt, C, row0, rows, col0, cols, ddt, &sh), DUET_OK);
                assert_int_equal(duet_cpu_weight_pack(blk, sdt, cols, 0, rows, 0, cols, ddt, &ref),
                                 DUET_OK);
                assert_int_equal(sh.bytes, ref.bytes);
                assert_int_equal(sh.rows, rows);
                assert_int_equal(sh.cols, cols);
                assert_memory_equal(sh.data, ref.data, sh.bytes);
                if (cols == C) {
                    /* Column-parallel shard: a column slice of the full y. */
                    static const int nl[] = {1, 16, 130};
                    for (int ni = 0; ni < 3; ni++) {
                        int nn = nl[ni];
                        for (int isa = 0; isa <= (int)g_isa_max; isa++) {
                            duet__cpu_matmul_isa((duet__mm_isa_t)isa, g_pool[2], yfull, (size_t)R,
                                                 x, (size_t)C, nn, &full, NULL);
                            duet__cpu_matmul_isa((duet__mm_isa_t)isa, g_pool[3], ys, (size_t)R, x,
                                                 (size_t)C, nn, &sh, NULL);
                            if (!rows_equal(yfull + row0, (size_t)R, ys, (size_t)R, nn, rows))
                                fail_msg("row shard %d+%d (%s->%s, %s, n %d): not the slice of "
                                         "the full output",
                                         row0, rows, duet_dtype_name(sdt), duet_dtype_name(ddt),
                                         duet__mm_isa_name((duet__mm_isa_t)isa), nn);
                        }
                    }
                } else if (row0 == 0 && rows == R) {
                    /* Row-parallel: shard [col0, col0+cols) plus the rest
                     * ([0, col0) and [col0+cols, C)) sum to the full y. */
                    duet_cpu_weight_t lo, hi;
                    int has_lo = col0 > 0, has_hi = col0 + cols < C;
                    duet__cpu_matmul_isa(g_isa_max, g_pool[2], yfull, (size_t)R, x, (size_t)C, n,
                                         &full, NULL);
                    duet__cpu_matmul_isa(g_isa_max, g_pool[2], ys, (size_t)R, x + col0, (size_t)C,
                                         n, &sh, NULL);
                    for (int i = 0; i < n * R; i++)
                        ys2[i] = 0;
                    if (has_lo) {
                        float *t = alloc_y(n, (size_t)R);
                        assert_int_equal(duet_cpu_weight_pack(src, sdt, C, 0, R, 0, col0, ddt, &lo),
                                         DUET_OK);
                        duet__cpu_matmul_isa(g_isa_max, g_pool[1], t, (size_t)R, x, (size_t)C, n,
                                             &lo, NULL);
                        for (int i = 0; i < n * R; i++)
                            ys2[i] += t[i];
                        duet_cpu_weight_free(&lo);
                        duet_free(t);
                    }
                    if (has_hi) {
                        float *t = alloc_y(n, (size_t)R);
                        assert_int_equal(duet_cpu_weight_pack(src, sdt, C, 0, R, col0 + cols,
                                                              C - col0 - cols, ddt, &hi),
                                         DUET_OK);
                        duet__cpu_matmul_isa(g_isa_max, g_pool[3], t, (size_t)R, x + col0 + cols,
                                             (size_t)C, n, &hi, NULL);
                        for (int i = 0; i < n * R; i++)
                            ys2[i] += t[i];
                        duet_cpu_weight_free(&hi);
                        duet_free(t);
                    }
                    for (int i = 0; i < n; i++) {
                        for (int j = 0; j < R; j++) {
                            double sum = (double)ys[i * R + j] + ys2[i * R + j];
                            double mag = 0;
                            for (int kk = 0; kk < C; kk++)
                                mag += fabs((double)x[(size_t)i * C + kk] *
                                            round_to(ddt, v[(size_t)j * C + kk]));
                            if (fabs(sum - yfull[i * R + j]) > 2 * TOL * mag + 1e-30)
                                fail_msg("column shards %d+%d: partial sums %.9g vs full %.9g",
                                         col0, cols, sum, (double)yfull[i * R + j]);
                        }
                    }
                }
                duet_cpu_weight_free(&ref);
                duet_cpu_weight_free(&sh);
            }
            duet_cpu_weight_free(&full);
        }
    }
    duet_free(ys2);
    duet_free(ys);
    duet_free(yfull);
    duet_free(x);
    duet_free(blk);
    duet_free(src);
    duet_free(v);
}

static void test_matmul_invalid(void **state)
{
    (void)state;
    float src[12] = {0};
    duet_cpu_weight_t w;
    long live = duet_alloc_live();

    memset(&w, 0, sizeof(w));
    assert_int_equal(duet_cpu_weight_pack(NULL, DUET_DTYPE_F32, 4, 0, 3, 0, 4, DUET_DTYPE_F32, &w),
                     DUET_ERR_INVALID);
    assert_int_equal(duet_cpu_weight_pack(src, DUET_DTYPE_I32, 4, 0, 3, 0, 4, DUET_DTYPE_F32, &w),
                     DUET_ERR_UNSUPPORTED);
    assert_int_equal(duet_cpu_weight_pack(src, DUET_DTYPE_F32, 4, 0, 3, 0, 4, DUET_DTYPE_I64, &w),
                     DUET_ERR_UNSUPPORTED);
    assert_int_equal(duet_cpu_weight_pack(src, DUET_DTYPE_F32, 4, 0, 0, 0, 4, DUET_DTYPE_F32, &w),
                     DUET_ERR_INVALID);
    assert_int_equal(duet_cpu_weight_pack(src, DUET_DTYPE_F32, 4, 0, 3, 1, 4, DUET_DTYPE_F32, &w),
                     DUET_ERR_INVALID);
    assert_int_equal(duet_cpu_weight_pack(src, DUET_DTYPE_F32, 4, -1, 3, 0, 4, DUET_DTYPE_F32, &w),
                     DUET_ERR_INVALID);
    assert_int_equal(duet_cpu_weight_pack(src, DUET_DTYPE_F32, 4, 0, 3, 0, 0, DUET_DTYPE_F32, &w),
                     DUET_ERR_INVALID);
    assert_null(w.data); /* untouched on failure */

    duet_alloc_fail_after(0);
    assert_int_equal(duet_cpu_weight_pack(src, DUET_DTYPE_F32, 4, 0, 3, 0, 4, DUET_DTYPE_F32, &w),
                     DUET_ERR_NO_MEMORY);
    duet_alloc_fail_after(-1);
    assert_null(w.data);

    assert_int_equal(duet_cpu_weight_pack(src, DUET_DTYPE_F32, 4, 0, 3, 0, 4, DUET_DTYPE_F16, &w),
                     DUET_OK);
    duet_cpu_weight_free(&w);
    duet_cpu_weight_free(&w); /* idempotent */
    duet_cpu_weight_free(NULL);
    assert_int_equal(duet_alloc_live(), live);

    /* n = 0 writes nothing. */
    {
        float y[4] = {CANARY, CANARY, CANARY, CANARY};
        assert_int_equal(
            duet_cpu_weight_pack(src, DUET_DTYPE_F32, 4, 0, 3, 0, 4, DUET_DTYPE_F32, &w), DUET_OK);
        duet_cpu_matmul(g_pool[2], y, 3, src, 4, 0, &w, NULL);
        for (int i = 0; i < 4; i++)
            assert_true(y[i] == CANARY);
        duet_cpu_weight_free(&w);
    }
}

static void test_matmul_isa_choice(void **state)
{
    (void)state;
    int ign;
    const char *name = duet_cpu_matmul_isa();
    const char *env = getenv("DUET_CPU_ISA");

    assert_true(strcmp(name, "generic") == 0 || strcmp(name, "avx2") == 0 ||
                strcmp(name, "avx512") == 0);
    if (env == NULL)
        assert_string_equal(name, duet__mm_isa_name(duet__mm_isa_detect()));

    assert_int_equal(duet__mm_isa_choose(DUET__MM_ISA_AVX512, NULL, &ign), DUET__MM_ISA_AVX512);
    assert_int_equal(ign, 0);
    assert_int_equal(duet__mm_isa_choose(DUET__MM_ISA_AVX512, "", &ign), DUET__MM_ISA_AVX512);
    assert_int_equal(duet__mm_isa_choose(DUET__MM_ISA_AVX512, "avx2", &ign), DUET__MM_ISA_AVX2);
    assert_int_equal(ign, 0);
    assert_int_equal(duet__mm_isa_choose(DUET__MM_ISA_AVX512, "generic", &ign),
                     DUET__MM_ISA_GENERIC);
    assert_int_equal(duet__mm_isa_choose(DUET__MM_ISA_AVX2, "avx512", &ign), DUET__MM_ISA_AVX2);
    assert_int_equal(ign, 1);
    assert_int_equal(duet__mm_isa_choose(DUET__MM_ISA_GENERIC, "avx2", &ign), DUET__MM_ISA_GENERIC);
    assert_int_equal(ign, 1);
    assert_int_equal(duet__mm_isa_choose(DUET__MM_ISA_AVX2, "sse9", &ign), DUET__MM_ISA_AVX2);
    assert_int_equal(ign, 1);
    print_message("isa: detected %s, in use %s\n", duet__mm_isa_name(duet__mm_isa_detect()), name);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul_isa_choice),
        cmocka_unit_test(test_matmul_invalid),
        cmocka_unit_test(test_matmul_pack_conversions),
        cmocka_unit_test(test_matmul_shards),
        cmocka_unit_test(test_matmul_small_shapes),
        cmocka_unit_test(test_matmul_model_shapes),
        cmocka_unit_test(test_matmul_long_k),
        cmocka_unit_test(test_matmul_batch_invariance),
        cmocka_unit_test(test_matmul_worker_grid),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
