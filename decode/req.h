/* A decode request's one home (req.c; scheduler thread): its states and
 * the one transition function that moves it between them.  Nothing else
 * changes a request's state or takes or gives back its pages, link,
 * Prefill stream, staging and expectations: the batch loop (sched.c)
 * calls duet_dc_req_go with what happened, and the leaves below
 * (prefill_path, local_prefill, output, lp, stage, cache) only compute
 * and report.  The states and edges are drawn in docs/architecture.md
 * "Decode request lifecycle":
 *
 *                    +-(CHUNK)-+
 *                    v         |
 *   NEW -> QUEUED -+-> LOCAL --+---------------------+-> KV_IN -> READY -> RUNNING -> ENDED
 *                  +-> (LINKING ->) PREFILL ---------+
 *   any state but ENDED -> ENDED (FAIL, CANCEL); PREFILL -> NEW -> (LINKING ->)
 *   PREFILL once when prefill lost our bootstrap; PREFILL -> QUEUED -> LOCAL
 *   once when its KV transfer failed and transfer.on_failure is recompute
 *   (after the Prefill call ended: docs/migration.md).  LOCAL stays LOCAL
 *   for each chunk of its prompt computed in a decode step (chunked
 *   prefill) and moves on with the last one (PREFILLED). */
#ifndef DUET_DECODE_REQ_H
#define DUET_DECODE_REQ_H

#include "decode/decode.h"

/* What happened to a request: the input of duet_dc_req_go. */
typedef enum {
    DUET_DC_GO_QUEUE,       /* NEW: posted by Generate -> QUEUED */
    DUET_DC_GO_PAGES,       /* QUEUED: take its KV pages (DUET_ERR_EXHAUSTED: none, stays) */
    DUET_DC_GO_UNPAGE,      /* QUEUED, pages held: give them back (admission stops) */
    DUET_DC_GO_REMOTE,      /* QUEUED, pages held -> LINKING or PREFILL */
    DUET_DC_GO_LOCAL,       /* QUEUED, pages held -> LOCAL */
    DUET_DC_GO_CHUNK,       /* LOCAL: n_tokens more prompt tokens computed, not the last */
    DUET_DC_GO_PREFILLED,   /* LOCAL: its last (or only) chunk's status, msg -> KV_IN */
    DUET_DC_GO_LINKED,      /* LINKING: ev, its link's LINK_DONE -> PREFILL */
    DUET_DC_GO_KV_DONE,     /* PREFILL (or later): ev, one rank's expectation ended */
    DUET_DC_GO_KV_PROGRESS, /* PREFILL, packed: ev, more layers landed on one rank */
    DUET_DC_GO_KV_STARTED,  /* PREFILL: ev, prefill began it (its transfer deadline restarts) */
    DUET_DC_GO_RPC_DONE,    /* PREFILL (or later): ev, the Prefill call returned */
    DUET_DC_GO_FIRST,       /* KV_IN: send output 0, KV into its pages -> READY */
    DUET_DC_GO_RUN,         /* READY -> RUNNING (the caller has a batch slot) */
    DUET_DC_GO_TOKEN,       /* RUNNING: token (and lp) sampled -> RUNNING or ENDED */
    DUET_DC_GO_CANCEL,      /* its client or owner stopped it: msg -> ENDED */
    DUET_DC_GO_FAIL,        /* answer with status, msg -> ENDED */
} duet_dc_go_t;

typedef struct {
    duet_dc_go_t go;
    const duet_dc_ev_t *ev;   /* LINKED, KV_DONE, KV_PROGRESS, KV_STARTED, RPC_DONE */
    int32_t token;            /* TOKEN */
    const duet_logprob_t *lp; /* TOKEN: its log-probability, NULL: none */
    int n_tokens;             /* CHUNK */
    duet_status_t status;     /* PREFILLED, FAIL */
    const char *msg;          /* PREFILLED (not DUET_OK), CANCEL, FAIL */
} duet_dc_input_t;

/* The transition function.  DUET_OK, or for PAGES the reason none were
 * taken.  An ENDED request is released (duet_dc_req_free after the next
 * event drain: dc->zombies) once nothing can write its pages or call back;
 * FAIL and CANCEL on an ENDED request change nothing. */
duet_status_t duet_dc_req_go(duet_decode_t *dc, duet_dc_req_t *req, const duet_dc_input_t *in);

/* Shorthands for the common inputs. */
static inline void duet_dc_req_fail(duet_decode_t *dc, duet_dc_req_t *req, duet_status_t st,
                                    const char *msg)
{
    duet_dc_input_t in = {.go = DUET_DC_GO_FAIL, .status = st, .msg = msg};
    (void)duet_dc_req_go(dc, req, &in);
}

static inline void duet_dc_req_event(duet_decode_t *dc, duet_dc_req_t *req, duet_dc_go_t go,
                                     const duet_dc_ev_t *ev)
{
    duet_dc_input_t in = {.go = go, .ev = ev};
    (void)duet_dc_req_go(dc, req, &in);
}

/* Free a request that holds nothing any more (a zombie, or one the
 * handler never posted).  NULL: nothing. */
void duet_dc_req_free(duet_decode_t *dc, duet_dc_req_t *req);

#endif
