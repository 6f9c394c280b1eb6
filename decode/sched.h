/* The decode scheduler thread (sched.c): the batch loop. */
#ifndef DUET_DECODE_SCHED_H
#define DUET_DECODE_SCHED_H

#include "decode/decode.h"

/* Start the scheduler thread (its arrays sized by max_seqs). */
duet_status_t duet_dc_sched_start(duet_decode_t *dc);
/* Have it end every request (UNAVAILABLE), wait for their prefill calls
 * and transfers, and join it.  Without a start: nothing. */
void duet_dc_sched_stop(duet_decode_t *dc);
/* The drain began (node op drain_begin, any thread): the scheduler ends
 * every migratable request UNAVAILABLE "decode draining", for its router
 * to continue elsewhere (docs/migration.md "Drains"). */
void duet_dc_drain_begin(void *arg);

#endif
