/* transfer/xfer, when things go wrong: cancel on either side, late,
 * unknown and early notifications, callbacks and shutdown with work
 * pending, a peer killed mid-transfer (both directions) and restarted, and
 * allocation failures.  Real processes, real UCX (see
 * test_xfer_loopback.c). */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "common/alloc.h"
#include "tests/integration/xfer/xfer_scenes.h"

static atomic_int cb_count;
static duet_status_t cb_status[4];

static void count_cb(void *arg, uint64_t transfer_id, const duet_xfer_result_t *res)
{
    (void)transfer_id;
    cb_status[(intptr_t)arg] = res->status;
    atomic_fetch_add(&cb_count, 1);
}

static int wait_cb(int n)
{
    int64_t dl = duet_deadline_in_ms(WAIT_MS);
    while (atomic_load(&cb_count) < n && duet_now_ns() < dl)
        usleep(1000);
    DUET_TESTKIT_CHECK(atomic_load(&cb_count) >= n, "%d callbacks, expected %d",
                       atomic_load(&cb_count), n);
    return 0;
}

static int cancel_prefill(void *arg)
{
    const spec_t *sp = arg;
    duet_slice_plan_t *plan;
    duet_xfer_result_t res;
    duet_xfer_rank_t *r0;
    int32_t a[NPG], b[NPG];
    duet_xfer_send_t x;
    duet_testkit_side_t sd;
    if (scene_start(&sd, sp, DUET_XFER_PREFILL, sp->fd_p, 7, &plan))
        return 1;
    r0 = duet_xfer_rank(sd.x, 0);
    DUET_TESTKIT_CHECK(duet_testkit_chan_expect(sp->fd_p, "ready", WAIT_MS) == 0,
                       "decode not ready");
    /* decode cancelled 50 before we send: acknowledged as cancelled */
    if (send_one(&sd, plan, 0, 50, 0, 0) || send_result(&sd, 0, 50, &res))
        return 1;
    DUET_TESTKIT_CHECK(res.status == DUET_ERR_CANCELLED, "request 50: %s", res.detail);
    /* we cancel 51 mid-way */
    x = send_desc(&sd, plan, 0, 51, 1, NPG, a, b, 0);
    DUET_TESTKIT_OK(duet_xfer_send_begin(r0, &x));
    DUET_TESTKIT_OK(duet_xfer_send_layers(r0, 51, 0, 1));
    if (wait_puts(&sd))
        return 1;
    DUET_TESTKIT_OK(duet_xfer_send_cancel(r0, 51));
    DUET_TESTKIT_CHECK(duet_xfer_send_cancel(r0, 51) == DUET_ERR_NOT_FOUND, "cancelled twice");
    DUET_TESTKIT_CHECK(duet_xfer_send_wait(r0, 51, duet_deadline_in_ms(100), &res) ==
                           DUET_ERR_NOT_FOUND,
                       "a cancelled send can still be waited on");
    DUET_TESTKIT_OK(duet_xfer_send_layers(r0, 51, 1, 2)); /* a late layer of it is ignored */
    DUET_TESTKIT_CHECK(stats_of(&sd, 0).active_send == 0, "cancelled send still held");
    /* 52 is never expected: refused once it expired at decode */
    if (send_one(&sd, plan, 0, 52, 2, 0) || send_result(&sd, 0, 52, &res))
        return 1;
    DUET_TESTKIT_CHECK(res.status == DUET_ERR_NOT_FOUND, "request 52: %s", res.detail);
    DUET_TESTKIT_CHECK(duet_testkit_chan_say(sp->fd_p, "c") == 0, "channel");
    /* 53 arrives before decode expects it */
    if (send_one(&sd, plan, 0, 53, 3, 0))
        return 1;
    DUET_TESTKIT_CHECK(duet_testkit_chan_say(sp->fd_p, "53") == 0, "channel");
    if (send_ok(&sd, 0, 53))
        return 1;
    /* 54 with callbacks on both sides */
    x = send_desc(&sd, plan, 0, 54, 4, NPG, a, b, 0);
    x.cb = count_cb;
    x.arg = (void *)(intptr_t)0;
    DUET_TESTKIT_OK(duet_xfer_send_post(r0, &x, TOKEN));
    if (wait_cb(1))
        return 1;
    DUET_TESTKIT_CHECK(cb_status[0] == DUET_OK, "callback status %s",
                       duet_status_name(cb_status[0]));
    DUET_TESTKIT_CHECK(duet_xfer_send_wait(r0, 54, duet_deadline_in_ms(100), &res) ==
                           DUET_ERR_NOT_FOUND,
                       "a delivered send is still held");
    /* 56 fails on the prefill side after a layer went out */
    x = send_desc(&sd, plan, 0, 56, 6, NPG, a, b, 0);
    DUET_TESTKIT_OK(duet_xfer_send_begin(r0, &x));
    DUET_TESTKIT_OK(duet_xfer_send_layers(r0, 56, 0, 1));
    DUET_TESTKIT_OK(duet_xfer_send_end(r0, 56, DUET_ERR_IO, DUET_XFER_NO_TOKEN));
    if (send_result(&sd, 0, 56, &res))
        return 1;
    DUET_TESTKIT_CHECK(res.status == DUET_ERR_IO, "request 56: %s", res.detail);
    /* 55 is left unfinished at shutdown */
    x = send_desc(&sd, plan, 0, 55, 5, NPG, a, b, 0);
    DUET_TESTKIT_OK(duet_xfer_send_begin(r0, &x));
    DUET_TESTKIT_CHECK(duet_testkit_chan_expect(sp->fd_p, "verified", WAIT_MS) == 0,
                       "decode did not verify");
    /* Only now may decode go: its endpoints closing would fail ours.  And
     * only once it stopped may we: ours closing first would end its
     * expectation of 55 as a peer failure instead of at its shutdown. */
    DUET_TESTKIT_CHECK(duet_testkit_chan_say(sp->fd_p, "finished") == 0, "channel");
    DUET_TESTKIT_CHECK(duet_testkit_chan_expect(sp->fd_p, "stopped", WAIT_MS) == 0,
                       "decode did not stop");
    return scene_stop(&sd, plan);
}

