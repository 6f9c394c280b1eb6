/* Packed transfers (transfer/xfer_pack.h): for every P, D in 1..8 and KV
 * head counts with replication on either side, stage on each prefill rank
 * into its arena, put each run's block in chunks of layers (one chunk per
 * layer, all layers at once, and uneven chunks), unstage on each decode
 * rank, then check every destination byte against the head it must hold;
 * the number of puts depends on the chunks, not on the page count, and the
 * packed checksum of each pair is the same over the sender's staging and
 * the receiver's.  Staging ranges are checked against the arena. */
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
    return (duet_kv_layout_t){.n_layers = 3,
                              .n_pages = POOL_PAGES,
                              .page_size = 2,
                              .n_kv_heads = n,
                              .head_dim = 3,
                              .elem_size = 2};
}

/* The sender's first slot of run (d, dst_head) among prefill rank s's runs. */
static int src_slot(const duet_slice_plan_t *plan, const duet_slice_run_t *run)
{
    const duet_slice_run_t *runs;
    int n = duet_slice_plan_src_runs(plan, run->src_rank, &runs), slot = 0;
    for (int k = 0; k < n; k++) {
        if (runs[k].dst_rank == run->dst_rank && runs[k].dst_head == run->dst_head)
            return slot;
        slot += runs[k].n_heads;
    }
    fail_msg("run to decode rank %d head %d not among prefill rank %d's", run->dst_rank,
             run->dst_head, run->src_rank);
    return -1;
}

/* One request of n_pages pages through every pair of the plan; layers are
 * put in chunks: chunk 0 one layer per put, 1 all at once, 2 uneven. */
static void run_case(int P, int D, int H, int n_pages, unsigned seed, int chunking)
{
    duet_slice_plan_t *plan;
    assert_int_equal(duet_slice_plan_create(P, D, H, &plan), DUET_OK);
    duet_kv_layout_t sl = layout_of(H, P), dl = layout_of(H, D);
    int32_t src_stage0 = (int32_t)(seed % 2), dst_stage0 = (int32_t)(seed % 3);
    int units = 0;
    for (int s = 0; s < P; s++) {
        const duet_slice_run_t *runs;
        int n_runs = duet_slice_plan_src_runs(plan, s, &runs);
        int u = duet_xfer_pack_units(&sl, n_pages, duet_xfer_pack_slots(runs, n_runs));
        units = u > units ? u : units;
    }
    size_t src_bytes =
        duet_kv_total_bytes(&sl) + (size_t)(src_stage0 + units) * duet_xfer_stage_unit_bytes(&sl);
    size_t dst_bytes =
        duet_kv_total_bytes(&dl) + (size_t)(dst_stage0 + n_pages) * duet_xfer_stage_unit_bytes(&dl);
    size_t hb = duet_kv_head_bytes(&sl);
    char why[96];

    /* request pages: a shuffled subset of 0..11 on either side */
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
    assert_int_equal(
        duet_xfer_pack_check_stage(&dl, dst_bytes, dst_stage0, n_pages, why, sizeof(why)), 0);

    uint8_t **src_pool = calloc((size_t)P, sizeof(*src_pool));
    size_t cap = (size_t)n_pages * 64u; /* slots <= max(H, D) <= 16 here */
    duet_kv_copy_t *copies = calloc(cap, sizeof(*copies));
    assert_non_null(src_pool);
    assert_non_null(copies);
    for (int s = 0; s < P; s++) {
        src_pool[s] = calloc(1, src_bytes);
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
        int slots = duet_xfer_pack_slots(runs, n_runs);
        if (slots > 0)
            assert_int_equal(duet_xfer_pack_check_stage(&sl, src_bytes, src_stage0,
                                                        duet_xfer_pack_units(&sl, n_pages, slots),
                                                        why, sizeof(why)),
                             0);
        int n = duet_xfer_pack_copies(&sl, src_pages, n_pages, src_stage0, runs, n_runs, 0, copies);
        assert_true(n <= n_pages * slots);
        for (int layer = 0; layer < sl.n_layers; layer++)
            duet_kv_copy_apply_host(&sl, src_pool[s], layer, copies, n);
    }

    uint8_t *dst_pool = malloc(dst_bytes);
    assert_non_null(dst_pool);
    for (int d = 0; d < D; d++) {
        memset(dst_pool, 0, dst_bytes);
        const duet_slice_run_t *runs;
        int n_runs = duet_slice_plan_dst_runs(plan, d, &runs);
        long puts = 0, chunks = 0;
        for (int l0 = 0; l0 < dl.n_layers; chunks++) {
            int l1 = chunking == 0   ? l0 + 1
                     : chunking == 1 ? dl.n_layers
                     : l0 == 0       ? 1
                                     : dl.n_layers;
            for (int k = 0; k < n_runs; k++) {
                duet_xfer_pack_put_t put;
                duet_xfer_pack_put(&sl, &dl, n_pages, src_stage0, src_slot(plan, &runs[k]),
                                   dst_stage0, &runs[k], 2 * l0, 2 * (l1 - l0), &put);
                assert_true(put.src_off >= duet_kv_total_bytes(&sl));
                assert_true(put.dst_off >= duet_kv_total_bytes(&dl));
                assert_true(put.src_off + put.len <= src_bytes);
                assert_true(put.dst_off + put.len <= dst_bytes);
                memcpy(dst_pool + put.dst_off, src_pool[runs[k].src_rank] + put.src_off, put.len);
                puts++;
            }
            l0 = l1;
        }
        /* O(runs x chunks), whatever n_pages is */
        assert_int_equal(puts, (long)n_runs * chunks);
        /* Per pair, the packed checksum over the sender's staging equals the
         * one over the receiver's. */
        for (int s = 0; s < P; s++) {
            duet_slice_run_t pair[64];
            int n_pair = 0;
            for (int k = 0; k < n_runs; k++)
                if (runs[k].src_rank == s)
                    pair[n_pair++] = runs[k];
            if (n_pair == 0)
                continue;
            uint32_t crc = duet_xfer_pack_crc(&sl, src_pool[s], pair, n_pair, n_pages, src_stage0,
                                              0, src_slot(plan, &pair[0]));
            assert_int_equal(
                crc, duet_xfer_pack_crc(&dl, dst_pool, pair, n_pair, n_pages, dst_stage0, 1, 0));
        }
        int n = duet_xfer_pack_copies(&dl, dst_pages, n_pages, dst_stage0, runs, n_runs, 1, copies);
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
                                fail_msg("P %d D %d H %d pages %d chunking %d: decode rank %d "
                                         "layer %d kv %d page index %d head %d byte %zu: got %u "
                                         "want %u",
                                         P, D, H, n_pages, chunking, d, layer, kv, i, h, b, p[b],
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
                    run_case(P, D, H, n_pages, (unsigned)(P * 131 + D * 17 + H + n_pages),
                             n_pages % 3);
                cases++;
            }
    assert_true(cases > 60);
}

/* Consecutive page ids with one head per rank collapse into one copy;
 * the staging side walks its block with a step. */
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
    duet_slice_run_t one = {.n_heads = 1};
    duet_kv_copy_t c[4];
    assert_int_equal(duet_xfer_pack_copies(&l, pages, 4, 10, &one, 1, 0, c), 2);
    assert_int_equal(c[0].len, 3 * duet_kv_head_bytes(&l));
    assert_int_equal(c[0].src, 3 * duet_kv_page_bytes(&l));
    assert_int_equal(c[0].src_step, 0);
    assert_int_equal(c[0].dst, duet_kv_total_bytes(&l) + 10 * duet_xfer_stage_unit_bytes(&l));
    assert_int_equal(c[0].dst_step, 4 * duet_kv_head_bytes(&l));
    /* page-major staging: a run of all the rank's heads merges a page run
     * into one copy (unpack: staging -> pages 3..5, then page 9) */
    l.n_kv_heads = 2;
    duet_slice_run_t two = {.n_heads = 2};
    duet_kv_copy_t c2[8];
    assert_int_equal(duet_xfer_pack_copies(&l, pages, 4, 10, &two, 1, 1, c2), 2);
    assert_int_equal(c2[0].len, 6 * duet_kv_head_bytes(&l));
    assert_int_equal(c2[0].dst, 3 * duet_kv_page_bytes(&l));
    assert_int_equal(c2[0].src_step, 2 * 4 * duet_kv_head_bytes(&l));
    assert_int_equal(c2[1].len, 2 * duet_kv_head_bytes(&l));
    assert_int_equal(c2[1].dst, 9 * duet_kv_page_bytes(&l));
    /* one of the two heads: one copy per page (the other head lies between) */
    duet_slice_run_t second = {.n_heads = 1, .src_head = 1, .dst_head = 1};
    assert_int_equal(duet_xfer_pack_copies(&l, pages, 4, 10, &second, 1, 0, c2), 4);
    assert_int_equal(c2[1].src, 4 * duet_kv_page_bytes(&l) + duet_kv_head_bytes(&l));
    assert_int_equal(c2[1].dst, c2[0].dst + duet_kv_head_bytes(&l));
}

