#include "node/cache_info.h"

#include "kv/prefix_cache.h"

void duet_node_cache_info(duet_kv_pool_t *pool, Duet__V1__InfoResponse *r)
{
    duet_kv_pool_stats_t s;
    duet_kv_pool_stats(pool, &s);
    r->total_pages = (uint32_t)s.total;
    r->free_pages = (uint32_t)(s.free + s.cached_idle);
    r->prefix_cache = duet_kv_pool_cache_enabled(pool);
    r->pool_free_pages = (uint32_t)s.free;
    r->cached_idle_pages = (uint32_t)s.cached_idle;
    r->in_use_pages = (uint32_t)s.in_use;
    r->cached_pages = (uint32_t)s.cached;
    r->shared_pages = (uint32_t)s.shared;
    r->cache_lookups = s.lookups;
    r->cache_lookup_tokens = s.lookup_tokens;
    r->cache_hit_tokens = s.hit_tokens;
    r->cache_hit_pages = s.hit_pages;
    r->cache_inserted_pages = s.inserted_pages;
    r->cache_evictions = s.evictions;
}
