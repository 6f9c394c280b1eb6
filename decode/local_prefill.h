/* Colocated mode and conditional disaggregation (local_prefill.c;
 * scheduler thread; docs/design-notes.md).  Leaves: they decide and
 * compute, and return what happened; req.c moves the requests on. */
#ifndef DUET_DECODE_LOCAL_PREFILL_H
#define DUET_DECODE_LOCAL_PREFILL_H

#include <stdbool.h>

#include "decode/decode.h"

/* What a local prefill did for one request: DUET_OK with
 * req->kv_first_token (and its logprobs) set, or why it failed. */
typedef struct duet_dc_local_result {
    duet_status_t status;
    char msg[512];
} duet_dc_local_result_t;

/* Should req (pages held, not yet started) prefill on our own engine?
 * busy: sequences decoding or about to (running, ready, admitted now). */
bool duet_dc_local_wanted(duet_decode_t *dc, const duet_dc_req_t *req, int busy);
/* Prefill reqs[0..n) (n <= max_seqs, state LOCAL) in one engine call and
 * sample each first token: res[i] says how req i fared.  Not DUET_OK: the
 * engine failed (message set) and res is not filled: every request fails,
 * and the engine cannot run again. */
duet_status_t duet_dc_local_prefill(duet_decode_t *dc, duet_dc_req_t **reqs, int n,
                                    duet_dc_local_result_t *res);

#endif
