/* The engine's packed-transfer copies (duet_engine_kv_copy_layer and
 * duet_engine_kv_copy, issue 12) on the cpu backend, TP 2, a batch of two
 * requests prefilled in several chunks:
 *  - packing from the on_layer hook stages every layer's K and V of each
 *    request head-major in its staging pages, equal to the stored KV (the
 *    pool starts as 0xff bytes, so a copy taken before the store, or none,
 *    shows), and every done() ran;
 *  - unpacking the staging pages into other pages on every rank and layer
 *    reproduces the request's KV; bad entries are refused, naming the
 *    entry, before anything is copied;
 *  - the job sequence with a backend that completes copies and exports
 *    only in kv_export_sync (as a GPU does, asynchronously), with the pool
 *    registered for direct puts (no mirror): every pack and export is
 *    queued after its layer's KV store, no done() has run when the forward
 *    returns, and every one has when duet_engine_kv_export_sync returns --
 *    the prefill scheduler ends its sends right after it.  (The direct
 *    path returned from the rank's sync job without syncing: the sends
 *    then ended "after N of M layers".)
 *  - duet_engine_kv_crc (a transfer's checksum where the pool lives): the
 *    CRC32C of the listed bytes of each rank's pool, ranges outside the
 *    pool refused;
 *  - duet_engine_kv_copy_ranks_layers (decode unpacking the layers a
 *    progress message announced): each rank's own list applied to exactly
 *    layers [l0, l1), every other byte of the pools untouched, queued
 *    (wait = false) as well as waited for; bad ranges refused. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/alloc.h"
#include "common/crc32c.h"
#include "engine/backend.h"
#include "engine/engine.h"
#include "synth/mkmodel.h"

#define TP      2
#define LAYERS  3
#define N_REQ   2
#define N_PAGES 48
#define PS      4

static char tmpdir[256];

static const int32_t req_pages[N_REQ][6] = {{17, 3, 9, 4, 30, 11}, {0, 25, 5}};
static const int req_tokens[N_REQ] = {23, 10};
static const int32_t req_stage0[N_REQ] = {36, 42};
static const int32_t req_dst[N_REQ][6] = {{12, 13, 14, 15, 16, 18}, {19, 20, 21}};

static int req_n_pages(int q)
{
    return (req_tokens[q] + PS - 1) / PS;
}

static const char *model_path(void)
{
    static char path[512];
    snprintf(path, sizeof(path), "%s/m", tmpdir);
    if (access(path, F_OK) == 0)
        return path;
    duet_mkmodel_opts_t o = duet_mkmodel_opts_default();
    o.layers = LAYERS;
    o.hidden = 64;
    o.heads = 8;
    o.kv_heads = 4;
    o.head_dim = 8;
    o.intermediate = 96;
    o.vocab = 300;
    o.max_pos = 256;
    o.seed = 12;
    o.threads = 1;
    assert_int_equal(duet_mkmodel_write(path, &o), DUET_OK);
    return path;
}

/* Head-major staging of request q (transfer/xfer_pack.h): local head h of
 * page index i at stage0 * page + (h * n + i) * head; unpack: the reverse
 * into pages to[]. */
static int pack_list(const duet_kv_layout_t *l, int q, bool unpack, const int32_t *to,
                     duet_kv_copy_t *out)
{
    uint64_t hb = duet_kv_head_bytes(l), pb = duet_kv_page_bytes(l);
    int n = req_n_pages(q), k = 0;
    for (int h = 0; h < l->n_kv_heads; h++) {
        for (int i = 0; i < n; i++) {
            uint64_t page = (uint64_t)(unpack ? to[i] : req_pages[q][i]) * pb + (uint64_t)h * hb;
            uint64_t stage = (uint64_t)req_stage0[q] * pb + (uint64_t)(h * n + i) * hb;
            out[k++] = unpack ? (duet_kv_copy_t){stage, page, hb, 0, 0}
                              : (duet_kv_copy_t){page, stage, hb, 0, 0};
        }
    }
    return k;
}

