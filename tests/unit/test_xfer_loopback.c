/* transfer/xfer, moving data: real processes, real UCX.  Each test forks a
 * prefill child and a decode child (UCX lives only in the children), which
 * swap descriptors over a socketpair and move pattern-filled KV pages; the
 * parent waits for both with a deadline, so a hang fails the test.
 *
 * Every scenario runs on shared memory (UCX_TLS=sm,self) and on tcp
 * (UCX_TLS=tcp,self), or only on the one named by DUET_XFER_TLS.
 * Failures (cancel, dead peers, allocation failures) are in
 * test_xfer_faults.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <cmocka.h>

#include "common/alloc.h"
#include "tests/integration/xfer/xfer_scenes.h"

/* ---- scenario: plans ------------------------------------------------------------------------ */

/* Request 0: whole-request posting with CRC; request 1: per-layer posting. */
static int plans_prefill(void *arg)
{
    const spec_t *sp = arg;
    int sizes[2] = {1, 16};
    for (int z = 0; z < 2; z++) {
        int ps = sizes[z], n = n_pages_of(sp, ps);
        duet_slice_plan_t *plan;
        duet_testkit_side_t sd;
        side_init(&sd, sp, DUET_XFER_PREFILL, ps);
        if (duet_testkit_side_start(&sd) || duet_testkit_side_connect(&sd, sp->fd_p))
            return 1;
        DUET_TESTKIT_OK(duet_slice_plan_create(sp->P, sp->D, sp->H, &plan));
        prefill_fill(&sd, 2, n);
        DUET_TESTKIT_CHECK(duet_testkit_chan_expect(sp->fd_p, "ready", WAIT_MS) == 0,
                           "decode not ready");
        for (int s = 0; s < sp->P; s++) {
            int32_t a[POOL_PAGES], b[POOL_PAGES];
            duet_xfer_send_t x = send_desc(&sd, plan, s, 1000, 0, n, a, b, DUET_XFER_SEND_CRC);
            DUET_TESTKIT_OK(duet_xfer_send_post(duet_xfer_rank(sd.x, s), &x, TOKEN));
        }
        for (int s = 0; s < sp->P; s++) {
            int32_t a[POOL_PAGES], b[POOL_PAGES];
            duet_xfer_rank_t *r = duet_xfer_rank(sd.x, s);
            duet_xfer_send_t x = send_desc(&sd, plan, s, 1001, 1, n, a, b, 0);
            DUET_TESTKIT_OK(duet_xfer_send_begin(r, &x));
            for (int l = 0; l < LAYERS; l++)
                DUET_TESTKIT_OK(duet_xfer_send_layers(r, 1001, l, l + 1));
            DUET_TESTKIT_OK(duet_xfer_send_end(r, 1001, DUET_OK, TOKEN));
        }
        for (int s = 0; s < sp->P; s++) {
            for (int q = 0; q < 2; q++) {
                duet_xfer_result_t res;
                DUET_TESTKIT_OK(duet_xfer_send_wait(duet_xfer_rank(sd.x, s), 1000 + (uint64_t)q,
                                                    duet_deadline_in_ms(WAIT_MS), &res));
                DUET_TESTKIT_CHECK(res.status == DUET_OK, "prefill rank %d request %d: %s", s, q,
                                   res.detail);
                DUET_TESTKIT_CHECK(res.puts == puts_expected(&sd, plan, s, q, n),
                                   "prefill rank %d: %llu puts, expected %llu", s,
                                   (unsigned long long)res.puts,
                                   (unsigned long long)puts_expected(&sd, plan, s, q, n));
            }
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
        int ps = sizes[z], n = n_pages_of(sp, ps), reqs[2] = {0, 1};
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
        for (int q = 0; q < 2; q++)
            if (expect_all(&sd, plan, 1000 + (uint64_t)q, q, n, duet_deadline_in_ms(WAIT_MS)))
                return 1;
        DUET_TESTKIT_CHECK(duet_testkit_chan_say(sp->fd_d, "ready") == 0, "channel");
        for (int d = 0; d < sp->D; d++) {
            for (int q = 0; q < 2; q++) {
                duet_xfer_result_t res;
                uint64_t want = duet_kv_page_bytes(&sd.layout) * (uint64_t)n * 2u * LAYERS;
                DUET_TESTKIT_OK(duet_xfer_recv_wait(duet_xfer_rank(sd.x, d), 1000 + (uint64_t)q,
                                                    duet_deadline_in_ms(WAIT_MS), &res));
                DUET_TESTKIT_CHECK(res.status == DUET_OK, "decode rank %d request %d: %s", d, q,
                                   res.detail);
                DUET_TESTKIT_CHECK(res.first_token == TOKEN, "first token %lld",
                                   (long long)res.first_token);
                DUET_TESTKIT_CHECK(res.bytes == want, "decode rank %d: %llu bytes, expected %llu",
                                   d, (unsigned long long)res.bytes, (unsigned long long)want);
            }
        }
        if (decode_verify(&sd, reqs, 2, n))
            return 1;
        /* Per-layer posting put the same bytes as whole-request posting. */
        for (int d = 0; d < sp->D; d++) {
            int32_t a[POOL_PAGES], b[POOL_PAGES];
            req_pages(a, n, 0, 0);
            req_pages(b, n, 0, 1);
            for (int l = 0; l < LAYERS; l++)
                for (int kv = 0; kv < 2; kv++)
                    for (int i = 0; i < n; i++)
                        DUET_TESTKIT_CHECK(
                            memcmp(sd.base[d] + duet_kv_offset(&sd.layout, l, kv, a[i], 0),
                                   sd.base[d] + duet_kv_offset(&sd.layout, l, kv, b[i], 0),
                                   duet_kv_page_bytes(&sd.layout)) == 0,
                            "per-layer and whole-request pages differ");
        }
        DUET_TESTKIT_CHECK(duet_testkit_chan_say(sp->fd_d, "verified") == 0, "channel");
        DUET_TESTKIT_CHECK(duet_testkit_chan_expect(sp->fd_d, "stopped", WAIT_MS) == 0,
                           "prefill did not stop");
        duet_slice_plan_destroy(plan);
        if (duet_testkit_side_stop(&sd))
            return 1;
    }
    return 0;
}

static int order_prefill(void *arg)
{
    const spec_t *sp = arg;
    duet_slice_plan_t *plan;
    duet_testkit_side_t sd;
    if (scene_start(&sd, sp, DUET_XFER_PREFILL, sp->fd_p, 3, &plan))
        return 1;
    DUET_TESTKIT_CHECK(duet_testkit_chan_expect(sp->fd_p, "ready", WAIT_MS) == 0,
                       "decode not ready");
    if (send_one(&sd, plan, 1, 10, 0, 0) || send_ok(&sd, 1, 10))
        return 1;
    DUET_TESTKIT_CHECK(duet_testkit_chan_say(sp->fd_p, "half") == 0, "channel");
    DUET_TESTKIT_CHECK(duet_testkit_chan_expect(sp->fd_p, "go", WAIT_MS) == 0, "no go");
    if (send_one(&sd, plan, 0, 10, 0, 0) || send_ok(&sd, 0, 10))
        return 1;
    if (send_one(&sd, plan, 1, 11, 1, 0) || send_ok(&sd, 1, 11)) /* rank 0 stays silent */
        return 1;
    if (send_one(&sd, plan, 0, 12, 2, 0) || send_ok(&sd, 0, 12) ||
        send_one(&sd, plan, 1, 12, 2, 0) || send_ok(&sd, 1, 12))
        return 1;
    DUET_TESTKIT_CHECK(duet_testkit_chan_expect(sp->fd_p, "verified", WAIT_MS) == 0,
                       "decode did not verify");
    return scene_stop(&sd, plan);
}

static int order_decode(void *arg)
{
    const spec_t *sp = arg;
    int reqs[2] = {0, 2};
    duet_slice_plan_t *plan;
    duet_xfer_result_t res;
    duet_xfer_stats_t st;
    duet_testkit_side_t sd;
    int64_t t0;
    if (scene_start(&sd, sp, DUET_XFER_DECODE, sp->fd_d, 3, &plan))
        return 1;
    t0 = duet_now_ns();
    if (expect_all(&sd, plan, 10, 0, NPG, duet_deadline_in_ms(WAIT_MS)) ||
        expect_all(&sd, plan, 11, 1, NPG, duet_deadline_in_ms(1500)) ||
        expect_all(&sd, plan, 12, 2, NPG, duet_deadline_in_ms(WAIT_MS)))
        return 1;
    DUET_TESTKIT_CHECK(duet_testkit_chan_say(sp->fd_d, "ready") == 0, "channel");
    DUET_TESTKIT_CHECK(duet_testkit_chan_expect(sp->fd_d, "half", WAIT_MS) == 0, "no half");
    DUET_TESTKIT_CHECK(duet_xfer_recv_wait(duet_xfer_rank(sd.x, 0), 10, duet_deadline_in_ms(300),
                                           &res) == DUET_ERR_TIMEOUT,
                       "request 10 complete after one of its two senders");
    DUET_TESTKIT_CHECK(duet_testkit_chan_say(sp->fd_d, "go") == 0, "channel");
    if (recv_ok(&sd, 10))
        return 1;
    {
        /* Waiting idle costs no CPU: the progress thread sleeps in epoll. */
        struct timespec c0, c1;
        int64_t w0 = duet_now_ns(), wall;
        double cpu;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
        if (recv_result(&sd, 0, 11, &res))
            return 1;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
        wall = duet_now_ns() - w0;
        cpu = (double)(c1.tv_sec - c0.tv_sec) * 1e9 + (double)(c1.tv_nsec - c0.tv_nsec);
        DUET_TESTKIT_CHECK(wall > 500 * DUET_NS_PER_MS && cpu < 0.2 * (double)wall,
                           "waiting %.0f ms cost %.0f ms of CPU", (double)wall / 1e6, cpu / 1e6);
    }
    DUET_TESTKIT_CHECK(res.status == DUET_ERR_TIMEOUT && res.missing_mask == 1 &&
                           strstr(res.detail, "waiting for prefill ranks 0") != NULL,
                       "request 11: %s (%s), missing %llx", duet_status_name(res.status),
                       res.detail, (unsigned long long)res.missing_mask);
    DUET_TESTKIT_CHECK(
        duet_now_ns() - t0 >= 1400 * DUET_NS_PER_MS && duet_now_ns() - t0 < 4000 * DUET_NS_PER_MS,
        "request 11 failed after %lld ms", (long long)((duet_now_ns() - t0) / DUET_NS_PER_MS));
    if (recv_ok(&sd, 12) || decode_verify_some(&sd, reqs, 2, NPG, 0))
        return 1;
    st = stats_of(&sd, 0);
    DUET_TESTKIT_CHECK(
        st.recv_done == 2 && st.recv_failed == 1 && st.timeouts == 1 && st.notify_received == 5 &&
            st.dropped_late + st.dropped_unknown + st.dropped_invalid + st.dropped_duplicate == 0,
        "stats: done %llu failed %llu timeouts %llu notified %llu",
        (unsigned long long)st.recv_done, (unsigned long long)st.recv_failed,
        (unsigned long long)st.timeouts, (unsigned long long)st.notify_received);
    DUET_TESTKIT_CHECK(duet_testkit_chan_say(sp->fd_d, "verified") == 0, "channel");
    return scene_stop(&sd, plan);
}

/* DUET_XFER_EXPECT_STARTS (docs/migration.md "Overload"): request 50's
 * sender never starts (it waits in prefill's queue) and times out alone --
 * the link stays up, so request 51, announced started afterwards and sent
 * then, completes on the same connections. */
static int queued_prefill(void *arg)
{
    const spec_t *sp = arg;
    duet_slice_plan_t *plan;
    duet_testkit_side_t sd;
    if (scene_start(&sd, sp, DUET_XFER_PREFILL, sp->fd_p, 2, &plan))
        return 1;
    DUET_TESTKIT_CHECK(duet_testkit_chan_expect(sp->fd_p, "go", WAIT_MS) == 0, "no go");
    if (send_one(&sd, plan, 0, 51, 1, 0) || send_ok(&sd, 0, 51))
        return 1;
    DUET_TESTKIT_CHECK(duet_testkit_chan_expect(sp->fd_p, "verified", WAIT_MS) == 0,
                       "decode did not verify");
    return scene_stop(&sd, plan);
}

static int queued_decode(void *arg)
{
    const spec_t *sp = arg;
    int reqs[1] = {1};
    duet_slice_plan_t *plan;
    duet_xfer_result_t res;
    duet_testkit_side_t sd;
    if (scene_start(&sd, sp, DUET_XFER_DECODE, sp->fd_d, 2, &plan))
        return 1;
    if (expect_all_flags(&sd, plan, 50, 0, NPG, duet_deadline_in_ms(500),
                         DUET_XFER_EXPECT_STARTS) ||
        expect_all_flags(&sd, plan, 51, 1, NPG, duet_deadline_in_ms(800),
                         DUET_XFER_EXPECT_STARTS))
        return 1;
    if (recv_result(&sd, 0, 50, &res))
        return 1;
    DUET_TESTKIT_CHECK(res.status == DUET_ERR_TIMEOUT, "request 50: %s (%s)",
                       duet_status_name(res.status), res.detail);
    /* 51 starts now: its deadline counts from here, past the first one */
    DUET_TESTKIT_OK(duet_xfer_recv_started(duet_xfer_rank(sd.x, 0), 51,
                                           duet_deadline_in_ms(WAIT_MS)));
    DUET_TESTKIT_CHECK(duet_xfer_recv_started(duet_xfer_rank(sd.x, 0), 999,
                                              duet_deadline_in_ms(WAIT_MS)) ==
                           DUET_ERR_NOT_FOUND,
                       "started: an unknown id");
    nanosleep(&(struct timespec){0, 500 * 1000000L}, NULL); /* past 51's first deadline */
    DUET_TESTKIT_CHECK(duet_testkit_chan_say(sp->fd_d, "go") == 0, "channel");
    if (recv_ok(&sd, 51) || decode_verify_some(&sd, reqs, 1, NPG, 0))
        return 1;
    DUET_TESTKIT_CHECK(duet_testkit_chan_say(sp->fd_d, "verified") == 0, "channel");
    return scene_stop(&sd, plan);
}

/* The corrupted slice is caught by the receiver's CRC; the next request on
 * the same connections is fine. */
static int crc_prefill(void *arg)
{
    const spec_t *sp = arg;
    duet_slice_plan_t *plan;
    duet_xfer_result_t res;
    duet_testkit_side_t sd;
    if (scene_start(&sd, sp, DUET_XFER_PREFILL, sp->fd_p, 2, &plan))
        return 1;
    DUET_TESTKIT_CHECK(duet_testkit_chan_expect(sp->fd_p, "ready", WAIT_MS) == 0,
                       "decode not ready");
    DUET_TESTKIT_OK(duet_xfer_debug_corrupt_put(duet_xfer_rank(sd.x, 0), 5));
    if (send_one(&sd, plan, 0, 40, 0, DUET_XFER_SEND_CRC) || send_result(&sd, 0, 40, &res))
        return 1;
    DUET_TESTKIT_CHECK(res.status == DUET_ERR_MISMATCH && strstr(res.detail, "refused") != NULL,
                       "request 40: %s (%s)", duet_status_name(res.status), res.detail);
    if (send_one(&sd, plan, 0, 41, 1, DUET_XFER_SEND_CRC) || send_ok(&sd, 0, 41))
        return 1;
    DUET_TESTKIT_CHECK(duet_testkit_chan_expect(sp->fd_p, "verified", WAIT_MS) == 0,
                       "decode did not verify");
    return scene_stop(&sd, plan);
}

static int crc_decode(void *arg)
{
    const spec_t *sp = arg;
    int bad = 0, crc_failures = 0, reqs[1] = {1};
    duet_slice_plan_t *plan;
    duet_testkit_side_t sd;
    if (scene_start(&sd, sp, DUET_XFER_DECODE, sp->fd_d, 2, &plan))
        return 1;
    if (expect_all(&sd, plan, 40, 0, NPG, duet_deadline_in_ms(WAIT_MS)) ||
        expect_all(&sd, plan, 41, 1, NPG, duet_deadline_in_ms(WAIT_MS)))
        return 1;
    DUET_TESTKIT_CHECK(duet_testkit_chan_say(sp->fd_d, "ready") == 0, "channel");
    for (int d = 0; d < sd.tp; d++) {
        duet_xfer_result_t res;
        if (recv_result(&sd, d, 40, &res))
            return 1;
        if (res.status != DUET_OK) {
            DUET_TESTKIT_CHECK(
                res.status == DUET_ERR_MISMATCH &&
                    strstr(res.detail, "checksum mismatch on the slice from prefill rank 0"),
                "decode rank %d: %s", d, res.detail);
            bad++;
        }
        crc_failures += (int)stats_of(&sd, d).crc_failures;
    }
    DUET_TESTKIT_CHECK(bad == 1 && crc_failures == 1, "%d ranks failed, %d crc failures", bad,
                       crc_failures);
    if (recv_ok(&sd, 41) || decode_verify_some(&sd, reqs, 1, NPG, 0))
        return 1;
    DUET_TESTKIT_CHECK(duet_testkit_chan_say(sp->fd_d, "verified") == 0, "channel");
    return scene_stop(&sd, plan);
}

/* Cancel on either side, unknown and early notifications, callbacks, and
 * shutdown with work pending. */

static int mismatch_child(void *arg)
{
    const spec_t *sp = arg;
    static const struct {
        const char *want;
        duet_status_t st;
    } cases[] = {
        {"connected", DUET_OK},
        {"peer decode rank 0: model fingerprint differs", DUET_ERR_MISMATCH},
        {"peer decode rank 0: head_dim 16 != 8", DUET_ERR_MISMATCH},
        {"peer decode rank 0: page_size 8 != 16", DUET_ERR_MISMATCH},
        {"peer decode rank 0: layers 2 != 3", DUET_ERR_MISMATCH},
        {"peer decode rank 0: dtype F16 != BF16", DUET_ERR_MISMATCH},
        {"peer decode rank 0: kv_heads 8 != 4", DUET_ERR_MISMATCH},
        {"peer prefill rank 0: same role", DUET_ERR_MISMATCH},
        {"descriptor version 2 unsupported", DUET_ERR_UNSUPPORTED},
        {"truncated", DUET_ERR_FORMAT},
        {"checksum mismatch", DUET_ERR_FORMAT},
        {"not a duet transfer descriptor", DUET_ERR_FORMAT},
    };
    duet_testkit_side_t a;
    side_init(&a, sp, DUET_XFER_PREFILL, 16);
    if (duet_testkit_side_start(&a))
        return 1;
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        duet_xfer_peer_t *peer = NULL;
        unsigned char *blob;
        size_t len;
        duet_status_t st;
        duet_testkit_side_t b;
        side_init(&b, sp, k == 7 ? DUET_XFER_PREFILL : DUET_XFER_DECODE, k == 3 ? 8 : 16);
        b.fingerprint ^= k == 1;
        b.layout.head_dim = k == 2 ? 16 : HEAD_DIM;
        b.layout.n_layers = k == 4 ? 2 : LAYERS;
        b.dtype = k == 5 ? DUET_DTYPE_F16 : b.dtype;
        b.kv_heads = k == 6 ? 8 : b.kv_heads;
        if (duet_testkit_side_start(&b))
            return 1;
        DUET_TESTKIT_OK(duet_xfer_desc_pack(duet_xfer_rank(b.x, 0), (void **)&blob, &len));
        if (k == 8)
            blob[4] = 2;
        if (k == 9)
            len /= 2;
        if (k == 10)
            blob[len - 9] ^= 0x10;
        if (k == 11)
            memset(blob, 0x5a, len);
        duet_error_clear();
        st = duet_xfer_peer_connect(duet_xfer_rank(a.x, 0), blob, len, duet_deadline_in_ms(5000),
                                    &peer);
        DUET_TESTKIT_CHECK(st == cases[k].st &&
                               (st == DUET_OK || strstr(duet_error_msg(), cases[k].want)),
                           "case %zu: got %s '%s', expected %s '%s'", k, duet_status_name(st),
                           duet_error_msg(), duet_status_name(cases[k].st), cases[k].want);
        duet_xfer_peer_disconnect(peer);
        duet_free(blob);
        if (duet_testkit_side_stop(&b))
            return 1;
    }
    return duet_testkit_side_stop(&a);
}

