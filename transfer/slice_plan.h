/* Heterogeneous-TP slice plan (DESIGN §4): which prefill engine rank writes
 * which KV heads into which decode engine rank.
 *
 * One pure function used by both sides: prefill asks "what do I send",
 * decode asks "whom do I wait for".  Head ownership on each side follows
 * DESIGN §2 (engine/tp.h: split when H >= TP, replicated when H < TP).
 * Every (decode rank, local head) is written by exactly one prefill rank that
 * holds that head; when a head is replicated on several prefill ranks the
 * senders are spread across the replicas deterministically.  Consecutive
 * heads with the same sender become one run. */
#ifndef DUET_TRANSFER_SLICE_PLAN_H
#define DUET_TRANSFER_SLICE_PLAN_H

#include <stdint.h>

#include "common/status.h"

typedef struct {
    int src_rank; /* prefill engine rank */
    int dst_rank; /* decode engine rank */
    int src_head; /* first local head index on the prefill rank */
    int dst_head; /* first local head index on the decode rank */
    int n_heads;  /* consecutive heads in the run */
} duet_slice_run_t;

typedef struct duet_slice_plan duet_slice_plan_t;

/* Build the plan for prefill TP P, decode TP D, total KV heads H.  A
 * combination that either side cannot shard (engine/tp.h rules) is
 * DUET_ERR_CONFIG naming the side and the numbers. */
duet_status_t duet_slice_plan_create(int P, int D, int H, duet_slice_plan_t **plan_p);
void duet_slice_plan_destroy(duet_slice_plan_t *plan);

int duet_slice_plan_prefill_tp(const duet_slice_plan_t *plan);
int duet_slice_plan_decode_tp(const duet_slice_plan_t *plan);
int duet_slice_plan_kv_heads(const duet_slice_plan_t *plan);

/* Queries with a rank outside 0..TP-1 return 0 (with *runs_p = NULL and a
 * mask of 0).
 *
 * Runs that fill decode rank d, ordered by dst_head.  Returns the count and
 * points *runs_p into the plan (valid until destroy). */
int duet_slice_plan_dst_runs(const duet_slice_plan_t *plan, int d, const duet_slice_run_t **runs_p);

/* Runs prefill rank s sends (to any decode rank), ordered by (dst_rank,
 * dst_head). */
int duet_slice_plan_src_runs(const duet_slice_plan_t *plan, int s, const duet_slice_run_t **runs_p);

/* senders(d): the distinct prefill ranks that write to decode rank d, in
 * ascending order, into ranks[] (capacity P).  Returns the count. */
int duet_slice_plan_senders(const duet_slice_plan_t *plan, int d, int *ranks);

/* Bitmask form of senders(d) (P <= 64). */
uint64_t duet_slice_plan_sender_mask(const duet_slice_plan_t *plan, int d);

/* The decode ranks prefill rank s writes to, ascending, into ranks[]
 * (capacity D). Returns the count. */
int duet_slice_plan_receivers(const duet_slice_plan_t *plan, int s, int *ranks);

#endif