/* ---- the order log (shared by rank threads and driver "threads") ---- */
enum { EV_STORE, EV_HOOK, EV_QUEUE, EV_SYNC_BEGIN, EV_DONE, EV_SYNC_END };
typedef struct {
    int kind, rank, layer;
} ev_t;

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static ev_t evlog[4096];
static int n_ev;

static void log_ev(int kind, int rank, int layer)
{
    pthread_mutex_lock(&log_mu);
    if (n_ev < (int)(sizeof(evlog) / sizeof(evlog[0])))
        evlog[n_ev++] = (ev_t){kind, rank, layer};
    pthread_mutex_unlock(&log_mu);
}

/* ---- the hook ---- */
typedef struct ctx ctx_t;
typedef struct {
    ctx_t *c;
    int rank, layer;
    atomic_int runs;
} rec_t;

struct ctx {
    duet_engine_t *e;
    void *pool[TP];
    bool also_export; /* registered pool: duet_engine_kv_export_layer too */
    rec_t rec[TP][LAYERS][N_REQ + 1];
    atomic_int hook_errors;
};

static void on_done(void *arg)
{
    rec_t *r = arg;
    atomic_fetch_add(&r->runs, 1);
    log_ev(EV_DONE, r->rank, r->layer);
}

static void on_layer(void *ud, int rank, int layer, bool last_chunk)
{
    ctx_t *c = ud;
    duet_kv_copy_t list[64];
    log_ev(EV_HOOK, rank, layer);
    if (!last_chunk)
        return;
    for (int q = 0; q < N_REQ; q++) {
        rec_t *r = &c->rec[rank][layer][q];
        int n = pack_list(duet_engine_kv_layout(c->e), q, false, NULL, list);
        r->c = c;
        r->rank = rank;
        r->layer = layer;
        if (duet_engine_kv_copy_layer(c->e, rank, layer, list, n, on_done, r) != DUET_OK)
            atomic_fetch_add(&c->hook_errors, 1);
        memset(list, 0xab, sizeof(list)); /* read during the call only */
    }
    if (c->also_export) {
        rec_t *r = &c->rec[rank][layer][N_REQ];
        r->c = c;
        r->rank = rank;
        r->layer = layer;
        if (duet_engine_kv_export_layer(c->e, rank, layer, req_pages[0], req_n_pages(0), on_done,
                                        r) != DUET_OK)
            atomic_fetch_add(&c->hook_errors, 1);
    }
}

static int dones(ctx_t *c, int expect_each)
{
    int n = 0, slots = c->also_export ? N_REQ + 1 : N_REQ;
    for (int r = 0; r < TP; r++)
        for (int l = 0; l < LAYERS; l++)
            for (int q = 0; q < slots; q++) {
                int k = atomic_load(&c->rec[r][l][q].runs);
                assert_true(k <= expect_each);
                n += k;
            }
    return n;
}

static duet_status_t pool_alloc(void *ud, int rank, size_t bytes, void **base_p)
{
    ctx_t *c = ud;
    c->pool[rank] = duet_aligned_alloc(64, bytes);
    if (c->pool[rank] == NULL)
        return DUET_ERR_NO_MEMORY;
    memset(c->pool[rank], 0xff, bytes); /* no KV stored yet */
    *base_p = c->pool[rank];
    return DUET_OK;
}

static void pool_free(void *ud, int rank, void *base)
{
    (void)ud;
    (void)rank;
    duet_aligned_free(base);
}

