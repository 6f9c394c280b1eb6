/* Scenario helpers shared by the transfer engine's process tests
 * (tests/unit/test_xfer_*.c; include after cmocka.h): the KV shape of the
 * tests, which pages each request uses on each side, filling and checking
 * them, and running a prefill child and a decode child against each other
 * on every transport under test.  The process harness underneath is the
 * duet_testkit library (testkit/testkit.h), which the benchmarks use too. */
#ifndef DUET_TESTS_XFER_SCENES_H
#define DUET_TESTS_XFER_SCENES_H

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "testkit/testkit.h"
#include "transfer/slice_plan.h"
#include "transfer/xfer_segs.h"

#define LAYERS     3
#define HEAD_DIM   8
#define POOL_PAGES 96
#define TOKEN      4242
#define WAIT_MS    20000

/* Transports under test: sm,self and tcp,self, or DUET_XFER_TLS alone. */
static const char *tls_list[2];
static int n_tls;

static inline void xs_init(void)
{
    const char *only = getenv("DUET_XFER_TLS");
    if (only != NULL && only[0] != '\0') {
        tls_list[n_tls++] = only;
    } else {
        tls_list[n_tls++] = "sm,self";
        tls_list[n_tls++] = "tcp,self";
    }
    signal(SIGPIPE, SIG_IGN);
    if (getenv("DUET_LOG_LEVEL") == NULL)
        duet_log_set_level(DUET_LOG_LEVEL_ERROR);
    duet_log_init_from_env();
}

/* ---- scenario parameters shared by both children ------------------------------------- */

typedef struct {
    int P, D, H;
    int page_size;
    int n_tokens;
    const char *tls;
    int fd_p, fd_d;           /* socketpair: prefill end, decode end */
    int ctl_p, ctl_d;         /* child -> parent channels (child ends) */
    int ctl_p_par, ctl_d_par; /* parent ends */
    int fd_d2, fd_p2;         /* a second decode incarnation (reconnect test) */
    int early_ttl_ms;
    int reg_p, reg_d; /* registered (not UCX-allocated) pools on that side */
} spec_t;

/* A pair's spec: P x D ranks, H KV heads, over tls; the rest zero (the
 * scene's defaults; channels from pair_channels). */
static inline spec_t spec_of(int P, int D, int H, const char *tls)
{
    return (spec_t){.P = P, .D = D, .H = H, .tls = tls};
}

static inline void side_init(duet_testkit_side_t *sd, const spec_t *sp, duet_xfer_role_t role,
                             int page_size)
{
    memset(sd, 0, sizeof(*sd));
    sd->role = role;
    sd->tp = role == DUET_XFER_PREFILL ? sp->P : sp->D;
    sd->remote_tp = role == DUET_XFER_PREFILL ? sp->D : sp->P;
    sd->kv_heads = sp->H;
    sd->layout.n_layers = LAYERS;
    sd->layout.n_pages = POOL_PAGES;
    sd->layout.page_size = page_size;
    sd->layout.head_dim = HEAD_DIM;
    sd->dtype = page_size == 1 ? DUET_DTYPE_F32 : DUET_DTYPE_BF16;
    sd->layout.elem_size = (int)duet_dtype_size(sd->dtype);
    sd->fingerprint = 0x5eed5eed12345678ULL;
    sd->tls = sp->tls;
    sd->early_ttl_ms = sp->early_ttl_ms;
    sd->registered = role == DUET_XFER_PREFILL ? sp->reg_p : sp->reg_d;
    sd->stage_units = 96; /* packed transfers' staging arena */
}

static inline int head0_of(int H, int tp, int rank)
{
    int h0, n;
    duet_kv_heads_owned(H, tp, rank, &h0, &n);
    return h0;
}

/* Request r's pages: prefill blocks of 3, decode blocks of 4, so the two
 * sides' consecutive runs do not line up. */