/* Staging must lie in the arena after the planes. */
static void test_check_stage(void **state)
{
    duet_kv_layout_t l = {.n_layers = 2,
                          .n_pages = 8,
                          .page_size = 4,
                          .n_kv_heads = 2,
                          .head_dim = 8,
                          .elem_size = 2};
    uint64_t pool = duet_kv_total_bytes(&l) + 32 * duet_xfer_stage_unit_bytes(&l);
    char why[96];
    (void)state;
    assert_int_equal(duet_xfer_stage_units(&l, pool), 32);
    assert_int_equal(duet_xfer_stage_units(&l, pool - 1), 31);
    assert_int_equal(duet_xfer_stage_units(&l, duet_kv_total_bytes(&l)), 0);
    assert_int_equal(duet_xfer_pack_units(&l, 5, 2), 5);
    assert_int_equal(duet_xfer_pack_units(&l, 5, 3), 8);
    assert_int_equal(duet_xfer_pack_check_stage(&l, pool, 0, 32, why, sizeof(why)), 0);
    assert_int_equal(duet_xfer_pack_check_stage(&l, pool, 29, 3, why, sizeof(why)), 0);
    assert_int_equal(duet_xfer_pack_check_stage(&l, pool, 30, 3, why, sizeof(why)), -1);
    assert_string_equal(why, "staging units [30, 33) outside the 32-unit arena");
    assert_int_equal(duet_xfer_pack_check_stage(&l, pool, -1, 3, why, sizeof(why)), -1);
    assert_string_equal(why, "staging units [-1, 2) outside the 32-unit arena");
    assert_int_equal(duet_xfer_pack_check_stage(&l, pool, 0, 0, why, sizeof(why)), -1);
    assert_int_equal(duet_xfer_pack_check_stage(&l, pool, INT32_MAX, 3, why, sizeof(why)), -1);
    assert_int_equal(
        duet_xfer_pack_check_stage(&l, duet_kv_total_bytes(&l), 0, 1, why, sizeof(why)), -1);
    assert_string_equal(why, "staging units [0, 1) outside the 0-unit arena");
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_every_pair),
                                       cmocka_unit_test(test_copies_merge),
                                       cmocka_unit_test(test_check_stage)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
