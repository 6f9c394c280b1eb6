/* cuda argmax_rows (device greedy sampling) against the host rule it
 * replaces, duet_sample with temperature 0 on the same values: the same id
 * exactly, ties included (lowest id wins), for vocab sizes of real models,
 * strided rows and rows whose maximum sits at either end. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "engine/backend.h"
#include "engine/sampling.h"

#ifdef DUET_HAVE_CUDA
#include "tests/gpu/cuda_test_util.h"

static void run(duet_test_pair_t *p, int n, int d, int ld)
{
    duet_test_rng_t g = {23u * (unsigned)d + (unsigned)n};
    float *src = duet_malloc((size_t)n * ld * sizeof(float));
    float *scratch = duet_malloc(2u * (size_t)d * sizeof(float));
    float mx[64];
    int32_t idx[64];
    duet_sampling_t greedy = duet_sampling_greedy();
    duet_test_fill(&g, src, (size_t)n * ld, 8.0f);
    for (int i = 0; i < n; i++) {
        float *row = src + (size_t)i * ld;
        if (i % 4 == 1) { /* a tie between two far-apart ids */
            row[d / 3] = 9.0f;
            row[d - 1] = 9.0f;
        } else if (i % 4 == 2) {
            row[d - 1] = 9.5f;
        } else if (i % 4 == 3) {
            row[0] = 9.5f;
        }
    }
    void *dsrc = duet_test_dev_bf16(&duet_backend_cuda, p->gpu, src, (size_t)n * ld);
    assert_non_null(dsrc);
    assert_int_equal(duet_backend_cuda.argmax_rows(p->gpu, mx, idx, dsrc, n, d, (size_t)ld), 0);
    for (int i = 0; i < n; i++) {
        const float *row = src + (size_t)i * ld;
        int32_t want = duet_sample(row, d, &greedy, 0, scratch);
        if (idx[i] != want || mx[i] != row[want])
            fprintf(stderr, "argmax row %d: got %d (%g) want %d (%g)\n", i, idx[i], mx[i], want,
                    row[want]);
        assert_int_equal(idx[i], want);
        assert_true(mx[i] == row[want]);
    }
    fprintf(stderr, "argmax n %d d %d ld %d: %d rows equal to duet_sample greedy ok\n", n, d, ld,
            n);
    duet_backend_cuda.free(p->gpu, dsrc);
    duet_free(src);
    duet_free(scratch);
}

static void test_argmax(void **state)
{
    (void)state;
    DUET_TEST_NEED_GPU();
    duet_kv_layout_t kv = {1, 4, 4, 1, 8, 2};
    duet_test_pair_t p;
    duet_test_pair_open(&p, kv);
    run(&p, 1, 128256, 128256);
    run(&p, 64, 32000, 32000);
    run(&p, 7, 513, 600);
    run(&p, 4, 5, 5);
    duet_test_pair_close(&p);
}
#else
static void test_argmax(void **state)
{
    (void)state;
    skip();
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_argmax)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
