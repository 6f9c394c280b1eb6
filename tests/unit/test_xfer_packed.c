/* transfer/xfer, packed requests (DUET_XFER_SEND_PACKED, transfer/xfer_pack.h)
 * between real processes, on every transport under test (sm,self and
 * tcp,self, or DUET_XFER_TLS alone).
 *
 * The prefill child stands in for the engine: it fills pattern pages, packs
 * them into its staging arena with duet_xfer_pack_copies +
 * duet_kv_copy_apply_host (all layers before one send, or layer by layer
 * between duet_xfer_send_layers calls), and sends packed; the decode child
 * unpacks its staging the same way once its ranks completed, then checks
 * every byte of every destination page, and that no other page was
 * written.  Puts per prefill rank: one per run when every layer is released
 * at once, at most runs x layers when they are released one by one.  Plus
 * the refusals: staging that leaves the arena, a packed
 * slice for a per-page expectation and the reverse, and a corrupted packed
 * put caught by the checksum over the staging. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "common/alloc.h"
#include "kv/copy.h"
#include "tests/integration/xfer/xfer_scenes.h"
#include "transfer/xfer_pack.h"

/* Request pages are scattered in [0, PK_AREA); staging lives in the arena:
 * request q stages at unit q * PK_SLOT on prefill and 2 units further on
 * decode, so a mix-up of the two shows. */
#define PK_AREA  48
#define PK_SLOT  48
#define PK_SHIFT 2
#define PK_REQS  2

static int tokens_of(int page_size)
{
    return page_size == 1 ? 21 : 300; /* 21 pages of 1 token, 19 pages of 16 */
}

static void pk_pages(int32_t *pages, int n, int prefill, int req)
{
    if (prefill)
        duet_testkit_pages(pages, n, PK_AREA, 3, 303, req * ((n + 2) / 3));
    else
        duet_testkit_pages(pages, n, PK_AREA, 4, 404, req * ((n + 3) / 4));
}

static int32_t pk_stage(int prefill, int req)
{
    return req * PK_SLOT + (prefill ? 0 : PK_SHIFT);
}

/* Prefill: junk everywhere, the pattern in the requests' pages. */
static void pk_fill(duet_testkit_side_t *sd, int n)
{
    for (int r = 0; r < sd->tp; r++) {
        int h0 = head0_of(sd->kv_heads, sd->tp, r);
        for (int pg = 0; pg < POOL_PAGES; pg++)
            duet_testkit_fill_page(&sd->layout, sd->base[r], h0, pg,
                                   1000000 + (int64_t)pg * sd->layout.page_size);
        for (int q = 0; q < PK_REQS; q++) {
            int32_t pages[POOL_PAGES];
            pk_pages(pages, n, 1, q);
            for (int i = 0; i < n; i++)
                duet_testkit_fill_page(&sd->layout, sd->base[r], h0, pages[i],
                                       (int64_t)i * sd->layout.page_size);
        }
    }
}

/* Stage (unpack = 0, on prefill rank `rank`: the runs it sends) or
 * unstage (unpack = 1, on decode rank `rank`: the runs it receives) request
 * q's layers [l0, l1), as the engine would. */
static int pk_copy(duet_testkit_side_t *sd, const duet_slice_plan_t *plan, int rank, int q, int n,
                   int unpack, int l0, int l1)
{
    const duet_kv_layout_t *l = &sd->layout;
    int32_t pages[POOL_PAGES];
    const duet_slice_run_t *runs;
    int n_runs = unpack ? duet_slice_plan_dst_runs(plan, rank, &runs)
                        : duet_slice_plan_src_runs(plan, rank, &runs);
    duet_kv_copy_t *copies =
        duet_malloc(sizeof(*copies) * ((size_t)n * (size_t)duet_xfer_pack_slots(runs, n_runs) + 1));
    int nc;
    DUET_TESTKIT_CHECK(copies != NULL, "out of memory");
    pk_pages(pages, n, !unpack, q);
    nc = duet_xfer_pack_copies(l, pages, n, pk_stage(!unpack, q), runs, n_runs, unpack, copies);
    for (int layer = l0; layer < l1; layer++)
        duet_kv_copy_apply_host(l, sd->base[rank], layer, copies, nc);
    duet_free(copies);
    return 0;
}

