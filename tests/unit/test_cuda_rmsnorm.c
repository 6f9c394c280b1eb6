/* cuda rmsnorm against the cpu backend.  Inputs and weights are bf16
 * values; the cuda kernel sums squares in float32 and rounds the output
 * once to bf16, so each element is within half a bf16 ulp (2^-8 relative)
 * of the float32 result plus float32 noise.  Bound: |err| <= 2^-7 |ref| +
 * 1e-3 max|ref|, rel_l2 <= 4e-3.  Out-of-place and in place; vectorised
 * (d % 8 == 0) and scalar rows. */
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
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_rmsnorm)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
