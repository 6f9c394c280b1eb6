/* cuda rmsnorm against the cpu backend.  Inputs and weights are bf16
 * values; the cuda kernel sums squares in float32 and rounds the output
 * once to bf16, so each element is within half a bf16 ulp (2^-8 relative)
 * of the float32 result plus float32 noise.  Bound: |err| <= 2^-7 |ref| +
 * 1e-3 max|ref|, rel_l2 <= 4e-3.  Out-of-place and in place; vectorised
 * (d % 8 == 0) and scalar rows.  head_rmsnorm (Qwen3's q_norm / k_norm):
 * the q and k heads of qkv rows normalised in place with their own
 * weights, v left as it was, against the cpu backend, same bound. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "engine/backend.h"

#ifdef DUET_HAVE_CUDA
#include "tests/gpu/cuda_test_util.h"

static void run(duet_test_pair_t *p, int n, int d, float eps, bool in_place)
{
    duet_test_rng_t g = {7u * (unsigned)d + (unsigned)n};
    size_t nd = (size_t)n * d;
    float *x = duet_malloc(nd * sizeof(float)), *w = duet_malloc((size_t)d * sizeof(float));
    float *ref = duet_malloc(nd * sizeof(float)), *got = duet_malloc(nd * sizeof(float));
    void *wv_c, *wv_g;

    duet_test_fill(&g, x, nd, 3.0f);
    for (int i = 0; i < d; i++)
        w[i] = duet_bf16_to_f32(duet_f32_to_bf16(1.0f + 0.2f * (duet_test_uniform(&g) - 0.5f)));
    for (int t = 0; t < n; t++) /* rows of very different scale */
        for (int i = 0; i < d; i++)
            x[(size_t)t * d + i] = duet_bf16_to_f32(
                duet_f32_to_bf16(x[(size_t)t * d + i] * (float)(1 << (t % 5)) * 0.25f));
    assert_int_equal(duet_backend_cpu.vector_create(p->cpu, w, DUET_DTYPE_F32, 0, d, &wv_c), 0);
    assert_int_equal(duet_backend_cuda.vector_create(p->gpu, w, DUET_DTYPE_F32, 0, d, &wv_g), 0);
    void *xin = duet_test_dev_bf16(&duet_backend_cuda, p->gpu, x, nd);
    void *xout = in_place ? xin : duet_backend_cuda.alloc(p->gpu, nd * 2);
    assert_non_null(xin);
    assert_non_null(xout);
    assert_int_equal(duet_backend_cpu.rmsnorm(p->cpu, ref, x, wv_c, n, d, eps), 0);
    assert_int_equal(duet_backend_cuda.rmsnorm(p->gpu, xout, xin, wv_g, n, d, eps), 0);
    assert_int_equal(duet_test_host_f32(&duet_backend_cuda, p->gpu, xout, got, nd), 0);
    char what[64];
    snprintf(what, sizeof(what), "rmsnorm n %d d %d%s", n, d, in_place ? " in place" : "");
    DUET_TEST_ASSERT_CLOSE(what, got, ref, nd, 1.0 / 128, 1e-3, 4e-3);
    if (!in_place)
        duet_backend_cuda.free(p->gpu, xout);
    duet_backend_cuda.free(p->gpu, xin);
    duet_backend_cpu.free(p->cpu, wv_c);
    duet_backend_cuda.free(p->gpu, wv_g);
    duet_free(x);
    duet_free(w);
    duet_free(ref);
    duet_free(got);
}