static duet_xfer_send_t pk_send_desc(duet_testkit_side_t *sd, const duet_slice_plan_t *plan, int s,
                                     uint64_t id, int q, int n, int32_t *sp, int32_t *dp,
                                     unsigned flags)
{
    duet_xfer_send_t x;
    pk_pages(sp, n, 1, q);
    pk_pages(dp, n, 0, q);
    memset(&x, 0, sizeof(x));
    x.transfer_id = id;
    x.plan = plan;
    x.peers = sd->peers[s];
    x.src_pages = sp;
    x.dst_pages = dp;
    x.n_pages = n;
    x.flags = flags;
    x.src_stage0 = pk_stage(1, q);
    x.dst_stage0 = pk_stage(0, q);
    x.deadline_ns = duet_deadline_in_ms(WAIT_MS);
    return x;
}

static duet_xfer_expect_t pk_expect_desc(duet_testkit_side_t *sd, const duet_slice_plan_t *plan,
                                         int d, uint64_t id, int32_t *pages, int n, unsigned flags,
                                         int32_t stage0)
{
    duet_xfer_expect_t e;
    memset(&e, 0, sizeof(e));
    e.transfer_id = id;
    e.plan = plan;
    e.peers = sd->peers[d];
    e.pages = pages;
    e.n_pages = n;
    e.flags = flags;
    e.dst_stage0 = stage0;
    e.deadline_ns = duet_deadline_in_ms(WAIT_MS);
    return e;
}

static int pk_expect(duet_testkit_side_t *sd, const duet_slice_plan_t *plan, uint64_t id, int q,
                     int n, unsigned flags)
{
    for (int d = 0; d < sd->tp; d++) {
        int32_t pages[POOL_PAGES];
        duet_xfer_expect_t e;
        pk_pages(pages, n, 0, q);
        e = pk_expect_desc(sd, plan, d, id, pages, n, flags, pk_stage(0, q));
        DUET_TESTKIT_OK(duet_xfer_recv_expect(duet_xfer_rank(sd->x, d), &e));
    }
    return 0;
}

/* Decode: unstage request q on every rank, then check its pages. */
static int pk_unpack_verify(duet_testkit_side_t *sd, const duet_slice_plan_t *plan, int q, int n)
{
    for (int d = 0; d < sd->tp; d++) {
        int32_t pages[POOL_PAGES];
        int h0 = head0_of(sd->kv_heads, sd->tp, d);
        if (pk_copy(sd, plan, d, q, n, 1, 0, LAYERS))
            return 1;
        pk_pages(pages, n, 0, q);
        for (int i = 0; i < n; i++) {
            char what[64];
            snprintf(what, sizeof(what), "decode rank %d request %d", d, q);
            if (duet_testkit_check_page(&sd->layout, sd->base[d], h0, pages[i],
                                        (int64_t)i * sd->layout.page_size, what) != 0)
                return 1;
        }
    }
    return 0;
}

/* Decode: pages outside every request and staging range are untouched. */
static int pk_rest_untouched(duet_testkit_side_t *sd, int n)
{
    char used[POOL_PAGES];
    memset(used, 0, sizeof(used));
    for (int q = 0; q < PK_REQS; q++) {
        int32_t pages[POOL_PAGES];
        pk_pages(pages, n, 0, q);
        for (int i = 0; i < n; i++)
            used[pages[i]] = 1;
    }
    for (int d = 0; d < sd->tp; d++)
        for (int pg = 0; pg < POOL_PAGES; pg++)
            DUET_TESTKIT_CHECK(used[pg] || duet_testkit_page_is(&sd->layout, sd->base[d], pg, 0xEE),
                               "decode rank %d: page %d belongs to no request but was written", d,
                               pg);
    return 0;
}

