/* Decode's prefix cache (cache.c; scheduler thread; docs/prefix-cache.md). */
#ifndef DUET_DECODE_CACHE_H
#define DUET_DECODE_CACHE_H

#include <stdbool.h>

#include "decode/decode.h"

/* Take req's pages: the longest cached prefix of its prompt (at most
 * duet_kv_prefix_lookup_pages, referenced) and new ones for the rest;
 * sets pages_held.  DUET_ERR_EXHAUSTED (nothing held) when the pool cannot
 * cover the rest.  Called by req.c only. */
duet_status_t duet_dc_cache_take(duet_decode_t *dc, duet_dc_req_t *req);
/* req's prompt KV is complete in its pages: keep its full prompt pages. */
void duet_dc_cache_keep(duet_decode_t *dc, duet_dc_req_t *req);
/* req ends with kv_whole: keep the full pages of prompt + output whose KV
 * was computed (every output token's but the last, whose KV is not written)
 * beyond the prompt's (docs/prefix-cache.md "Generated pages"). */
void duet_dc_cache_keep_generated(duet_decode_t *dc, duet_dc_req_t *req);
/* Prompt tokens whose KV req still needs (after take). */
int duet_dc_uncached_tokens(const duet_decode_t *dc, const duet_dc_req_t *req);
/* True when the cache held every page it may (only the last page's tokens
 * are left): no prefill instance is needed. */
bool duet_dc_cache_covers(const duet_decode_t *dc, const duet_dc_req_t *req);

/* Scheduler thread, before admission: when a slice landed that no live
 * transfer expected (transfer/xfer.h `unsolicited`: a replayed grant or a
 * rogue sender wrote into pages it did not own), forget the whole prefix
 * cache (kv/prefix_cache.h): which pages were hit is unknown, so none is
 * served again; pages held by live requests stay theirs. */
void duet_dc_cache_check_writes(duet_decode_t *dc);

#endif
