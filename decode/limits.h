/* Decode's own request limits (docs/security.md, "Input limits"): the caps
 * the router applies, enforced again for a Decode.Generate that did not
 * come through the router. */
#ifndef DUET_DECODE_LIMITS_H
#define DUET_DECODE_LIMITS_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "decode/decode.h"
#include "duet/v1/decode.pb-c.h"

/* max_tokens (router.max_tokens_limit), stop strings and stop_token_ids
 * (common/limits.h) and a token-id prompt's length (router.max_prompt_tokens
 * or the model context): DUET_ERR_INVALID / DUET_ERR_TOO_LONG naming the
 * field and the limit.  resumed: the prompt's last tokens that are a
 * migrated stream's output (DecodeGenerateRequest.first_output_index). */
duet_status_t duet_dc_limits_check(const duet_decode_t *dc, const Duet__V1__GenerateRequest *g,
                                   uint32_t resumed);

/* The longest prompt decode accepts, in tokens: router.max_prompt_tokens
 * or the model context; a migrated stream's resumed output counts against
 * the context only (docs/migration.md). */
int duet_dc_limits_prompt(const duet_decode_t *dc, uint32_t resumed);

#endif