/* Puts of prefill rank s for `chunks` chunks of layers. */
static uint64_t pk_puts_expected(const duet_slice_plan_t *plan, int s, int chunks)
{
    const duet_slice_run_t *runs;
    return (uint64_t)duet_slice_plan_src_runs(plan, s, &runs) * (uint64_t)chunks;
}

/* ---- scenario: plans ---------------------------------------------------------------------- */

/* Request 0: every layer packed, then one send_post with CRC; request 1:
 * each layer packed, then released on its own. */
static int plans_prefill(void *arg)
{
    const spec_t *sp = arg;
    int sizes[2] = {1, 16};
    for (int z = 0; z < 2; z++) {
        int ps = sizes[z], n = (tokens_of(ps) + ps - 1) / ps;
        duet_slice_plan_t *plan;
        duet_testkit_side_t sd;
        side_init(&sd, sp, DUET_XFER_PREFILL, ps);
        if (duet_testkit_side_start(&sd) || duet_testkit_side_connect(&sd, sp->fd_p))
            return 1;
        DUET_TESTKIT_OK(duet_slice_plan_create(sp->P, sp->D, sp->H, &plan));
        pk_fill(&sd, n);
        DUET_TESTKIT_CHECK(duet_testkit_chan_expect(sp->fd_p, "ready", WAIT_MS) == 0,
                           "decode not ready");
        for (int s = 0; s < sp->P; s++) {
            int32_t a[POOL_PAGES], b[POOL_PAGES];
            duet_xfer_send_t x = pk_send_desc(&sd, plan, s, 2000, 0, n, a, b,
                                              DUET_XFER_SEND_PACKED | DUET_XFER_SEND_CRC);
            if (pk_copy(&sd, plan, s, 0, n, 0, 0, LAYERS))
                return 1;
            DUET_TESTKIT_OK(duet_xfer_send_post(duet_xfer_rank(sd.x, s), &x, TOKEN));
        }
        for (int s = 0; s < sp->P; s++) {
            int32_t a[POOL_PAGES], b[POOL_PAGES];
            duet_xfer_rank_t *r = duet_xfer_rank(sd.x, s);
            duet_xfer_send_t x =
                pk_send_desc(&sd, plan, s, 2001, 1, n, a, b, DUET_XFER_SEND_PACKED);
            DUET_TESTKIT_OK(duet_xfer_send_begin(r, &x));
            for (int l = 0; l < LAYERS; l++) {
                if (pk_copy(&sd, plan, s, 1, n, 0, l, l + 1))
                    return 1;
                DUET_TESTKIT_OK(duet_xfer_send_layers(r, 2001, l, l + 1));
            }
            DUET_TESTKIT_OK(duet_xfer_send_end(r, 2001, DUET_OK, TOKEN));
        }
        for (int s = 0; s < sp->P; s++) {
            uint64_t puts = 0;
            for (int q = 0; q < PK_REQS; q++) {
                duet_xfer_result_t res;
                DUET_TESTKIT_OK(duet_xfer_send_wait(duet_xfer_rank(sd.x, s), 2000 + (uint64_t)q,
                                                    duet_deadline_in_ms(WAIT_MS), &res));
                DUET_TESTKIT_CHECK(res.status == DUET_OK, "prefill rank %d request %d: %s", s, q,
                                   res.detail);
                /* request 0: every layer at once, one chunk; request 1:
                 * layer by layer, one chunk each unless posting lagged */
                DUET_TESTKIT_CHECK(q == 0 ? res.puts == pk_puts_expected(plan, s, 1)
                                          : res.puts >= pk_puts_expected(plan, s, 1) &&
                                                res.puts <= pk_puts_expected(plan, s, LAYERS),
                                   "prefill rank %d request %d (%d pages): %llu puts, expected "
                                   "%llu (one chunk) to %llu (one per layer)",
                                   s, q, n, (unsigned long long)res.puts,
                                   (unsigned long long)pk_puts_expected(plan, s, 1),
                                   (unsigned long long)pk_puts_expected(plan, s, LAYERS));
                puts += res.puts;
            }
            DUET_TESTKIT_CHECK(stats_of(&sd, s).puts == puts,
                               "prefill rank %d: stats say %llu puts", s,
                               (unsigned long long)stats_of(&sd, s).puts);
        }
        DUET_TESTKIT_CHECK(duet_testkit_chan_expect(sp->fd_p, "verified", WAIT_MS) == 0,
                           "decode did not verify");
        duet_slice_plan_destroy(plan);
        if (duet_testkit_side_stop(&sd))
            return 1;
        DUET_TESTKIT_CHECK(duet_testkit_chan_say(sp->fd_p, "stopped") == 0, "channel");
    }
    return 0;
}

