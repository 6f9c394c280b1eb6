/* cuda rows_to_host_f32 against the cpu backend: bf16 -> float is exact,
 * tolerance zero; strided rows (src_ld > d). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "engine/backend.h"

#ifdef DUET_HAVE_CUDA
#include "tests/gpu/cuda_test_util.h"

static void run(duet_test_pair_t *p, int n, int d, int ld)
{
    duet_test_rng_t g = {19u * (unsigned)d + (unsigned)ld};
    float *src = duet_malloc((size_t)n * ld * sizeof(float));
    float *ref = duet_malloc((size_t)n * d * sizeof(float));
    float *got = duet_malloc((size_t)n * d * sizeof(float));
    duet_test_fill(&g, src, (size_t)n * ld, 30.0f);
    void *dsrc = duet_test_dev_bf16(&duet_backend_cuda, p->gpu, src, (size_t)n * ld);
    assert_non_null(dsrc);
    assert_int_equal(duet_backend_cpu.rows_to_host_f32(p->cpu, ref, src, n, d, (size_t)ld), 0);
    assert_int_equal(duet_backend_cuda.rows_to_host_f32(p->gpu, got, dsrc, n, d, (size_t)ld), 0);
    char what[64];
    snprintf(what, sizeof(what), "rows_to_host n %d d %d ld %d", n, d, ld);
    DUET_TEST_ASSERT_CLOSE(what, got, ref, (size_t)n * d, 0.0, 0.0, 0.0);
    duet_backend_cuda.free(p->gpu, dsrc);
    duet_free(src);
    duet_free(ref);
    duet_free(got);
}

static void test_rows_to_host(void **state)
{
    (void)state;
    DUET_TEST_NEED_GPU();
    duet_kv_layout_t kv = {1, 4, 4, 1, 8, 2};
    duet_test_pair_t p;
    duet_test_pair_open(&p, kv);
    run(&p, 1, 32000, 32000);
    run(&p, 5, 300, 301);
    run(&p, 64, 1000, 1024);
    duet_test_pair_close(&p);
}
#else
static void test_rows_to_host(void **state)
{
    (void)state;
    skip();
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_rows_to_host)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
