/* cuda silu_mul (SwiGLU) against the cpu backend: float32 silu(g) * u,
 * rounded once to bf16.  Bound: |err| <= 2^-7 |ref| + 1e-4 max|ref|,
 * rel_l2 <= 4e-3; vectorised (m % 8 == 0) and scalar widths. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "engine/backend.h"

#ifdef DUET_HAVE_CUDA
#include "tests/gpu/cuda_test_util.h"

static void run(duet_test_pair_t *p, int n, int m)
{
    duet_test_rng_t g = {11u * (unsigned)m + (unsigned)n};
    size_t ngu = (size_t)n * 2 * m, nm = (size_t)n * m;
    float *gu = duet_malloc(ngu * sizeof(float));
    float *ref = duet_malloc(nm * sizeof(float)), *got = duet_malloc(nm * sizeof(float));
    duet_test_fill(&g, gu, ngu, 6.0f);
    void *dgu = duet_test_dev_bf16(&duet_backend_cuda, p->gpu, gu, ngu);
    void *dout = duet_backend_cuda.alloc(p->gpu, nm * 2);
    assert_non_null(dgu);
    assert_int_equal(duet_backend_cpu.silu_mul(p->cpu, ref, gu, n, m), 0);
    assert_int_equal(duet_backend_cuda.silu_mul(p->gpu, dout, dgu, n, m), 0);
    assert_int_equal(duet_test_host_f32(&duet_backend_cuda, p->gpu, dout, got, nm), 0);
    char what[64];
    snprintf(what, sizeof(what), "silu_mul n %d m %d", n, m);
    DUET_TEST_ASSERT_CLOSE(what, got, ref, nm, 1.0 / 128, 1e-4, 4e-3);
    duet_backend_cuda.free(p->gpu, dgu);
    duet_backend_cuda.free(p->gpu, dout);
    duet_free(gu);
    duet_free(ref);
    duet_free(got);
}

static void test_silu_mul(void **state)
{
    (void)state;
    DUET_TEST_NEED_GPU();
    duet_kv_layout_t kv = {1, 4, 4, 1, 8, 2};
    duet_test_pair_t p;
    duet_test_pair_open(&p, kv);
    run(&p, 1, 8192);
    run(&p, 9, 64);
    run(&p, 5, 37);
    run(&p, 300, 1024);
    duet_test_pair_close(&p);
}
#else
static void test_silu_mul(void **state)
{
    (void)state;
    skip();
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_silu_mul)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
