/* The router's approximate picture of one instance's prefix cache
 * (docs/kv-aware-routing.md): the prompt prefixes this router sent there
 * (and, on a decode, prompt + output of the requests that ran there), as
 * chained page hashes, bounded with LRU eviction.
 *
 * A prompt of n tokens has n / page_size full pages; page k's key is a
 * 64-bit hash of tokens [0, (k+1) * page_size) -- the whole prefix, so a
 * key present means that whole prefix was sent (up to hash collisions,
 * which only cost a routing choice).  A partial last page has no key: the
 * caches keep full pages only.  An index is a hash set of keys with an LRU
 * list; a prompt's pages are touched last page first, so its first page
 * is the most recent and eviction takes the deepest pages first (as a radix
 * tree drops leaves), keeping matches prefix-closed.
 *
 * Not thread-safe: the owner serialises calls (router/fleet/policy_cache.h). */
#ifndef DUET_ROUTER_FLEET_CACHE_INDEX_H
#define DUET_ROUTER_FLEET_CACHE_INDEX_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef struct duet_router_cache_index duet_router_cache_index_t;

/* The page keys of a prompt: keys_p[k] for its full pages k = 0..*n_p-1
 * (duet_malloc'd; NULL with *n_p 0 when it has no full page).
 * DUET_ERR_NO_MEMORY when the array cannot be allocated. */
duet_status_t duet_router_cache_keys(const int32_t *ids, size_t n_ids, size_t page_size,
                                     uint64_t **keys_p, size_t *n_p);

/* An empty index holding at most max_pages keys (>= 1); its memory grows
 * as keys come.  DUET_ERR_NO_MEMORY. */
duet_status_t duet_router_cache_index_create(size_t max_pages, duet_router_cache_index_t **ci_p);
/* Accepts NULL. */
void duet_router_cache_index_destroy(duet_router_cache_index_t *ci);
/* Forget every key (the instance restarted or was replaced). */
void duet_router_cache_index_clear(duet_router_cache_index_t *ci);

/* How many leading keys[] are present (the matched prefix, in pages).
 * Changes nothing. */
size_t duet_router_cache_index_match(const duet_router_cache_index_t *ci, const uint64_t *keys,
                                     size_t n);
/* Record that a prompt with these keys went there: present keys become the
 * most recent, missing ones are added, evicting the least recent beyond
 * max_pages; only the first max_pages keys are kept.  Best effort: when
 * memory cannot grow, older keys are evicted instead. */
void duet_router_cache_index_insert(duet_router_cache_index_t *ci, const uint64_t *keys, size_t n);

/* Keys held now, and keys evicted since creation. */
size_t duet_router_cache_index_pages(const duet_router_cache_index_t *ci);
uint64_t duet_router_cache_index_evicted(const duet_router_cache_index_t *ci);

#endif