static inline void req_pages(int32_t *pages, int n, int prefill, int req)
{
    if (prefill)
        duet_testkit_pages(pages, n, POOL_PAGES, 3, 101, req * ((n + 2) / 3));
    else
        duet_testkit_pages(pages, n, POOL_PAGES, 4, 202, req * ((n + 3) / 4));
}

static inline int n_pages_of(const spec_t *sp, int page_size)
{
    return (sp->n_tokens + page_size - 1) / page_size;
}

/* Prefill: fill every page with junk, the request's pages with the pattern. */
static inline void prefill_fill(duet_testkit_side_t *sd, int n_req, int n)
{
    for (int r = 0; r < sd->tp; r++) {
        int h0 = head0_of(sd->kv_heads, sd->tp, r);
        for (int pg = 0; pg < POOL_PAGES; pg++)
            duet_testkit_fill_page(&sd->layout, sd->base[r], h0, pg,
                                   1000000 + (int64_t)pg * sd->layout.page_size);
        for (int q = 0; q < n_req; q++) {
            int32_t pages[POOL_PAGES];
            req_pages(pages, n, 1, q);
            for (int i = 0; i < n; i++)
                duet_testkit_fill_page(&sd->layout, sd->base[r], h0, pages[i],
                                       (int64_t)i * sd->layout.page_size);
        }
    }
}

/* Decode: every page of the requests in `reqs` matches the pattern and,
 * with check_rest, every other page is still 0xEE. */
static inline int decode_verify_some(duet_testkit_side_t *sd, const int *reqs, int n_req, int n,
                                     int check_rest)
{
    for (int r = 0; r < sd->tp; r++) {
        int h0 = head0_of(sd->kv_heads, sd->tp, r);
        char owner[POOL_PAGES];
        memset(owner, -1, sizeof(owner));
        for (int k = 0; k < n_req; k++) {
            int32_t pages[POOL_PAGES];
            req_pages(pages, n, 0, reqs[k]);
            for (int i = 0; i < n; i++) {
                char what[64];
                snprintf(what, sizeof(what), "decode rank %d request %d", r, reqs[k]);
                owner[pages[i]] = (char)k;
                if (duet_testkit_check_page(&sd->layout, sd->base[r], h0, pages[i],
                                            (int64_t)i * sd->layout.page_size, what) != 0)
                    return 1;
            }
        }
        for (int pg = 0; pg < POOL_PAGES && check_rest; pg++)
            DUET_TESTKIT_CHECK(
                owner[pg] >= 0 || duet_testkit_page_is(&sd->layout, sd->base[r], pg, 0xEE),
                "decode rank %d: page %d belongs to no request but was written", r, pg);
    }
    return 0;
}

static inline int decode_verify(duet_testkit_side_t *sd, const int *reqs, int n_req, int n)
{
    return decode_verify_some(sd, reqs, n_req, n, 1);
}

static inline int expect_all_flags(duet_testkit_side_t *sd, const duet_slice_plan_t *plan,
                                   uint64_t id, int req, int n, int64_t deadline, unsigned flags)
{
    int32_t pages[POOL_PAGES];
    duet_xfer_expect_t e[DUET_TP_MAX];
    duet_xfer_rank_t *ranks[DUET_TP_MAX];
    duet_status_t st[DUET_TP_MAX];
    req_pages(pages, n, 0, req);
    /* every rank at once, as the decode daemon registers them */
    for (int d = 0; d < sd->tp; d++) {
        ranks[d] = duet_xfer_rank(sd->x, d);
        e[d] = (duet_xfer_expect_t){.transfer_id = id,
                                    .plan = plan,
                                    .peers = sd->peers[d],
                                    .pages = pages,
                                    .n_pages = n,
                                    .deadline_ns = deadline,
                                    .flags = flags};
    }
    DUET_TESTKIT_OK(duet_xfer_recv_expect_all(ranks, e, sd->tp, st));
    return 0;
}

static inline int expect_all(duet_testkit_side_t *sd, const duet_slice_plan_t *plan, uint64_t id,
                             int req, int n, int64_t deadline)
{
    return expect_all_flags(sd, plan, id, req, n, deadline, 0);
}

