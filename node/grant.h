/* Page grants (docs/security.md "Page grants and ownership"): prefill
 * writes KV only into the decode pages that decode granted for that
 * transfer.
 *
 * At every bootstrap decode makes a fresh 32-byte key from the CSPRNG and
 * hands it to prefill with its descriptors (node/link.c); both keep it in
 * the link.  For each Prefill call decode signs a grant -- HMAC-SHA256 over
 * a fixed encoding of the transfer id, its own instance id, the exact
 * destination page list, the packed flag and staging page, an expiry, and
 * what decides the bytes written there: the prompt ids, the cached-page
 * count and the first token's sampling -- and prefill recomputes it over
 * the request it is about to serve, compares in constant time and checks
 * the expiry before any put.  A caller without the key cannot name pages,
 * a grant for one transfer does not cover another transfer's ids or
 * pages, and a captured grant replayed with another prompt does not match.
 * Prefill also takes each grant once (node/replay.h).
 *
 * The key travels on the bootstrap call: it is as secret as that channel
 * (authenticated and encrypted once the cluster runs with mTLS, see
 * docs/security.md).  Pure functions; thread-safe. */
#ifndef DUET_NODE_GRANT_H
#define DUET_NODE_GRANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/sha256.h"
#include "common/status.h"

#define DUET_NODE_GRANT_KEY_LEN 32
#define DUET_NODE_GRANT_LEN     DUET_SHA256_LEN
/* Clock skew between the two hosts that an expiry tolerates. */
#define DUET_NODE_GRANT_SKEW_MS 30000

typedef struct {
    uint64_t transfer_id;
    const char *decode_id; /* the decode's instance id */
    const int32_t *pages;  /* the destination pages, in order */
    size_t n_pages;
    bool packed;
    int32_t stage0;       /* first staging page when packed, else ignored */
    uint32_t chunk_pages; /* packed: the chunks' size (PrefillRequest.chunk_pages; 0: whole) */
    uint64_t expiry_ms;   /* wall clock, ms since the epoch */
    /* what the KV written there is computed from (grant v2) */
    const int32_t *prompt; /* the prompt ids, [n_prompt] */
    size_t n_prompt;
    uint32_t cached_pages;
    float temperature, top_p;
    int32_t top_k;
    uint64_t seed;
} duet_node_grant_t;

/* The MAC of g under key.  An error only when libcrypto fails (no
 * memory): mac is then zeros, which no verify accepts. */
duet_status_t duet_node_grant_sign(const uint8_t key[DUET_NODE_GRANT_KEY_LEN],
                                   const duet_node_grant_t *g, uint8_t mac[DUET_NODE_GRANT_LEN]);

/* Check mac (len bytes, as received) for g under key at wall-clock time
 * now_ms.  DUET_OK, or DUET_ERR_INVALID with a message naming why: no
 * grant, wrong length, expired, or a MAC that does not match (wrong key,
 * or a page list, transfer id or staging run other than the granted
 * ones). */
duet_status_t duet_node_grant_verify(const uint8_t key[DUET_NODE_GRANT_KEY_LEN],
                                     const duet_node_grant_t *g, const uint8_t *mac, size_t len,
                                     uint64_t now_ms);

/* Wall-clock milliseconds since the epoch (grant expiries). */
uint64_t duet_node_grant_now_ms(void);

#endif
