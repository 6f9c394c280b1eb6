/* Prefill side: the end of a (send, decode rank) pair and the messages on
 * its control endpoint (xfer_send_state.h).  Once a pair's puts are posted:
 * flush its data endpoint (and take the pair's checksum while the flush is
 * in flight, where it is not taken put by put), then send the notification
 * and wait for the acknowledgement (xfer_send.c).  A packed send with
 * progress_layers also announces, while posting, the layers that landed. */
#include "transfer/xfer_send_state.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "transfer/xfer_pack.h"

/* ---- flush, notify ----------------------------------------------------------------- */

static void duet__send_notified(duet_xfer_rank_t *r, duet__send_dst_t *dst)
{
    DUET__STAT_ADD(r, notify_sent, 1);
    if (dst->state != DUET__DST_NOTIFYING)
        return; /* acknowledged already, or failed meanwhile */
    dst->state = dst->failure_notice ? DUET__DST_DONE : DUET__DST_ACK_WAIT;
}

static void duet__send_notify_done(void *arg, duet_status_t st, const char *why)
{
    duet__send_dst_t *dst = arg;
    duet__send_t *s = dst->s;
    duet_xfer_rank_t *r = s->r;
    s->inflight--;
    if (st != DUET_OK)
        duet__send_dst_fail(r, dst, DUET_ERR_PEER,
                            "request %" PRIu64 ": notifying decode rank %d: %s", s->o.transfer_id,
                            dst->d, why);
    else
        duet__send_notified(r, dst);
    duet__send_check_done(r, s);
    duet__send_maybe_free(r, s);
}

/* A message of kind to dst's decode rank about this send (the rest zero). */
void duet__send_msg_init(const duet_xfer_rank_t *r, const duet__send_dst_t *dst, int kind,
                         duet__msg_t *m)
{
    memset(m, 0, sizeof(*m));
    m->kind = kind;
    m->transfer_id = dst->s->o.transfer_id;
    m->from_instance = r->info.instance;
    m->to_instance = dst->peer->info.instance;
    m->src_rank = r->index;
    m->dst_rank = dst->d;
}

static void duet__send_notify(duet_xfer_rank_t *r, duet__send_dst_t *dst)
{
    duet__send_t *s = dst->s;
    const char *why = NULL;
    duet_xfer_op_t op;
    duet__msg_t m;

    if (dst->peer == NULL) {
        duet__send_dst_fail(r, dst, DUET_ERR_PEER, "request %" PRIu64 ": decode rank %d is gone",
                            s->o.transfer_id, dst->d);
        return;
    }
    duet__send_msg_init(r, dst, DUET__MSG_NOTIFY, &m);
    m.status = s->failing ? s->o.res.status : DUET_OK;
    m.has_crc = (s->flags & DUET_XFER_SEND_CRC) && !s->failing;
    m.packed = (s->flags & DUET_XFER_SEND_PACKED) != 0;
    m.crc = dst->crc;
    m.bytes = dst->bytes;
    m.first_token = s->first_token;
    if (m.status == DUET_OK && s->failing)
        m.status = DUET_ERR_INTERNAL;
    dst->failure_notice = m.status != DUET_OK;
    duet__msg_encode(&m, dst->msg);
    dst->state = DUET__DST_NOTIFYING;
    DUET_LOG_TRACE("xfer p%d: request %" PRIu64 " to decode rank %d: flushed, notify at %lld",
                   r->index, s->o.transfer_id, dst->d, (long long)(duet_now_ns() / 1000));

    op = r->ops->msg_send(dst->peer->ctl_ep, dst->msg, DUET__MSG_BYTES, duet__send_notify_done, dst,
                          &why);
    if (op == DUET_XFER_OP_DONE)
        duet__send_notified(r, dst);
    else if (op == DUET_XFER_OP_FAILED)
        duet__send_dst_fail(r, dst, DUET_ERR_PEER,
                            "request %" PRIu64 ": notifying decode rank %d: %s", s->o.transfer_id,
                            dst->d, why);
    else
        s->inflight++;
}

static void duet__send_flush_done(void *arg, duet_status_t st, const char *why)
{
    duet__send_dst_t *dst = arg;
    duet__send_t *s = dst->s;
    duet_xfer_rank_t *r = s->r;
    s->inflight--;
    if (dst->state == DUET__DST_FLUSHING) {
        if (st != DUET_OK)
            duet__send_dst_fail(r, dst, DUET_ERR_PEER,
                                "request %" PRIu64 ": flush to decode rank %d: %s",
                                s->o.transfer_id, dst->d, why);
        else
            duet__send_notify(r, dst);
    }
    duet__send_check_done(r, s);
    duet__send_maybe_free(r, s);
}

/* The pair's checksum through the rank's hook once all its puts are posted
 * (the source stays as it is until the send ended); a failing hook fails
 * the send: this notification and the later ones report it. */
