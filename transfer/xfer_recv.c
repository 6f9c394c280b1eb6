/* Decode side: the table of expected requests of one rank.
 *
 * An expectation knows senders(d) from the slice plan and which runs each
 * sender writes.  A notification is keyed by (request id, source engine
 * rank) and must come from the instance of the peer registered for that
 * sender.  The request completes exactly when every sender reported success
 * (byte count right, CRC32C right when sent, same first token); a failure
 * report, a failed or disconnected sender peer, or the deadline ends it with
 * an error naming the sender ranks.  Every success notification is
 * acknowledged with this rank's verdict.  A packed expectation
 * (DUET_XFER_EXPECT_PACKED) takes only packed slices and checks them in
 * the staging pages (transfer/xfer_pack.h); an unpacked one only per-page
 * slices.
 *
 * Notifications for ids not (yet) expected wait in a bounded ring for
 * early_ttl_ms: decode registers right before asking prefill, so a
 * notification can only beat its expectation when the daemon registers late;
 * the ring makes that harmless.  Ids that ended here (completed, failed,
 * cancelled) are remembered in a bounded tombstone table so that their late
 * notifications are dropped and counted at once.
 *
 * Progress messages (packed senders asked for them) raise the layers
 * landed per sender; when the least of them over senders(d) grows, the
 * expectation's progress callback hears of it.  They are never
 * acknowledged nor buffered: one that beats its expectation or comes after
 * it ended is dropped (the final notification says it all). */
#include "transfer/xfer_internal.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "transfer/xfer_pack.h"
#include "transfer/xfer_segs.h"

struct duet__expect {
    duet__outcome_t o; /* first: outcome pointers are expectation pointers */
    int P;
    uint64_t senders, reported;
    duet_xfer_peer_t **peers; /* [P] */
    duet_slice_run_t *runs;   /* this rank's runs grouped by sender, dst_head order within */
    int *run_off, *run_cnt;   /* [P] */
    int32_t *pages;
    int n_pages;
    int packed; /* DUET_XFER_EXPECT_PACKED: the senders put into staging at stage0 */
    int starts;  /* DUET_XFER_EXPECT_STARTS: the senders announce their start */
    int started; /* ... and they did (duet_xfer_recv_started) */
    int32_t stage0;
    int token_from;                   /* sender whose first token was taken, -1: none yet */
    duet_xfer_progress_cb_t progress; /* packed: told of landed layers */
    void *progress_arg;
    int *landed; /* [P] layers each sender's progress messages announced */
    int told;    /* layers passed to progress */
};

void duet__recv_free(duet__expect_t *e)
{
    if (e == NULL)
        return;
    duet_free(e->peers);
    duet_free(e->runs);
    duet_free(e->run_off);
    duet_free(e->run_cnt);
    duet_free(e->pages);
    duet_free(e->landed);
    duet_free(e);
}

/* ---- acknowledgements ------------------------------------------------------------------ */

static void duet__recv_ack_sent(void *arg, duet_status_t st, const char *why)
{
    (void)st;
    (void)why;
    duet_free(arg); /* the message */
}

static void duet__recv_send_ack(duet_xfer_rank_t *r, const duet__msg_t *m, duet_status_t st)
{
    duet_xfer_peer_t *p = duet__peer_find(r, m->from_instance, m->src_rank);
    const char *why = NULL;
    duet_xfer_op_t op;
    uint8_t *buf;
    duet__msg_t a;

    if (p == NULL || p->failed != DUET_OK || !p->ready)
        return;                         /* the sender's deadline covers a lost acknowledgement */
    buf = duet_malloc(DUET__MSG_BYTES); /* lives until the send completed */
    if (buf == NULL)
        return;
    memset(&a, 0, sizeof(a));
    a.kind = DUET__MSG_ACK;
    a.transfer_id = m->transfer_id;
    a.from_instance = r->info.instance;
    a.to_instance = m->from_instance;
    a.src_rank = m->src_rank;
    a.dst_rank = r->index;
    a.status = st;
    a.bytes = m->bytes;
    a.first_token = DUET_XFER_NO_TOKEN;
    duet__msg_encode(&a, buf);
    op = r->ops->msg_send(p->ctl_ep, buf, DUET__MSG_BYTES, duet__recv_ack_sent, buf, &why);
    if (op != DUET_XFER_OP_PENDING) {
        duet_free(buf);
        if (op == DUET_XFER_OP_FAILED)
            return;
    }
    DUET__STAT_ADD(r, ack_sent, 1);
}

