/* transfer/xfer checksums through a rank's hook (duet_xfer_rank_set_checksum,
 * the path device pools take, where the GPU computes the CRC): here the
 * pools are host memory and the hooks compute on the host, so the path
 * runs for real between processes over UCX (sm,self and tcp,self, or
 * DUET_XFER_TLS alone), per-page and packed.
 *  - the slice's ranges (xfer_checksum.c) in checksum order equal the
 *    inline CRCs of both sides (duet__seg_crc, duet_xfer_pack_crc) for
 *    every pair of many plans, scattered and consecutive pages;
 *  - good requests complete and every byte arrives; each prefill rank's
 *    hook ran once per receiver and request, each decode rank's once per
 *    sender and request (a hook left uncalled fails the count);
 *  - a corrupted put (duet_xfer_debug_corrupt_put: on the hook path an
 *    extra put after a fence, the source left intact) is caught by the
 *    receiver's CRC: the one pair fails "checksum mismatch", and the next
 *    request from the same source pages arrives intact;
 *  - a hook whose result is wrong on either side fails the pair with a
 *    checksum mismatch (a result ignored would pass);
 *  - a hook that fails: on decode the request fails with its message and
 *    the sender is told; on prefill the receivers get a failure notice. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "common/alloc.h"
#include "kv/copy.h"
#include "tests/integration/xfer/xfer_scenes.h"
#include "transfer/xfer_internal.h"
#include "transfer/xfer_pack.h"

/* ---- the pure part: ranges in checksum order ----------------------------------------------- */

static void test_ranges_order(void **state)
{
    static const int plans[][3] = {{1, 1, 2}, {1, 2, 2}, {2, 1, 4}, {2, 4, 8}, {4, 2, 8},
                                   {4, 8, 2}, {8, 4, 2}, {3, 1, 3}, {1, 3, 6}, {2, 3, 6}};
    (void)state;
    for (size_t k = 0; k < sizeof(plans) / sizeof(plans[0]); k++) {
        int P = plans[k][0], D = plans[k][1], H = plans[k][2];
        duet_slice_plan_t *plan;
        assert_int_equal(duet_slice_plan_create(P, D, H, &plan), DUET_OK);
        for (int consecutive = 0; consecutive < 2; consecutive++)
            for (int s = 0; s < P; s++) {
                const duet_slice_run_t *runs;
                int n_runs = duet_slice_plan_src_runs(plan, s, &runs), at = 0;
                duet_kv_layout_t sl = {3, 40, 4, 0, 8, 2}, dl = sl;
                int h0;
                duet_kv_heads_owned(H, P, s, &h0, &sl.n_kv_heads);
                duet_kv_heads_owned(H, D, 0, &h0, &dl.n_kv_heads);
                const duet_kv_layout_t *big = sl.n_kv_heads > dl.n_kv_heads ? &sl : &dl;
                size_t bytes = duet_kv_total_bytes(big) + 64u * duet_xfer_stage_unit_bytes(big);
                unsigned char *pool = duet_malloc(bytes);
                assert_non_null(pool);
                for (size_t i = 0; i < bytes; i++)
                    pool[i] = (unsigned char)(i * 2654435761u >> 13);
                int32_t pages[7];
                for (int i = 0; i < 7; i++)
                    pages[i] = consecutive ? 3 + i : (i * 11 + 5) % 30;
                while (at < n_runs) { /* one pair: the runs to one receiver */
                    int d = runs[at].dst_rank, m = 0;
                    while (at + m < n_runs && runs[at + m].dst_rank == d)
                        m++;
                    duet_crc32c_range_t out[3 * 2 * 7 * 8];
                    for (int dst = 0; dst < 2; dst++) {
                        const duet_kv_layout_t *l = dst ? &dl : &sl;
                        int n = duet__crc_ranges(l, runs + at, m, pages, 7, 0, dst, 0, out);
                        assert_int_equal(duet_crc32c_ranges(pool, out, n),
                                         duet__seg_crc(l, pool, runs + at, m, pages, 7, dst));
                        int slot0 = duet_xfer_pack_slots(runs, at);
                        n = duet__crc_ranges(l, runs + at, m, NULL, 7, 31, dst, slot0, out);
                        assert_int_equal(
                            duet_crc32c_ranges(pool, out, n),
                            duet_xfer_pack_crc(l, pool, runs + at, m, 7, 31, dst, slot0));
                        assert_true(n <= 2 * 3 * m);
                    }
                    at += m;
                }
                duet_free(pool);
            }
        duet_slice_plan_destroy(plan);
    }
}