static int plans_decode(void *arg)
{
    const spec_t *sp = arg;
    int sizes[2] = {1, 16};
    for (int z = 0; z < 2; z++) {
        int ps = sizes[z], n = (tokens_of(ps) + ps - 1) / ps;
        duet_slice_plan_t *plan;
        duet_testkit_side_t sd;
        side_init(&sd, sp, DUET_XFER_DECODE, ps);
        if (duet_testkit_side_start(&sd))
            return 1;
        DUET_TESTKIT_OK(duet_slice_plan_create(sp->P, sp->D, sp->H, &plan));
        for (int d = 0; d < sp->D; d++)
            memset(sd.base[d], 0xEE, duet_kv_total_bytes(&sd.layout));
        if (duet_testkit_side_connect(&sd, sp->fd_d))
            return 1;
        for (int q = 0; q < PK_REQS; q++)
            if (pk_expect(&sd, plan, 2000 + (uint64_t)q, q, n, DUET_XFER_EXPECT_PACKED))
                return 1;
        DUET_TESTKIT_CHECK(duet_testkit_chan_say(sp->fd_d, "ready") == 0, "channel");
        for (int d = 0; d < sp->D; d++) {
            for (int q = 0; q < PK_REQS; q++) {
                duet_xfer_result_t res;
                uint64_t want = duet_kv_page_bytes(&sd.layout) * (uint64_t)n * 2u * LAYERS;
                DUET_TESTKIT_OK(duet_xfer_recv_wait(duet_xfer_rank(sd.x, d), 2000 + (uint64_t)q,
                                                    duet_deadline_in_ms(WAIT_MS), &res));
                DUET_TESTKIT_CHECK(res.status == DUET_OK && res.first_token == TOKEN,
                                   "decode rank %d request %d: %s", d, q, res.detail);
                DUET_TESTKIT_CHECK(res.bytes == want, "decode rank %d: %llu bytes, expected %llu",
                                   d, (unsigned long long)res.bytes, (unsigned long long)want);
            }
        }
        for (int q = 0; q < PK_REQS; q++)
            if (pk_unpack_verify(&sd, plan, q, n))
                return 1;
        if (pk_rest_untouched(&sd, n))
            return 1;
        DUET_TESTKIT_CHECK(duet_testkit_chan_say(sp->fd_d, "verified") == 0, "channel");
        DUET_TESTKIT_CHECK(duet_testkit_chan_expect(sp->fd_d, "stopped", WAIT_MS) == 0,
                           "prefill did not stop");
        duet_slice_plan_destroy(plan);
        if (duet_testkit_side_stop(&sd))
            return 1;
    }
    return 0;
}

/* ---- scenario: refusals ------------------------------------------------------------------- */

#define RF_PS 16
#define RF_N  19

/* The caller's staging mistakes are refused before anything moves.  Case
 * k of the sends: src_stage0 / dst_stage0 (INT32_MIN: the default). */
