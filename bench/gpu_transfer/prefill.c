/* bench_gpu_transfer: the sending process, which times each request and
 * reports (gpu_transfer.h). */
#include "bench/gpu_transfer/gpu_transfer.h"

/* ---- prefill ----------------------------------------------------------------------------- */

/* ---- the layers' release: a host function per layer, or a waiter thread --- */

static void CUDART_CB on_layer_landed(void *arg)
{
    gpost_t *p = arg;
    gside_t *g = p->g;
    int64_t now = duet_now_ns(), prev = atomic_load(&g->landed_ns);
    if (duet_xfer_send_layers(duet_xfer_rank(g->sd.x, p->rank), atomic_load(&g->cur_id), p->layer,
                              p->layer + 1) != DUET_OK)
        atomic_fetch_add(&g->post_errors, 1);
    while (now > prev && !atomic_compare_exchange_weak(&g->landed_ns, &prev, now)) {
    }
    atomic_fetch_add(&g->landed, 1);
}

/* End every rank's send of the current request (once). */
static void end_sends(gside_t *g)
{
    int64_t zero = 0;
    for (int s = 0; s < g->tp; s++)
        if (duet_xfer_send_end(duet_xfer_rank(g->sd.x, s), atomic_load(&g->cur_id), DUET_OK, 1) !=
            DUET_OK)
            atomic_fetch_add(&g->post_errors, 1);
    atomic_compare_exchange_strong(&g->ended_ns, &zero, duet_now_ns());
}

/* --layer-done event: instead of a host function on the copy stream (which
 * holds the stream until the host ran it, so layer l+1's copies wait for a
 * GPU -> host -> GPU round trip), each layer's end is an event that this
 * thread waits for, in layer order, releasing the layer's puts. */
typedef struct {
    gside_t *g;
    int r;
    const int32_t *pages; /* the request's pages, n of them (the launcher's staged copies) */
    int n;
} gwait_t;

static void *layer_waiter(void *arg)
{
    gwait_t *w = arg;
    grank_t *k = &w->g->rk[w->r];
    cudaSetDevice(k->st.dev);
    while (!atomic_load(&w->g->go)) {
    }
    for (int l = 0; l < G_LAYERS; l++) {
        while (atomic_load(&k->recorded) <= l)
            if (atomic_load(&k->launch_failed))
                return NULL;
        if (w->g->b->signal && w->g->b->packed) {
            /* the engine's wait (kv_done.c), with a deadline for a failed
             * stream instead of its cudaStreamQuery */
            int64_t give_up = duet_now_ns() + (int64_t)G_TIMEOUT_MS * 1000000;
            while (__atomic_load_n(k->sig_word, __ATOMIC_ACQUIRE) < k->sig_seq0 + (unsigned)l)
                if (duet_now_ns() > give_up) {
                    atomic_fetch_add(&w->g->post_errors, 1);
                    return NULL;
                }
        } else if (cudaEventSynchronize(k->ev[l]) != cudaSuccess) {
            atomic_fetch_add(&w->g->post_errors, 1);
        }
        on_layer_landed(&k->post[l]);
    }
    /* every rank's layers released: the last waiter ends every send, as the
     * prefill daemon does once its forward returned (ending them after
     * joining these threads counted their exit: 0.1-0.25 ms on 4 GPUs) */
    if (atomic_fetch_add(&w->g->waiters_done, 1) + 1 == w->g->tp)
        end_sends(w->g);
    return NULL;
}

/* --layer-done event: rank r's own thread queues its layers (stage, then
 * an event), as each engine rank thread does in the daemons: one host
 * thread launching every rank's copies would make the launches, not the
 * GPU, the bench's per-layer cost. */
