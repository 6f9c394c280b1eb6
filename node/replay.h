/* The grants prefill has taken (docs/security.md "Grants are used once"):
 * a grant -- one (decode instance, transfer id) -- is served once; the
 * same one again, until it has expired, is a replay and refused.
 *
 * A fixed table (open addressing, linear probing) of (decode id hash,
 * transfer id, keep-until) entries: memory is bounded by its capacity,
 * given at creation (24 bytes an entry, calloc'ed: untouched pages cost no
 * RSS).  An entry is kept until its grant's expiry plus the clock skew a
 * grant tolerates (node/grant.h): after that the grant itself is refused.
 * Expired entries are dropped when three quarters of the slots are used;
 * when live ones fill three quarters, a new grant is refused
 * (DUET_ERR_EXHAUSTED) rather than an old one forgotten early.
 * Thread-safe (one mutex). */
#ifndef DUET_NODE_REPLAY_H
#define DUET_NODE_REPLAY_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef struct duet_node_replay duet_node_replay_t;

/* A table for up to 3/4 capacity live grants (capacity rounded up to a
 * power of two, at least 64).  NULL: no memory. */
duet_node_replay_t *duet_node_replay_create(size_t capacity);
void duet_node_replay_destroy(duet_node_replay_t *t);

/* Take the grant of (decode_id, transfer_id), valid until expiry_ms (wall
 * clock), at now_ms.  DUET_OK: first use, now remembered until expiry_ms
 * + DUET_NODE_GRANT_SKEW_MS.  DUET_ERR_INVALID: taken before and not yet
 * expired (a replay).  DUET_ERR_EXHAUSTED: the table is full of live
 * grants.  Each sets the error message. */
duet_status_t duet_node_replay_take(duet_node_replay_t *t, const char *decode_id,
                                    uint64_t transfer_id, uint64_t expiry_ms, uint64_t now_ms);

/* Live entries (tests, metrics). */
size_t duet_node_replay_live(duet_node_replay_t *t, uint64_t now_ms);

#endif