/* ---- tombstones -------------------------------------------------------------------- */

static void duet__recv_tomb_add(duet_xfer_rank_t *r, uint64_t id, duet_status_t st)
{
    size_t slot = r->tomb_pos % DUET__TOMB_CAP;
    if (r->tomb_pos >= DUET__TOMB_CAP)
        duet__map_del(&r->tombs, r->tomb_ring[slot]);
    duet__map_del(&r->tombs, id);
    if (duet__map_put(&r->tombs, id, (void *)(uintptr_t)(1 - (intptr_t)st)) != DUET_OK)
        return; /* out of memory: late notifications go through the early ring */
    r->tomb_ring[slot] = id;
    r->tomb_pos++;
}

static int duet__recv_tomb_get(const duet_xfer_rank_t *r, uint64_t id, duet_status_t *st_p)
{
    void *v = duet__map_get(&r->tombs, id);
    if (v == NULL)
        return 0;
    *st_p = (duet_status_t)(1 - (intptr_t)(uintptr_t)v);
    return 1;
}

/* ---- outcomes --------------------------------------------------------------------------- */

static void duet__recv_end(duet_xfer_rank_t *r, duet__expect_t *e)
{
    e->o.terminal = 1;
    e->o.res.missing_mask = e->senders & ~e->reported;
    if (e->o.res.status == DUET_OK)
        DUET__STAT_ADD(r, recv_done, 1);
    else
        DUET__STAT_ADD(r, recv_failed, 1);
    duet__due(r, &e->o);
}

static void duet__recv_fail(duet_xfer_rank_t *r, duet__expect_t *e, duet_status_t st,
                            const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static void duet__recv_fail(duet_xfer_rank_t *r, duet__expect_t *e, duet_status_t st,
                            const char *fmt, ...)
{
    char detail[DUET_XFER_DETAIL_MAX];
    va_list ap;
    if (e->o.terminal)
        return;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof(detail), fmt, ap);
    va_end(ap);
    duet__outcome_fail(&e->o, st, "%s", detail);
    duet__recv_end(r, e);
}

/* "0,2" from a mask of sender ranks. */
static void duet__recv_rank_list(uint64_t mask, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int s = 0; s < 64 && n + 4 < cap; s++)
        if (mask >> s & 1u)
            n += (size_t)snprintf(buf + n, cap - n, n ? ",%d" : "%d", s);
}

/* ---- notifications ----------------------------------------------------------------------- */

static void duet__recv_progress(duet_xfer_rank_t *r, duet__expect_t *e);

