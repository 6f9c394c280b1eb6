/* cuda matmul on FP8 (e4m3) weights against the cpu backend, which
 * dequantizes them exactly at load (e4m3 * scale in f32): per-channel and
 * per-tensor scales (F32 or BF16), stacked sources with different
 * per-tensor scales (q/k/v-like), a column slice (row-parallel), bias.
 *
 * n <= 4 runs the FP8 GEMV: weights exact, x bf16 as given, float32
 * accumulation, y rounded once to bf16 -- the bf16 matmul test's bound:
 * |err| <= 2^-7 |ref| + 2e-3 max|ref|, rel_l2 <= 5e-3.
 * Larger n runs cuBLASLt's FP8 GEMM on activations quantized per token to
 * e4m3 (scale amax / 448).  Against a reference whose x is quantized the
 * same way on the host (duet_f32_to_e4m3(x / s) * s): the same bound.
 * Against the plain dequantized reference (x unquantized): e4m3's 3-bit
 * mantissa costs up to 2^-4 relative per element of x, about 2^-4 / sqrt(3)
 * on a dot product of random terms: rel_l2 <= 0.05, |err| <= 2^-3 |ref| +
 * 0.05 max|ref| -- the tolerance stated for FP8 prefill in docs/fp8.md.
 * Weights whose rows or columns are not multiples of 16 are dequantized to
 * bf16 at load (cuBLASLt's FP8 GEMM would not take them): the bf16 bound
 * (weights rounded once to bf16: 2^-9 relative). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "engine/backend.h"

#ifdef DUET_HAVE_CUDA
#include "tests/gpu/cuda_test_util.h"

/* an FP8 source [rows][cols] quantized from uniform values, its scales
 * (per row or one) in scale_dt */
typedef struct {
    uint8_t *q;
    void *scale;
} fp8_src_t;

static void make_fp8(duet_test_rng_t *g, int rows, int cols, bool per_row, duet_dtype_t scale_dt,
                     float std, fp8_src_t *out)
{
    size_t n = (size_t)rows * cols;
    float *f = duet_malloc(n * sizeof(float));
    int ns = per_row ? rows : 1;
    float *s = duet_malloc((size_t)ns * sizeof(float));
    duet_test_fill(g, f, n, std);
    for (int i = 0; i < ns; i++)
        s[i] = 0;
    for (size_t i = 0; i < n; i++) {
        int r = per_row ? (int)(i / (size_t)cols) : 0;
        s[r] = fabsf(f[i]) > s[r] ? fabsf(f[i]) : s[r];
    }
    for (int i = 0; i < ns; i++) {
        s[i] = s[i] / 448.0f;
        if (scale_dt == DUET_DTYPE_BF16) /* the scale the checkpoint stores */
            s[i] = duet_bf16_to_f32(duet_f32_to_bf16(s[i]));
    }
    out->q = duet_malloc(n);
    for (size_t i = 0; i < n; i++)
        out->q[i] = duet_f32_to_e4m3(f[i] / s[per_row ? i / (size_t)cols : 0]);
    if (scale_dt == DUET_DTYPE_BF16) {
        uint16_t *h = duet_malloc((size_t)ns * 2);
        for (int i = 0; i < ns; i++)
            h[i] = duet_f32_to_bf16(s[i]);
        duet_free(s);
        out->scale = h;
    } else {
        out->scale = s;
    }
    duet_free(f);
}

/* x quantized per row as the GPU does */
static void quant_rows(float *xq, const float *x, int n, int cols)
{
    for (int t = 0; t < n; t++) {
        float amax = 0;
        for (int c = 0; c < cols; c++)
            amax = fabsf(x[(size_t)t * cols + c]) > amax ? fabsf(x[(size_t)t * cols + c]) : amax;
        float s = amax / 448.0f;
        for (int c = 0; c < cols; c++) {
            size_t i = (size_t)t * cols + c;
            xq[i] = s > 0 ? duet_e4m3_to_f32(duet_f32_to_e4m3(x[i] / s)) * s : 0.0f;
        }
    }
}