static int cancel_decode(void *arg)
{
    const spec_t *sp = arg;
    int reqs[2] = {3, 4};
    duet_slice_plan_t *plan;
    duet_xfer_result_t res;
    duet_xfer_rank_t *r0;
    duet_xfer_stats_t st;
    int32_t pages[NPG];
    duet_testkit_side_t sd;
    if (scene_start(&sd, sp, DUET_XFER_DECODE, sp->fd_d, 7, &plan))
        return 1;
    r0 = duet_xfer_rank(sd.x, 0);
    if (expect_all(&sd, plan, 50, 0, NPG, duet_deadline_in_ms(WAIT_MS)) ||
        expect_all(&sd, plan, 51, 1, NPG, duet_deadline_in_ms(WAIT_MS)) ||
        expect_all(&sd, plan, 56, 6, NPG, duet_deadline_in_ms(WAIT_MS)))
        return 1;
    {
        duet_xfer_expect_t e = {.transfer_id = 51,
                                .plan = plan,
                                .peers = sd.peers[0],
                                .pages = pages,
                                .n_pages = NPG,
                                .deadline_ns = duet_deadline_in_ms(WAIT_MS)};
        req_pages(pages, NPG, 0, 1);
        DUET_TESTKIT_CHECK(duet_xfer_recv_expect(r0, &e) == DUET_ERR_INVALID,
                           "the same id expected twice");
    }
    {
        /* several at once, per-rank results: 57 is registered, the second
         * is refused before the thread (no pages), the third on it (51
         * again); the first failure is what comes back */
        duet_xfer_expect_t e[3];
        duet_xfer_rank_t *rs[3] = {r0, r0, r0};
        duet_status_t each[3];
        req_pages(pages, NPG, 0, 7);
        for (int k = 0; k < 3; k++)
            e[k] = (duet_xfer_expect_t){.transfer_id = k == 0 ? 57 : k == 1 ? 58 : 51,
                                        .plan = plan,
                                        .peers = sd.peers[0],
                                        .pages = k == 1 ? NULL : pages,
                                        .n_pages = NPG,
                                        .deadline_ns = duet_deadline_in_ms(WAIT_MS)};
        DUET_TESTKIT_CHECK(duet_xfer_recv_expect_all(rs, e, 3, each) == DUET_ERR_INVALID,
                           "a batch with bad entries succeeded");
        DUET_TESTKIT_CHECK(each[0] == DUET_OK && each[1] == DUET_ERR_INVALID &&
                               each[2] == DUET_ERR_INVALID,
                           "per-rank results %s %s %s", duet_status_name(each[0]),
                           duet_status_name(each[1]), duet_status_name(each[2]));
        DUET_TESTKIT_CHECK(strstr(duet_error_msg(), "51") == NULL,
                           "the first failure is the second entry's, not: %s", duet_error_msg());
        DUET_TESTKIT_OK(duet_xfer_recv_cancel(r0, 57));
        DUET_TESTKIT_CHECK(duet_xfer_recv_cancel(r0, 58) == DUET_ERR_NOT_FOUND,
                           "a refused entry was registered");
    }
    DUET_TESTKIT_OK(duet_xfer_recv_cancel(r0, 50));
    DUET_TESTKIT_CHECK(duet_xfer_recv_cancel(r0, 50) == DUET_ERR_NOT_FOUND, "cancelled twice");
    for (int k = 0; k < 2; k++) {
        duet_xfer_expect_t e = {.transfer_id = 54 + (uint64_t)k,
                                .plan = plan,
                                .peers = sd.peers[0],
                                .pages = pages,
                                .n_pages = NPG,
                                .deadline_ns = duet_deadline_in_ms(WAIT_MS),
                                .cb = count_cb,
                                .arg = (void *)(intptr_t)(k + 1)};
        req_pages(pages, NPG, 0, 4 + k);
        DUET_TESTKIT_OK(duet_xfer_recv_expect(r0, &e));
    }
    DUET_TESTKIT_CHECK(duet_testkit_chan_say(sp->fd_d, "ready") == 0, "channel");
    if (recv_result(&sd, 0, 51, &res))
        return 1;
    DUET_TESTKIT_CHECK(res.status == DUET_ERR_CANCELLED &&
                           strstr(res.detail, "prefill rank 0 cancelled"),
                       "request 51: %s (%s)", duet_status_name(res.status), res.detail);
    DUET_TESTKIT_CHECK(duet_testkit_chan_expect(sp->fd_d, "c", WAIT_MS) == 0, "no c");
    st = stats_of(&sd, 0);
    DUET_TESTKIT_CHECK(st.dropped_late == 1 && st.dropped_unknown == 1,
                       "late %llu (want 1: request 50), unknown %llu (want 1: request 52)",
                       (unsigned long long)st.dropped_late, (unsigned long long)st.dropped_unknown);
    DUET_TESTKIT_CHECK(duet_testkit_chan_expect(sp->fd_d, "53", WAIT_MS) == 0, "no 53");
    usleep(100 * 1000);
    if (expect_all(&sd, plan, 53, 3, NPG, duet_deadline_in_ms(WAIT_MS)) || recv_ok(&sd, 53))
        return 1;
    DUET_TESTKIT_CHECK(stats_of(&sd, 0).early_buffered == 2, "early %llu, expected 2 (52, 53)",
                       (unsigned long long)stats_of(&sd, 0).early_buffered);
    if (wait_cb(1))
        return 1;
    DUET_TESTKIT_CHECK(cb_status[1] == DUET_OK, "request 54: %s", duet_status_name(cb_status[1]));
    DUET_TESTKIT_CHECK(duet_xfer_recv_wait(r0, 54, duet_deadline_in_ms(100), &res) ==
                           DUET_ERR_NOT_FOUND,
                       "a delivered expectation is still held");
    if (recv_result(&sd, 0, 56, &res))
        return 1;
    DUET_TESTKIT_CHECK(res.status == DUET_ERR_IO && strstr(res.detail, "prefill rank 0 i/o error"),
                       "request 56: %s (%s)", duet_status_name(res.status), res.detail);
    if (decode_verify_some(&sd, reqs, 2, NPG, 0))
        return 1;
    DUET_TESTKIT_CHECK(stats_of(&sd, 0).active_recv == 1, "%llu expectations held, expected 1 (55)",
                       (unsigned long long)stats_of(&sd, 0).active_recv);
    DUET_TESTKIT_CHECK(duet_testkit_chan_say(sp->fd_d, "verified") == 0, "channel");
    DUET_TESTKIT_CHECK(duet_testkit_chan_expect(sp->fd_d, "finished", WAIT_MS) == 0,
                       "prefill did not finish");
    if (scene_stop(&sd, plan))
        return 1;
    DUET_TESTKIT_CHECK(duet_testkit_chan_say(sp->fd_d, "stopped") == 0, "channel");
    DUET_TESTKIT_CHECK(atomic_load(&cb_count) == 2 && cb_status[2] == DUET_ERR_SHUTDOWN,
                       "request 55 at shutdown: %d callbacks, status %s", atomic_load(&cb_count),
                       duet_status_name(cb_status[2]));
    return 0;
}

