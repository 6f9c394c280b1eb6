/* Prefill side: sending a request's slices.
 *
 * A send state holds one "dst" per decode rank this rank writes to.  Puts are
 * issued by a cursor over (layer, K|V, page, dst, run) -- the order of
 * transfer/xfer_segs.h -- in bounded batches from the progress loop, up to
 * the layers released by duet_xfer_send_layers.  A packed send has no page
 * dimension: the cursor runs over (chunk, dst, run), a chunk being the
 * layers released and not yet posted when it starts, and each put moves a
 * run's staged block over the chunk's planes (transfer/xfer_pack.h): one
 * put per run and layer while posting keeps up with the releases, fewer
 * when it lags.  Per dst, once every layer
 * is posted and the send was ended: flush the data endpoint, then send the
 * notification on the control endpoint, then wait for the decode rank's
 * acknowledgement.  Puts, flushes and notifications go through the
 * transport's ops (transfer/transport.h).
 *
 *   POSTING -> FLUSHING -> NOTIFYING -> ACK_WAIT -> DONE
 *
 * A packed send with progress_layers also tells a receiver, while POSTING,
 * how far it got: once a chunk's puts to it are posted, a flush of its data
 * endpoint and then a progress message on the control endpoint (outside
 * the state machine: a failure there only loses the message; the final
 * flush and notification report the pair's fate).
 *
 * Any state can jump to DONE with an error (peer failure, deadline).  The
 * state is freed when its outcome was delivered (or it was cancelled) and no
 * transport operation points at it any more.
 *
 * The files, each calling only the ones after it: xfer_send_post.c (the
 * put loop), this one (the state's course: commands, events, preparation),
 * xfer_send_notify.c (a pair's flush, checksum and notification; progress
 * messages), xfer_send_state.c (bookkeeping); the state is in
 * xfer_send_state.h. */
#include "transfer/xfer_send_state.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "kv/heads.h"
#include "transfer/xfer_crc32c.h"
#include "transfer/xfer_pack.h"
#include "transfer/xfer_segs.h"

/* Move on once posting is over: flush and notify every dst still posting. */
void duet__send_advance(duet_xfer_rank_t *r, duet__send_t *s)
{
    int posted_all = s->stop_posting || s->c_layer >= s->n_layers;
    if (!s->stop_posting && s->c_layer < s->limit)
        duet__send_posting_add(r, s);
    if (posted_all && (s->ended || s->failing)) {
        duet__send_posting_remove(r, s);
        for (int k = 0; k < s->n_dst; k++)
            if (s->dst[k].state == DUET__DST_POSTING)
                duet__send_flush(r, &s->dst[k]);
    }
    duet__send_check_done(r, s);
}

/* Stop posting and tell the receivers why (after flushing what was posted). */
static void duet__send_fail(duet_xfer_rank_t *r, duet__send_t *s, duet_status_t st, const char *fmt,
                            ...) __attribute__((format(printf, 4, 5)));

static void duet__send_fail(duet_xfer_rank_t *r, duet__send_t *s, duet_status_t st, const char *fmt,
                            ...)
{
    char detail[DUET_XFER_DETAIL_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof(detail), fmt, ap);
    va_end(ap);
    duet__outcome_fail(&s->o, st, "%s", detail);
    s->stop_posting = 1;
    s->failing = 1;
    duet__send_advance(r, s);
}

/* ---- commands ----------------------------------------------------------------------- */

