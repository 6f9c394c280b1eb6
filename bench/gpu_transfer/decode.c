/* bench_gpu_transfer: the receiving process (gpu_transfer.h). */
#include "bench/gpu_transfer/gpu_transfer.h"

/* ---- decode ---------------------------------------------------------------------------- */

/* Read rank r's destination pages [0, n) back and compare every byte. */
static int verify(gside_t *g, int r, int n, char *why, size_t why_len)
{
    const duet_kv_layout_t *l = &g->sd.layout;
    grank_t *k = &g->rk[r];
    size_t len = (size_t)n * duet_kv_page_bytes(l);
    for (int p = 0; p < 2 * l->n_layers; p++)
        if (gs_copy(&k->st, k->back + g->cplane * (size_t)p,
                    k->pool + duet_kv_plane_bytes(l) * (size_t)p, len, true))
            return 1;
    if (gs_sync(&k->st))
        return 1;
    for (int p = 0; p < 2 * l->n_layers; p++) {
        const unsigned char *got = k->back + g->cplane * (size_t)p;
        const unsigned char *want = k->ref + g->cplane * (size_t)p;
        size_t i = 0, row = (size_t)l->head_dim * (size_t)l->elem_size;
        if (memcmp(got, want, len) == 0)
            continue;
        while (got[i] == want[i])
            i++;
        snprintf(why, why_len,
                 "decode rank %d: layer %d %c page %zu head %zu token %zu byte %zu is 0x%02x, "
                 "want 0x%02x",
                 r, p / 2, p % 2 ? 'V' : 'K', i / duet_kv_page_bytes(l),
                 k->head0 + i % duet_kv_page_bytes(l) / duet_kv_head_bytes(l),
                 i / duet_kv_page_bytes(l) * (size_t)l->page_size + i % duet_kv_head_bytes(l) / row,
                 i % row, got[i], want[i]);
        return 1;
    }
    return 0;
}

/* The progress messages a request of n pages gets (the decode daemon's
 * rule, decode/prefill_path.c and node/kv_engine.h). */
int progress_of(const bench_t *b, int n)
{
    duet_kv_layout_t l = {
        .n_layers = G_LAYERS, .page_size = G_PAGE, .head_dim = G_HEAD_DIM, .elem_size = G_ELEM};
    if (b->progress_auto && b->shares_gpu && !duet_xfer_pack_progress_pays(&l, G_HEADS, n))
        return 0;
    return b->progress;
}

/* A packed expectation's callbacks (progress thread): what landed, and
 * the end. */
typedef struct {
    atomic_int landed, done;
    duet_status_t status;
    char detail[DUET_XFER_DETAIL_MAX];
} gexp_t;

static void on_exp_progress(void *arg, uint64_t id, int layers)
{
    (void)id;
    atomic_store(&((gexp_t *)arg)->landed, layers);
}

static void on_exp_done(void *arg, uint64_t id, const duet_xfer_result_t *res)
{
    gexp_t *x = arg;
    (void)id;
    x->status = res->status;
    snprintf(x->detail, sizeof(x->detail), "%s", res->detail);
    atomic_store(&x->done, 1);
}

/* Packed: wait for every rank's end, unpacking on the way the layers all
 * ranks have landed (as decode/prefill_path.c does with its progress
 * events); *unpacked_p: the layers queued so far. */
static int packed_wait(gside_t *g, gexp_t *x, int *unpacked_p)
{
    int64_t give_up = duet_now_ns() + (int64_t)G_TIMEOUT_MS * 1000000;
    /* BENCH_PROGRESS_NO_UNPACK=1 (a diagnostic): hear the progress but
     * unpack everything at the end, which splits the cost of announcing
     * (prefill) from the cost of unpacking early (decode) */
    bool early = getenv("BENCH_PROGRESS_NO_UNPACK") == NULL;
    for (;;) {
        int least = G_LAYERS, done = 0;
        for (int d = 0; d < g->tp; d++) {
            int l = atomic_load(&x[d].landed);
            least = l < least ? l : least;
            done += atomic_load(&x[d].done);
        }
        if (done == g->tp)
            break;
        if (early && least > *unpacked_p && least < G_LAYERS) {
            for (int d = 0; d < g->tp; d++)
                if (run_list(g, d, 2 * *unpacked_p, 2 * (least - *unpacked_p)))
                    return 1;
            *unpacked_p = least;
        }
        DUET_TESTKIT_CHECK(duet_now_ns() < give_up, "decode: the transfer did not end");
    }
    for (int d = 0; d < g->tp; d++)
        DUET_TESTKIT_CHECK(x[d].status == DUET_OK, "decode rank %d: %s", d, x[d].detail);
    return 0;
}

/* One request: clear, expect, wait for the KV, import, verify.  Reports
 * "done <notified ns> <imported ns>" or "bad <what>" to prefill. */