static duet_engine_t *open_engine(ctx_t *c, const duet_backend_ops_t *ops)
{
    duet_engine_opts_t eo;
    duet_engine_opts_default(&eo);
    eo.model_dir = model_path();
    eo.backend_ops = ops;
    eo.tp = TP;
    eo.threads = 1;
    eo.page_size = PS;
    eo.n_pages = N_PAGES;
    eo.max_batch_tokens = 8; /* 33 tokens: five chunks */
    eo.max_seqs = 8;
    eo.comm_timeout_ms = 20000;
    eo.kv_alloc = pool_alloc;
    eo.kv_free = pool_free;
    eo.kv_ud = c;
    eo.on_layer = on_layer;
    eo.layer_ud = c;
    if (duet_engine_create(&eo, &c->e) != DUET_OK)
        fail_msg("engine create: %s", duet_error_msg());
    return c->e;
}

static void prefill(ctx_t *c)
{
    static int32_t toks[N_REQ][32];
    duet_engine_seq_t s[N_REQ];
    int32_t next[N_REQ];
    for (int q = 0; q < N_REQ; q++) {
        for (int t = 0; t < req_tokens[q]; t++)
            toks[q][t] = (int32_t)((t * 37 + q * 101 + 5) % 300);
        s[q] = (duet_engine_seq_t){.tokens = toks[q],
                                   .n_tokens = req_tokens[q],
                                   .pages = req_pages[q],
                                   .n_pages = req_n_pages(q),
                                   .sample = true,
                                   .sampling = duet_sampling_greedy()};
    }
    assert_int_equal(duet_engine_forward(c->e, s, N_REQ, next), DUET_OK);
}

/* Every staged head slice equals the stored one (and something was stored). */
static void check_staged(ctx_t *c)
{
    const duet_kv_layout_t *l = duet_engine_kv_layout(c->e);
    size_t hb = duet_kv_head_bytes(l), pb = duet_kv_page_bytes(l);
    unsigned char ff[256];
    assert_true(hb <= sizeof(ff));
    memset(ff, 0xff, sizeof(ff));
    for (int r = 0; r < TP; r++)
        for (int L = 0; L < LAYERS; L++)
            for (int kv = 0; kv < 2; kv++)
                for (int q = 0; q < N_REQ; q++)
                    for (int h = 0; h < l->n_kv_heads; h++)
                        for (int i = 0; i < req_n_pages(q); i++) {
                            const unsigned char *plane =
                                (const unsigned char *)c->pool[r] + duet_kv_offset(l, L, kv, 0, 0);
                            const unsigned char *page = plane + req_pages[q][i] * pb + h * hb;
                            const unsigned char *st =
                                plane + req_stage0[q] * pb + (size_t)(h * req_n_pages(q) + i) * hb;
                            assert_memory_not_equal(page, ff, 16); /* token 0 of the page */
                            if (memcmp(page, st, hb) != 0)
                                fail_msg("rank %d layer %d kv %d req %d head %d page %d: staged "
                                         "bytes differ from the stored KV",
                                         r, L, kv, q, h, i);
                        }
}