/* Descriptors that do not match are refused, naming the field. */

/* The transfer config of one side of sp, rank 0's share of the heads. */
static duet_xfer_config_t config_of(const spec_t *sp, duet_xfer_role_t role)
{
    duet_xfer_config_t cfg;
    duet_testkit_side_t sd;
    side_init(&sd, sp, role, 16);
    memset(&cfg, 0, sizeof(cfg));
    cfg.role = sd.role;
    cfg.tp = sd.tp;
    cfg.kv_heads = sd.kv_heads;
    cfg.dtype = sd.dtype;
    cfg.layout = sd.layout;
    duet_kv_heads_owned(sd.kv_heads, sd.tp, 0, &(int){0}, &cfg.layout.n_kv_heads);
    cfg.tls = sp->tls;
    return cfg;
}

static int alloc_child(void *arg)
{
    const spec_t *sp = arg;
    int created = 0;
    for (long n = 0; n < 400 && !created; n++) {
        long live0 = duet_alloc_live(), fails0 = duet_alloc_failures();
        duet_xfer_config_t cfg = config_of(sp, n % 2 ? DUET_XFER_DECODE : DUET_XFER_PREFILL);
        duet_status_t st;
        duet_xfer_t *x = NULL;
        duet_alloc_fail_after(n / 2);
        st = duet_xfer_create(&cfg, &x);
        duet_alloc_fail_after(-1);
        DUET_TESTKIT_CHECK(st == DUET_OK || st == DUET_ERR_NO_MEMORY, "create: %s",
                           duet_error_msg());
        created = st == DUET_OK && duet_alloc_failures() == fails0;
        if (st == DUET_OK) {
            duet_xfer_rank_t *r = duet_xfer_rank(x, 0);
            duet_xfer_peer_t *none[DUET_TP_MAX] = {0};
            duet_slice_plan_t *plan;
            int32_t pages[NPG] = {0, 1, 2};
            void *base, *blob;
            size_t len;
            DUET_TESTKIT_OK(duet_xfer_pool_alloc(r, duet_kv_total_bytes(&cfg.layout), &base));
            DUET_TESTKIT_OK(duet_slice_plan_create(sp->P, sp->D, sp->H, &plan));
            for (long m = 0; m < 8; m++) {
                duet_alloc_fail_after(m);
                st = duet_xfer_desc_pack(r, &blob, &len);
                duet_alloc_fail_after(-1);
                if (st == DUET_OK)
                    duet_free(blob);
                duet_alloc_fail_after(m);
                if (cfg.role == DUET_XFER_DECODE) {
                    duet_xfer_expect_t e = {.transfer_id = 1,
                                            .plan = plan,
                                            .peers = none,
                                            .pages = pages,
                                            .n_pages = NPG,
                                            .deadline_ns = duet_deadline_in_ms(1000)};
                    st = duet_xfer_recv_expect(r, &e);
                } else {
                    duet_xfer_send_t e = {.transfer_id = 1,
                                          .plan = plan,
                                          .peers = none,
                                          .src_pages = pages,
                                          .dst_pages = pages,
                                          .n_pages = NPG,
                                          .deadline_ns = duet_deadline_in_ms(1000)};
                    st = duet_xfer_send_begin(r, &e);
                }
                duet_alloc_fail_after(-1);
                /* out of memory, or refused: nobody is connected */
                DUET_TESTKIT_CHECK(st == DUET_ERR_NO_MEMORY || st == DUET_ERR_INVALID, "%s: %s",
                                   duet_status_name(st), duet_error_msg());
            }
            duet_slice_plan_destroy(plan);
            duet_xfer_destroy(x);
        }
        DUET_TESTKIT_CHECK(duet_alloc_live() == live0,
                           "after failing allocation %ld: %ld blocks leaked", n / 2,
                           duet_alloc_live() - live0);
    }
    DUET_TESTKIT_CHECK(created, "never created");
    return 0;
}