static int decode_request(gside_t *g, const duet_slice_plan_t *plan, const int32_t *pages,
                          uint64_t id, int n)
{
    int fd = g->b->fd_d;
    int64_t t_recv, t1;
    char msg[256];
    gexp_t x[G_MAX_TP];
    int unpacked = 0;
    for (int d = 0; d < g->tp; d++)
        if (clear_pages(g, d, n))
            return 1;
    for (int d = 0; d < g->tp; d++) {
        duet_xfer_expect_t e = {.transfer_id = id,
                                .plan = plan,
                                .peers = g->sd.peers[d],
                                .pages = pages,
                                .n_pages = n,
                                .deadline_ns = duet_deadline_in_ms(G_TIMEOUT_MS),
                                .flags = g->b->packed ? DUET_XFER_EXPECT_PACKED : 0,
                                .dst_stage0 = 0};
        if (g->b->packed) {
            memset(&x[d], 0, sizeof(x[d]));
            e.cb = on_exp_done;
            e.arg = &x[d];
            e.progress = progress_of(g->b, n) > 0 ? on_exp_progress : NULL;
            e.progress_arg = &x[d];
        }
        if (g->b->packed && upload_list(g, d, plan, pages, n))
            return 1;
        DUET_TESTKIT_OK(duet_xfer_recv_expect(duet_xfer_rank(g->sd.x, d), &e));
    }
    DUET_TESTKIT_CHECK(duet_testkit_chan_say(fd, "ok") == 0, "channel");
    if (g->b->packed && packed_wait(g, x, &unpacked))
        return 1;
    for (int d = 0; d < g->tp && !g->b->packed; d++) {
        duet_xfer_result_t res;
        DUET_TESTKIT_OK(duet_xfer_recv_wait(duet_xfer_rank(g->sd.x, d), id,
                                            duet_deadline_in_ms(G_TIMEOUT_MS), &res));
        DUET_TESTKIT_CHECK(res.status == DUET_OK, "decode rank %d: %s", d, res.detail);
    }
    t_recv = duet_now_ns();
    /* --mirror device: the KV already is in the device pages, nothing to
     * import; --mirror packed: unstage every layer into the pages */
    for (int d = 0; d < g->tp && !g->b->device; d++)
        if (copy_pages(g, d, 0, G_LAYERS, pages, n, false))
            return 1;
    for (int d = 0; d < g->tp && g->b->packed; d++)
        if (run_list(g, d, 2 * unpacked, 2 * (G_LAYERS - unpacked)))
            return 1;
    int64_t t_launched = duet_now_ns();
    for (int d = 0; d < g->tp && (!g->b->device || g->b->packed); d++)
        if (gs_sync(&g->rk[d].st))
            return 1;
    t1 = g->b->device && !g->b->packed ? t_recv : duet_now_ns();
    if (g->b->packed && getenv("BENCH_IMPORT_DETAIL") != NULL) {
        /* where the unpack's time goes: the launches, the wait, and the
         * same unpack again at once (a warm GPU, nothing in flight) */
        int64_t t2 = duet_now_ns();
        for (int d = 0; d < g->tp; d++)
            if (run_list(g, d, 0, 2 * G_LAYERS))
                return 1;
        for (int d = 0; d < g->tp; d++)
            if (gs_sync(&g->rk[d].st))
                return 1;
        fprintf(stderr,
                "# import detail: %d pages, %d layers unpacked early, launch %.1f us, wait %.1f "
                "us, all again %.1f us\n",
                n, unpacked, (double)(t_launched - t_recv) / 1e3, (double)(t1 - t_launched) / 1e3,
                (double)(duet_now_ns() - t2) / 1e3);
    }
    for (int d = 0; d < g->tp; d++) {
        char why[200];
        if (verify(g, d, n, why, sizeof(why))) {
            duet_testkit_fail("request %llu, %d pages: %s", (unsigned long long)id, n, why);
            snprintf(msg, sizeof(msg), "bad %s", why);
            duet_testkit_chan_say(fd, msg);
            return 1;
        }
    }
    if (getenv("BENCH_TIMELINE") != NULL)
        fprintf(stderr, "timeline decode: received %lld imported %lld (us)\n",
                (long long)(t_recv / 1000), (long long)(t1 / 1000));
    snprintf(msg, sizeof(msg), "done %lld %lld", (long long)t_recv, (long long)t1);
    DUET_TESTKIT_CHECK(duet_testkit_chan_say(fd, msg) == 0, "channel");
    return 0;
}

int bench_decode(void *arg)
{
    const bench_t *b = arg;
    duet_slice_plan_t *plan;
    int32_t *pages;
    gside_t *g = DUET_NEW(gside_t);
    int rc = 0;
    DUET_TESTKIT_CHECK(g != NULL, "out of memory");
    if (gside_start(g, b, DUET_XFER_DECODE, b->fd_d))
        return 1;
    DUET_TESTKIT_OK(duet_slice_plan_create(b->P, b->D, G_HEADS, &plan));
    pages = seq_pages(g->max_pages);
    DUET_TESTKIT_CHECK(pages != NULL, "out of memory");
    while (rc == 0) {
        unsigned long long id;
        uint32_t len;
        void *msg;
        int n;
        DUET_TESTKIT_CHECK(duet_testkit_chan_recv(b->fd_d, &msg, &len, 300000) == 0,
                           "prefill went away");
        if (strcmp(msg, "bye") == 0) {
            duet_free(msg);
            break;
        }
        if (sscanf(msg, "exp %llu %d", &id, &n) != 2)
            n = -1;
        DUET_TESTKIT_CHECK(n > 0 && n <= g->max_pages, "bad message '%s'", (char *)msg);
        duet_free(msg);
        rc = decode_request(g, plan, pages, id, n);
    }
    duet_free(pages);
    duet_slice_plan_destroy(plan);
    if (gside_stop(g))
        rc = 1;
    duet_free(g);
    return rc;
}
