/* Prefill side: the send state's bookkeeping (xfer_send_state.h): the
 * rank's lists of sends, a pair's failure, the outcome once every pair is
 * done, and the state's end.  Calls nothing else of the send side. */
#include "transfer/xfer_send_state.h"

#include <stdarg.h>
#include <stdio.h>

#include "common/alloc.h"
#include "common/clock.h"

/* ---- bookkeeping ---------------------------------------------------------------- */

void duet__send_free(duet__send_t *s)
{
    duet_xfer_rank_t *r = s->r;
    if (s->prev != NULL)
        s->prev->next = s->next;
    else if (r->send_list == s)
        r->send_list = s->next;
    if (s->next != NULL)
        s->next->prev = s->prev;
    duet_free(s->dst);
    duet_free(s->runs);
    duet_free(s->pages);
    duet_free(s);
}

void duet__send_posting_remove(duet_xfer_rank_t *r, duet__send_t *s)
{
    if (!s->in_posting)
        return;
    if (s->post_prev != NULL)
        s->post_prev->post_next = s->post_next;
    else
        r->posting = s->post_next;
    if (s->post_next != NULL)
        s->post_next->post_prev = s->post_prev;
    s->post_next = s->post_prev = NULL;
    s->in_posting = 0;
}

void duet__send_posting_add(duet_xfer_rank_t *r, duet__send_t *s)
{
    if (s->in_posting)
        return;
    s->post_prev = NULL;
    s->post_next = r->posting;
    if (r->posting != NULL)
        r->posting->post_prev = s;
    r->posting = s;
    s->in_posting = 1;
}

void duet__send_maybe_free(duet_xfer_rank_t *r, duet__send_t *s)
{
    (void)r;
    if (s->in_table || s->in_posting || s->inflight > 0 || !s->o.terminal || s->o.in_callback ||
        s->o.is_due)
        return;
    duet__send_free(s);
}

void duet__send_check_done(duet_xfer_rank_t *r, duet__send_t *s)
{
    if (s->o.terminal)
        return;
    if (s->timed_out && s->inflight > 0 &&
        duet_now_ns() < s->o.deadline_ns + DUET__SEND_DRAIN_GRACE_NS)
        return;
    for (int k = 0; k < s->n_dst; k++)
        if (s->dst[k].state != DUET__DST_DONE)
            return;
    s->o.terminal = 1;
    s->o.res.bytes = 0;
    s->o.res.puts = 0;
    for (int k = 0; k < s->n_dst; k++) {
        s->o.res.bytes += s->dst[k].bytes;
        s->o.res.puts += s->dst[k].puts;
    }
    duet__send_posting_remove(r, s);
    if (s->o.res.status == DUET_OK)
        DUET__STAT_ADD(r, send_done, 1);
    else
        DUET__STAT_ADD(r, send_failed, 1);
    if (!s->detached)
        duet__due(r, &s->o);
}

void duet__send_dst_fail(duet_xfer_rank_t *r, duet__send_dst_t *dst, duet_status_t st,
                         const char *fmt, ...)
{
    char detail[DUET_XFER_DETAIL_MAX];
    va_list ap;
    (void)r;
    if (dst->state == DUET__DST_DONE)
        return;
    dst->state = DUET__DST_DONE;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof(detail), fmt, ap);
    va_end(ap);
    duet__outcome_fail(&dst->s->o, st, "%s", detail);
}