static duet_status_t duet__send_begin_check(duet_xfer_rank_t *r, duet__send_t *s, char *msg,
                                            size_t cap)
{
    if ((s->flags & DUET_XFER_SEND_CRC) && r->info.pool_device && !s->crc_hook) {
        snprintf(msg, cap,
                 "request %" PRIu64 ": checksums of prefill rank %d's device pool need a checksum "
                 "hook (duet_xfer_rank_set_checksum)",
                 s->o.transfer_id, r->index);
        return DUET_ERR_UNSUPPORTED;
    }
    if (duet__map_get(&r->sends, s->o.transfer_id) != NULL) {
        snprintf(msg, cap, "request %" PRIu64 " is already being sent from prefill rank %d",
                 s->o.transfer_id, r->index);
        return DUET_ERR_INVALID;
    }
    for (int k = 0; k < s->n_dst; k++) {
        duet__send_dst_t *dst = &s->dst[k];
        duet_xfer_peer_t *p = dst->peer;
        if (p == NULL || !duet__peer_known(r, p) || p->closing || !p->ready ||
            p->info.role != DUET_XFER_DECODE || p->info.rank != dst->d) {
            snprintf(msg, cap,
                     "request %" PRIu64 ": decode rank %d is not connected to prefill "
                     "rank %d",
                     s->o.transfer_id, dst->d, r->index);
            return DUET_ERR_INVALID;
        }
        if (p->failed != DUET_OK) {
            snprintf(msg, cap, "request %" PRIu64 ": decode rank %d failed: %s", s->o.transfer_id,
                     dst->d, p->why);
            return DUET_ERR_PEER;
        }
        for (int i = 0; i < s->n_pages; i++) {
            int32_t pg = s->pages[s->n_pages + i];
            if (pg < 0 || pg >= p->info.layout.n_pages) {
                snprintf(msg, cap,
                         "request %" PRIu64 ": destination page %d outside decode rank "
                         "%d's %d pages",
                         s->o.transfer_id, (int)pg, dst->d, p->info.layout.n_pages);
                return DUET_ERR_INVALID;
            }
        }
        if (s->flags & DUET_XFER_SEND_PACKED) {
            char why[96];
            if (duet_xfer_pack_check_stage(&p->info.layout, p->info.pool_bytes, s->dst_stage0,
                                           s->n_pages, why, sizeof(why)) != 0) {
                snprintf(msg, cap, "request %" PRIu64 ": decode rank %d: destination %s",
                         s->o.transfer_id, dst->d, why);
                return DUET_ERR_INVALID;
            }
        }
    }
    return DUET_OK;
}

void duet__send_exec_begin(duet_xfer_rank_t *r, duet__cmd_t *c)
{
    duet__send_t *s = c->u.send;
    char msg[DUET_XFER_DETAIL_MAX];
    duet_status_t st = duet__send_begin_check(r, s, msg, sizeof(msg));
    if (st == DUET_OK && duet__map_put(&r->sends, s->o.transfer_id, s) != DUET_OK) {
        st = DUET_ERR_NO_MEMORY;
        snprintf(msg, sizeof(msg), "request table");
    }
    if (st != DUET_OK) {
        duet__send_free(s);
        duet__cmd_done(r, c, st, "%s", msg);
        return;
    }
    s->in_table = 1;
    s->next = r->send_list;
    if (s->next != NULL)
        s->next->prev = s;
    r->send_list = s;
    DUET__STAT_ADD(r, active_send, 1);
    duet__deadline_hint(r, s->o.deadline_ns);
    duet__send_check_done(r, s); /* nothing to send from this rank: done already */
    duet__cmd_done(r, c, DUET_OK, NULL);
}

void duet__send_exec_layers(duet_xfer_rank_t *r, duet__cmd_t *c)
{
    duet__send_t *s = duet__map_get(&r->sends, c->u.layers.transfer_id);
    int l0 = c->u.layers.l0, l1 = c->u.layers.l1;
    if (s == NULL || s->o.terminal || s->failing || s->ended) {
        duet__cmd_done(r, c, DUET_ERR_NOT_FOUND, "request %" PRIu64 " not sending",
                       c->u.layers.transfer_id);
        return;
    }
    if (l0 != s->limit)
        duet__send_fail(r, s, DUET_ERR_INVALID,
                        "request %" PRIu64
                        ": layers [%d, %d) posted out of order on prefill rank %d "
                        "(next layer is %d)",
                        s->o.transfer_id, l0, l1, r->index, s->limit);
    else {
        DUET_LOG_TRACE("xfer p%d: request %" PRIu64 ": layers [%d, %d) released, taken at %lld",
                       r->index, s->o.transfer_id, l0, l1, (long long)(duet_now_ns() / 1000));
        s->limit = l1;
        duet__send_advance(r, s);
    }
    duet__cmd_done(r, c, DUET_OK, NULL);
}

