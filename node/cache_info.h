/* The prefix cache's side of a daemon's Info (docs/prefix-cache.md): page
 * accounting and cache counters, the same on prefill and decode. */
#ifndef DUET_NODE_CACHE_INFO_H
#define DUET_NODE_CACHE_INFO_H

#include "duet/v1/common.pb-c.h"
#include "kv/pool.h"

/* Fill r's free_pages, the accounting and the cache fields from pool (one
 * consistent snapshot).  Thread-safe. */
void duet_node_cache_info(duet_kv_pool_t *pool, Duet__V1__InfoResponse *r);

#endif
