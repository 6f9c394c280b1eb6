/* cuda matmul (cuBLASLt) against the cpu backend: y = x W^T (+ bias) for
 * stacked sources (q/k/v-like row slices, a column slice for row-parallel
 * layers), f32 / f16 / bf16 checkpoints with bf16-representable values, so
 * both backends multiply the same numbers.  The GPU accumulates in float32
 * and rounds y once to bf16.  Bound: |err| <= 2^-7 |ref| + 2e-3 max|ref|
 * (the second term covers outputs that cancel to near zero), rel_l2 <=
 * 5e-3.  n <= 4 runs the skinny GEMV kernel, larger n cuBLASLt. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "engine/backend.h"

#ifdef DUET_HAVE_CUDA
#include "tests/gpu/cuda_test_util.h"

/* W source matrix [src_rows][src_cols] in dtype, values bf16-representable */
static void *make_src(duet_test_rng_t *g, int rows, int cols, duet_dtype_t dt, float scale)
{
    size_t n = (size_t)rows * cols;
    float *f = duet_malloc(n * sizeof(float));
    duet_test_fill(g, f, n, scale);
    if (dt == DUET_DTYPE_F32)
        return f;
    uint16_t *h = duet_malloc(n * 2);
    for (size_t i = 0; i < n; i++)
        h[i] = dt == DUET_DTYPE_BF16 ? duet_f32_to_bf16(f[i]) : duet_f32_to_f16(f[i]);
    duet_free(f);
    return h;
}

static void run(duet_test_pair_t *p, int n, int n_src, const int *rows, int cols, int src_cols,
                int col0, duet_dtype_t dt, bool bias)
{
    duet_test_rng_t g = {29u * (unsigned)cols + (unsigned)n + (unsigned)n_src};
    duet_weight_src_t srcs[3];
    void *mats[3];
    int total = 0;
    for (int i = 0; i < n_src; i++) {
        int src_rows = rows[i] + 3;
        mats[i] = make_src(&g, src_rows, src_cols, dt, 1.0f / sqrtf((float)cols));
        srcs[i] = (duet_weight_src_t){mats[i], dt,   src_cols,       2,    rows[i], col0,
                                      cols,    NULL, DUET_DTYPE_F32, false};
        total += rows[i];
    }
    float *x = duet_malloc((size_t)n * cols * sizeof(float));
    float *b = duet_malloc((size_t)total * sizeof(float));
    float *ref = duet_malloc((size_t)n * total * sizeof(float));
    float *got = duet_malloc((size_t)n * total * sizeof(float));
    duet_test_fill(&g, x, (size_t)n * cols, 2.0f);
    duet_test_fill(&g, b, (size_t)total, 0.5f);
    duet_weight_t *wc, *wg;
    void *bc = NULL, *bg = NULL;
    assert_int_equal(duet_backend_cpu.weight_create(p->cpu, srcs, n_src, &wc), 0);
    assert_int_equal(duet_backend_cuda.weight_create(p->gpu, srcs, n_src, &wg), 0);
    if (bias) {
        assert_int_equal(duet_backend_cpu.vector_create(p->cpu, b, DUET_DTYPE_F32, 0, total, &bc),
                         0);
        assert_int_equal(duet_backend_cuda.vector_create(p->gpu, b, DUET_DTYPE_F32, 0, total, &bg),
                         0);
    }
    void *dx = duet_test_dev_bf16(&duet_backend_cuda, p->gpu, x, (size_t)n * cols);
    void *dy = duet_backend_cuda.alloc(p->gpu, (size_t)n * total * 2);
    assert_int_equal(duet_backend_cpu.matmul(p->cpu, ref, x, n, wc, bc), 0);
    assert_int_equal(duet_backend_cuda.matmul(p->gpu, dy, dx, n, wg, bg), 0);
    assert_int_equal(duet_test_host_f32(&duet_backend_cuda, p->gpu, dy, got, (size_t)n * total), 0);
    char what[96];
    snprintf(what, sizeof(what), "matmul n %d [%d x %d] %s%s x%d", n, total, cols,
             duet_dtype_name(dt), bias ? " +bias" : "", n_src);
    DUET_TEST_ASSERT_CLOSE(what, got, ref, (size_t)n * total, 1.0 / 128, 2e-3, 5e-3);
    duet_backend_cpu.weight_destroy(p->cpu, wc);
    duet_backend_cuda.weight_destroy(p->gpu, wg);
    duet_backend_cpu.free(p->cpu, bc);
    duet_backend_cuda.free(p->gpu, bg);
    duet_backend_cuda.free(p->gpu, dx);
    duet_backend_cuda.free(p->gpu, dy);
    for (int i = 0; i < n_src; i++)
        duet_free(mats[i]);
    duet_free(x);
    duet_free(b);
    duet_free(ref);
    duet_free(got);
}

static void test_matmul(void **state)
{
    (void)state;
    DUET_TEST_NEED_GPU();
    duet_kv_layout_t kv = {1, 4, 4, 1, 8, 2};
    duet_test_pair_t p;
    duet_test_pair_open(&p, kv);
    int r1[1] = {300}, r3[3] = {128, 64, 64}, r2[2] = {1000, 1000}, rbig[1] = {2048};
    run(&p, 1, 1, r1, 64, 64, 0, DUET_DTYPE_F32, false);
    run(&p, 7, 3, r3, 128, 128, 0, DUET_DTYPE_BF16, true);
    run(&p, 33, 2, r2, 512, 512, 0, DUET_DTYPE_F16, false);
    run(&p, 5, 1, r1, 96, 200, 64, DUET_DTYPE_BF16, false); /* column slice */
    run(&p, 300, 1, rbig, 256, 256, 0, DUET_DTYPE_BF16, false);
    run(&p, 64, 1, rbig, 2048, 2048, 0, DUET_DTYPE_BF16, true);
    run(&p, 3, 3, r3, 48, 48, 0, DUET_DTYPE_F32, true);
    /* decode sizes (n <= 4: the skinny GEMV kernel), odd row counts */
    int r4[1] = {4096}, r5[1] = {1001}, r6[2] = {7168, 7168}, r7[1] = {32003};
    run(&p, 1, 1, r4, 2048, 2048, 0, DUET_DTYPE_BF16, false);
    run(&p, 2, 1, r5, 512, 512, 0, DUET_DTYPE_BF16, true);
    run(&p, 4, 2, r6, 4096, 4096, 0, DUET_DTYPE_BF16, false);
    run(&p, 3, 1, r7, 256, 256, 0, DUET_DTYPE_F16, false);
    run(&p, 4, 1, r5, 14336, 14336, 0, DUET_DTYPE_BF16, true);
    duet_test_pair_close(&p);
}
#else
static void test_matmul(void **state)
{
    (void)state;
    skip();
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_matmul)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
