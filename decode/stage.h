/* Packed transfers on decode (stage.c; scheduler thread;
 * transfer/xfer_pack.h): a packed request's KV lands in staging units of
 * node.stage, laid out by the runs each rank receives, and is copied
 * ("unpacked") into the request's pages.  Leaves: the staging run itself
 * is taken and given back by req.c. */
#ifndef DUET_DECODE_STAGE_H
#define DUET_DECODE_STAGE_H

#include <stdbool.h>

#include "decode/decode.h"

/* A packed request must move unpacked (no room in a staging arena): count
 * it, warn the first time. */
void duet_dc_unstaged(duet_decode_t *dc, duet_dc_req_t *req, const char *why);
/* Unpack layers [l0, l1) of the request's staging into its pages on every
 * rank; wait = false returns once queued (unpack_queued), wait = true once
 * everything queued landed. */
duet_status_t duet_dc_unpack_layers(duet_decode_t *dc, duet_dc_req_t *req, int l0, int l1,
                                    bool wait);
/* Wait for the unpacks queued without waiting, if any (before the
 * request's staging or pages are reused or given back). */
void duet_dc_unpack_wait(duet_decode_t *dc, duet_dc_req_t *req);

#endif