static void *layer_launcher(void *arg)
{
    gwait_t *w = arg;
    gside_t *g = w->g;
    grank_t *k = &g->rk[w->r];
    if (cudaSetDevice(k->st.dev) != cudaSuccess)
        goto err_launch;
    while (!atomic_load(&g->go)) {
    }
    for (int l = 0; l < G_LAYERS; l++) {
        if (!g->b->device && copy_pages(g, w->r, l, l + 1, w->pages, w->n, true))
            goto err_launch;
        duet__cuda_signal_t sig = {k->sig_ctr, k->sig_word_dev, k->sig_seq0 + (unsigned)l};
        bool signalled = g->b->signal && g->b->packed;
        if (g->b->packed &&
            duet__cuda_kv_copy(k->st.s, k->pool, duet_kv_plane_bytes(&g->sd.layout), 2 * l, 2,
                               k->dlist, k->n_list, signalled ? &sig : NULL) != DUET_OK)
            goto err_launch;
        if (!signalled && cudaEventRecord(k->ev[l], k->st.s) != cudaSuccess)
            goto err_launch;
        atomic_store(&k->recorded, l + 1);
    }
    int64_t now = duet_now_ns(), prev = atomic_load(&g->launched_ns);
    while (now > prev && !atomic_compare_exchange_weak(&g->launched_ns, &prev, now)) {
    }
    return NULL;
err_launch:
    atomic_fetch_add(&g->post_errors, 1);
    atomic_store(&k->launch_failed, 1);
    return NULL;
}

/* ---- one request, timed --------------------------------------------------------- */

enum { T_E2E, T_EXPORT, T_PUTS, T_IMPORT, T_PUT1, T_LAUNCH, T_N };

