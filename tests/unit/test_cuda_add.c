/* cuda add (residual) and add_bias (a bias row added to every row)
 * against the cpu backend: float32 x + y rounded once to bf16.  Bound:
 * |err| <= 2^-8 |ref| (half an ulp) + 1e-6 max|ref|, rel_l2 <= 4e-3;
 * vectorised (count, row length % 8 == 0) and scalar shapes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "engine/backend.h"

#ifdef DUET_HAVE_CUDA
#include "tests/gpu/cuda_test_util.h"

static void run(duet_test_pair_t *p, size_t count)
{
    duet_test_rng_t g = {13u + count};
    float *x = duet_malloc(count * sizeof(float)), *y = duet_malloc(count * sizeof(float));
    float *got = duet_malloc(count * sizeof(float));
    duet_test_fill(&g, x, count, 4.0f);
    duet_test_fill(&g, y, count, 1.0f);
    void *dx = duet_test_dev_bf16(&duet_backend_cuda, p->gpu, x, count);
    void *dy = duet_test_dev_bf16(&duet_backend_cuda, p->gpu, y, count);
    assert_non_null(dx);
    assert_non_null(dy);
    assert_int_equal(duet_backend_cpu.add(p->cpu, x, y, count), 0);
    assert_int_equal(duet_backend_cuda.add(p->gpu, dx, dy, count), 0);
    assert_int_equal(duet_test_host_f32(&duet_backend_cuda, p->gpu, dx, got, count), 0);
    char what[64];
    snprintf(what, sizeof(what), "add count %zu", count);
    DUET_TEST_ASSERT_CLOSE(what, got, x, count, 1.0 / 256, 1e-6, 4e-3);
    duet_backend_cuda.free(p->gpu, dx);
    duet_backend_cuda.free(p->gpu, dy);
    duet_free(x);
    duet_free(y);
    duet_free(got);
}

static void run_bias(duet_test_pair_t *p, int n, int d)
{
    size_t count = (size_t)n * (size_t)d;
    duet_test_rng_t g = {29u + count};
    float *x = duet_malloc(count * sizeof(float)), *b = duet_malloc((size_t)d * sizeof(float));
    float *got = duet_malloc(count * sizeof(float));
    duet_test_fill(&g, x, count, 4.0f);
    duet_test_fill(&g, b, (size_t)d, 1.0f);
    void *dx = duet_test_dev_bf16(&duet_backend_cuda, p->gpu, x, count);
    void *db = duet_test_dev_bf16(&duet_backend_cuda, p->gpu, b, (size_t)d);
    assert_non_null(dx);
    assert_non_null(db);
    assert_int_equal(duet_backend_cpu.add_bias(p->cpu, x, b, n, d), 0);
    assert_int_equal(duet_backend_cuda.add_bias(p->gpu, dx, db, n, d), 0);
    assert_int_equal(duet_test_host_f32(&duet_backend_cuda, p->gpu, dx, got, count), 0);
    char what[64];
    snprintf(what, sizeof(what), "add_bias %d x %d", n, d);
    DUET_TEST_ASSERT_CLOSE(what, got, x, count, 1.0 / 256, 1e-6, 4e-3);
    duet_backend_cuda.free(p->gpu, dx);
    duet_backend_cuda.free(p->gpu, db);
    duet_free(x);
    duet_free(b);
    duet_free(got);
}

static void test_add(void **state)
{
    (void)state;
    DUET_TEST_NEED_GPU();
    duet_kv_layout_t kv = {1, 4, 4, 1, 8, 2};
    duet_test_pair_t p;
    duet_test_pair_open(&p, kv);
    run(&p, 4096);
    run(&p, 1001);
    run(&p, (size_t)3 << 20);
    run_bias(&p, 1, 4096);
    run_bias(&p, 37, 64);
    run_bias(&p, 5, 100);
    run_bias(&p, 3000, 1000);
    duet_test_pair_close(&p);
}
#else
static void test_add(void **state)
{
    (void)state;
    skip();
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_add)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