/* Every allocation failure on the way up unwinds cleanly (no crash, no
 * leak); so do failures preparing requests. */

static void test_plans(void **state)
{
    static const int plans[][3] = {{1, 1, 4}, {2, 1, 4}, {1, 2, 4}, {2, 4, 2},
                                   {4, 2, 2}, {3, 2, 6}, {8, 1, 2}, {1, 8, 2}};
    (void)state;
    for (int t = 0; t < n_tls; t++)
        for (size_t k = 0; k < sizeof(plans) / sizeof(plans[0]); k++) {
            spec_t sp = spec_of(plans[k][0], plans[k][1], plans[k][2], tls_list[t]);
            sp.n_tokens = 37;
            /* Memory the engine registers rather than allocates (the CUDA
             * staging path): puts into it are not one-sided. */
            sp.reg_d = k == 1 || k == 5;
            sp.reg_p = k == 2 || k == 5;
            pair_channels(&sp);
            run_pair(&sp, plans_prefill, plans_decode, 90000);
        }
}

static void test_notify_order(void **state)
{
    (void)state;
    scene(2, 1, 4, order_prefill, order_decode, 0);
}

static void test_crc(void **state)
{
    (void)state;
    scene(1, 2, 4, crc_prefill, crc_decode, 0);
}

static void test_queued_timeout(void **state)
{
    (void)state;
    scene(1, 1, 4, queued_prefill, queued_decode, 0);
}

static void test_mismatch(void **state)
{
    (void)state;
    for (int t = 0; t < n_tls; t++) {
        spec_t sp;
        pid_t pid;
        int rc;
        memset(&sp, 0, sizeof(sp));
        sp.P = sp.D = 1;
        sp.H = 4;
        sp.tls = tls_list[t];
        pid = duet_testkit_spawn("mismatch", mismatch_child, &sp, NULL, 0);
        duet_testkit_wait_all(&pid, 1, duet_deadline_in_ms(60000), &rc);
        if (rc != 0)
            fail_msg("tls %s: mismatch child exit %d", sp.tls, rc);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plans),
        cmocka_unit_test(test_notify_order),
        cmocka_unit_test(test_crc),
        cmocka_unit_test(test_queued_timeout),
        cmocka_unit_test(test_mismatch),
    };
    xs_init();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