static void test_pack_unpack_cpu(void **state)
{
    (void)state;
    ctx_t *c = DUET_NEW(ctx_t);
    duet_engine_t *e = open_engine(c, NULL);
    const duet_kv_layout_t *l = duet_engine_kv_layout(e);
    size_t pb = duet_kv_page_bytes(l), hb = duet_kv_head_bytes(l);
    duet_kv_copy_t list[128];
    int n = 0;

    prefill(c);
    /* cpu: each done ran inside its call, before the forward returned */
    assert_int_equal(dones(c, 1), TP * LAYERS * N_REQ);
    assert_int_equal(atomic_load(&c->hook_errors), 0);
    assert_int_equal(duet_engine_kv_export_sync(e), DUET_OK);
    check_staged(c);

    /* refused before anything moves: entry 0 valid, entry 1 leaves the plane */
    size_t plane = duet_kv_plane_bytes(l);
    unsigned char *probe = (unsigned char *)c->pool[1] + duet_kv_offset(l, 2, 1, 46, 0);
    duet_kv_copy_t bad[2] = {{17 * pb, 46 * pb, pb, 0, 0}, {plane - 10, 47 * pb, hb, 0, 0}};
    assert_int_equal(duet_engine_kv_copy(e, bad, 2), DUET_ERR_INVALID);
    assert_non_null(strstr(duet_error_msg(), "copy 1 "));
    assert_int_equal(probe[0], 0xff);
    bad[1] = (duet_kv_copy_t){47 * pb, 47 * pb + 8, hb, 0, 0};
    assert_int_equal(duet_engine_kv_copy(e, bad, 2), DUET_ERR_INVALID);
    assert_non_null(strstr(duet_error_msg(), "overlaps itself"));
    bad[1] = (duet_kv_copy_t){46 * pb, 47 * pb, UINT64_MAX, 0, 0};
    assert_int_equal(duet_engine_kv_copy(e, bad, 2), DUET_ERR_INVALID);
    assert_int_equal(probe[0], 0xff);
    assert_int_equal(duet_engine_kv_copy_layer(e, 0, LAYERS, bad, 1, on_done, &c->rec[0][0][0]),
                     DUET_ERR_INVALID);
    assert_int_equal(duet_engine_kv_copy_layer(e, TP, 0, bad, 1, on_done, &c->rec[0][0][0]),
                     DUET_ERR_INVALID);

    /* unpack both requests on every rank and layer */
    for (int q = 0; q < N_REQ; q++)
        n += pack_list(l, q, true, req_dst[q], list + n);
    assert_int_equal(duet_engine_kv_copy(e, list, n), DUET_OK);
    for (int r = 0; r < TP; r++)
        for (int L = 0; L < LAYERS; L++)
            for (int kv = 0; kv < 2; kv++)
                for (int q = 0; q < N_REQ; q++)
                    for (int i = 0; i < req_n_pages(q); i++) {
                        const unsigned char *b = c->pool[r];
                        if (memcmp(b + duet_kv_offset(l, L, kv, req_pages[q][i], 0),
                                   b + duet_kv_offset(l, L, kv, req_dst[q][i], 0), pb) != 0)
                            fail_msg("rank %d layer %d kv %d req %d page %d: unpacked page "
                                     "differs",
                                     r, L, kv, q, i);
                    }
    duet_engine_destroy(e);
    duet_free(c);
}

/* duet_engine_kv_crc on the cpu backend: the CRC32C of the listed pool
 * bytes in list order (a transfer's checksum hook), ranges validated. */
static void test_kv_crc_cpu(void **state)
{
    (void)state;
    ctx_t *c = DUET_NEW(ctx_t);
    duet_engine_t *e = open_engine(c, NULL);
    const duet_kv_layout_t *l = duet_engine_kv_layout(e);
    uint64_t pool = duet_kv_total_bytes(l), hb = duet_kv_head_bytes(l);
    duet_crc32c_range_t r[3] = {
        {duet_kv_offset(l, 1, 1, 9, 1), 3 * hb}, {duet_kv_offset(l, 0, 0, 17, 0), hb + 5}, {7, 1}};
    uint32_t crc[TP] = {0}, got = 1;

    prefill(c);
    for (int rank = 0; rank < TP; rank++) {
        assert_int_equal(duet_engine_kv_crc(e, rank, r, 3, &crc[rank]), DUET_OK);
        assert_int_equal(crc[rank], duet_crc32c_ranges(c->pool[rank], r, 3));
    }
    assert_int_not_equal(crc[0], crc[1]); /* each rank its own pool */
    assert_int_equal(duet_engine_kv_crc(e, 0, r, 0, &got), DUET_OK);
    assert_int_equal(got, 0);
    r[1] = (duet_crc32c_range_t){pool - 4, 5};
    assert_int_equal(duet_engine_kv_crc(e, 0, r, 3, &got), DUET_ERR_INVALID);
    assert_non_null(strstr(duet_error_msg(), "range 1 "));
    r[1] = (duet_crc32c_range_t){8, UINT64_MAX};
    assert_int_equal(duet_engine_kv_crc(e, 0, r, 3, &got), DUET_ERR_INVALID);
    assert_int_equal(duet_engine_kv_crc(e, TP, r, 1, &got), DUET_ERR_INVALID);
    duet_engine_destroy(e);
    duet_free(c);
}

