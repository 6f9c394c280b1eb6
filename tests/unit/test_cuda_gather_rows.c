/* cuda gather_rows against the cpu backend: a copy, tolerance zero, more
 * rows than one launch carries, repeated and out-of-order rows. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "engine/backend.h"

#ifdef DUET_HAVE_CUDA
#include "tests/gpu/cuda_test_util.h"

static void run(duet_test_pair_t *p, int n_in, int n_rows, int d)
{
    duet_test_rng_t g = {17u * (unsigned)d};
    float *in = duet_malloc((size_t)n_in * d * sizeof(float));
    float *ref = duet_malloc((size_t)n_rows * d * sizeof(float));
    float *got = duet_malloc((size_t)n_rows * d * sizeof(float));
    int32_t *rows = duet_malloc((size_t)n_rows * sizeof(int32_t));
    duet_test_fill(&g, in, (size_t)n_in * d, 2.0f);
    for (int i = 0; i < n_rows; i++)
        rows[i] = (int32_t)((i * 37 + 5) % n_in);
    void *din = duet_test_dev_bf16(&duet_backend_cuda, p->gpu, in, (size_t)n_in * d);
    void *dout = duet_backend_cuda.alloc(p->gpu, (size_t)n_rows * d * 2);
    assert_int_equal(duet_backend_cpu.gather_rows(p->cpu, ref, in, rows, n_rows, d), 0);
    assert_int_equal(duet_backend_cuda.gather_rows(p->gpu, dout, din, rows, n_rows, d), 0);
    assert_int_equal(duet_test_host_f32(&duet_backend_cuda, p->gpu, dout, got, (size_t)n_rows * d),
                     0);
    char what[64];
    snprintf(what, sizeof(what), "gather_rows %d of %d, d %d", n_rows, n_in, d);
    DUET_TEST_ASSERT_CLOSE(what, got, ref, (size_t)n_rows * d, 0.0, 0.0, 0.0);
    duet_backend_cuda.free(p->gpu, din);
    duet_backend_cuda.free(p->gpu, dout);
    duet_free(in);
    duet_free(ref);
    duet_free(got);
    duet_free(rows);
}

static void test_gather_rows(void **state)
{
    (void)state;
    DUET_TEST_NEED_GPU();
    duet_kv_layout_t kv = {1, 4, 4, 1, 8, 2};
    duet_test_pair_t p;
    duet_test_pair_open(&p, kv);
    run(&p, 100, 7, 64);
    run(&p, 300, 150, 2048);
    run(&p, 50, 64, 33);
    duet_test_pair_close(&p);
}
#else
static void test_gather_rows(void **state)
{
    (void)state;
    skip();
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_gather_rows)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