static void run_heads(duet_test_pair_t *p, int n, int nq, int nkv, int hd, float eps)
{
    duet_test_rng_t g = {13u * (unsigned)hd + (unsigned)n};
    size_t nw = (size_t)n * (size_t)(nq + 2 * nkv) * (size_t)hd;
    float *x = duet_malloc(nw * sizeof(float)), *got = duet_malloc(nw * sizeof(float));
    float *w = duet_malloc(2 * (size_t)hd * sizeof(float));
    void *qc, *kc, *qg, *kg;

    duet_test_fill(&g, x, nw, 3.0f);
    for (size_t i = 0; i < nw; i++) /* bf16 inputs: both backends see the same values */
        x[i] = duet_bf16_to_f32(duet_f32_to_bf16(x[i]));
    for (int i = 0; i < 2 * hd; i++)
        w[i] = duet_bf16_to_f32(duet_f32_to_bf16(1.0f + 0.4f * (duet_test_uniform(&g) - 0.5f)));
    assert_int_equal(duet_backend_cpu.vector_create(p->cpu, w, DUET_DTYPE_F32, 0, hd, &qc), 0);
    assert_int_equal(duet_backend_cpu.vector_create(p->cpu, w, DUET_DTYPE_F32, hd, hd, &kc), 0);
    assert_int_equal(duet_backend_cuda.vector_create(p->gpu, w, DUET_DTYPE_F32, 0, hd, &qg), 0);
    assert_int_equal(duet_backend_cuda.vector_create(p->gpu, w, DUET_DTYPE_F32, hd, hd, &kg), 0);
    void *dx = duet_test_dev_bf16(&duet_backend_cuda, p->gpu, x, nw);
    assert_non_null(dx);
    assert_int_equal(duet_backend_cpu.head_rmsnorm(p->cpu, x, n, nq, nkv, hd, qc, kc, eps), 0);
    assert_int_equal(duet_backend_cuda.head_rmsnorm(p->gpu, dx, n, nq, nkv, hd, qg, kg, eps), 0);
    assert_int_equal(duet_test_host_f32(&duet_backend_cuda, p->gpu, dx, got, nw), 0);
    char what[80];
    snprintf(what, sizeof(what), "head_rmsnorm n %d heads %d/%d hd %d", n, nq, nkv, hd);
    DUET_TEST_ASSERT_CLOSE(what, got, x, nw, 1.0 / 128, 1e-3, 4e-3);
    duet_backend_cuda.free(p->gpu, dx);
    duet_backend_cpu.free(p->cpu, qc);
    duet_backend_cpu.free(p->cpu, kc);
    duet_backend_cuda.free(p->gpu, qg);
    duet_backend_cuda.free(p->gpu, kg);
    duet_free(x);
    duet_free(w);
    duet_free(got);
}

static void test_head_rmsnorm(void **state)
{
    (void)state;
    DUET_TEST_NEED_GPU();
    duet_kv_layout_t kv = {1, 4, 4, 1, 8, 2};
    duet_test_pair_t p;
    duet_test_pair_open(&p, kv);
    run_heads(&p, 5, 16, 8, 128, 1e-6f); /* Qwen3-8B's heads */
    run_heads(&p, 3, 4, 1, 64, 1e-6f);
    run_heads(&p, 7, 2, 2, 16, 1e-5f); /* hd below a warp */
    run_heads(&p, 1, 8, 4, 256, 1e-6f);
    duet_test_pair_close(&p);
}

static void test_rmsnorm(void **state)
{
    (void)state;
    DUET_TEST_NEED_GPU();
    duet_kv_layout_t kv = {1, 4, 4, 1, 8, 2};
    duet_test_pair_t p;
    duet_test_pair_open(&p, kv);
    run(&p, 5, 64, 1e-5f, false);
    run(&p, 3, 4096, 1e-6f, false);
    run(&p, 17, 2048, 1e-5f, true);
    run(&p, 4, 100, 1e-5f, false);
    run(&p, 2, 48, 1e-5f, true);
    run(&p, 1, 8192, 1e-5f, false);
    duet_test_pair_close(&p);
}
#else
static void test_rmsnorm(void **state)
{
    (void)state;
    skip();
}

static void test_head_rmsnorm(void **state)
{
    (void)state;
    skip();
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_rmsnorm),
                                       cmocka_unit_test(test_head_rmsnorm)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
