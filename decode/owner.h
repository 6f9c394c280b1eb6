/* Who may do what to a decode request (owner.c; any thread;
 * docs/security.md "Page grants and ownership"). */
#ifndef DUET_DECODE_OWNER_H
#define DUET_DECODE_OWNER_H

#include <stdbool.h>

#include "decode/decode.h"

/* Set req's request id (the caller's, or 128 random bits as hex) and its
 * abort token (checked: empty, or 16..64 bytes). */
duet_status_t duet_dc_request_owner(duet_decode_t *dc, const char *request_id,
                                    const char *abort_token, duet_dc_req_t *req);
/* May the holder of token abort req?  Constant time in the token bytes. */
bool duet_dc_abort_allowed(const duet_dc_req_t *req, const char *token);
/* Is target a prefill instance of this cluster: an address of the config,
 * or (with resolve: a DNS lookup, worker threads only) one of the addresses
 * a prefill entry's discover name resolves to?  DUET_OK; DUET_ERR_INVALID
 * with the same message whatever listens at target; without resolve,
 * DUET_ERR_NOT_FOUND (no message) when only a lookup can tell. */
duet_status_t duet_dc_target_check(duet_decode_t *dc, const char *target, bool resolve);

#endif
