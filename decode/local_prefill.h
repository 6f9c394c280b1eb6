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
/* Fill seq with req's (LOCAL) next chunk: at most max tokens from
 * req->local_done on (INT_MAX: the rest of its prompt), sampling when it is
 * the last.  Returns its tokens. */
int duet_dc_local_chunk(duet_decode_t *dc, duet_dc_req_t *req, int max, duet_engine_seq_t *seq);
/* A decode step's local chunks (chunk_tokens > 0): the next chunks of the
 * LOCAL requests in admission order, up to chunk_tokens prompt tokens
 * (fewer when n_running decode tokens and they would exceed
 * max_batch_tokens; at least one) and max sequences, into seqs, their
 * requests into reqs.  Returns how many (counted in chunks_local). */
int duet_dc_local_chunks(duet_decode_t *dc, int n_running, int max, duet_dc_req_t **reqs,
                         duet_engine_seq_t *seqs);
/* After the forward that ran req's last chunk: its first token (sampled,
 * or DUET_ENGINE_NONFINITE) and logprobs; *res says how it fared. */
void duet_dc_local_first(duet_decode_t *dc, duet_dc_req_t *req, int32_t sampled,
                         duet_dc_local_result_t *res);
/* Prefill reqs[0..n) (n <= max_seqs, state LOCAL) whole in one engine call and
 * sample each first token: res[i] says how req i fared.  Not DUET_OK: the
 * engine failed (message set) and res is not filled: every request fails,
 * and the engine cannot run again. */
duet_status_t duet_dc_local_prefill(duet_decode_t *dc, duet_dc_req_t **reqs, int n,
                                    duet_dc_local_result_t *res);

#endif