void duet__send_exec_end(duet_xfer_rank_t *r, duet__cmd_t *c)
{
    duet__send_t *s = duet__map_get(&r->sends, c->u.end.transfer_id);
    if (s == NULL || s->ended || s->o.terminal) {
        duet__cmd_done(r, c, DUET_ERR_NOT_FOUND, "request %" PRIu64 " not sending",
                       c->u.end.transfer_id);
        return;
    }
    s->ended = 1;
    s->first_token = c->u.end.first_token;
    if (c->u.end.status != DUET_OK)
        duet__send_fail(r, s, c->u.end.status, "request %" PRIu64 ": prefill rank %d ended it: %s",
                        s->o.transfer_id, r->index, duet_status_str(c->u.end.status));
    else if (s->limit != s->n_layers)
        duet__send_fail(r, s, DUET_ERR_INVALID,
                        "request %" PRIu64 ": ended on prefill rank %d after %d of %d layers",
                        s->o.transfer_id, r->index, s->limit, s->n_layers);
    else
        duet__send_advance(r, s);
    duet__send_maybe_free(r, s);
    duet__cmd_done(r, c, DUET_OK, NULL);
}

duet_status_t duet__send_cancel(duet_xfer_rank_t *r, uint64_t id, char *msg, size_t cap)
{
    duet__send_t *s = duet__map_get(&r->sends, id);
    if (s == NULL) {
        snprintf(msg, cap, "request %" PRIu64 " is not being sent from prefill rank %d", id,
                 r->index);
        return DUET_ERR_NOT_FOUND;
    }
    duet__map_del(&r->sends, id);
    s->in_table = 0;
    s->detached = 1;
    DUET__STAT_SUB(r, active_send, 1);
    duet__undue(r, &s->o);
    if (s->o.waiter != NULL) {
        duet__cmd_t *w = s->o.waiter;
        s->o.waiter = NULL;
        memset(w->u.wait.res, 0, sizeof(*w->u.wait.res));
        w->u.wait.res->status = DUET_ERR_CANCELLED;
        snprintf(w->u.wait.res->detail, sizeof(w->u.wait.res->detail),
                 "request %" PRIu64 " cancelled", id);
        duet__cmd_done(r, w, DUET_OK, NULL);
    }
    if (!s->o.terminal) {
        /* Receivers already notified need nothing more; the rest get told. */
        for (int k = 0; k < s->n_dst; k++)
            if (s->dst[k].state == DUET__DST_ACK_WAIT || s->dst[k].state == DUET__DST_NOTIFYING)
                s->dst[k].state = DUET__DST_DONE;
        duet__send_fail(r, s, DUET_ERR_CANCELLED,
                        "request %" PRIu64 " cancelled on prefill rank %d", id, r->index);
    }
    duet__send_maybe_free(r, s);
    return DUET_OK;
}

/* ---- events -------------------------------------------------------------------------- */

void duet__send_on_ack(duet_xfer_rank_t *r, const duet__msg_t *m)
{
    duet__send_t *s = duet__map_get(&r->sends, m->transfer_id);
    duet__send_dst_t *dst = NULL;
    if (s != NULL && m->src_rank == r->index && m->to_instance == r->info.instance) {
        for (int k = 0; k < s->n_dst; k++)
            if (s->dst[k].d == m->dst_rank && s->dst[k].peer != NULL &&
                s->dst[k].peer->info.instance == m->from_instance)
                dst = &s->dst[k];
    }
    if (dst == NULL || (dst->state != DUET__DST_ACK_WAIT && dst->state != DUET__DST_NOTIFYING)) {
        DUET__STAT_ADD(r, acks_dropped, 1);
        return;
    }
    DUET__STAT_ADD(r, ack_received, 1);
    if (m->status != DUET_OK)
        duet__send_dst_fail(r, dst, m->status,
                            "request %" PRIu64 ": decode rank %d refused the slice of "
                            "prefill rank %d: %s",
                            s->o.transfer_id, dst->d, r->index, duet_status_str(m->status));
    else
        dst->state = DUET__DST_DONE;
    duet__send_check_done(r, s);
}

void duet__send_peer_gone(duet_xfer_rank_t *r, duet_xfer_peer_t *p)
{
    for (duet__send_t *s = r->send_list, *next; s != NULL; s = next) {
        next = s->next;
        for (int k = 0; k < s->n_dst; k++) {
            duet__send_dst_t *dst = &s->dst[k];
            if (dst->peer != p)
                continue;
            duet__send_dst_fail(r, dst, DUET_ERR_PEER, "request %" PRIu64 ": decode rank %d %s%s",
                                s->o.transfer_id, dst->d,
                                p->failed != DUET_OK ? "failed: " : "disconnected",
                                p->failed != DUET_OK ? p->why : "");
            dst->peer = NULL;
        }
        duet__send_check_done(r, s);
        duet__send_maybe_free(r, s);
    }
}