/* One request; t[] gets the stage times in seconds. */
static int prefill_request(gside_t *g, const duet_slice_plan_t *plan, const int32_t *pages,
                           uint64_t id, int n, double *t)
{
    const bench_t *b = g->b;
    long long t_recv, t1;
    int64_t t0, t_put;
    size_t bytes = (size_t)n * G_PAGE * G_TOKEN_BYTES;
    char msg[64];
    void *reply;
    uint32_t len;

    for (int s = 0; s < g->tp; s++)
        if (clear_pages(g, s, n))
            return 1;
    snprintf(msg, sizeof(msg), "exp %llu %d", (unsigned long long)id, n);
    DUET_TESTKIT_CHECK(duet_testkit_chan_say(b->fd_p, msg) == 0, "channel");
    DUET_TESTKIT_CHECK(duet_testkit_chan_expect(b->fd_p, "ok", G_TIMEOUT_MS) == 0,
                       "decode did not register");
    for (int s = 0; s < g->tp; s++) {
        duet_xfer_send_t x = {.transfer_id = id,
                              .plan = plan,
                              .peers = g->sd.peers[s],
                              .src_pages = pages,
                              .dst_pages = pages,
                              .n_pages = n,
                              .flags = (b->packed ? DUET_XFER_SEND_PACKED : 0u) |
                                       (b->checksum ? DUET_XFER_SEND_CRC : 0u),
                              .deadline_ns = duet_deadline_in_ms(G_TIMEOUT_MS),
                              .src_stage0 = 0,
                              .dst_stage0 = 0,
                              .progress_layers = b->packed ? progress_of(b, n) : 0};
        if (b->packed && upload_list(g, s, plan, pages, n))
            return 1;
        DUET_TESTKIT_OK(duet_xfer_send_begin(duet_xfer_rank(g->sd.x, s), &x));
    }
    atomic_store(&g->cur_id, id);
    atomic_store(&g->landed, 0);
    atomic_store(&g->landed_ns, 0);
    atomic_store(&g->launched_ns, 0);
    atomic_store(&g->waiters_done, 0);
    atomic_store(&g->ended_ns, 0);
    t0 = duet_now_ns();
    /* what the rank threads do as each layer's KV is stored; --mirror device
     * exports nothing (the pool was rewritten and synchronised before t0)
     * but posts the puts from the same host functions on the copy stream
     * (--layer-done event: from each rank's waiter thread, the layers
     * queued by each rank's launcher thread) */
    gwait_t waits[G_MAX_TP];
    for (int s = 0; s < g->tp && b->event_done; s++) {
        grank_t *k = &g->rk[s];
        waits[s] = (gwait_t){g, s, pages, n};
        atomic_store(&k->recorded, 0);
        atomic_store(&k->launch_failed, 0);
        G_CUDA(cudaSetDevice(k->st.dev));
        for (int l = 0; l < G_LAYERS; l++)
            if (k->ev[l] == NULL)
                G_CUDA(cudaEventCreateWithFlags(&k->ev[l], cudaEventDisableTiming));
        if (b->signal && k->sig_word == NULL) {
            G_CUDA(cudaHostAlloc((void **)&k->sig_word, sizeof(*k->sig_word),
                                 cudaHostAllocMapped | cudaHostAllocPortable));
            G_CUDA(cudaHostGetDevicePointer((void **)&k->sig_word_dev, k->sig_word, 0));
            G_CUDA(cudaMalloc((void **)&k->sig_ctr, sizeof(*k->sig_ctr)));
            G_CUDA(cudaMemset(k->sig_ctr, 0, sizeof(*k->sig_ctr)));
            *k->sig_word = 0;
        }
        /* this round's seqs follow the last round's (the word only grows) */
        k->sig_seq0 = k->sig_word != NULL ? *k->sig_word + 1 : 0;
    }
    if (b->event_done) {
        /* the threads start (and bind their GPU) before t0: in the daemons
         * the rank and completion threads exist before the request */
        atomic_store(&g->go, 0);
        for (int s = 0; s < g->tp; s++)
            DUET_TESTKIT_CHECK(
                pthread_create(&g->rk[s].waiter, NULL, layer_waiter, &waits[s]) == 0 &&
                    pthread_create(&g->rk[s].launcher, NULL, layer_launcher, &waits[s]) == 0,
                "pthread_create");
        usleep(2000); /* past their cudaSetDevice */
        t0 = duet_now_ns();
        atomic_store(&g->go, 1);
        for (int s = 0; s < g->tp; s++) {
            pthread_join(g->rk[s].launcher, NULL);
            pthread_join(g->rk[s].waiter, NULL);
        }
    }
    for (int l = 0; l < G_LAYERS && !b->event_done; l++)
        for (int s = 0; s < g->tp; s++) {
            grank_t *k = &g->rk[s];
            if ((!b->device && copy_pages(g, s, l, l + 1, pages, n, true)) ||
                (b->packed && run_list(g, s, 2 * l, 2)))
                return 1;
            if (gs_host_fn(&k->st, on_layer_landed, &k->post[l]))
                return 1;
        }
    /* the end of every rank's send: as the prefill daemon ends them once
     * its forward returned, every rank's layers released (--layer-done
     * event: the last waiter did, unless one failed; a stream synchronize
     * of every rank first, which the daemons do not do, cost 0.26-0.45 ms
     * on 4 GPUs); with host functions their stream must have run them */
    for (int s = 0; s < g->tp && !b->event_done; s++)
        if (gs_sync(&g->rk[s].st))
            return 1;
    if (atomic_load(&g->ended_ns) == 0)
        end_sends(g);
    int64_t t_ended = atomic_load(&g->ended_ns);
    for (int s = 0; s < g->tp && b->event_done; s++)
        if (gs_sync(&g->rk[s].st))
            return 1;
    int64_t t_synced = duet_now_ns();
    if (getenv("BENCH_TIMELINE") != NULL) /* with DUET_LOG_LEVEL=trace: the transfer's own */
        fprintf(stderr,
                "timeline prefill: request %llu t0 %lld launched %lld landed %lld synced %lld "
                "ended %lld (us)\n",
                (unsigned long long)id, (long long)(t0 / 1000),
                (long long)(atomic_load(&g->launched_ns) / 1000),
                (long long)(atomic_load(&g->landed_ns) / 1000), (long long)(t_synced / 1000),
                (long long)(t_ended / 1000));
    for (int s = 0; s < g->tp; s++) {
        duet_xfer_result_t res;
        DUET_TESTKIT_OK(duet_xfer_send_wait(duet_xfer_rank(g->sd.x, s), id,
                                            duet_deadline_in_ms(G_TIMEOUT_MS), &res));
        DUET_TESTKIT_CHECK(res.status == DUET_OK, "prefill rank %d: %s", s, res.detail);
        g->rk[s].puts = res.puts;
    }
    DUET_TESTKIT_CHECK(atomic_load(&g->landed) == G_LAYERS * g->tp &&
                           atomic_load(&g->post_errors) == 0,
                       "%d of %d layers landed, %d posts refused", atomic_load(&g->landed),
                       G_LAYERS * g->tp, atomic_load(&g->post_errors));
    DUET_TESTKIT_CHECK(duet_testkit_chan_recv(b->fd_p, &reply, &len, G_TIMEOUT_MS) == 0,
                       "no word from decode");
    if (sscanf(reply, "done %lld %lld", &t_recv, &t1) != 2) {
        duet_testkit_fail("decode: %s", (char *)reply);
        duet_free(reply);
        return 1;
    }
    duet_free(reply);
    t[T_E2E] = (double)(t1 - t0) / 1e9;
    t[T_EXPORT] = (double)(atomic_load(&g->landed_ns) - t0) / 1e9;
    t[T_LAUNCH] = b->event_done ? (double)(atomic_load(&g->launched_ns) - t0) / 1e9 : 0.0;
    t[T_PUTS] = (double)(t_recv - atomic_load(&g->landed_ns)) / 1e9;
    t[T_IMPORT] = (double)(t1 - t_recv) / 1e9;
    /* one put of the same bytes, mirror to mirror (--mirror device: device
     * pool to device pool) */
    t_put = duet_now_ns();
    DUET_TESTKIT_OK(
        duet_xfer_debug_put(g->sd.peers[0][0], 0, 0, bytes, duet_deadline_in_ms(G_TIMEOUT_MS)));
    t[T_PUT1] = (double)(duet_now_ns() - t_put) / 1e9;
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int bench_prefill(void *arg)
{
    const bench_t *b = arg;
    duet_slice_plan_t *plan;
    int32_t *pages;
    gside_t *g = DUET_NEW(gside_t);
    uint64_t id = 1;
    DUET_TESTKIT_CHECK(g != NULL, "out of memory");
    if (gside_start(g, b, DUET_XFER_PREFILL, b->fd_p))
        return 1;
    DUET_TESTKIT_OK(duet_slice_plan_create(b->P, b->D, G_HEADS, &plan));
    pages = seq_pages(g->max_pages);
    DUET_TESTKIT_CHECK(pages != NULL, "out of memory");
    DUET_TESTKIT_OK(duet_xfer_debug_corrupt_put(duet_xfer_rank(g->sd.x, 0), b->corrupt_put));
    for (int i = 0; i < b->n_tokens; i++) {
        double t[T_N][G_MAX_ROUNDS], med[T_N], r[T_N];
        int n = (b->tokens[i] + G_PAGE - 1) / G_PAGE;
        double bytes = (double)n * G_PAGE * G_TOKEN_BYTES;
        /* round 0 warms up (first touch of the pages, UCX attach) */
        for (int round = 0; round <= b->rounds; round++) {
            if (prefill_request(g, plan, pages, id++, n, r))
                return 1;
            for (int k = 0; round > 0 && k < T_N; k++)
                t[k][round - 1] = r[k];
        }
        for (int k = 0; k < T_N; k++)
            med[k] = median(t[k], b->rounds);
        /* a staged copy cannot beat max(d2h, put) + h2d of the same bytes; the
         * device-direct path is its puts alone */
        double put = bytes / med[T_PUT1] / 1e9, d2h = b->base.d2h[i], h2d = b->base.h2d[i];
        double model = b->device            ? put
                       : d2h > 0 && h2d > 0 ? 1.0 / ((1.0 / (d2h < put ? d2h : put)) + 1.0 / h2d)
                                            : 0;
        double e2e = bytes / med[T_E2E] / 1e9;
        double ref = strcmp(b->variant, "same") == 0 ? b->base.d2d[i] : b->base.peer[i];
        uint64_t puts = 0;
        for (int s = 0; s < g->tp; s++)
            puts += g->rk[s].puts;
        printf("%-7s %2d %2d %6d %7.0f %9.2f %9.2f %8.2f %9.2f %9.2f %9.2f %9.2f %8.2f %7llu "
               "%9.2f%s\n",
               b->variant, b->P, b->D, b->tokens[i], bytes / 1048576.0, e2e, med[T_EXPORT] * 1e3,
               med[T_PUTS] * 1e3, med[T_IMPORT] * 1e3, put, model, ref, ref > 0 ? e2e / ref : 0.0,
               (unsigned long long)puts, med[T_LAUNCH] * 1e3,
               !b->auto_pack ? ""
               : b->packed   ? " packed"
                             : " direct");
        fflush(stdout);
    }
    DUET_TESTKIT_CHECK(duet_testkit_chan_say(b->fd_p, "bye") == 0, "channel");
    duet_free(pages);
    duet_slice_plan_destroy(plan);
    int rc = gside_stop(g);
    duet_free(g);
    return rc;
}