static void duet__send_crc(duet_xfer_rank_t *r, duet__send_dst_t *dst)
{
    duet__send_t *s = dst->s;
    duet_status_t st;
    if (!s->crc_hook) { /* packed on a host pool: the CPU reads the staging */
        dst->crc = duet_xfer_pack_crc(&r->info.layout, r->base, dst->runs, dst->n_runs, s->n_pages,
                                      s->src_stage0, 0, dst->slot0);
        return;
    }
    st = duet__crc_hook(r, dst->runs, dst->n_runs,
                        (s->flags & DUET_XFER_SEND_PACKED) ? NULL : s->pages, s->n_pages,
                        s->src_stage0, 0, dst->slot0, &dst->crc);
    if (st != DUET_OK) {
        duet__outcome_fail(&s->o, st, "request %" PRIu64 ": decode rank %d's slice: %s",
                           s->o.transfer_id, dst->d, duet_error_msg());
        s->stop_posting = s->failing = 1;
    }
}

void duet__send_flush(duet_xfer_rank_t *r, duet__send_dst_t *dst)
{
    duet__send_t *s = dst->s;
    const char *why = NULL;
    duet_xfer_op_t op;

    if (dst->peer == NULL) {
        duet__send_dst_fail(r, dst, DUET_ERR_PEER, "request %" PRIu64 ": decode rank %d is gone",
                            s->o.transfer_id, dst->d);
        return;
    }
    dst->state = DUET__DST_FLUSHING;
    /* the timeline of a send's end, in monotonic microseconds (trace) */
    DUET_LOG_TRACE(
        "xfer p%d: request %" PRIu64 " to decode rank %d: %" PRIu64 " puts posted, flush at %lld",
        r->index, s->o.transfer_id, dst->d, dst->puts, (long long)(duet_now_ns() / 1000));
    op = r->ops->flush(dst->peer->data_ep, duet__send_flush_done, dst, &why);
    if (op != DUET_XFER_OP_FAILED && !s->failing && s->crc_flush)
        duet__send_crc(r, dst); /* while the flush is in flight */
    if (op == DUET_XFER_OP_DONE)
        duet__send_notify(r, dst);
    else if (op == DUET_XFER_OP_FAILED)
        duet__send_dst_fail(r, dst, DUET_ERR_PEER,
                            "request %" PRIu64 ": flush to decode rank %d: %s", s->o.transfer_id,
                            dst->d, why);
    else
        s->inflight++;
}

/* ---- progress (packed) ------------------------------------------------------------ */

typedef struct {
    duet__send_dst_t *dst;
    uint8_t msg[DUET__MSG_BYTES];
} duet__progress_t;

static void duet__progress_sent(void *arg, duet_status_t st, const char *why)
{
    duet__progress_t *p = arg;
    duet__send_t *s = p->dst->s;
    (void)why;
    s->inflight--;
    if (st == DUET_OK)
        DUET__STAT_ADD(s->r, progress_sent, 1);
    duet_free(p);
    duet__send_check_done(s->r, s);
    duet__send_maybe_free(s->r, s);
}

/* The flush of p's puts completed: send the message (p is the send's while
 * it is in flight, else freed here). */
static void duet__progress_msg(duet_xfer_rank_t *r, duet__progress_t *p)
{
    duet__send_dst_t *dst = p->dst;
    duet__send_t *s = dst->s;
    const char *why = NULL;
    duet_xfer_op_t op = DUET_XFER_OP_FAILED;
    /* a failed flush fails the pair's own flush too, which reports it */
    if (dst->peer != NULL && !s->failing && dst->state != DUET__DST_DONE)
        op = r->ops->msg_send(dst->peer->ctl_ep, p->msg, DUET__MSG_BYTES, duet__progress_sent, p,
                              &why);
    if (op == DUET_XFER_OP_PENDING) {
        s->inflight++;
        return;
    }
    if (op == DUET_XFER_OP_DONE)
        DUET__STAT_ADD(r, progress_sent, 1);
    duet_free(p);
}

static void duet__progress_flushed(void *arg, duet_status_t st, const char *why)
{
    duet__progress_t *p = arg;
    duet__send_t *s = p->dst->s;
    duet_xfer_rank_t *r = s->r;
    (void)why;
    s->inflight--;
    if (st == DUET_OK)
        duet__progress_msg(r, p);
    else
        duet_free(p);
    duet__send_check_done(r, s);
    duet__send_maybe_free(r, s);
}

/* dst's puts of layers [0, layers) are posted: announce them once flushed,
 * if they are far enough from the last announcement and not the end. */
void duet__send_progress(duet_xfer_rank_t *r, duet__send_t *s, duet__send_dst_t *dst, int layers)
{
    const char *why = NULL;
    duet__progress_t *p;
    duet__msg_t m;
    duet_xfer_op_t op;

    if (s->progress_layers <= 0 || layers >= s->n_layers ||
        layers - dst->told < s->progress_layers || dst->peer == NULL || s->failing)
        return;
    if ((p = DUET_NEW(duet__progress_t)) == NULL)
        return; /* only an optimization lost */
    dst->told = layers;
    duet__send_msg_init(r, dst, DUET__MSG_PROGRESS, &m);
    m.packed = 1;
    m.bytes = (uint64_t)layers;
    duet__msg_encode(&m, p->msg);
    p->dst = dst;
    op = r->ops->flush(dst->peer->data_ep, duet__progress_flushed, p, &why);
    if (op == DUET_XFER_OP_PENDING)
        s->inflight++;
    else if (op == DUET_XFER_OP_DONE)
        duet__progress_msg(r, p);
    else
        duet_free(p);
}