static void duet__recv_apply(duet_xfer_rank_t *r, duet__expect_t *e, const duet__msg_t *m)
{
    const duet_kv_layout_t *l = &r->info.layout;
    int s = m->src_rank;
    uint64_t bit = (uint64_t)1 << s, want;
    duet_xfer_peer_t *p;

    if (s >= e->P || !(e->senders & bit)) {
        DUET__STAT_ADD(r, dropped_invalid, 1);
        duet__recv_send_ack(r, m, DUET_ERR_INVALID);
        return;
    }
    p = e->peers[s];
    if (p == NULL || p->info.instance != m->from_instance) {
        /* A stale incarnation of the sender, or one we are not connected to. */
        DUET__STAT_ADD(r, dropped_invalid, 1);
        duet__recv_send_ack(r, m, DUET_ERR_INVALID);
        return;
    }
    if (e->reported & bit) {
        DUET__STAT_ADD(r, dropped_duplicate, 1);
        return;
    }
    if (e->o.terminal) {
        DUET__STAT_ADD(r, dropped_late, 1);
        if (m->status == DUET_OK)
            duet__recv_send_ack(r, m,
                                e->o.res.status != DUET_OK ? e->o.res.status : DUET_ERR_INVALID);
        return;
    }
    if (m->status != DUET_OK) {
        duet__recv_fail(r, e, m->status, "request %" PRIu64 ": prefill rank %d %s (decode rank %d)",
                        e->o.transfer_id, s,
                        m->status == DUET_ERR_CANCELLED ? "cancelled it"
                                                        : duet_status_str(m->status),
                        r->index);
        return;
    }
    if (m->packed != e->packed) {
        duet__recv_fail(r, e, DUET_ERR_MISMATCH,
                        "request %" PRIu64 ": prefill rank %d sent a %s slice; decode rank %d "
                        "expected a %s one",
                        e->o.transfer_id, s, m->packed ? "packed" : "per-page", r->index,
                        e->packed ? "packed" : "per-page");
        duet__recv_send_ack(r, m, DUET_ERR_MISMATCH);
        return;
    }
    want = duet__seg_bytes(l, e->runs + e->run_off[s], e->run_cnt[s], e->n_pages);
    if (m->bytes != want) {
        duet__recv_fail(r, e, DUET_ERR_MISMATCH,
                        "request %" PRIu64 ": prefill rank %d sent %" PRIu64
                        " bytes to decode rank %d, expected %" PRIu64,
                        e->o.transfer_id, s, m->bytes, r->index, want);
        duet__recv_send_ack(r, m, DUET_ERR_MISMATCH);
        return;
    }
    if (m->has_crc) {
        const duet_slice_run_t *runs = e->runs + e->run_off[s];
        uint32_t crc = 0;
        if (r->crc_fn != NULL) { /* the pool's owner reads it (xfer_checksum.c) */
            duet_status_t st = duet__crc_hook(r, runs, e->run_cnt[s], e->packed ? NULL : e->pages,
                                              e->n_pages, e->stage0, 1, 0, &crc);
            if (st != DUET_OK) {
                duet__recv_fail(r, e, st, "request %" PRIu64 ": prefill rank %d's slice: %s",
                                e->o.transfer_id, s, duet_error_msg());
                duet__recv_send_ack(r, m, st);
                return;
            }
        } else if (e->packed) {
            crc = duet_xfer_pack_crc(l, r->base, runs, e->run_cnt[s], e->n_pages, e->stage0, 1, 0);
        } else {
            crc = duet__seg_crc(l, r->base, runs, e->run_cnt[s], e->pages, e->n_pages, 1);
        }
        if (crc != m->crc) {
            DUET__STAT_ADD(r, crc_failures, 1);
            duet__recv_fail(r, e, DUET_ERR_MISMATCH,
                            "request %" PRIu64 ": checksum mismatch on the slice from prefill rank "
                            "%d (decode rank %d computed %08x, sender %08x)",
                            e->o.transfer_id, s, r->index, crc, m->crc);
            duet__recv_send_ack(r, m, DUET_ERR_MISMATCH);
            return;
        }
    }
    if (m->first_token != DUET_XFER_NO_TOKEN) {
        if (e->token_from < 0) {
            e->token_from = s;
            e->o.res.first_token = m->first_token;
        } else if (e->o.res.first_token != m->first_token) {
            duet__recv_fail(r, e, DUET_ERR_MISMATCH,
                            "request %" PRIu64 ": first token differs between prefill ranks %d "
                            "(%" PRId64 ") and %d (%" PRId64 ")",
                            e->o.transfer_id, e->token_from, e->o.res.first_token, s,
                            m->first_token);
            duet__recv_send_ack(r, m, DUET_ERR_MISMATCH);
            return;
        }
    }
    e->reported |= bit;
    e->o.res.bytes += m->bytes;
    duet__recv_send_ack(r, m, DUET_OK);
    if (e->reported == e->senders)
        duet__recv_end(r, e);
    else
        duet__recv_progress(r, e); /* all of this sender's layers landed */
}

