/* duet.v1.Decode: Generate, Abort, Info (service.c). */
#ifndef DUET_DECODE_SERVICE_H
#define DUET_DECODE_SERVICE_H

#include "decode/decode.h"

/* Add the Decode methods to the node's server (start-up). */
duet_status_t duet_dc_service_register(duet_decode_t *dc);

/* The checks Generate runs on a request before posting it (fills req,
 * tokenizing a text prompt; the caller frees it with duet_dc_req_free,
 * req.h).  Exposed for fuzz/. */
struct Duet__V1__DecodeGenerateRequest;
duet_status_t duet_dc_validate(duet_decode_t *dc, const struct Duet__V1__DecodeGenerateRequest *m,
                               duet_dc_req_t *req);

#endif