/* ---- hooks on host pools -------------------------------------------------------------------- */

#define CK_N  3  /* pages a request */
#define CK_PS 16 /* tokens a page */

enum { HOOK_OK, HOOK_LIE, HOOK_FAIL };

typedef struct {
    const unsigned char *base;
    atomic_int calls;
    atomic_int mode; /* set by the test's thread, read on the progress thread */
} hook_t;

static duet_status_t hook_crc(void *ctx, const duet_crc32c_range_t *ranges, int n, uint32_t *crc_p)
{
    hook_t *h = ctx;
    atomic_fetch_add(&h->calls, 1);
    int mode = atomic_load(&h->mode);
    if (mode == HOOK_FAIL)
        return duet_error(DUET_ERR_IO, "test hook refused");
    *crc_p = duet_crc32c_ranges(h->base, ranges, n) ^ (mode == HOOK_LIE ? 1u : 0u);
    return DUET_OK;
}

static hook_t hooks[8];

static void install_hooks(duet_testkit_side_t *sd)
{
    for (int r = 0; r < sd->tp; r++) {
        hooks[r].base = sd->base[r];
        atomic_store(&hooks[r].calls, 0);
        atomic_store(&hooks[r].mode, HOOK_OK);
        duet_xfer_rank_set_checksum(duet_xfer_rank(sd->x, r), hook_crc, &hooks[r]);
    }
}

/* Pages: disjoint source, destination and staging (packed) ranges. */
static void ck_pages(int32_t *p, int prefill)
{
    static const int32_t src[CK_N] = {41, 7, 19}, dst[CK_N] = {12, 13, 30};
    memcpy(p, prefill ? src : dst, sizeof(src));
}
#define CK_STAGE_P 1 /* staging units in the arena */
#define CK_STAGE_D 2

/* The cases, run in this order; each is one request. */
typedef struct {
    const char *name;
    int packed;
    long corrupt; /* prefill rank 0's n-th put, or -1 */
    int p_mode;   /* prefill rank 0's hook */
    int d_mode;   /* decode rank 0's hook */
} ck_case_t;

static const ck_case_t cases[] = {
    {"per-page", 0, -1, HOOK_OK, HOOK_OK},
    {"packed", 1, -1, HOOK_OK, HOOK_OK},
    {"per-page, corrupted put", 0, 1, HOOK_OK, HOOK_OK},
    {"per-page after the corruption", 0, -1, HOOK_OK, HOOK_OK},
    {"packed, corrupted put", 1, 0, HOOK_OK, HOOK_OK}, /* (one put per run here) */
    {"packed after the corruption", 1, -1, HOOK_OK, HOOK_OK},
    {"prefill hook wrong", 0, -1, HOOK_LIE, HOOK_OK},
    {"decode hook wrong", 1, -1, HOOK_OK, HOOK_LIE},
    {"decode hook fails", 0, -1, HOOK_OK, HOOK_FAIL},
    {"prefill hook fails", 1, -1, HOOK_FAIL, HOOK_OK},
};
#define N_CASES ((int)(sizeof(cases) / sizeof(cases[0])))