static void test_cancel(void **state)
{
    (void)state;
    scene(1, 1, 4, cancel_prefill, cancel_decode, 400);
}

/* fn in a child process on a 2 x 2 spec with 4 heads; fails the test
 * unless it exits 0 within timeout_ms. */
static void run_child(const char *name, int (*fn)(void *), int64_t timeout_ms)
{
    pid_t pid;
    int rc;
    spec_t sp;
    memset(&sp, 0, sizeof(sp));
    sp.P = sp.D = 2;
    sp.H = 4;
    sp.tls = tls_list[0];
    pid = duet_testkit_spawn(name, fn, &sp, NULL, 0);
    duet_testkit_wait_all(&pid, 1, duet_deadline_in_ms(timeout_ms), &rc);
    if (rc != 0)
        fail_msg("%s child exit %d", name, rc);
}

static void test_alloc_failures(void **state)
{
    (void)state;
    run_child("alloc", alloc_child, 120000);
}

/* ---- device pools and progress-thread calls (what runs without CUDA) ------------------------ */

static pthread_t run_thread;

static duet_status_t run_on_thread(void *arg)
{
    run_thread = pthread_self();
    return *(duet_status_t *)arg == DUET_OK
               ? DUET_OK
               : duet_error(*(duet_status_t *)arg, "bind test: refused on purpose");
}