void duet__recv_on_notify(duet_xfer_rank_t *r, const duet__msg_t *m)
{
    duet__expect_t *e;
    duet_status_t st;

    DUET__STAT_ADD(r, notify_received, 1);
    if (m->dst_rank != r->index || m->to_instance != r->info.instance) {
        DUET__STAT_ADD(r, dropped_invalid, 1);
        return;
    }
    e = duet__map_get(&r->expects, m->transfer_id);
    DUET_LOG_TRACE("xfer d%d: request %" PRIu64 ": notification from prefill rank %d at %lld",
                   r->index, m->transfer_id, m->src_rank, (long long)(duet_now_ns() / 1000));
    if (e != NULL) {
        duet__recv_apply(r, e, m);
        return;
    }
    if (duet__recv_tomb_get(r, m->transfer_id, &st)) {
        DUET__STAT_ADD(r, dropped_late, 1);
        /* a transfer that failed or was cancelled here keeps its pages
         * until prefill has answered (decode/req.c): bytes for it land in
         * pages nobody else has.  One that completed gave its pages on. */
        if (m->status == DUET_OK && st == DUET_OK)
            DUET__STAT_ADD(r, unsolicited, 1);
        if (m->status == DUET_OK)
            duet__recv_send_ack(r, m, st == DUET_OK ? DUET_ERR_INVALID : st);
        return;
    }
    if (r->n_early < r->x->cfg.early_max) {
        duet__early_t *slot = &r->early[(r->early_head + r->n_early) % r->x->cfg.early_max];
        int64_t now = duet_now_ns();
        slot->msg = *m;
        slot->arrived_ns = now;
        r->n_early++;
        DUET__STAT_ADD(r, early_buffered, 1);
        duet__deadline_hint(r, now + (int64_t)r->x->cfg.early_ttl_ms * DUET_NS_PER_MS);
        return;
    }
    DUET__STAT_ADD(r, dropped_unknown, 1);
    if (m->status == DUET_OK) {
        DUET__STAT_ADD(r, unsolicited, 1);
        duet__recv_send_ack(r, m, DUET_ERR_NOT_FOUND);
    }
}

/* Tell e's progress callback when the layers landed from every sender (a
 * sender that reported: all of them) grew. */
static void duet__recv_progress(duet_xfer_rank_t *r, duet__expect_t *e)
{
    int least = r->info.layout.n_layers;
    if (e->progress == NULL || e->o.terminal)
        return;
    for (int k = 0; k < e->P; k++) {
        uint64_t bit = (uint64_t)1 << k;
        if ((e->senders & bit) && !(e->reported & bit) && e->landed[k] < least)
            least = e->landed[k];
    }
    if (least <= e->told || least >= r->info.layout.n_layers)
        return;
    e->told = least;
    DUET__STAT_ADD(r, progress_received, 1);
    e->progress(e->progress_arg, e->o.transfer_id, least);
}

void duet__recv_on_progress(duet_xfer_rank_t *r, const duet__msg_t *m)
{
    duet__expect_t *e = duet__map_get(&r->expects, m->transfer_id);
    int s = m->src_rank;
    duet_xfer_peer_t *p;

    if (m->dst_rank != r->index || m->to_instance != r->info.instance) {
        DUET__STAT_ADD(r, dropped_invalid, 1);
        return;
    }
    if (e == NULL)
        return; /* not expected yet, or over: the notification decides */
    if (s >= e->P || !(e->senders & ((uint64_t)1 << s)) || (p = e->peers[s]) == NULL ||
        p->info.instance != m->from_instance || !e->packed ||
        m->bytes >= (uint64_t)r->info.layout.n_layers) {
        DUET__STAT_ADD(r, dropped_invalid, 1);
        return;
    }
    if ((int)m->bytes > e->landed[s])
        e->landed[s] = (int)m->bytes;
    duet__recv_progress(r, e);
}

/* Apply buffered notifications of e's id, in arrival order. */
static void duet__recv_apply_early(duet_xfer_rank_t *r, duet__expect_t *e)
{
    int max = r->x->cfg.early_max, j = 0;
    for (int i = 0; i < r->n_early; i++) {
        duet__early_t ent = r->early[(r->early_head + i) % max];
        if (ent.msg.transfer_id == e->o.transfer_id)
            duet__recv_apply(r, e, &ent.msg);
        else
            r->early[(r->early_head + j++) % max] = ent;
    }
    r->n_early = j;
}

/* ---- commands ---------------------------------------------------------------------------- */