static int ck_prefill(void *arg)
{
    const spec_t *sp = arg;
    duet_testkit_side_t sd;
    duet_slice_plan_t *plan;
    int32_t src[CK_N], dst[CK_N];
    side_init(&sd, sp, DUET_XFER_PREFILL, CK_PS);
    if (duet_testkit_side_start(&sd) || duet_testkit_side_connect(&sd, sp->fd_p))
        return 1;
    DUET_TESTKIT_OK(duet_slice_plan_create(sp->P, sp->D, sp->H, &plan));
    install_hooks(&sd);
    ck_pages(src, 1);
    ck_pages(dst, 0);
    for (int r = 0; r < sd.tp; r++) {
        int h0 = head0_of(sd.kv_heads, sd.tp, r);
        const duet_slice_run_t *runs;
        duet_kv_copy_t copies[CK_N * 64];
        for (int pg = 0; pg < POOL_PAGES; pg++)
            duet_testkit_fill_page(&sd.layout, sd.base[r], h0, pg, 1000000 + (int64_t)pg * CK_PS);
        for (int i = 0; i < CK_N; i++)
            duet_testkit_fill_page(&sd.layout, sd.base[r], h0, src[i], (int64_t)i * CK_PS);
        /* staged once: the hook path never writes the source */
        int n_runs = duet_slice_plan_src_runs(plan, r, &runs);
        int nc = duet_xfer_pack_copies(&sd.layout, src, CK_N, CK_STAGE_P, runs, n_runs, 0, copies);
        for (int l = 0; l < LAYERS; l++)
            duet_kv_copy_apply_host(&sd.layout, sd.base[r], l, copies, nc);
    }
    for (int c = 0; c < N_CASES; c++) {
        const ck_case_t *k = &cases[c];
        uint64_t id = 500 + (uint64_t)c;
        int calls0[8];
        DUET_TESTKIT_CHECK(duet_testkit_chan_expect(sp->fd_p, "ready", WAIT_MS) == 0,
                           "%s: decode not ready", k->name);
        atomic_store(&hooks[0].mode, k->p_mode);
        DUET_TESTKIT_OK(duet_xfer_debug_corrupt_put(duet_xfer_rank(sd.x, 0), k->corrupt));
        for (int s = 0; s < sp->P; s++) {
            duet_xfer_send_t x = {.transfer_id = id,
                                  .plan = plan,
                                  .peers = sd.peers[s],
                                  .src_pages = src,
                                  .dst_pages = dst,
                                  .n_pages = CK_N,
                                  .flags =
                                      DUET_XFER_SEND_CRC | (k->packed ? DUET_XFER_SEND_PACKED : 0u),
                                  .deadline_ns = duet_deadline_in_ms(WAIT_MS),
                                  .src_stage0 = CK_STAGE_P,
                                  .dst_stage0 = CK_STAGE_D};
            calls0[s] = atomic_load(&hooks[s].calls);
            DUET_TESTKIT_OK(duet_xfer_send_post(duet_xfer_rank(sd.x, s), &x, TOKEN));
        }
        for (int s = 0; s < sp->P; s++) {
            duet_xfer_result_t res;
            int recv[DUET_TP_MAX], n_recv = duet_slice_plan_receivers(plan, s, recv);
            int calls;
            if (send_result(&sd, s, id, &res))
                return 1;
            calls = atomic_load(&hooks[s].calls) - calls0[s];
            if (s == 0 && k->p_mode == HOOK_FAIL) {
                DUET_TESTKIT_CHECK(res.status == DUET_ERR_IO &&
                                       strstr(res.detail, "test hook refused") != NULL,
                                   "%s: prefill rank 0: %s (%s)", k->name,
                                   duet_status_name(res.status), res.detail);
                /* the first receiver's hook failed; no more are computed */
                DUET_TESTKIT_CHECK(calls == 1, "%s: prefill rank 0's hook ran %d times", k->name,
                                   calls);
                continue;
            }
            DUET_TESTKIT_CHECK(calls == n_recv,
                               "%s: prefill rank %d's hook ran %d times for %d receivers (%s)",
                               k->name, s, calls, n_recv, res.detail);
            if (k->corrupt >= 0 || k->p_mode != HOOK_OK || k->d_mode != HOOK_OK)
                continue; /* decode checks who failed */
            DUET_TESTKIT_CHECK(res.status == DUET_OK, "%s: prefill rank %d: %s", k->name, s,
                               res.detail);
        }
        atomic_store(&hooks[0].mode, HOOK_OK);
        DUET_TESTKIT_CHECK(duet_testkit_chan_expect(sp->fd_p, "checked", WAIT_MS) == 0,
                           "%s: decode did not check", k->name);
    }
    /* every slice acknowledged: decode may stop */
    DUET_TESTKIT_CHECK(duet_testkit_chan_say(sp->fd_p, "bye") == 0, "channel");
    return scene_stop(&sd, plan);
}