static void run(duet_test_pair_t *p, int n, int n_src, const int *rows, int cols, int src_cols,
                int col0, bool per_row, duet_dtype_t scale_dt, bool bias)
{
    duet_test_rng_t g = {31u * (unsigned)cols + (unsigned)n + (unsigned)n_src + per_row};
    duet_weight_src_t srcs[3];
    fp8_src_t mats[3];
    int total = 0;
    for (int i = 0; i < n_src; i++) {
        int src_rows = rows[i] + 3;
        /* different magnitudes per source: different per-tensor scales */
        make_fp8(&g, src_rows, src_cols, per_row, scale_dt, (1.0f + i) / sqrtf((float)cols),
                 &mats[i]);
        srcs[i] =
            (duet_weight_src_t){mats[i].q, DUET_DTYPE_F8_E4M3, src_cols, 2,      rows[i], col0,
                                cols,      mats[i].scale,      scale_dt, per_row};
        total += rows[i];
    }
    size_t nx = (size_t)n * cols, ny = (size_t)n * total;
    float *x = duet_malloc(nx * sizeof(float)), *xq = duet_malloc(nx * sizeof(float));
    float *b = duet_malloc((size_t)total * sizeof(float));
    float *ref = duet_malloc(ny * sizeof(float)), *refq = duet_malloc(ny * sizeof(float));
    float *got = duet_malloc(ny * sizeof(float));
    duet_test_fill(&g, x, nx, 2.0f);
    duet_test_fill(&g, b, (size_t)total, 0.5f);
    quant_rows(xq, x, n, cols);
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
    void *dx = duet_test_dev_bf16(&duet_backend_cuda, p->gpu, x, nx);
    void *dy = duet_backend_cuda.alloc(p->gpu, ny * 2);
    assert_int_equal(duet_backend_cpu.matmul(p->cpu, ref, x, n, wc, bc), 0);
    assert_int_equal(duet_backend_cpu.matmul(p->cpu, refq, xq, n, wc, bc), 0);
    assert_int_equal(duet_backend_cuda.matmul(p->gpu, dy, dx, n, wg, bg), 0);
    assert_int_equal(duet_test_host_f32(&duet_backend_cuda, p->gpu, dy, got, ny), 0);
    char what[112];
    bool kept = total % 16 == 0 && cols % 16 == 0; /* else bf16 weights */
    snprintf(what, sizeof(what), "fp8 %s n %d [%d x %d] %s%s x%d",
             !kept    ? "as bf16"
             : n <= 4 ? "gemv"
                      : "gemm",
             n, total, cols, per_row ? "channel" : "tensor", bias ? " +bias" : "", n_src);
    if (n <= 4 || !kept) {
        DUET_TEST_ASSERT_CLOSE(what, got, ref, ny, 1.0 / 128, 2e-3, 5e-3);
    } else {
        DUET_TEST_ASSERT_CLOSE(what, got, refq, ny, 1.0 / 128, 2e-3, 5e-3);
        strncat(what, " vs unquantized x", sizeof(what) - strlen(what) - 1);
        DUET_TEST_ASSERT_CLOSE(what, got, ref, ny, 1.0 / 8, 0.05, 0.05);
    }
    duet_backend_cpu.weight_destroy(p->cpu, wc);
    duet_backend_cuda.weight_destroy(p->gpu, wg);
    duet_backend_cpu.free(p->cpu, bc);
    duet_backend_cuda.free(p->gpu, bg);
    duet_backend_cuda.free(p->gpu, dx);
    duet_backend_cuda.free(p->gpu, dy);
    for (int i = 0; i < n_src; i++) {
        duet_free(mats[i].q);
        duet_free(mats[i].scale);
    }
    duet_free(x);
    duet_free(xq);
    duet_free(b);
    duet_free(ref);
    duet_free(refq);
    duet_free(got);
}

static void test_matmul_fp8(void **state)
{
    (void)state;
    DUET_TEST_NEED_GPU();
    duet_kv_layout_t kv = {1, 4, 4, 1, 8, 2};
    duet_test_pair_t p;
    duet_test_pair_open(&p, kv);
    int r1[1] = {304}, r3[3] = {128, 64, 64}, r2[2] = {1000, 1000}, rbig[1] = {2048};
    int r4[1] = {4096}, r5[1] = {1008}, r6[2] = {7168, 7168}, r7[1] = {32000};
    int odd[1] = {1001}; /* rows % 16 != 0: dequantized to bf16 at load */
    const duet_dtype_t F32 = DUET_DTYPE_F32, BF16 = DUET_DTYPE_BF16;
    /* decode sizes: the FP8 GEMV */
    run(&p, 1, 1, r4, 4096, 4096, 0, true, F32, false);
    run(&p, 1, 3, r3, 128, 128, 0, false, F32, true); /* q/k/v: three tensor scales */
    run(&p, 2, 1, r5, 512, 512, 0, true, BF16, true);
    run(&p, 3, 1, r7, 256, 256, 0, false, BF16, false);
    run(&p, 4, 2, r6, 4096, 4096, 0, true, F32, false);  /* gate/up */
    run(&p, 4, 1, r5, 14336, 14336, 0, true, F32, true); /* down_proj */
    run(&p, 2, 1, r1, 96, 224, 64, true, F32, false);    /* column slice */
    /* prefill / large decode batches: cuBLASLt FP8 */
    run(&p, 5, 1, r1, 64, 64, 0, true, F32, false);
    run(&p, 7, 3, r3, 128, 128, 0, false, F32, true);
    run(&p, 33, 2, r2, 512, 512, 0, true, BF16, false);
    run(&p, 300, 1, rbig, 256, 256, 0, false, F32, false);
    run(&p, 64, 1, rbig, 2048, 2048, 0, true, F32, true);
    run(&p, 17, 1, r1, 96, 224, 64, true, F32, false); /* column slice */
    run(&p, 512, 2, r6, 4096, 4096, 0, true, F32, false);
    /* shapes cuBLASLt's FP8 GEMM does not take: bf16 weights, same bound */
    run(&p, 2, 1, odd, 512, 512, 0, true, F32, true);
    run(&p, 9, 1, odd, 512, 512, 0, false, BF16, false);
    duet_test_pair_close(&p);
}
#else
static void test_matmul_fp8(void **state)
{
    (void)state;
    skip();
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_matmul_fp8)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