void duet__recv_exec_expect(duet_xfer_rank_t *r, duet__cmd_t *c)
{
    duet__expect_t *e = c->u.expect;
    const char *bad = NULL;
    duet_status_t st = DUET_OK;
    int bad_s = -1;

    if (duet__map_get(&r->expects, e->o.transfer_id) != NULL) {
        duet__cmd_done(r, c, DUET_ERR_INVALID,
                       "request %" PRIu64 " is already expected on "
                       "decode rank %d",
                       e->o.transfer_id, r->index);
        duet__recv_free(e);
        return;
    }
    for (int s = 0; s < e->P && bad == NULL; s++) {
        duet_xfer_peer_t *p = e->peers[s];
        if (!(e->senders >> s & 1u))
            continue;
        bad_s = s;
        if (p == NULL || !duet__peer_known(r, p) || p->closing || !p->ready ||
            p->info.role != DUET_XFER_PREFILL || p->info.rank != s || p->info.tp != e->P) {
            st = DUET_ERR_INVALID;
            bad = "is not connected";
        } else if (p->failed != DUET_OK) {
            st = DUET_ERR_PEER;
            bad = p->why;
        }
    }
    if (bad != NULL) {
        duet__cmd_done(r, c, st, "request %" PRIu64 ": prefill rank %d %s (decode rank %d)",
                       e->o.transfer_id, bad_s, bad, r->index);
        duet__recv_free(e);
        return;
    }
    if (duet__map_put(&r->expects, e->o.transfer_id, e) != DUET_OK) {
        duet__cmd_done(r, c, DUET_ERR_NO_MEMORY, "request %" PRIu64 ": expectation table",
                       e->o.transfer_id);
        duet__recv_free(e);
        return;
    }
    duet__map_del(&r->tombs, e->o.transfer_id); /* an id may come back after it ended */
    DUET__STAT_ADD(r, active_recv, 1);
    duet__deadline_hint(r, e->o.deadline_ns);
    duet__recv_apply_early(r, e);
    duet__cmd_done(r, c, DUET_OK, NULL);
}

duet_status_t duet__recv_cancel(duet_xfer_rank_t *r, uint64_t id, char *msg, size_t cap)
{
    duet__expect_t *e = duet__map_get(&r->expects, id);
    if (e == NULL) {
        snprintf(msg, cap, "request %" PRIu64 " is not expected on decode rank %d", id, r->index);
        return DUET_ERR_NOT_FOUND;
    }
    duet__map_del(&r->expects, id);
    DUET__STAT_SUB(r, active_recv, 1);
    duet__recv_tomb_add(r, id, DUET_ERR_CANCELLED);
    duet__undue(r, &e->o);
    if (e->o.waiter != NULL) {
        duet__cmd_t *w = e->o.waiter;
        memset(w->u.wait.res, 0, sizeof(*w->u.wait.res));
        w->u.wait.res->status = DUET_ERR_CANCELLED;
        snprintf(w->u.wait.res->detail, sizeof(w->u.wait.res->detail),
                 "request %" PRIu64 " cancelled", id);
        e->o.waiter = NULL;
        duet__cmd_done(r, w, DUET_OK, NULL);
    }
    if (e->o.in_callback)
        e->o.cancelled = 1; /* freed when the callback returns */
    else
        duet__recv_free(e);
    return DUET_OK;
}

/* ---- events ------------------------------------------------------------------------------- */

void duet__recv_peer_gone(duet_xfer_rank_t *r, duet_xfer_peer_t *p, int disconnect)
{
    void *v;
    for (size_t it = 0; duet__map_next(&r->expects, &it, &v);) {
        duet__expect_t *e = v;
        for (int s = 0; s < e->P; s++) {
            if (e->peers[s] != p)
                continue;
            if (!(e->reported >> s & 1u))
                duet__recv_fail(r, e, DUET_ERR_PEER,
                                "request %" PRIu64 ": prefill rank %d %s%s "
                                "(decode rank %d)",
                                e->o.transfer_id, s,
                                p->failed != DUET_OK ? "failed: " : "disconnected",
                                p->failed != DUET_OK ? p->why : "", r->index);
            if (disconnect)
                e->peers[s] = NULL;
        }
    }
}

