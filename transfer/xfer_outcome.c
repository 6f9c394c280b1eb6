/* The rank's bookkeeping that every layer of the progress thread uses:
 * completing a command (waking its caller, or freeing it), the list of
 * outcomes that became final and wait for delivery, the first failure of an
 * outcome, and the next deadline to wake up for.  Calls nothing else in
 * transfer/. */
#include "transfer/xfer_internal.h"

#include <stdarg.h>
#include <stdio.h>

#include "common/alloc.h"
#include "common/log.h"

void duet__cmd_done(duet_xfer_rank_t *r, duet__cmd_t *c, duet_status_t st, const char *fmt, ...)
{
    c->status = st;
    if (fmt != NULL) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->msg, sizeof(c->msg), fmt, ap);
        va_end(ap);
    }
    if (c->heap) {
        if (st != DUET_OK)
            DUET_LOG_DEBUG("xfer rank %d: queued command %d: %s", r->index, c->kind, c->msg);
        duet_free(c);
        return;
    }
    pthread_mutex_lock(&r->mu);
    c->done = 1;
    pthread_cond_broadcast(&r->cond);
    pthread_mutex_unlock(&r->mu);
}

void duet__deadline_hint(duet_xfer_rank_t *r, int64_t deadline_ns)
{
    if (deadline_ns < r->next_deadline_ns)
        r->next_deadline_ns = deadline_ns;
}

void duet__outcome_fail(duet__outcome_t *o, duet_status_t st, const char *fmt, ...)
{
    va_list ap;
    if (o->res.status != DUET_OK)
        return; /* the first failure is the one reported */
    o->res.status = st;
    va_start(ap, fmt);
    vsnprintf(o->res.detail, sizeof(o->res.detail), fmt, ap);
    va_end(ap);
}

void duet__due(duet_xfer_rank_t *r, duet__outcome_t *o)
{
    if (o->is_due)
        return;
    o->is_due = 1;
    o->due_next = NULL;
    o->due_prev = r->due_tail;
    if (r->due_tail != NULL)
        r->due_tail->due_next = o;
    else
        r->due_head = o;
    r->due_tail = o;
}

void duet__undue(duet_xfer_rank_t *r, duet__outcome_t *o)
{
    if (!o->is_due)
        return;
    if (o->due_prev != NULL)
        o->due_prev->due_next = o->due_next;
    else
        r->due_head = o->due_next;
    if (o->due_next != NULL)
        o->due_next->due_prev = o->due_prev;
    else
        r->due_tail = o->due_prev;
    o->is_due = 0;
    o->due_prev = o->due_next = NULL;
}
