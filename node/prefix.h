/* The prefix cache on a daemon's request (docs/prefix-cache.md), the same
 * on prefill and decode: a request's pages begin with the longest cached
 * prefix of its prompt (found by page hash, referenced) followed by new
 * pages for the rest, and once its prompt's KV is computed its full pages
 * are kept for the next prompt.  Scheduler threads only: the scheduler
 * decides, the ranks follow the page table it hands them (DESIGN §3
 * rule 1). */
#ifndef DUET_NODE_PREFIX_H
#define DUET_NODE_PREFIX_H

#include <stdbool.h>
#include <stdint.h>

#include "node/node.h"

/* Fill pages[0..n_pages) for a prompt of n_prompt tokens: the cached
 * prefix when lookup (and the pool's cache is on), new pages after it.
 * *hashes_p: the prompt's page hashes, computed (allocated, the caller's
 * to free) on first use.  *n_hit_p: the cached pages at the front (0 on
 * failure).  DUET_ERR_EXHAUSTED, holding nothing, when the pool cannot
 * cover the rest; DUET_ERR_NO_MEMORY. */
duet_status_t duet_node_prefix_take(duet_node_t *node, const int32_t *prompt, int n_prompt,
                                    bool lookup, duet_kv_page_hash_t **hashes_p, int32_t *pages,
                                    int n_pages, int *n_hit_p);

/* The prompt's KV is complete in pages: keep its full pages after the
 * n_hit that came from the cache (nothing without hashes). */
void duet_node_prefix_keep(duet_node_t *node, int n_prompt, const duet_kv_page_hash_t *hashes,
                           const int32_t *pages, int n_hit);

#endif
