/* Log-probabilities on decode (lp.c; docs/api-logprobs.md).  Leaves: they
 * fill req's logprob fields and return a status; the caller decides. */
#ifndef DUET_DECODE_LP_H
#define DUET_DECODE_LP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "decode/decode.h"

/* Does req need the Prefill reply before decoding (its logprobs)? */
bool duet_dc_lp_wants_reply(const duet_dc_req_t *req);
/* Client thread, Prefill's reply message: keep its logprobs in req->pf_*. */
void duet_dc_lp_take_reply(duet_decode_t *dc, duet_dc_req_t *req, const uint8_t *data, size_t len);
/* Scheduler, once KV and reply are both in: adopt the reply's logprobs
 * (checked against the first token).  DUET_ERR_INTERNAL (logged, with the
 * message the client gets) when prefill sent bad ones. */
duet_status_t duet_dc_lp_adopt_reply(duet_decode_t *dc, duet_dc_req_t *req);
/* Allocate the decode step's logits row (output init). */
duet_status_t duet_dc_lp_init(duet_decode_t *dc, duet_dc_req_t *req);
/* Free what lp.c allocated (req_free). */
void duet_dc_lp_cleanup(duet_dc_req_t *req);
/* Local prefill, one chunk of req's prompt in seq (first: the first
 * chunk, which allocates; last: the one that samples): point seq at the
 * rows req's logprobs need from it (prompt logprobs: every row, kept
 * across chunks; else the last row).  After the last chunk's forward,
 * compute them for the sampled first token. */
duet_status_t duet_dc_lp_local_prepare(duet_decode_t *dc, duet_dc_req_t *req,
                                       duet_engine_seq_t *seq, bool first, bool last);
duet_status_t duet_dc_lp_local_compute(duet_decode_t *dc, duet_dc_req_t *req, int32_t first);
/* Decode step: the logprob of the sampled token from req->logits into *lp;
 * NULL when req asked none. */
const duet_logprob_t *duet_dc_lp_step(duet_decode_t *dc, duet_dc_req_t *req, int32_t token,
                                      duet_logprob_t *lp);

#endif
