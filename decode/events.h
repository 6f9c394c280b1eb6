/* The scheduler's event queue (decode.h): the one hand-over from the other
 * threads (gRPC handlers and client callbacks, transfer progress, the
 * bootstrap worker) to the scheduler.  Every function here is thread-safe
 * (under dc->evlock). */
#ifndef DUET_DECODE_EVENTS_H
#define DUET_DECODE_EVENTS_H

#include <stdbool.h>

#include "decode/decode.h"

/* A zeroed event of type for req (NULL: none); NULL without memory. */
duet_dc_ev_t *duet_dc_ev_new(duet_dc_ev_type_t type, duet_dc_req_t *req);
/* Queue an event for the scheduler (any thread; takes ownership). */
void duet_dc_post(duet_decode_t *dc, duet_dc_ev_t *ev);
/* The same for an event whose call the scheduler must answer: false, and
 * ev stays the caller's, once the scheduler has left (shutdown). */
bool duet_dc_post_live(duet_decode_t *dc, duet_dc_ev_t *ev);
/* Count of requests in each phase, for Info and draining. */
/* Post a new request's EV_NEW unless the decode drains or its scheduler
 * is gone (DUET_ERR_SHUTDOWN, message set): under the event lock, so a
 * drain that began counts it in duet_dc_pending or refuses it, and it is
 * counted as queued at once (a request the scheduler has not taken yet is
 * never missed by the drain). */
duet_status_t duet_dc_post_new(duet_decode_t *dc, duet_dc_ev_t *ev);
void duet_dc_counts(duet_decode_t *dc, int *queued_p, int *running_p);
/* queued + running, for the drain (any thread; arg: the duet_decode_t). */
int duet_dc_pending(void *arg);

#endif
