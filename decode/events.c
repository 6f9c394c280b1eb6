/* The scheduler's event queue (events.h). */
#include "decode/events.h"

#include "common/alloc.h"

duet_dc_ev_t *duet_dc_ev_new(duet_dc_ev_type_t type, duet_dc_req_t *req)
{
    duet_dc_ev_t *ev = DUET_NEW(duet_dc_ev_t);
    if (ev != NULL) {
        ev->type = type;
        ev->req = req;
    }
    return ev;
}

/* evlock held */
static void duet__ev_append(duet_decode_t *dc, duet_dc_ev_t *ev)
{
    if (dc->ev_tail != NULL)
        dc->ev_tail->next = ev;
    else
        dc->ev_head = ev;
    dc->ev_tail = ev;
    pthread_cond_signal(&dc->evcv);
}

void duet_dc_post(duet_decode_t *dc, duet_dc_ev_t *ev)
{
    pthread_mutex_lock(&dc->evlock);
    duet__ev_append(dc, ev);
    pthread_mutex_unlock(&dc->evlock);
}

bool duet_dc_post_live(duet_decode_t *dc, duet_dc_ev_t *ev)
{
    bool live;
    pthread_mutex_lock(&dc->evlock);
    live = !dc->sched_gone;
    if (live)
        duet__ev_append(dc, ev);
    pthread_mutex_unlock(&dc->evlock);
    return live;
}

duet_status_t duet_dc_post_new(duet_decode_t *dc, duet_dc_ev_t *ev)
{
    duet_status_t st = DUET_OK;
    pthread_mutex_lock(&dc->evlock);
    if (dc->sched_gone) {
        st = duet_error(DUET_ERR_SHUTDOWN, "decode is shutting down");
    } else if (atomic_load(&dc->node.draining)) {
        st = duet_error(DUET_ERR_SHUTDOWN, "decode is draining");
    } else {
        duet__ev_append(dc, ev);
        dc->info_queued++; /* counted until the scheduler's next count */
    }
    pthread_mutex_unlock(&dc->evlock);
    return st;
}

void duet_dc_counts(duet_decode_t *dc, int *queued_p, int *running_p)
{
    pthread_mutex_lock(&dc->evlock);
    *queued_p = dc->info_queued;
    *running_p = dc->info_running;
    pthread_mutex_unlock(&dc->evlock);
}

int duet_dc_pending(void *arg)
{
    int queued = 0, running = 0;
    duet_dc_counts(arg, &queued, &running);
    return queued + running;
}