/* Decode rank d's outcome of case k: what it must be. */
static int ck_check(duet_testkit_side_t *sd, const duet_slice_plan_t *plan, const ck_case_t *k,
                    int d, const duet_xfer_result_t *res, int *crc_fails)
{
    int senders[DUET_TP_MAX], n = duet_slice_plan_senders(plan, d, senders), from0 = 0;
    for (int i = 0; i < n; i++)
        from0 |= senders[i] == 0;
    if (k->d_mode == HOOK_FAIL && d == 0) {
        DUET_TESTKIT_CHECK(res->status == DUET_ERR_IO && strstr(res->detail, "test hook refused"),
                           "%s: decode rank 0: %s (%s)", k->name, duet_status_name(res->status),
                           res->detail);
        return 0;
    }
    if (k->p_mode == HOOK_FAIL && from0) {
        DUET_TESTKIT_CHECK(res->status == DUET_ERR_IO && strstr(res->detail, "prefill rank 0"),
                           "%s: decode rank %d: %s (%s)", k->name, d, duet_status_name(res->status),
                           res->detail);
        return 0;
    }
    if ((k->p_mode == HOOK_LIE && from0) || (k->d_mode == HOOK_LIE && d == 0) ||
        (k->corrupt >= 0 && res->status != DUET_OK)) {
        DUET_TESTKIT_CHECK(res->status == DUET_ERR_MISMATCH &&
                               strstr(res->detail, "checksum mismatch on the slice from prefill "
                                                   "rank"),
                           "%s: decode rank %d: %s (%s)", k->name, d, duet_status_name(res->status),
                           res->detail);
        (*crc_fails)++;
        return 0;
    }
    DUET_TESTKIT_CHECK(res->status == DUET_OK && res->first_token == TOKEN,
                       "%s: decode rank %d: %s", k->name, d, res->detail);
    /* every byte: unstage first when packed */
    int32_t dst[CK_N];
    int h0 = head0_of(sd->kv_heads, sd->tp, d);
    ck_pages(dst, 0);
    if (k->packed) {
        duet_kv_copy_t copies[CK_N * 64];
        const duet_slice_run_t *runs;
        int n_runs = duet_slice_plan_dst_runs(plan, d, &runs);
        int nc = duet_xfer_pack_copies(&sd->layout, dst, CK_N, CK_STAGE_D, runs, n_runs, 1, copies);
        for (int l = 0; l < LAYERS; l++)
            duet_kv_copy_apply_host(&sd->layout, sd->base[d], l, copies, nc);
    }
    for (int i = 0; i < CK_N; i++) {
        char what[96];
        snprintf(what, sizeof(what), "%s: decode rank %d", k->name, d);
        if (duet_testkit_check_page(&sd->layout, sd->base[d], h0, dst[i], (int64_t)i * CK_PS,
                                    what) != 0)
            return 1;
    }
    return 0;
}