static const char *duet__send_waiting_for(int state)
{
    switch (state) {
    case DUET__DST_POSTING:
        return "posting was not finished";
    case DUET__DST_FLUSHING:
        return "the flush did not complete";
    default:
        return "no acknowledgement arrived";
    }
}

void duet__send_scan(duet_xfer_rank_t *r, int64_t now, int64_t *next_p)
{
    for (duet__send_t *s = r->send_list, *next; s != NULL; s = next) {
        next = s->next;
        if (s->o.terminal)
            continue;
        if (now <= s->o.deadline_ns) {
            if (s->o.deadline_ns < *next_p)
                *next_p = s->o.deadline_ns;
            continue;
        }
        if (!s->timed_out) {
            DUET__STAT_ADD(r, timeouts, 1);
            s->timed_out = 1;
            s->stop_posting = 1;
            duet__send_posting_remove(r, s);
            for (int k = 0; k < s->n_dst; k++)
                duet__send_dst_fail(
                    r, &s->dst[k], DUET_ERR_TIMEOUT,
                    "request %" PRIu64 ": deadline exceeded on prefill rank %d sending to "
                    "decode rank %d: %s (%d of %d layers posted)",
                    s->o.transfer_id, r->index, s->dst[k].d,
                    duet__send_waiting_for(s->dst[k].state), s->c_layer, s->n_layers);
        }
        duet__send_check_done(r, s);
        /* still waiting for puts in flight: look again soon */
        if (!s->o.terminal && now + 10 * DUET_NS_PER_MS < *next_p)
            *next_p = now + 10 * DUET_NS_PER_MS;
        duet__send_maybe_free(r, s);
    }
}

void duet__send_fail_all(duet_xfer_rank_t *r, duet_status_t st, const char *why)
{
    for (duet__send_t *s = r->send_list, *next; s != NULL; s = next) {
        next = s->next;
        s->stop_posting = 1;
        duet__send_posting_remove(r, s);
        for (int k = 0; k < s->n_dst; k++)
            duet__send_dst_fail(r, &s->dst[k], st, "request %" PRIu64 ": %s", s->o.transfer_id,
                                why);
        duet__send_check_done(r, s);
        duet__send_maybe_free(r, s);
    }
}

duet__outcome_t *duet__send_outcome(duet_xfer_rank_t *r, uint64_t id)
{
    duet__send_t *s = duet__map_get(&r->sends, id);
    return s != NULL ? &s->o : NULL;
}

void duet__send_release(duet_xfer_rank_t *r, duet__outcome_t *o)
{
    duet__send_t *s = (duet__send_t *)o;
    duet__undue(r, o);
    if (s->in_table && duet__map_get(&r->sends, o->transfer_id) == s) {
        duet__map_del(&r->sends, o->transfer_id);
        s->in_table = 0;
        DUET__STAT_SUB(r, active_send, 1);
    }
    duet__send_maybe_free(r, s);
}

int duet__sends_idle(const duet_xfer_rank_t *r)
{
    for (const duet__send_t *s = r->send_list; s != NULL; s = s->next)
        if (s->inflight > 0)
            return 0;
    return 1;
}

/* ---- plan -> state (on the caller's thread) ---------------------------------------- */

