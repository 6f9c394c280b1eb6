/* Packed transfers (transfer/xfer_pack.h): for every P, D in 1..8 and KV
 * head counts with replication on either side, stage on each prefill rank,
 * one put per (layer, K|V, run), unstage on each decode rank, then check
 * every destination byte against the head it must hold; the number of puts
 * does not depend on the page count, and the packed checksum of each pair
 * is the same over the sender's staging, put by put, and the receiver's.
 * Staging ranges are checked against the pool and the request's pages. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kv/heads.h"
#include "transfer/slice_plan.h"
#include "transfer/xfer_crc32c.h"
#include "transfer/xfer_pack.h"

#define POOL_PAGES 28

static uint8_t pattern(int head, int layer, int kv, int i, size_t b)
{
    uint32_t x = (uint32_t)head * 2654435761u ^ (uint32_t)layer * 40503u ^ (uint32_t)kv * 977u ^
                 (uint32_t)i * 131u ^ (uint32_t)b * 7u;
    return (uint8_t)(x ^ (x >> 11) ^ (x >> 19)) | 1u; /* never 0: 0 is "not written" */
}

static duet_kv_layout_t layout_of(int H, int tp)
{
    int h0, n;
    duet_kv_heads_owned(H, tp, 0, &h0, &n);
    return (duet_kv_layout_t){.n_layers = 2,
                              .n_pages = POOL_PAGES,
                              .page_size = 2,
                              .n_kv_heads = n,
                              .head_dim = 3,
                              .elem_size = 2};
}

/* One request of n_pages pages through every pair of the plan. */
static void run_case(int P, int D, int H, int n_pages, unsigned seed)
{
    duet_slice_plan_t *plan;
    assert_int_equal(duet_slice_plan_create(P, D, H, &plan), DUET_OK);
    duet_kv_layout_t sl = layout_of(H, P), dl = layout_of(H, D);
    size_t pool_bytes = duet_kv_total_bytes(&sl) > duet_kv_total_bytes(&dl)
                            ? duet_kv_total_bytes(&sl)
                            : duet_kv_total_bytes(&dl);
    size_t hb = duet_kv_head_bytes(&sl);

    /* request pages: a shuffled subset of 0..11, staging at 12.. on either side */
    int32_t src_pages[12], dst_pages[12];
    for (int i = 0; i < 12; i++)
        src_pages[i] = dst_pages[i] = i;
    srand(seed);
    for (int i = 11; i > 0; i--) {
        int j = rand() % (i + 1), k = rand() % (i + 1);
        int32_t t = src_pages[i];
        src_pages[i] = src_pages[j];
        src_pages[j] = t;
        t = dst_pages[i];
        dst_pages[i] = dst_pages[k];
        dst_pages[k] = t;
    }
    int32_t src_stage0 = 12, dst_stage0 = 12 + (int32_t)(seed % 3);

    uint8_t **src_pool = calloc((size_t)P, sizeof(*src_pool));
    duet_kv_copy_t *copies =
        calloc((size_t)n_pages * (size_t)(sl.n_kv_heads + dl.n_kv_heads), sizeof(*copies));
    assert_non_null(src_pool);
    assert_non_null(copies);
    for (int s = 0; s < P; s++) {
        src_pool[s] = calloc(1, pool_bytes);
        assert_non_null(src_pool[s]);
        int h0, nh;
        duet_kv_heads_owned(H, P, s, &h0, &nh);
        for (int layer = 0; layer < sl.n_layers; layer++)
            for (int kv = 0; kv < 2; kv++)
                for (int i = 0; i < n_pages; i++)
                    for (int h = 0; h < nh; h++) {
                        uint8_t *p = src_pool[s] + duet_kv_offset(&sl, layer, kv, src_pages[i], h);
                        for (size_t b = 0; b < hb; b++)
                            p[b] = pattern(h0 + h, layer, kv, i, b);
                    }
        const duet_slice_run_t *runs;
        int n_runs = duet_slice_plan_src_runs(plan, s, &runs);
        uint8_t heads[64];
        duet_xfer_pack_src_heads(runs, n_runs, heads, sl.n_kv_heads);
        int n = duet_xfer_pack_copies(&sl, src_pages, n_pages, src_stage0, heads, 0, copies);
        assert_true(n <= n_pages * sl.n_kv_heads);
        for (int layer = 0; layer < sl.n_layers; layer++)
            duet_kv_copy_apply_host(&sl, src_pool[s], layer, copies, n);
    }

    uint8_t *dst_pool = malloc(pool_bytes);
    assert_non_null(dst_pool);
    for (int d = 0; d < D; d++) {
        memset(dst_pool, 0, pool_bytes);
        const duet_slice_run_t *runs;
        int n_runs = duet_slice_plan_dst_runs(plan, d, &runs);
        long puts = 0;
        for (int k = 0; k < n_runs; k++)
            for (int layer = 0; layer < dl.n_layers; layer++)
                for (int kv = 0; kv < 2; kv++) {
                    duet_xfer_pack_put_t put;
                    duet_xfer_pack_put(&sl, &dl, &runs[k], layer, kv, n_pages, src_stage0,
                                       dst_stage0, &put);
                    assert_true(put.src_off + put.len <= pool_bytes);
                    assert_true(put.dst_off + put.len <= pool_bytes);
                    memcpy(dst_pool + put.dst_off, src_pool[runs[k].src_rank] + put.src_off,
                           put.len);
                    puts++;
                }
        /* O(layers x runs), whatever n_pages is */
        assert_int_equal(puts, (long)n_runs * 2 * dl.n_layers);
        /* Per pair, the packed checksum over the sender's staging, taken put
         * by put in posting order (as the sender does), equals the one over
         * the receiver's staging. */
        for (int s = 0; s < P; s++) {
            duet_slice_run_t pair[64];
            int n_pair = 0;
            uint32_t crc = 0;
            for (int k = 0; k < n_runs; k++)
                if (runs[k].src_rank == s)
                    pair[n_pair++] = runs[k];
            for (int layer = 0; layer < dl.n_layers; layer++)
                for (int kv = 0; kv < 2; kv++)
                    for (int k = 0; k < n_pair; k++) {
                        duet_xfer_pack_put_t put;
                        duet_xfer_pack_put(&sl, &dl, &pair[k], layer, kv, n_pages, src_stage0,
                                           dst_stage0, &put);
                        crc = duet__crc32c(crc, src_pool[s] + put.src_off, put.len);
                    }
            assert_int_equal(
                crc, duet_xfer_pack_crc(&sl, src_pool[s], pair, n_pair, n_pages, src_stage0, 0));
            assert_int_equal(
                crc, duet_xfer_pack_crc(&dl, dst_pool, pair, n_pair, n_pages, dst_stage0, 1));
        }
        int n = duet_xfer_pack_copies(&dl, dst_pages, n_pages, dst_stage0, NULL, 1, copies);
        for (int layer = 0; layer < dl.n_layers; layer++)
            duet_kv_copy_apply_host(&dl, dst_pool, layer, copies, n);
        int h0, nh;
        duet_kv_heads_owned(H, D, d, &h0, &nh);
        for (int layer = 0; layer < dl.n_layers; layer++)
            for (int kv = 0; kv < 2; kv++)
                for (int i = 0; i < n_pages; i++)
                    for (int h = 0; h < nh; h++) {
                        const uint8_t *p =
                            dst_pool + duet_kv_offset(&dl, layer, kv, dst_pages[i], h);
                        for (size_t b = 0; b < hb; b++)
                            if (p[b] != pattern(h0 + h, layer, kv, i, b))
                                fail_msg("P %d D %d H %d pages %d: decode rank %d layer %d kv %d "
                                         "page index %d head %d byte %zu: got %u want %u",
                                         P, D, H, n_pages, d, layer, kv, i, h, b, p[b],
                                         pattern(h0 + h, layer, kv, i, b));
                    }
    }
    free(dst_pool);
    for (int s = 0; s < P; s++)
        free(src_pool[s]);
    free(src_pool);
    free(copies);
    duet_slice_plan_destroy(plan);
}