static int ck_decode(void *arg)
{
    const spec_t *sp = arg;
    duet_testkit_side_t sd;
    duet_slice_plan_t *plan;
    int32_t dst[CK_N];
    side_init(&sd, sp, DUET_XFER_DECODE, CK_PS);
    if (duet_testkit_side_start(&sd) || duet_testkit_side_connect(&sd, sp->fd_d))
        return 1;
    DUET_TESTKIT_OK(duet_slice_plan_create(sp->P, sp->D, sp->H, &plan));
    install_hooks(&sd);
    ck_pages(dst, 0);
    for (int c = 0; c < N_CASES; c++) {
        const ck_case_t *k = &cases[c];
        uint64_t id = 500 + (uint64_t)c;
        int calls0[8], crc_fails = 0;
        uint64_t crc_stat0 = 0, crc_stat = 0;
        for (int d = 0; d < sd.tp; d++) {
            duet_xfer_expect_t e = {.transfer_id = id,
                                    .plan = plan,
                                    .peers = sd.peers[d],
                                    .pages = dst,
                                    .n_pages = CK_N,
                                    .deadline_ns = duet_deadline_in_ms(WAIT_MS),
                                    .flags = k->packed ? DUET_XFER_EXPECT_PACKED : 0u,
                                    .dst_stage0 = CK_STAGE_D};
            memset(sd.base[d], 0xEE,
                   duet_kv_total_bytes(&sd.layout) +
                       (size_t)sd.stage_units * duet_xfer_stage_unit_bytes(&sd.layout));
            calls0[d] = atomic_load(&hooks[d].calls);
            crc_stat0 += stats_of(&sd, d).crc_failures;
            DUET_TESTKIT_OK(duet_xfer_recv_expect(duet_xfer_rank(sd.x, d), &e));
        }
        atomic_store(&hooks[0].mode, k->d_mode);
        DUET_TESTKIT_CHECK(duet_testkit_chan_say(sp->fd_d, "ready") == 0, "channel");
        for (int d = 0; d < sd.tp; d++) {
            duet_xfer_result_t res;
            int senders[DUET_TP_MAX], n = duet_slice_plan_senders(plan, d, senders);
            int calls;
            if (recv_result(&sd, d, id, &res) || ck_check(&sd, plan, k, d, &res, &crc_fails))
                return 1;
            calls = atomic_load(&hooks[d].calls) - calls0[d];
            crc_stat += stats_of(&sd, d).crc_failures;
            /* one call per sender heard: a failure notice or an ended
             * request takes none */
            DUET_TESTKIT_CHECK(res.status != DUET_OK || calls == n,
                               "%s: decode rank %d's hook ran %d times for %d senders", k->name, d,
                               calls, n);
            DUET_TESTKIT_CHECK(!(k->d_mode == HOOK_FAIL && d == 0) || calls >= 1,
                               "%s: decode rank 0's failing hook never ran", k->name);
        }
        atomic_store(&hooks[0].mode, HOOK_OK);
        DUET_TESTKIT_CHECK(k->corrupt < 0 || crc_fails == 1,
                           "%s: %d slices failed their checksum, expected 1", k->name, crc_fails);
        DUET_TESTKIT_CHECK(crc_stat - crc_stat0 == (uint64_t)crc_fails,
                           "%s: crc_failures counted %llu, %d seen", k->name,
                           (unsigned long long)(crc_stat - crc_stat0), crc_fails);
        DUET_TESTKIT_CHECK(duet_testkit_chan_say(sp->fd_d, "checked") == 0, "channel");
    }
    /* a sender whose slice came after its request failed here still waits
     * for the acknowledgement */
    DUET_TESTKIT_CHECK(duet_testkit_chan_expect(sp->fd_d, "bye", WAIT_MS) == 0,
                       "prefill did not finish");
    return scene_stop(&sd, plan);
}

static void test_hooks(void **state)
{
    /* 1 -> 2: one sender, two receivers; 2 -> 1: two senders into one
     * receiver (2 runs each way) */
    static const int plans[][3] = {{1, 2, 2}, {2, 1, 4}};
    (void)state;
    for (int t = 0; t < n_tls; t++)
        for (size_t k = 0; k < sizeof(plans) / sizeof(plans[0]); k++) {
            spec_t sp = spec_of(plans[k][0], plans[k][1], plans[k][2], tls_list[t]);
            pair_channels(&sp);
            run_pair(&sp, ck_prefill, ck_decode, 90000);
        }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ranges_order),
        cmocka_unit_test(test_hooks),
    };
    xs_init();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