static int device_child(void *arg)
{
    const spec_t *sp = arg;
    duet_xfer_config_t cfg = config_of(sp, DUET_XFER_PREFILL);
    duet_xfer_t *x = NULL;
    duet_status_t want;
    const char *why = NULL;
    void *base;
    char *fake_device;

    DUET_TESTKIT_OK(duet_xfer_create(&cfg, &x));
    duet_xfer_rank_t *r = duet_xfer_rank(x, 0);
    fake_device = duet_aligned_alloc(4096, duet_kv_total_bytes(&cfg.layout));
    DUET_TESTKIT_CHECK(fake_device != NULL, "no memory");

    /* fn runs on the rank's progress thread; its status and message come back */
    want = DUET_OK;
    run_thread = pthread_self();
    DUET_TESTKIT_OK(duet_xfer_rank_run(r, run_on_thread, &want));
    DUET_TESTKIT_CHECK(!pthread_equal(run_thread, pthread_self()), "ran on the caller's thread");
    want = DUET_ERR_IO;
    DUET_TESTKIT_CHECK(duet_xfer_rank_run(r, run_on_thread, &want) == DUET_ERR_IO, "status lost");
    DUET_TESTKIT_CHECK(strstr(duet_error_msg(), "refused on purpose") != NULL, "message lost: %s",
                       duet_error_msg());

    /* a UCX without CUDA transports (CI's): device pools refused, naming why */
    if (!duet_xfer_supports_cuda_memory(x)) {
        DUET_TESTKIT_CHECK(!duet_xfer_device_puts(x, &why) && why != NULL &&
                               strstr(why, "CUDA") != NULL,
                           "device puts: %s", why ? why : "(no reason)");
        DUET_TESTKIT_CHECK(
            duet_xfer_pool_register_device(r, fake_device, duet_kv_total_bytes(&cfg.layout)) ==
                DUET_ERR_UNSUPPORTED,
            "device pool accepted without CUDA transports");
        DUET_TESTKIT_CHECK(strstr(duet_error_msg(), "no puts from device memory") != NULL,
                           "message: %s", duet_error_msg());
        DUET_TESTKIT_CHECK(strcmp(duet_xfer_pool_kind(r), "none") == 0,
                           "pool kind %s after a refusal", duet_xfer_pool_kind(r));
    }
    DUET_TESTKIT_CHECK(duet_xfer_ucx_version() >= 100, "ucx version %d", duet_xfer_ucx_version());

    /* unregistering leaves a pool UCX allocated alone; a registered one goes */
    DUET_TESTKIT_OK(duet_xfer_pool_alloc(r, duet_kv_total_bytes(&cfg.layout), &base));
    duet_xfer_pool_unregister(r);
    DUET_TESTKIT_CHECK(strcmp(duet_xfer_pool_kind(r), "ucx-alloc") == 0,
                       "ucx-alloc pool unregistered");
    duet_xfer_rank_t *r1 = cfg.tp > 1 ? duet_xfer_rank(x, 1) : NULL;
    if (r1 != NULL) {
        DUET_TESTKIT_OK(duet_xfer_pool_register(r1, fake_device, duet_kv_total_bytes(&cfg.layout)));
        DUET_TESTKIT_CHECK(strcmp(duet_xfer_pool_kind(r1), "registered") == 0, "kind %s",
                           duet_xfer_pool_kind(r1));
        duet_xfer_pool_unregister(r1);
        DUET_TESTKIT_CHECK(strcmp(duet_xfer_pool_kind(r1), "none") == 0, "still registered");
        DUET_TESTKIT_OK(duet_xfer_pool_register(r1, fake_device, duet_kv_total_bytes(&cfg.layout)));
    }
    duet_xfer_destroy(x); /* unmaps r1's pool; the memory stays ours */
    duet_aligned_free(fake_device);
    return 0;
}

