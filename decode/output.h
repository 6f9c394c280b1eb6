/* Streaming a request's tokens (output.c; scheduler thread).  A leaf: it
 * writes chunks and the Finished message on the request's call and says
 * what happened; the terminal call and the request's end are req.c's. */
#ifndef DUET_DECODE_OUTPUT_H
#define DUET_DECODE_OUTPUT_H

#include "decode/decode.h"

typedef enum {
    DUET_DC_EMIT_MORE,   /* sent; the request goes on */
    DUET_DC_EMIT_FINISH, /* sent with the Finished message: end the call OK */
    DUET_DC_EMIT_ENDED,  /* nothing to send: the call was answered already */
    DUET_DC_EMIT_FAIL,   /* end the request with status and msg */
} duet_dc_emit_kind_t;

typedef struct {
    duet_dc_emit_kind_t kind;
    duet_status_t status; /* FAIL */
    char msg[512];        /* FAIL */
} duet_dc_emit_t;

/* The request's output buffers, its detokenizer primed with the prompt. */
duet_status_t duet_dc_output_init(duet_decode_t *dc, duet_dc_req_t *req);
/* Account a new token and stream it, with its log-probability (NULL:
 * none); the first chunk also carries req->prompt_lps when asked. */
duet_dc_emit_t duet_dc_output_emit(duet_decode_t *dc, duet_dc_req_t *req, int32_t token,
                                   const duet_logprob_t *lp);

#endif
