/* cuda embed against the cpu backend: a bf16 copy of the looked-up rows,
 * so the tolerance is zero (table values are bf16-representable), for f32
 * and bf16 checkpoints, vectorised (hidden % 8 == 0) and scalar rows. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "engine/backend.h"

#ifdef DUET_HAVE_CUDA
#include "tests/gpu/cuda_test_util.h"

static void run(int vocab, int hidden, duet_dtype_t dtype)
{
    duet_test_rng_t g = {42u + (unsigned)hidden};
    duet_kv_layout_t kv = {1, 8, 4, 1, 8, 2};
    duet_test_pair_t p;
    duet_test_batch_t b;
    int n_new[2] = {7, 3}, start[2] = {0, 5};
    float *table = duet_malloc((size_t)vocab * hidden * sizeof(float));
    uint16_t *t16 = duet_malloc((size_t)vocab * hidden * 2);
    duet_weight_t *wc, *wg;

    duet_test_fill(&g, table, (size_t)vocab * hidden, 1.5f);
    duet_test_to_bf16(table, t16, (size_t)vocab * hidden);
    const void *src = dtype == DUET_DTYPE_BF16 ? (const void *)t16 : (const void *)table;
    duet_test_pair_open(&p, kv);
    duet_test_batch_make(&b, 2, n_new, start, 4, 8, 4, vocab);
    b.tokens[0] = vocab - 1; /* both ends of the table */
    b.tokens[1] = 0;
    int n = b.d.n_tokens;
    float *ref = duet_malloc((size_t)n * hidden * sizeof(float));
    float *got = duet_malloc((size_t)n * hidden * sizeof(float));
    void *out = duet_backend_cuda.alloc(p.gpu, (size_t)n * hidden * 2);

    assert_int_equal(duet_backend_cpu.embedding_create(p.cpu, src, dtype, vocab, hidden, &wc), 0);
    assert_int_equal(duet_backend_cuda.embedding_create(p.gpu, src, dtype, vocab, hidden, &wg), 0);
    assert_int_equal(duet_backend_cpu.batch_prepare(p.cpu, &b.d), 0);
    assert_int_equal(duet_backend_cuda.batch_prepare(p.gpu, &b.d), 0);
    assert_int_equal(duet_backend_cpu.embed(p.cpu, ref, wc, n, hidden), 0);
    assert_int_equal(duet_backend_cuda.embed(p.gpu, out, wg, n, hidden), 0);
    assert_int_equal(duet_test_host_f32(&duet_backend_cuda, p.gpu, out, got, (size_t)n * hidden),
                     0);
    char what[64];
    snprintf(what, sizeof(what), "embed vocab %d hidden %d %s", vocab, hidden,
             duet_dtype_name(dtype));
    DUET_TEST_ASSERT_CLOSE(what, got, ref, (size_t)n * hidden, 0.0, 0.0, 0.0);

    duet_backend_cpu.weight_destroy(p.cpu, wc);
    duet_backend_cuda.weight_destroy(p.gpu, wg);
    duet_backend_cuda.free(p.gpu, out);
    duet_test_batch_free(&b);
    duet_test_pair_close(&p);
    duet_free(ref);
    duet_free(got);
    duet_free(table);
    duet_free(t16);
}

static void test_embed(void **state)
{
    (void)state;
    DUET_TEST_NEED_GPU();
    run(300, 64, DUET_DTYPE_F32);
    run(300, 64, DUET_DTYPE_BF16);
    run(257, 36, DUET_DTYPE_F32);
    run(1000, 4096, DUET_DTYPE_BF16);
}

/* an id outside the table is refused before anything runs */
static void test_embed_bad_id(void **state)
{
    (void)state;
    DUET_TEST_NEED_GPU();
    duet_kv_layout_t kv = {1, 8, 4, 1, 8, 2};
    duet_test_pair_t p;
    duet_test_batch_t b;
    int n_new[1] = {2}, start[1] = {0};
    float table[16 * 8] = {0};
    duet_weight_t *w;
    duet_test_pair_open(&p, kv);
    assert_int_equal(duet_backend_cuda.embedding_create(p.gpu, table, DUET_DTYPE_F32, 16, 8, &w),
                     0);
    duet_test_batch_make(&b, 1, n_new, start, 4, 8, 2, 16);
    b.tokens[1] = 16;
    assert_int_equal(duet_backend_cuda.batch_prepare(p.gpu, &b.d), DUET_ERR_INVALID);
    duet_backend_cuda.weight_destroy(p.gpu, w);
    duet_test_batch_free(&b);
    duet_test_pair_close(&p);
}
#else
static void test_embed(void **state)
{
    (void)state;
    skip();
}

static void test_embed_bad_id(void **state)
{
    (void)state;
    skip();
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embed),
        cmocka_unit_test(test_embed_bad_id),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