/* ---- a backend that completes packs and exports only in kv_export_sync,
 * as the GPU does asynchronously; its pool is registered for direct puts */
typedef struct {
    duet_backend_rank_t *br;
    int layer;
    duet_kv_copy_t *copies; /* NULL: an export (no copies on the direct path) */
    int n;
    void (*done)(void *arg);
    void *arg;
} pending_t;

static duet_backend_ops_t deferred;
static pthread_mutex_t pend_mu = PTHREAD_MUTEX_INITIALIZER;
static pending_t pend[256];
static int n_pend;
static duet_backend_rank_t *rank_of_br[TP];

static int br_rank(duet_backend_rank_t *br)
{
    for (int r = 0; r < TP; r++)
        if (rank_of_br[r] == br)
            return r;
    return -1;
}

static duet_status_t d_rank_create(const duet_backend_rank_opts_t *o, duet_backend_rank_t **r_p)
{
    duet_status_t st = duet_backend_cpu.rank_create(o, r_p);
    if (st == DUET_OK)
        rank_of_br[o->rank] = *r_p;
    return st;
}

static duet_status_t d_rope_kv_store(duet_backend_rank_t *r, void *qkv, int n, int nq, int nkv,
                                     int head_dim, const float *inv_freq, float attn, int layer)
{
    duet_status_t st =
        duet_backend_cpu.rope_kv_store(r, qkv, n, nq, nkv, head_dim, inv_freq, attn, layer);
    log_ev(EV_STORE, br_rank(r), layer);
    return st;
}

static duet_status_t d_defer(duet_backend_rank_t *r, int layer, const duet_kv_copy_t *copies, int n,
                             void (*done)(void *arg), void *arg)
{
    pending_t p = {r, layer, NULL, n, done, arg};
    if (copies != NULL) {
        p.copies = duet_malloc((size_t)n * sizeof(*copies) + 1);
        if (p.copies == NULL)
            return DUET_ERR_NO_MEMORY;
        memcpy(p.copies, copies, (size_t)n * sizeof(*copies));
    }
    pthread_mutex_lock(&pend_mu);
    if (n_pend == (int)(sizeof(pend) / sizeof(pend[0]))) {
        pthread_mutex_unlock(&pend_mu);
        duet_free(p.copies);
        return duet_error(DUET_ERR_EXHAUSTED, "test backend: too many pending");
    }
    pend[n_pend++] = p;
    pthread_mutex_unlock(&pend_mu);
    log_ev(EV_QUEUE, br_rank(r), layer);
    return DUET_OK;
}

static duet_status_t d_kv_copy(duet_backend_rank_t *r, int l0, int l1, const duet_kv_copy_t *copies,
                               int n, void (*done)(void *arg), void *arg)
{
    if (done == NULL)
        return duet_backend_cpu.kv_copy(r, l0, l1, copies, n, NULL, NULL);
    return d_defer(r, l0, copies, n, done, arg);
}

static duet_status_t d_kv_export_layer(duet_backend_rank_t *r, int layer, const int32_t *pages,
                                       int n, void *host, void (*done)(void *arg), void *arg)
{
    (void)pages;
    (void)n;
    if (host != NULL)
        return duet_error(DUET_ERR_INTERNAL, "test backend: a mirror export on the direct path");
    return d_defer(r, layer, NULL, 0, done, arg);
}