void duet__recv_scan(duet_xfer_rank_t *r, int64_t now, int64_t *next_p)
{
    int max = r->x->cfg.early_max;
    int64_t ttl = (int64_t)r->x->cfg.early_ttl_ms * DUET_NS_PER_MS;
    void *v;
    for (size_t it = 0; duet__map_next(&r->expects, &it, &v);) {
        duet__expect_t *e = v;
        char missing[160];
        if (e->o.terminal)
            continue;
        if (now <= e->o.deadline_ns) {
            if (e->o.deadline_ns < *next_p)
                *next_p = e->o.deadline_ns;
            continue;
        }
        DUET__STAT_ADD(r, timeouts, 1);
        duet__recv_rank_list(e->senders & ~e->reported, missing, sizeof(missing));
        /* the senders that did not report may still be putting into this
         * request's pages: cut them off before the pages are given back --
         * unless they never started (the request waited in prefill's
         * queue): then nothing is on the way and the link stays up for
         * the other requests on it */
        for (int s = 0; s < e->P; s++)
            if (!(e->reported >> s & 1u) && e->peers[s] != NULL && (!e->starts || e->started))
                duet__peer_reset(r, e->peers[s], "a transfer from it timed out here");
        duet__recv_fail(r, e, DUET_ERR_TIMEOUT,
                        "request %" PRIu64
                        ": deadline exceeded on decode rank %d waiting for prefill "
                        "ranks %s",
                        e->o.transfer_id, r->index, missing);
    }
    while (r->n_early > 0) {
        duet__early_t *ent = &r->early[r->early_head];
        if (ent->arrived_ns + ttl > now) {
            if (ent->arrived_ns + ttl < *next_p)
                *next_p = ent->arrived_ns + ttl;
            break;
        }
        DUET__STAT_ADD(r, dropped_unknown, 1);
        if (ent->msg.status == DUET_OK) {
            DUET__STAT_ADD(r, unsolicited, 1);
            duet__recv_send_ack(r, &ent->msg, DUET_ERR_NOT_FOUND);
        }
        r->early_head = (r->early_head + 1) % max;
        r->n_early--;
    }
}

void duet__recv_fail_all(duet_xfer_rank_t *r, duet_status_t st, const char *why)
{
    void *v;
    for (size_t it = 0; duet__map_next(&r->expects, &it, &v);) {
        duet__expect_t *e = v;
        duet__recv_fail(r, e, st, "request %" PRIu64 ": %s", e->o.transfer_id, why);
    }
}

typedef struct {
    duet_xfer_rank_t *r;
    uint64_t id;
    int64_t deadline_ns;
} duet__started_t;

/* (rank thread) */
static duet_status_t duet__recv_started_run(void *arg)
{
    duet__started_t *a = arg;
    duet__expect_t *e = duet__map_get(&a->r->expects, a->id);
    if (e == NULL)
        return duet_error(DUET_ERR_NOT_FOUND, "xfer: request %" PRIu64 " is not expected here",
                          a->id);
    if (e->o.terminal)
        return DUET_OK;
    e->started = 1;
    e->o.deadline_ns = a->deadline_ns;
    duet__deadline_hint(a->r, a->deadline_ns);
    return DUET_OK;
}

duet_status_t duet_xfer_recv_started(duet_xfer_rank_t *r, uint64_t transfer_id,
                                     int64_t deadline_ns)
{
    duet__started_t a = {r, transfer_id, deadline_ns};
    return duet_xfer_rank_run(r, duet__recv_started_run, &a);
}

duet__outcome_t *duet__recv_outcome(duet_xfer_rank_t *r, uint64_t id)
{
    duet__expect_t *e = duet__map_get(&r->expects, id);
    return e != NULL ? &e->o : NULL;
}

void duet__recv_release(duet_xfer_rank_t *r, duet__outcome_t *o)
{
    duet__expect_t *e = (duet__expect_t *)o;
    duet__undue(r, o);
    if (!e->o.cancelled && duet__map_get(&r->expects, o->transfer_id) == e) {
        duet__map_del(&r->expects, o->transfer_id);
        DUET__STAT_SUB(r, active_recv, 1);
        duet__recv_tomb_add(r, o->transfer_id, o->res.status);
    }
    duet__recv_free(e);
}

void duet__recv_cleanup(duet_xfer_rank_t *r)
{
    void *v;
    for (size_t it = 0; duet__map_next(&r->expects, &it, &v);)
        duet__recv_free(v);
    duet__map_cleanup(&r->expects);
    duet__map_cleanup(&r->tombs);
    duet_free(r->tomb_ring);
    duet_free(r->early);
}

/* ---- plan -> state (on the caller's thread) ---------------------------------------- */