static void test_device_pool(void **state)
{
    (void)state;
    run_child("device", device_child, 60000);
}

/* ---- killing a peer mid-transfer ----------------------------------------------------------- */

#define KILL_DEADLINE_MS 4000

static int killp_prefill(void *arg)
{
    const spec_t *sp = arg;
    duet_slice_plan_t *plan;
    int32_t a[NPG], b[NPG];
    duet_xfer_send_t x;
    duet_testkit_side_t sd;
    if (scene_start(&sd, sp, DUET_XFER_PREFILL, sp->fd_p, 1, &plan))
        return 1;
    DUET_TESTKIT_CHECK(duet_testkit_chan_expect(sp->fd_p, "ready", WAIT_MS) == 0,
                       "decode not ready");
    x = send_desc(&sd, plan, 0, 20, 0, NPG, a, b, 0);
    DUET_TESTKIT_OK(duet_xfer_send_begin(duet_xfer_rank(sd.x, 0), &x));
    DUET_TESTKIT_OK(duet_xfer_send_layers(duet_xfer_rank(sd.x, 0), 20, 0, 1));
    if (wait_puts(&sd))
        return 1;
    DUET_TESTKIT_CHECK(duet_testkit_chan_say(sp->ctl_p, "posted") == 0, "channel");
    for (;;)
        pause(); /* until SIGKILL */
}

static int killp_decode(void *arg)
{
    const spec_t *sp = arg;
    duet_slice_plan_t *plan;
    duet_xfer_result_t res;
    duet_testkit_side_t sd;
    int64_t t0, ms;
    if (scene_start(&sd, sp, DUET_XFER_DECODE, sp->fd_d, 1, &plan))
        return 1;
    t0 = duet_now_ns();
    if (expect_all(&sd, plan, 20, 0, NPG, duet_deadline_in_ms(KILL_DEADLINE_MS)))
        return 1;
    DUET_TESTKIT_CHECK(duet_testkit_chan_say(sp->fd_d, "ready") == 0, "channel");
    if (recv_result(&sd, 0, 20, &res))
        return 1;
    ms = (duet_now_ns() - t0) / DUET_NS_PER_MS;
    fprintf(stderr, "[decode] prefill killed: %s after %lld ms: %s\n", duet_status_name(res.status),
            (long long)ms, res.detail);
    DUET_TESTKIT_CHECK((res.status == DUET_ERR_PEER || res.status == DUET_ERR_TIMEOUT) &&
                           strstr(res.detail, "prefill rank") != NULL,
                       "%s: %s", duet_status_name(res.status), res.detail);
    DUET_TESTKIT_CHECK(ms <= KILL_DEADLINE_MS + 1000, "error after %lld ms", (long long)ms);
    /* The restarted prefill daemon: new descriptors, same decode. */
    for (int d = 0; d < sd.tp; d++)
        for (int q = 0; q < sd.remote_tp; q++)
            duet_xfer_peer_disconnect(sd.peers[d][q]);
    if (duet_testkit_side_connect(&sd, sp->fd_d2) ||
        expect_all(&sd, plan, 21, 1, NPG, duet_deadline_in_ms(WAIT_MS)))
        return 1;
    DUET_TESTKIT_CHECK(duet_testkit_chan_say(sp->fd_d2, "ready") == 0, "channel");
    {
        int reqs[1] = {1};
        if (recv_ok(&sd, 21) || decode_verify_some(&sd, reqs, 1, NPG, 0))
            return 1;
    }
    DUET_TESTKIT_CHECK(duet_testkit_chan_say(sp->fd_d2, "verified") == 0, "channel");
    return scene_stop(&sd, plan);
}