static duet_status_t d_kv_export_sync(duet_backend_rank_t *r)
{
    int rank = br_rank(r);
    log_ev(EV_SYNC_BEGIN, rank, -1);
    pthread_mutex_lock(&pend_mu);
    for (int i = 0; i < n_pend; i++) {
        pending_t *p = &pend[i];
        if (p->br != r || p->done == NULL)
            continue;
        if (p->copies != NULL)
            duet_backend_cpu.kv_copy(r, p->layer, p->layer + 1, p->copies, p->n, NULL, NULL);
        p->done(p->arg);
        p->done = NULL;
        duet_free(p->copies);
        p->copies = NULL;
    }
    pthread_mutex_unlock(&pend_mu);
    log_ev(EV_SYNC_END, rank, -1);
    return DUET_OK;
}

static duet_status_t d_kv_import(duet_backend_rank_t *r, const int32_t *pages, int n,
                                 const void *host)
{
    (void)r;
    (void)pages;
    (void)n;
    (void)host;
    return duet_error(DUET_ERR_INTERNAL, "test backend: kv import on the direct path");
}

static duet_status_t d_register(void *ud, int rank, void *base, size_t bytes)
{
    ctx_t *c = ud;
    memset(base, 0xff, bytes);
    c->pool[rank] = base;
    return DUET_OK;
}

static void d_unregister(void *ud, int rank, void *base)
{
    ctx_t *c = ud;
    (void)base;
    c->pool[rank] = NULL;
}

static void test_export_sync_waits_direct(void **state)
{
    (void)state;
    ctx_t *c = DUET_NEW(ctx_t);
    duet_engine_opts_t eo;

    deferred = duet_backend_cpu;
    deferred.name = "cpu-deferred";
    deferred.rank_create = d_rank_create;
    deferred.rope_kv_store = d_rope_kv_store;
    deferred.kv_copy = d_kv_copy;
    deferred.kv_export_layer = d_kv_export_layer;
    deferred.kv_export_sync = d_kv_export_sync;
    deferred.kv_import = d_kv_import;
    n_ev = 0;
    c->also_export = true;

    duet_engine_opts_default(&eo);
    eo.model_dir = model_path();
    eo.backend_ops = &deferred;
    eo.tp = TP;
    eo.threads = 1;
    eo.page_size = PS;
    eo.n_pages = N_PAGES;
    eo.max_batch_tokens = 8;
    eo.max_seqs = 8;
    eo.comm_timeout_ms = 20000;
    eo.kv_register = d_register;
    eo.kv_unregister = d_unregister;
    eo.kv_ud = c;
    eo.on_layer = on_layer;
    eo.layer_ud = c;
    if (duet_engine_create(&eo, &c->e) != DUET_OK)
        fail_msg("engine create: %s", duet_error_msg());
    assert_true(duet_engine_kv_registered(c->e));
    assert_false(duet_engine_kv_mirrored(c->e));

    prefill(c);
    assert_int_equal(atomic_load(&c->hook_errors), 0);
    /* queued, not completed: only the sync completes them */
    assert_int_equal(dones(c, 1), 0);
    assert_int_equal(duet_engine_kv_export_sync(c->e), DUET_OK);
    assert_int_equal(dones(c, 1), TP * LAYERS * (N_REQ + 1));
    check_staged(c);

    /* per rank: each queue after its layer's store of the final chunk
     * (after a store of that layer with no later store of it), each done
     * inside that rank's sync */
    int last_store[TP][LAYERS], in_sync[TP] = {0}, n_queue = 0, n_done = 0;
    for (int r = 0; r < TP; r++)
        for (int L = 0; L < LAYERS; L++)
            last_store[r][L] = -1;
    for (int i = 0; i < n_ev; i++) {
        ev_t *v = &evlog[i];
        assert_true(v->rank >= 0 && v->rank < TP);
        switch (v->kind) {
        case EV_STORE:
            last_store[v->rank][v->layer] = i;
            break;
        case EV_QUEUE:
            if (last_store[v->rank][v->layer] < 0)
                fail_msg("rank %d layer %d: pack queued before any KV store", v->rank, v->layer);
            for (int j = last_store[v->rank][v->layer] + 1; j < n_ev; j++)
                if (evlog[j].kind == EV_STORE && evlog[j].rank == v->rank &&
                    evlog[j].layer == v->layer)
                    fail_msg("rank %d layer %d: KV stored again after the pack was queued", v->rank,
                             v->layer);
            n_queue++;
            break;
        case EV_SYNC_BEGIN:
            in_sync[v->rank] = 1;
            break;
        case EV_SYNC_END:
            in_sync[v->rank] = 0;
            break;
        case EV_DONE:
            if (!in_sync[v->rank])
                fail_msg("rank %d layer %d: done outside the rank's export sync", v->rank,
                         v->layer);
            n_done++;
            break;
        default:
            break;
        }
    }
    assert_int_equal(n_queue, TP * LAYERS * (N_REQ + 1));
    assert_int_equal(n_done, n_queue);
    duet_engine_destroy(c->e);
    duet_free(c);
}