static int refuse_send(duet_testkit_side_t *sd, const duet_slice_plan_t *plan)
{
    static const struct {
        int32_t src, dst;
        const char *want;
    } cases[] = {
        {-1, INT32_MIN, "prefill rank 0: source staging units [-1, "},
        {90, INT32_MIN, "prefill rank 0: source staging units [90, "},
        {INT32_MIN, 80,
         "decode rank 0: destination staging units [80, 99) outside the 96-unit "
         "arena"},
        {INT32_MIN, -3,
         "decode rank 0: destination staging units [-3, 16) outside the 96-unit "
         "arena"},
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        int32_t a[POOL_PAGES], b[POOL_PAGES];
        duet_xfer_send_t x =
            pk_send_desc(sd, plan, 0, 900 + k, 0, RF_N, a, b, DUET_XFER_SEND_PACKED);
        char want[128];
        duet_status_t st;
        if (cases[k].src != INT32_MIN)
            x.src_stage0 = cases[k].src;
        if (cases[k].dst != INT32_MIN)
            x.dst_stage0 = cases[k].dst;
        snprintf(want, sizeof(want), "%s", cases[k].want);
        duet_error_clear();
        st = duet_xfer_send_begin(duet_xfer_rank(sd->x, 0), &x);
        DUET_TESTKIT_CHECK(st == DUET_ERR_INVALID && strstr(duet_error_msg(), want),
                           "send case %zu: %s '%s', expected '%s'", k, duet_status_name(st),
                           duet_error_msg(), want);
    }
    {
        int32_t a[POOL_PAGES], b[POOL_PAGES];
        duet_xfer_send_t x = pk_send_desc(sd, plan, 0, 909, 0, RF_N, a, b, 1u << 7);
        DUET_TESTKIT_CHECK(duet_xfer_send_begin(duet_xfer_rank(sd->x, 0), &x) == DUET_ERR_INVALID &&
                               strstr(duet_error_msg(), "unknown flags 0x80"),
                           "unknown send flags: '%s'", duet_error_msg());
    }
    return 0;
}

/* Case k of the expectations: dst_stage0. */
static int refuse_expect(duet_testkit_side_t *sd, const duet_slice_plan_t *plan)
{
    int32_t pages[POOL_PAGES];
    static const struct {
        int32_t stage0;
        unsigned flags;
        const char *want;
    } cases[] = {
        {-5, DUET_XFER_EXPECT_PACKED,
         "decode rank 0: staging units [-5, 14) outside the 96-unit arena"},
        {78, DUET_XFER_EXPECT_PACKED,
         "decode rank 0: staging units [78, 97) outside the 96-unit arena"},
        {50, 1u << 5, "unknown flags 0x20"},
    };
    pk_pages(pages, RF_N, 0, 0);
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        int32_t stage0 = cases[k].stage0;
        duet_xfer_expect_t e =
            pk_expect_desc(sd, plan, 0, 800 + k, pages, RF_N, cases[k].flags, stage0);
        char want[128];
        duet_status_t st;
        snprintf(want, sizeof(want), "%s", cases[k].want);
        duet_error_clear();
        st = duet_xfer_recv_expect(duet_xfer_rank(sd->x, 0), &e);
        DUET_TESTKIT_CHECK(st == DUET_ERR_INVALID && strstr(duet_error_msg(), want),
                           "expect case %zu: %s '%s', expected '%s'", k, duet_status_name(st),
                           duet_error_msg(), want);
    }
    /* staging may sit anywhere in the arena */
    {
        int32_t hi[3] = {90, 91, 95};
        duet_xfer_expect_t e = pk_expect_desc(sd, plan, 0, 810, hi, 3, DUET_XFER_EXPECT_PACKED, 0);
        DUET_TESTKIT_OK(duet_xfer_recv_expect(duet_xfer_rank(sd->x, 0), &e));
        DUET_TESTKIT_OK(duet_xfer_recv_cancel(duet_xfer_rank(sd->x, 0), 810));
    }
    return 0;
}

