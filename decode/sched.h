/* The decode scheduler thread (sched.c): the batch loop. */
#ifndef DUET_DECODE_SCHED_H
#define DUET_DECODE_SCHED_H

#include "decode/decode.h"

/* Start the scheduler thread (its arrays sized by max_seqs). */
duet_status_t duet_dc_sched_start(duet_decode_t *dc);
/* Have it end every request (UNAVAILABLE), wait for their prefill calls
 * and transfers, and join it.  Without a start: nothing. */
void duet_dc_sched_stop(duet_decode_t *dc);
/* The drain began (node op drain_begin, any thread): the scheduler logs
 * what is in flight and counts the streams their router cancels from now
 * on (it moved them to another decode, make-before-break: docs/
 * migration.md "Drains"); the drain finishes the rest. */
void duet_dc_drain_begin(void *arg);
/* Log the drain's count of streams handed back (after the drain). */
void duet_dc_drain_report(duet_decode_t *dc);

#endif
