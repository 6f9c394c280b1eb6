/* cuda sample_rows (sampling on the device) against the host rule it
 * replaces, duet_sample on the same bf16 values: the same id for every
 * draw -- temperature alone, top-k, top-p, both, many ties (bf16 rows of a
 * real vocab size), a row with one candidate, greedy rows mixed in, the
 * vocab split in tensor-parallel shards, and a non-finite row. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "engine/backend.h"
#include "engine/sampling.h"

#ifdef DUET_HAVE_CUDA
#include "tests/gpu/cuda_test_util.h"

typedef struct {
    float t;
    int k;
    float p;
} duet__cfg_t;

static const duet__cfg_t cfgs[] = {
    {1.0f, 0, 1.0f},    {0.7f, 0, 1.0f},   {1.5f, 0, 1.0f}, {1.0f, 40, 1.0f},
    {0.8f, 1000, 1.0f}, {1.0f, 0, 0.9f},   {0.6f, 0, 0.5f}, {1.0f, 50, 0.95f},
    {2.0f, 7, 0.3f},    {0.0f, 0, 1.0f},   {1.0f, 1, 1.0f}, {0.9f, 0, 0.01f},
    {1.0f, 3, 1.0f},    {0.25f, 0, 0.99f}, {5.0f, 0, 1.0f}, {1.0f, 100000, 1.0f},
};
#define N_CFG ((int)(sizeof(cfgs) / sizeof(cfgs[0])))

/* n rows of vocab ids in the gathered layout of tp shards (shard q's rows at
 * q * n * chunk, row i of it at + i * n_vocab(q)); draws `draws` times per
 * row, the row's settings cycling through cfgs. */
static int run(duet_test_pair_t *p, int n, int vocab, int tp, float scale, int draws)
{
    duet_test_rng_t g = {101u * (unsigned)vocab + (unsigned)n};
    int chunk = (vocab + tp - 1) / tp;
    float *flat = duet_malloc((size_t)n * vocab * sizeof(float));
    float *gath = duet_malloc((size_t)tp * n * chunk * sizeof(float));
    float *scratch = duet_malloc(2u * (size_t)vocab * sizeof(float));
    duet_sample_row_t *rows = duet_malloc((size_t)n * sizeof(*rows));
    int32_t *ids = duet_malloc((size_t)n * sizeof(int32_t));
    int mismatches = 0;

    duet_test_fill(&g, flat, (size_t)n * vocab, scale);
    for (int i = 0; i < n; i++) {
        float *row = flat + (size_t)i * vocab;
        if (i % 5 == 1) /* one id far above the rest: a single candidate at t <= 1 */
            row[vocab / 2] = 200.0f;
        if (i % 5 == 3) /* a tie at the top */
            row[vocab - 1] = row[0] = scale + 1.0f;
    }
    for (int q = 0; q < tp; q++) {
        int v0 = q * chunk, nq = vocab - v0 < chunk ? vocab - v0 : chunk;
        for (int i = 0; i < n && nq > 0; i++)
            memcpy(gath + (size_t)q * n * chunk + (size_t)i * nq, flat + (size_t)i * vocab + v0,
                   (size_t)nq * sizeof(float));
    }
    void *dsrc = duet_test_dev_bf16(&duet_backend_cuda, p->gpu, gath, (size_t)tp * n * chunk);
    assert_non_null(dsrc);
    for (int d = 0; d < draws; d++) {
        for (int i = 0; i < n; i++) {
            const duet__cfg_t *c = &cfgs[(i + d) % N_CFG];
            rows[i] = (duet_sample_row_t){.temperature = c->t,
                                          .top_k = c->k,
                                          .top_p = c->p,
                                          .u53 = duet_sampling_u53(7u + (uint64_t)i, (uint64_t)d)};
        }
        assert_int_equal(duet_backend_cuda.sample_rows(p->gpu, ids, dsrc, n, vocab, chunk, rows),
                         0);
        for (int i = 0; i < n; i++) {
            const duet__cfg_t *c = &cfgs[(i + d) % N_CFG];
            duet_sampling_t s = {c->t, c->k, c->p, 7u + (uint64_t)i};
            int32_t want = duet_sample(flat + (size_t)i * vocab, vocab, &s, (uint64_t)d, scratch);
            if (ids[i] != want) {
                fprintf(stderr,
                        "sample vocab %d tp %d row %d draw %d (t %g k %d p %g): got %d want %d\n",
                        vocab, tp, i, d, (double)c->t, c->k, (double)c->p, ids[i], want);
                mismatches++;
            }
        }
    }
    fprintf(stderr, "sample n %d vocab %d tp %d: %d draws, %d differ from duet_sample\n", n, vocab,
            tp, n * draws, mismatches);
    duet_backend_cuda.free(p->gpu, dsrc);
    duet_free(flat);
    duet_free(gath);
    duet_free(scratch);
    duet_free(rows);
    duet_free(ids);
    return mismatches;
}

static void nonfinite(duet_test_pair_t *p)
{
    float row[3][100];
    int32_t ids[3];
    duet_sample_row_t rows[3];
    for (int i = 0; i < 3; i++) {
        for (int j = 0; j < 100; j++)
            row[i][j] = (float)((j * 7 + i) % 13) - 6.0f;
        rows[i] = (duet_sample_row_t){.temperature = 1.0f, .top_p = 1.0f, .u53 = 12345u};
    }
    row[0][17] = NAN;
    row[2][99] = INFINITY;
    void *d = duet_test_dev_bf16(&duet_backend_cuda, p->gpu, &row[0][0], 300);
    assert_non_null(d);
    assert_int_equal(duet_backend_cuda.sample_rows(p->gpu, ids, d, 3, 100, 100, rows), 0);
    assert_int_equal(ids[0], DUET_SAMPLE_NONFINITE);
    assert_true(ids[1] >= 0 && ids[1] < 100);
    assert_int_equal(ids[2], DUET_SAMPLE_NONFINITE);
    duet_backend_cuda.free(p->gpu, d);
}

static void test_sample(void **state)
{
    (void)state;
    DUET_TEST_NEED_GPU();
    duet_kv_layout_t kv = {1, 4, 4, 1, 8, 2};
    duet_test_pair_t p;
    int bad = 0;
    duet_test_pair_open(&p, kv);
    bad += run(&p, 8, 128256, 1, 8.0f, 24);
    bad += run(&p, 16, 32000, 1, 4.0f, 20);
    bad += run(&p, 6, 151936, 4, 12.0f, 10);
    bad += run(&p, 5, 1000, 3, 3.0f, 50);
    bad += run(&p, 4, 5, 2, 1.0f, 40);
    nonfinite(&p);
    duet_test_pair_close(&p);
    /* the device sums exact fixed-point weights, the host doubles: they may
     * part only where a threshold falls within ~2^-40 of a boundary */
    assert_int_equal(bad, 0);
}
#else
static void test_sample(void **state)
{
    (void)state;
    skip();
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_sample)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