duet_status_t duet__send_prepare(duet_xfer_rank_t *r, const duet_xfer_send_t *in,
                                 duet__send_t **s_p)
{
    const duet_slice_run_t *runs;
    int n_runs, recv[DUET_TP_MAX], n_recv, D, at = 0;
    duet__send_t *s;

    if (in == NULL || in->plan == NULL || in->peers == NULL || in->src_pages == NULL ||
        in->dst_pages == NULL || in->n_pages < 1)
        return duet_error(DUET_ERR_INVALID, "xfer send: missing plan, peers or pages");
    if (r->info.role != DUET_XFER_PREFILL || r->pool_kind == DUET__POOL_NONE)
        return duet_error(DUET_ERR_INVALID,
                          "xfer rank %d: sending needs a prefill rank with a "
                          "pool",
                          r->index);
    if (duet_slice_plan_prefill_tp(in->plan) != r->info.tp ||
        duet_slice_plan_kv_heads(in->plan) != r->info.kv_heads)
        return duet_error(DUET_ERR_INVALID,
                          "xfer send: plan for prefill tp %d, %d kv heads; this daemon has tp "
                          "%d, %d kv heads",
                          duet_slice_plan_prefill_tp(in->plan), duet_slice_plan_kv_heads(in->plan),
                          r->info.tp, r->info.kv_heads);
    for (int i = 0; i < in->n_pages; i++)
        if (in->src_pages[i] < 0 || in->src_pages[i] >= r->info.layout.n_pages)
            return duet_error(DUET_ERR_INVALID,
                              "xfer send: request %" PRIu64 ": source page %d outside the %d "
                              "pages of prefill rank %d",
                              in->transfer_id, (int)in->src_pages[i], r->info.layout.n_pages,
                              r->index);
    if (in->flags & ~(unsigned)(DUET_XFER_SEND_CRC | DUET_XFER_SEND_PACKED))
        return duet_error(DUET_ERR_INVALID, "xfer send: request %" PRIu64 ": unknown flags 0x%x",
                          in->transfer_id, in->flags);
    if (in->progress_layers < 0)
        return duet_error(DUET_ERR_INVALID, "xfer send: request %" PRIu64 ": progress_layers %d",
                          in->transfer_id, in->progress_layers);
    D = duet_slice_plan_decode_tp(in->plan);
    n_recv = duet_slice_plan_receivers(in->plan, r->index, recv);
    n_runs = duet_slice_plan_src_runs(in->plan, r->index, &runs);
    if ((in->flags & DUET_XFER_SEND_PACKED) &&
        n_runs > 0) { /* (a rank sending nothing stages nothing) */
        char why[96];
        int units =
            duet_xfer_pack_units(&r->info.layout, in->n_pages, duet_xfer_pack_slots(runs, n_runs));
        if (duet_xfer_pack_check_stage(&r->info.layout, r->info.pool_bytes, in->src_stage0, units,
                                       why, sizeof(why)) != 0)
            return duet_error(DUET_ERR_INVALID,
                              "xfer send: request %" PRIu64 ": prefill rank %d: source %s",
                              in->transfer_id, r->index, why);
    }

    s = DUET_NEW(duet__send_t);
    if (s == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "xfer send");
    s->r = r;
    s->dst = DUET_NEW_ARRAY(duet__send_dst_t, (size_t)(n_recv > 0 ? n_recv : 1));
    s->runs = DUET_NEW_ARRAY(duet_slice_run_t, (size_t)(n_runs > 0 ? n_runs : 1));
    s->pages = DUET_NEW_ARRAY(int32_t, 2u * (size_t)in->n_pages);
    if (s->dst == NULL || s->runs == NULL || s->pages == NULL) {
        duet__send_free(s);
        return duet_error(DUET_ERR_NO_MEMORY, "xfer send");
    }
    memcpy(s->runs, runs, (size_t)n_runs * sizeof(*runs));
    memcpy(s->pages, in->src_pages, (size_t)in->n_pages * sizeof(int32_t));
    memcpy(s->pages + in->n_pages, in->dst_pages, (size_t)in->n_pages * sizeof(int32_t));
    s->n_pages = in->n_pages;
    s->n_dst = n_recv;
    for (int k = 0; k < n_recv; k++) {
        duet__send_dst_t *dst = &s->dst[k];
        dst->s = s;
        dst->d = recv[k];
        dst->peer = recv[k] < D ? in->peers[recv[k]] : NULL;
        dst->runs = s->runs + at;
        dst->slot0 = duet_xfer_pack_slots(s->runs, at);
        while (at < n_runs && s->runs[at].dst_rank == recv[k]) {
            dst->n_runs++;
            at++;
        }
        dst->state = DUET__DST_POSTING;
    }
    s->o.transfer_id = in->transfer_id;
    s->o.side = DUET__SIDE_SEND;
    s->o.cb = in->cb;
    s->o.arg = in->arg;
    s->o.deadline_ns = in->deadline_ns;
    s->o.res.first_token = DUET_XFER_NO_TOKEN;
    s->flags = in->flags;
    s->crc_hook = (in->flags & DUET_XFER_SEND_CRC) && r->crc_fn != NULL;
    s->crc_flush =
        s->crc_hook || ((in->flags & DUET_XFER_SEND_CRC) && (in->flags & DUET_XFER_SEND_PACKED));
    s->src_stage0 = in->src_stage0;
    s->dst_stage0 = in->dst_stage0;
    s->n_layers = r->info.layout.n_layers;
    s->progress_layers = (in->flags & DUET_XFER_SEND_PACKED) ? in->progress_layers : 0;
    s->first_token = DUET_XFER_NO_TOKEN;
    *s_p = s;
    return DUET_OK;
}