static int refuse_prefill(void *arg)
{
    const spec_t *sp = arg;
    duet_slice_plan_t *plan;
    duet_xfer_result_t res;
    duet_testkit_side_t sd;
    side_init(&sd, sp, DUET_XFER_PREFILL, RF_PS);
    if (duet_testkit_side_start(&sd) || duet_testkit_side_connect(&sd, sp->fd_p))
        return 1;
    DUET_TESTKIT_OK(duet_slice_plan_create(sp->P, sp->D, sp->H, &plan));
    pk_fill(&sd, RF_N);
    if (refuse_send(&sd, plan))
        return 1;
    DUET_TESTKIT_CHECK(duet_testkit_chan_expect(sp->fd_p, "ready", WAIT_MS) == 0,
                       "decode not ready");
    /* 3000: packed into a per-page expectation; 3001: the reverse */
    for (int k = 0; k < 2; k++) {
        int32_t a[POOL_PAGES], b[POOL_PAGES];
        duet_xfer_send_t x = pk_send_desc(&sd, plan, 0, 3000 + (uint64_t)k, 0, RF_N, a, b,
                                          k == 0 ? DUET_XFER_SEND_PACKED : 0);
        if (k == 0 && pk_copy(&sd, plan, 0, 0, RF_N, 0, 0, LAYERS))
            return 1;
        DUET_TESTKIT_OK(duet_xfer_send_post(duet_xfer_rank(sd.x, 0), &x, TOKEN));
        if (send_result(&sd, 0, 3000 + (uint64_t)k, &res))
            return 1;
        DUET_TESTKIT_CHECK(res.status == DUET_ERR_MISMATCH && strstr(res.detail, "refused"),
                           "request %d: %s (%s)", 3000 + k, duet_status_name(res.status),
                           res.detail);
    }
    /* 3002: the 2nd put (every layer is released at once: one put per run)
     * lands corrupted; 3003 is fine */
    for (int k = 0; k < 2; k++) {
        int32_t a[POOL_PAGES], b[POOL_PAGES];
        duet_xfer_send_t x = pk_send_desc(&sd, plan, 0, 3002 + (uint64_t)k, k, RF_N, a, b,
                                          DUET_XFER_SEND_PACKED | DUET_XFER_SEND_CRC);
        if (pk_copy(&sd, plan, 0, k, RF_N, 0, 0, LAYERS))
            return 1;
        if (k == 0)
            DUET_TESTKIT_OK(duet_xfer_debug_corrupt_put(duet_xfer_rank(sd.x, 0), 1));
        DUET_TESTKIT_OK(duet_xfer_send_post(duet_xfer_rank(sd.x, 0), &x, TOKEN));
        if (send_result(&sd, 0, 3002 + (uint64_t)k, &res))
            return 1;
        DUET_TESTKIT_CHECK(k == 0 ? res.status == DUET_ERR_MISMATCH && strstr(res.detail, "refused")
                                  : res.status == DUET_OK,
                           "request %d: %s (%s)", 3002 + k, duet_status_name(res.status),
                           res.detail);
    }
    DUET_TESTKIT_CHECK(duet_testkit_chan_expect(sp->fd_p, "verified", WAIT_MS) == 0,
                       "decode did not verify");
    return scene_stop(&sd, plan);
}