/* ---- duet_engine_kv_copy_ranks_layers: one list per rank over a layer
 * range (decode unpacking the layers a progress message announced) ---- */

/* Rank r's list: whole pages 3 -> 20 and 7 -> 21 (page 7: rank 1 only),
 * and half of page 9's head 1 -> page 22; plane offsets (step 0). */
static int layers_list(const duet_kv_layout_t *l, int r, duet_kv_copy_t *out)
{
    uint64_t pb = duet_kv_page_bytes(l), hb = duet_kv_head_bytes(l);
    int n = 0;
    out[n++] = (duet_kv_copy_t){3 * pb, 20 * pb, pb, 0, 0};
    if (r == 1)
        out[n++] = (duet_kv_copy_t){7 * pb, 21 * pb, pb, 0, 0};
    out[n++] = (duet_kv_copy_t){9 * pb + hb, 22 * pb + 8, hb / 2, 0, 0};
    return n;
}

/* expect[r] gets rank r's list applied to layers [l0, l1), by hand. */
static void layers_expect(const duet_kv_layout_t *l, unsigned char *expect[TP], int l0, int l1)
{
    duet_kv_copy_t list[4];
    for (int r = 0; r < TP; r++) {
        int n = layers_list(l, r, list);
        for (int L = l0; L < l1; L++)
            for (int kv = 0; kv < 2; kv++)
                for (int i = 0; i < n; i++) {
                    size_t plane = duet_kv_offset(l, L, kv, 0, 0);
                    memcpy(expect[r] + plane + list[i].dst, expect[r] + plane + list[i].src,
                           (size_t)list[i].len);
                }
    }
}

static void layers_check(ctx_t *c, unsigned char *expect[TP], size_t bytes, const char *what)
{
    const duet_kv_layout_t *l = duet_engine_kv_layout(c->e);
    size_t plane = duet_kv_plane_bytes(l);
    for (int r = 0; r < TP; r++) {
        const unsigned char *got = c->pool[r];
        for (size_t i = 0; i < bytes; i++)
            if (got[i] != expect[r][i])
                fail_msg("%s: rank %d byte %zu (layer %zu, %s, page %zu) is %02x, expected %02x",
                         what, r, i, i / plane / 2, i / plane % 2 ? "V" : "K",
                         i % plane / duet_kv_page_bytes(l), got[i], expect[r][i]);
    }
}