duet_status_t duet__recv_prepare(duet_xfer_rank_t *r, const duet_xfer_expect_t *in,
                                 duet__expect_t **e_p)
{
    const duet_slice_run_t *runs;
    int n_runs, P, at = 0;
    duet__expect_t *e;

    if (in == NULL || in->plan == NULL || in->peers == NULL || in->pages == NULL || in->n_pages < 1)
        return duet_error(DUET_ERR_INVALID, "xfer expect: missing plan, peers or pages");
    if (r->info.role != DUET_XFER_DECODE || r->pool_kind == DUET__POOL_NONE)
        return duet_error(DUET_ERR_INVALID,
                          "xfer rank %d: expecting needs a decode rank with a "
                          "pool",
                          r->index);
    if (duet_slice_plan_decode_tp(in->plan) != r->info.tp ||
        duet_slice_plan_kv_heads(in->plan) != r->info.kv_heads)
        return duet_error(DUET_ERR_INVALID,
                          "xfer expect: plan for decode tp %d, %d kv heads; this daemon has tp "
                          "%d, %d kv heads",
                          duet_slice_plan_decode_tp(in->plan), duet_slice_plan_kv_heads(in->plan),
                          r->info.tp, r->info.kv_heads);
    for (int i = 0; i < in->n_pages; i++)
        if (in->pages[i] < 0 || in->pages[i] >= r->info.layout.n_pages)
            return duet_error(DUET_ERR_INVALID,
                              "xfer expect: request %" PRIu64 ": page %d outside the %d pages of "
                              "decode rank %d",
                              in->transfer_id, (int)in->pages[i], r->info.layout.n_pages, r->index);
    if (in->flags & ~(unsigned)(DUET_XFER_EXPECT_PACKED | DUET_XFER_EXPECT_STARTS))
        return duet_error(DUET_ERR_INVALID, "xfer expect: request %" PRIu64 ": unknown flags 0x%x",
                          in->transfer_id, in->flags);
    if (in->flags & DUET_XFER_EXPECT_PACKED) {
        char why[96];
        if (duet_xfer_pack_check_stage(&r->info.layout, r->info.pool_bytes, in->dst_stage0,
                                       in->n_pages, why, sizeof(why)) != 0)
            return duet_error(DUET_ERR_INVALID,
                              "xfer expect: request %" PRIu64 ": decode rank %d: %s",
                              in->transfer_id, r->index, why);
    }
    P = duet_slice_plan_prefill_tp(in->plan);
    n_runs = duet_slice_plan_dst_runs(in->plan, r->index, &runs);

    e = DUET_NEW(duet__expect_t);
    if (e == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "xfer expect");
    e->peers = DUET_NEW_ARRAY(duet_xfer_peer_t *, (size_t)P);
    e->runs = DUET_NEW_ARRAY(duet_slice_run_t, (size_t)(n_runs > 0 ? n_runs : 1));
    e->run_off = DUET_NEW_ARRAY(int, (size_t)P);
    e->run_cnt = DUET_NEW_ARRAY(int, (size_t)P);
    e->pages = DUET_NEW_ARRAY(int32_t, (size_t)in->n_pages);
    e->landed = DUET_NEW_ARRAY(int, (size_t)P);
    if (e->peers == NULL || e->runs == NULL || e->run_off == NULL || e->run_cnt == NULL ||
        e->pages == NULL || e->landed == NULL) {
        duet__recv_free(e);
        return duet_error(DUET_ERR_NO_MEMORY, "xfer expect");
    }
    memcpy(e->peers, in->peers, (size_t)P * sizeof(*e->peers));
    memcpy(e->pages, in->pages, (size_t)in->n_pages * sizeof(int32_t));
    e->n_pages = in->n_pages;
    e->packed = (in->flags & DUET_XFER_EXPECT_PACKED) != 0;
    e->starts = (in->flags & DUET_XFER_EXPECT_STARTS) != 0;
    e->stage0 = in->dst_stage0;
    e->P = P;
    e->senders = duet_slice_plan_sender_mask(in->plan, r->index);
    for (int s = 0; s < P; s++) {
        e->run_off[s] = at;
        for (int k = 0; k < n_runs; k++)
            if (runs[k].src_rank == s)
                e->runs[at++] = runs[k];
        e->run_cnt[s] = at - e->run_off[s];
    }
    e->token_from = -1;
    e->progress = e->packed ? in->progress : NULL;
    e->progress_arg = in->progress_arg;
    e->o.transfer_id = in->transfer_id;
    e->o.side = DUET__SIDE_RECV;
    e->o.cb = in->cb;
    e->o.arg = in->arg;
    e->o.deadline_ns = in->deadline_ns;
    e->o.res.first_token = DUET_XFER_NO_TOKEN;
    *e_p = e;
    return DUET_OK;
}