static inline duet_xfer_send_t send_desc(duet_testkit_side_t *sd, const duet_slice_plan_t *plan,
                                         int s, uint64_t id, int req, int n, int32_t *sp,
                                         int32_t *dp, unsigned flags)
{
    duet_xfer_send_t x;
    req_pages(sp, n, 1, req);
    req_pages(dp, n, 0, req);
    memset(&x, 0, sizeof(x));
    x.transfer_id = id;
    x.plan = plan;
    x.peers = sd->peers[s];
    x.src_pages = sp;
    x.dst_pages = dp;
    x.n_pages = n;
    x.flags = flags;
    x.deadline_ns = duet_deadline_in_ms(WAIT_MS);
    return x;
}

/* Expected puts of prefill rank s for one request. */
static inline uint64_t puts_expected(duet_testkit_side_t *sd, const duet_slice_plan_t *plan, int s,
                                     int req, int n)
{
    const duet_slice_run_t *runs;
    int nr = duet_slice_plan_src_runs(plan, s, &runs);
    int32_t sp[POOL_PAGES], dp[POOL_PAGES];
    duet_kv_layout_t dl = sd->layout;
    int h0;
    duet_kv_heads_owned(sd->kv_heads, sd->remote_tp, 0, &h0, &dl.n_kv_heads);
    req_pages(sp, n, 1, req);
    req_pages(dp, n, 0, req);
    return duet__seg_count(&sd->layout, &dl, runs, nr, sp, dp, n);
}

/* ---- scenarios on 16-token pages, 3 pages a request ----------------------------------- */

#define NPG 3

static inline int scene_start(duet_testkit_side_t *sd, const spec_t *sp, duet_xfer_role_t role,
                              int fd, int n_req, duet_slice_plan_t **plan_p)
{
    side_init(sd, sp, role, 16);
    if (duet_testkit_side_start(sd))
        return 1;
    if (role == DUET_XFER_DECODE)
        for (int d = 0; d < sd->tp; d++)
            memset(sd->base[d], 0xEE, duet_kv_total_bytes(&sd->layout));
    if (duet_testkit_side_connect(sd, fd))
        return 1;
    if (role == DUET_XFER_PREFILL)
        prefill_fill(sd, n_req, NPG);
    DUET_TESTKIT_OK(duet_slice_plan_create(sp->P, sp->D, sp->H, plan_p));
    return 0;
}

static inline int scene_stop(duet_testkit_side_t *sd, duet_slice_plan_t *plan)
{
    duet_slice_plan_destroy(plan);
    return duet_testkit_side_stop(sd);
}

static inline int send_one(duet_testkit_side_t *sd, const duet_slice_plan_t *plan, int s,
                           uint64_t id, int req, unsigned flags)
{
    int32_t a[NPG], b[NPG];
    duet_xfer_send_t x = send_desc(sd, plan, s, id, req, NPG, a, b, flags);
    DUET_TESTKIT_OK(duet_xfer_send_post(duet_xfer_rank(sd->x, s), &x, TOKEN));
    return 0;
}

static inline int send_result(duet_testkit_side_t *sd, int s, uint64_t id, duet_xfer_result_t *res)
{
    DUET_TESTKIT_OK(
        duet_xfer_send_wait(duet_xfer_rank(sd->x, s), id, duet_deadline_in_ms(WAIT_MS), res));
    return 0;
}

static inline int send_ok(duet_testkit_side_t *sd, int s, uint64_t id)
{
    duet_xfer_result_t res;
    if (send_result(sd, s, id, &res))
        return 1;
    DUET_TESTKIT_CHECK(res.status == DUET_OK, "prefill rank %d request %llu: %s", s,
                       (unsigned long long)id, res.detail);
    return 0;
}