static int refuse_decode(void *arg)
{
    const spec_t *sp = arg;
    static const char *const want[2] = {
        "prefill rank 0 sent a packed slice; decode rank %d expected a per-page one",
        "prefill rank 0 sent a per-page slice; decode rank %d expected a packed one"};
    int bad = 0, crc_failures = 0;
    duet_slice_plan_t *plan;
    duet_testkit_side_t sd;
    side_init(&sd, sp, DUET_XFER_DECODE, RF_PS);
    if (duet_testkit_side_start(&sd))
        return 1;
    for (int d = 0; d < sd.tp; d++)
        memset(sd.base[d], 0xEE, duet_kv_total_bytes(&sd.layout));
    if (duet_testkit_side_connect(&sd, sp->fd_d))
        return 1;
    DUET_TESTKIT_OK(duet_slice_plan_create(sp->P, sp->D, sp->H, &plan));
    if (refuse_expect(&sd, plan))
        return 1;
    if (pk_expect(&sd, plan, 3000, 0, RF_N, 0) ||
        pk_expect(&sd, plan, 3001, 0, RF_N, DUET_XFER_EXPECT_PACKED) ||
        pk_expect(&sd, plan, 3002, 0, RF_N, DUET_XFER_EXPECT_PACKED) ||
        pk_expect(&sd, plan, 3003, 1, RF_N, DUET_XFER_EXPECT_PACKED))
        return 1;
    DUET_TESTKIT_CHECK(duet_testkit_chan_say(sp->fd_d, "ready") == 0, "channel");
    for (int d = 0; d < sd.tp; d++) {
        for (int k = 0; k < 2; k++) {
            duet_xfer_result_t res;
            char detail[128];
            if (recv_result(&sd, d, 3000 + (uint64_t)k, &res))
                return 1;
            snprintf(detail, sizeof(detail), want[k], d);
            DUET_TESTKIT_CHECK(res.status == DUET_ERR_MISMATCH && strstr(res.detail, detail),
                               "decode rank %d request %d: %s (%s)", d, 3000 + k,
                               duet_status_name(res.status), res.detail);
        }
        {
            duet_xfer_result_t res;
            if (recv_result(&sd, d, 3002, &res))
                return 1;
            if (res.status != DUET_OK) {
                DUET_TESTKIT_CHECK(
                    res.status == DUET_ERR_MISMATCH &&
                        strstr(res.detail, "checksum mismatch on the slice from prefill rank 0"),
                    "decode rank %d request 3002: %s", d, res.detail);
                bad++;
            }
        }
        crc_failures += (int)stats_of(&sd, d).crc_failures;
    }
    DUET_TESTKIT_CHECK(bad == 1 && crc_failures == 1, "%d ranks failed, %d crc failures", bad,
                       crc_failures);
    if (recv_ok(&sd, 3003) || pk_unpack_verify(&sd, plan, 1, RF_N))
        return 1;
    DUET_TESTKIT_CHECK(duet_testkit_chan_say(sp->fd_d, "verified") == 0, "channel");
    return scene_stop(&sd, plan);
}

/* ---- tests --------------------------------------------------------------------------------- */

static void test_plans(void **state)
{
    /* replication on prefill (P > H), on decode (D > H), on both, and none */
    static const int plans[][3] = {{1, 2, 2}, {2, 1, 2}, {2, 4, 2}, {4, 2, 2}, {4, 8, 2},
                                   {1, 2, 8}, {2, 1, 8}, {2, 4, 8}, {4, 2, 8}};
    (void)state;
    for (int t = 0; t < n_tls; t++)
        for (size_t k = 0; k < sizeof(plans) / sizeof(plans[0]); k++) {
            spec_t sp = spec_of(plans[k][0], plans[k][1], plans[k][2], tls_list[t]);
            /* registered (not transport-allocated) pools: puts not one-sided */
            sp.reg_d = k == 2 || k == 6;
            sp.reg_p = k == 3 || k == 6;
            pair_channels(&sp);
            run_pair(&sp, plans_prefill, plans_decode, 120000);
        }
}

static void test_refusals(void **state)
{
    (void)state;
    for (int t = 0; t < n_tls; t++) {
        spec_t sp = spec_of(1, 2, 2, tls_list[t]);
        pair_channels(&sp);
        run_pair(&sp, refuse_prefill, refuse_decode, 60000);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plans),
        cmocka_unit_test(test_refusals),
    };
    xs_init();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