static int killp_prefill2(void *arg)
{
    const spec_t *sp = arg;
    duet_slice_plan_t *plan;
    duet_testkit_side_t sd;
    if (scene_start(&sd, sp, DUET_XFER_PREFILL, sp->fd_p2, 2, &plan))
        return 1;
    DUET_TESTKIT_CHECK(duet_testkit_chan_expect(sp->fd_p2, "ready", WAIT_MS) == 0,
                       "decode not ready");
    for (int s = 0; s < sd.tp; s++)
        if (send_one(&sd, plan, s, 21, 1, DUET_XFER_SEND_CRC) || send_ok(&sd, s, 21))
            return 1;
    DUET_TESTKIT_CHECK(duet_testkit_chan_expect(sp->fd_p2, "verified", WAIT_MS) == 0,
                       "decode did not verify");
    return scene_stop(&sd, plan);
}

static int killd_prefill(void *arg)
{
    const spec_t *sp = arg;
    duet_slice_plan_t *plan;
    duet_xfer_result_t res;
    duet_xfer_rank_t *r0;
    int32_t a[NPG], b[NPG];
    duet_xfer_send_t x;
    duet_testkit_side_t sd;
    int64_t t0, ms;
    if (scene_start(&sd, sp, DUET_XFER_PREFILL, sp->fd_p, 2, &plan))
        return 1;
    r0 = duet_xfer_rank(sd.x, 0);
    DUET_TESTKIT_CHECK(duet_testkit_chan_expect(sp->fd_p, "ready", WAIT_MS) == 0,
                       "decode not ready");
    x = send_desc(&sd, plan, 0, 30, 0, NPG, a, b, 0);
    x.deadline_ns = duet_deadline_in_ms(KILL_DEADLINE_MS);
    t0 = duet_now_ns();
    DUET_TESTKIT_OK(duet_xfer_send_begin(r0, &x));
    DUET_TESTKIT_OK(duet_xfer_send_layers(r0, 30, 0, 1));
    if (wait_puts(&sd))
        return 1;
    DUET_TESTKIT_CHECK(duet_testkit_chan_say(sp->ctl_p, "posted") == 0, "channel");
    DUET_TESTKIT_CHECK(duet_testkit_chan_expect(sp->ctl_p, "killed", WAIT_MS) == 0,
                       "parent did not kill decode");
    DUET_TESTKIT_OK(duet_xfer_send_layers(r0, 30, 1, LAYERS));
    DUET_TESTKIT_OK(duet_xfer_send_end(r0, 30, DUET_OK, TOKEN));
    if (send_result(&sd, 0, 30, &res))
        return 1;
    ms = (duet_now_ns() - t0) / DUET_NS_PER_MS;
    fprintf(stderr, "[prefill] decode killed: %s after %lld ms: %s\n", duet_status_name(res.status),
            (long long)ms, res.detail);
    DUET_TESTKIT_CHECK((res.status == DUET_ERR_PEER || res.status == DUET_ERR_TIMEOUT) &&
                           strstr(res.detail, "decode rank") != NULL,
                       "%s: %s", duet_status_name(res.status), res.detail);
    DUET_TESTKIT_CHECK(ms <= KILL_DEADLINE_MS + 1000, "error after %lld ms", (long long)ms);
    /* The restarted decode daemon: new descriptors, same prefill. */
    for (int s = 0; s < sd.tp; s++)
        for (int q = 0; q < sd.remote_tp; q++)
            duet_xfer_peer_disconnect(sd.peers[s][q]);
    if (duet_testkit_side_connect(&sd, sp->fd_p2))
        return 1;
    DUET_TESTKIT_CHECK(duet_testkit_chan_expect(sp->fd_p2, "ready", WAIT_MS) == 0,
                       "new decode not ready");
    if (send_one(&sd, plan, 0, 31, 1, DUET_XFER_SEND_CRC) || send_ok(&sd, 0, 31))
        return 1;
    DUET_TESTKIT_CHECK(duet_testkit_chan_expect(sp->fd_p2, "verified", WAIT_MS) == 0,
                       "new decode did not verify");
    return scene_stop(&sd, plan);
}