static void test_every_pair(void **state)
{
    (void)state;
    static const int heads[] = {1, 2, 3, 4, 6, 8, 16};
    int cases = 0;
    for (int P = 1; P <= 8; P++)
        for (int D = 1; D <= 8; D++)
            for (size_t k = 0; k < sizeof(heads) / sizeof(heads[0]); k++) {
                int H = heads[k];
                if (duet_kv_heads_check(H, P) != DUET_OK || duet_kv_heads_check(H, D) != DUET_OK)
                    continue;
                for (int n_pages = 1; n_pages <= 12; n_pages += 5)
                    run_case(P, D, H, n_pages, (unsigned)(P * 131 + D * 17 + H + n_pages));
                cases++;
            }
    assert_true(cases > 60);
}

/* Consecutive page ids with one head per rank collapse into one copy. */
static void test_copies_merge(void **state)
{
    (void)state;
    duet_kv_layout_t l = {.n_layers = 1,
                          .n_pages = 16,
                          .page_size = 4,
                          .n_kv_heads = 1,
                          .head_dim = 8,
                          .elem_size = 2};
    int32_t pages[4] = {3, 4, 5, 9};
    duet_kv_copy_t c[4];
    assert_int_equal(duet_xfer_pack_copies(&l, pages, 4, 10, NULL, 0, c), 2);
    assert_int_equal(c[0].len, 3 * duet_kv_head_bytes(&l));
    assert_int_equal(c[0].src, 3 * duet_kv_page_bytes(&l));
    assert_int_equal(c[0].dst, 10 * duet_kv_page_bytes(&l));
    l.n_kv_heads = 2; /* head-major staging: no page-run merges on the source */
    duet_kv_copy_t c2[8];
    assert_int_equal(duet_xfer_pack_copies(&l, pages, 4, 10, NULL, 1, c2), 8);
}

/* Staging must lie in the pool and hold none of the request's pages. */
static void test_check_stage(void **state)
{
    int32_t pages[3] = {7, 2, 30};
    char why[96];
    (void)state;
    assert_int_equal(duet_xfer_pack_check_stage(8, pages, 3, 32, why, sizeof(why)), 0);
    assert_int_equal(duet_xfer_pack_check_stage(3, pages, 3, 32, why, sizeof(why)), 0);
    assert_int_equal(duet_xfer_pack_check_stage(29, pages, 3, 32, why, sizeof(why)), -1);
    assert_string_equal(why, "staging pages [29, 32) hold request page 30");
    assert_int_equal(duet_xfer_pack_check_stage(0, pages, 3, 32, why, sizeof(why)), -1);
    assert_string_equal(why, "staging pages [0, 3) hold request page 2");
    assert_int_equal(duet_xfer_pack_check_stage(30, pages, 3, 32, why, sizeof(why)), -1);
    assert_string_equal(why, "staging pages [30, 33) outside the pool's 32");
    assert_int_equal(duet_xfer_pack_check_stage(-1, pages, 3, 32, why, sizeof(why)), -1);
    assert_string_equal(why, "staging pages [-1, 2) outside the pool's 32");
    assert_int_equal(duet_xfer_pack_check_stage(INT32_MAX, pages, 3, 32, why, sizeof(why)), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_every_pair),
                                       cmocka_unit_test(test_copies_merge),
                                       cmocka_unit_test(test_check_stage)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