static void test_copy_ranks_layers_cpu(void **state)
{
    (void)state;
    ctx_t *c = DUET_NEW(ctx_t);
    duet_engine_t *e = open_engine(c, NULL);
    const duet_kv_layout_t *l = duet_engine_kv_layout(e);
    size_t bytes = duet_kv_total_bytes(l);
    duet_kv_copy_t lists[TP][4];
    const duet_kv_copy_t *ptrs[TP];
    int n[TP], zero[TP] = {0};
    unsigned char *expect[TP];

    /* every byte of each rank's pool distinct from its neighbours' */
    for (int r = 0; r < TP; r++) {
        unsigned char *b = c->pool[r];
        for (size_t i = 0; i < bytes; i++)
            b[i] = (unsigned char)(i * 7u + i / 251u + (size_t)r * 13u);
        expect[r] = duet_malloc(bytes);
        assert_non_null(expect[r]);
        memcpy(expect[r], b, bytes);
        n[r] = layers_list(l, r, lists[r]);
        ptrs[r] = lists[r];
    }

    /* layer 1 only, waiting */
    assert_int_equal(duet_engine_kv_copy_ranks_layers(e, ptrs, n, 1, 2, true), DUET_OK);
    layers_expect(l, expect, 1, 2);
    layers_check(c, expect, bytes, "layers [1, 2), wait");
    /* layers [2, 3), queued: the cpu backend copies before it returns */
    assert_int_equal(duet_engine_kv_copy_ranks_layers(e, ptrs, n, 2, 3, false), DUET_OK);
    layers_expect(l, expect, 2, 3);
    layers_check(c, expect, bytes, "layers [2, 3), queued");
    /* an empty range moves nothing; empty lists with wait = true return */
    assert_int_equal(duet_engine_kv_copy_ranks_layers(e, ptrs, n, 0, 0, true), DUET_OK);
    assert_int_equal(duet_engine_kv_copy_ranks_layers(e, ptrs, zero, 0, LAYERS, true), DUET_OK);
    assert_int_equal(duet_engine_kv_copy_ranks_layers(e, ptrs, zero, 0, LAYERS, false), DUET_OK);
    layers_check(c, expect, bytes, "empty");

    /* refused before anything moves, naming the layers */
    duet_error_clear();
    assert_int_equal(duet_engine_kv_copy_ranks_layers(e, ptrs, n, 2, 1, true), DUET_ERR_INVALID);
    assert_non_null(strstr(duet_error_msg(), "layers [2, 1) of 3"));
    assert_int_equal(duet_engine_kv_copy_ranks_layers(e, ptrs, n, 0, LAYERS + 1, false),
                     DUET_ERR_INVALID);
    assert_non_null(strstr(duet_error_msg(), "layers [0, 4) of 3"));
    assert_int_equal(duet_engine_kv_copy_ranks_layers(e, ptrs, n, -1, 1, true), DUET_ERR_INVALID);
    assert_int_equal(duet_engine_kv_copy_ranks_layers(e, NULL, n, 0, 1, true), DUET_ERR_INVALID);
    /* a bad entry on rank 1 refuses the call on every rank */
    lists[1][0].len = duet_kv_plane_bytes(l);
    assert_int_equal(duet_engine_kv_copy_ranks_layers(e, ptrs, n, 0, 1, true), DUET_ERR_INVALID);
    assert_non_null(strstr(duet_error_msg(), "rank 1: "));
    layers_check(c, expect, bytes, "refused");

    /* the last layer left, queued, then a wait with empty lists */
    lists[1][0].len = duet_kv_page_bytes(l);
    assert_int_equal(duet_engine_kv_copy_ranks_layers(e, ptrs, n, 0, 1, false), DUET_OK);
    assert_int_equal(duet_engine_kv_copy_ranks_layers(e, ptrs, zero, 0, LAYERS, true), DUET_OK);
    layers_expect(l, expect, 0, 1);
    layers_check(c, expect, bytes, "layers [0, 1), queued");
    for (int r = 0; r < TP; r++)
        duet_free(expect[r]);
    duet_engine_destroy(e);
    duet_free(c);
}

static int setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/duet_test_engine_kv_XXXXXX");
    return mkdtemp(tmpdir) == NULL ? -1 : 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pack_unpack_cpu),
        cmocka_unit_test(test_kv_crc_cpu),
        cmocka_unit_test(test_export_sync_waits_direct),
        cmocka_unit_test(test_copy_ranks_layers_cpu),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