static inline int recv_result(duet_testkit_side_t *sd, int d, uint64_t id, duet_xfer_result_t *res)
{
    DUET_TESTKIT_OK(
        duet_xfer_recv_wait(duet_xfer_rank(sd->x, d), id, duet_deadline_in_ms(WAIT_MS), res));
    return 0;
}

static inline int recv_ok(duet_testkit_side_t *sd, uint64_t id)
{
    for (int d = 0; d < sd->tp; d++) {
        duet_xfer_result_t res;
        if (recv_result(sd, d, id, &res))
            return 1;
        DUET_TESTKIT_CHECK(res.status == DUET_OK && res.first_token == TOKEN,
                           "decode rank %d request %llu: %s", d, (unsigned long long)id,
                           res.detail);
    }
    return 0;
}

static inline duet_xfer_stats_t stats_of(duet_testkit_side_t *sd, int rank)
{
    duet_xfer_stats_t st;
    duet_xfer_rank_stats(duet_xfer_rank(sd->x, rank), &st);
    return st;
}

/* Wait until rank 0 issued at least one put. */
static inline int wait_puts(duet_testkit_side_t *sd)
{
    int64_t dl = duet_deadline_in_ms(5000);
    while (stats_of(sd, 0).puts == 0 && duet_now_ns() < dl)
        usleep(1000);
    DUET_TESTKIT_CHECK(stats_of(sd, 0).puts > 0, "no put was issued");
    return 0;
}

/* P=2, D=1: completion waits for both senders, in either order; a missing
 * sender becomes a deadline error that names it. */

/* ---- running a pair ----------------------------------------------------------------------------
 */

static inline void pair_channels(spec_t *sp)
{
    int a[2], b[2], c[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, a), 0);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, b), 0);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, c), 0);
    sp->fd_p = a[0];
    sp->fd_d = a[1];
    sp->ctl_p = b[0];
    sp->ctl_p_par = b[1];
    sp->ctl_d = c[0];
    sp->ctl_d_par = c[1];
    sp->fd_p2 = sp->fd_d2 = -1;
}

static inline void pair_close(spec_t *sp)
{
    int fds[] = {sp->fd_p,  sp->fd_d,      sp->ctl_p, sp->ctl_p_par,
                 sp->ctl_d, sp->ctl_d_par, sp->fd_p2, sp->fd_d2};
    for (size_t i = 0; i < sizeof(fds) / sizeof(fds[0]); i++)
        if (fds[i] >= 0)
            close(fds[i]);
}

static inline void run_pair(spec_t *sp, duet_testkit_child_cb pre, duet_testkit_child_cb dec,
                            int timeout_ms)
{
    pid_t pids[2];
    int rc[2];
    int close_p[] = {sp->fd_d, sp->ctl_d, sp->ctl_p_par, sp->ctl_d_par};
    int close_d[] = {sp->fd_p, sp->ctl_p, sp->ctl_p_par, sp->ctl_d_par};
    pids[0] = duet_testkit_spawn("prefill", pre, sp, close_p, 4);
    pids[1] = duet_testkit_spawn("decode", dec, sp, close_d, 4);
    duet_testkit_wait_all(pids, 2, duet_deadline_in_ms(timeout_ms), rc);
    pair_close(sp);
    if (rc[0] != 0 || rc[1] != 0)
        fail_msg("P=%d D=%d H=%d tls %s: prefill exit %d, decode exit %d", sp->P, sp->D, sp->H,
                 sp->tls, rc[0], rc[1]);
}

static inline void scene(int P, int D, int H, duet_testkit_child_cb pre, duet_testkit_child_cb dec,
                         int early_ttl_ms)
{
    for (int t = 0; t < n_tls; t++) {
        spec_t sp;
        memset(&sp, 0, sizeof(sp));
        sp.P = P;
        sp.D = D;
        sp.H = H;
        sp.n_tokens = 37;
        sp.tls = tls_list[t];
        sp.early_ttl_ms = early_ttl_ms;
        pair_channels(&sp);
        run_pair(&sp, pre, dec, 60000);
    }
}

#endif