static int killd_decode1(void *arg)
{
    const spec_t *sp = arg;
    duet_slice_plan_t *plan;
    duet_testkit_side_t sd;
    if (scene_start(&sd, sp, DUET_XFER_DECODE, sp->fd_d, 2, &plan) ||
        expect_all(&sd, plan, 30, 0, NPG, duet_deadline_in_ms(WAIT_MS)))
        return 1;
    DUET_TESTKIT_CHECK(duet_testkit_chan_say(sp->fd_d, "ready") == 0, "channel");
    for (;;)
        pause(); /* until SIGKILL */
}

static int killd_decode2(void *arg)
{
    const spec_t *sp = arg;
    int reqs[1] = {1};
    duet_slice_plan_t *plan;
    duet_testkit_side_t sd;
    if (scene_start(&sd, sp, DUET_XFER_DECODE, sp->fd_d2, 2, &plan) ||
        expect_all(&sd, plan, 31, 1, NPG, duet_deadline_in_ms(WAIT_MS)))
        return 1;
    DUET_TESTKIT_CHECK(duet_testkit_chan_say(sp->fd_d2, "ready") == 0, "channel");
    if (recv_ok(&sd, 31) || decode_verify_some(&sd, reqs, 1, NPG, 0))
        return 1;
    DUET_TESTKIT_CHECK(duet_testkit_chan_say(sp->fd_d2, "verified") == 0, "channel");
    return scene_stop(&sd, plan);
}

/* For each transport: prefill (P ranks) and decode (D ranks) in two
 * processes; once prefill says "posted", side `victim` (0 prefill, 1 decode)
 * is SIGKILLed and `restart` takes its place, told "killed" when
 * tell_killed.  Both must then exit 0. */
static void kill_scene(int P, int D, int victim, int (*prefill)(void *), int (*decode)(void *),
                       int (*restart)(void *), const char *restart_name, int tell_killed)
{
    static const char *const roles[2] = {"prefill", "decode"};
    for (int t = 0; t < n_tls; t++) {
        spec_t sp;
        pid_t pids[2];
        int rc[2], x[2], killed = 0;
        memset(&sp, 0, sizeof(sp));
        sp.P = P;
        sp.D = D;
        sp.H = 4;
        sp.n_tokens = 37;
        sp.tls = tls_list[t];
        pair_channels(&sp);
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, x), 0);
        sp.fd_p2 = x[0];
        sp.fd_d2 = x[1];
        int close_p[] = {sp.fd_d, sp.fd_d2, sp.ctl_d, sp.ctl_p_par, sp.ctl_d_par};
        int close_d[] = {sp.fd_p, sp.fd_p2, sp.ctl_p, sp.ctl_p_par, sp.ctl_d_par};
        pids[0] =
            duet_testkit_spawn(victim == 0 ? "prefill-1" : "prefill", prefill, &sp, close_p, 5);
        pids[1] = duet_testkit_spawn(victim == 1 ? "decode-1" : "decode", decode, &sp, close_d, 5);
        if (duet_testkit_chan_expect(sp.ctl_p_par, "posted", WAIT_MS) == 0) {
            kill(pids[victim], SIGKILL);
            waitpid(pids[victim], NULL, 0);
            killed = 1;
            pids[victim] =
                duet_testkit_spawn(restart_name, restart, &sp, victim == 0 ? close_p : close_d, 5);
            if (tell_killed)
                duet_testkit_chan_say(sp.ctl_p_par, "killed");
        }
        duet_testkit_wait_all(pids, 2, duet_deadline_in_ms(killed ? 60000 : 1000), rc);
        if (!killed)
            rc[victim] = -1; /* the peer never got to the kill */
        pair_close(&sp);
        if (rc[0] != 0 || rc[1] != 0)
            fail_msg("tls %s: %s%s exit %d, %s%s exit %d", sp.tls, victim == 0 ? "new " : "",
                     roles[0], rc[0], victim == 1 ? "new " : "", roles[1], rc[1]);
    }
}

static void test_kill_prefill(void **state)
{
    (void)state;
    kill_scene(2, 1, 0, killp_prefill, killp_decode, killp_prefill2, "prefill-2", 0);
}

static void test_kill_decode_reconnect(void **state)
{
    (void)state;
    kill_scene(1, 2, 1, killd_prefill, killd_decode1, killd_decode2, "decode-2", 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_kill_prefill),
        cmocka_unit_test(test_kill_decode_reconnect),
        cmocka_unit_test(test_alloc_failures),
        cmocka_unit_test(test_device_pool),
    };
    xs_init();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
