/* Inside the KV pool: its state, shared by pool.c and prefix_cache.c (the
 * cache lives under the pool's lock, so that allocation can evict and a
 * reference count and the cache's LRU never disagree).  Not for other
 * modules. */
#ifndef DUET_KV_POOL_INTERNAL_H
#define DUET_KV_POOL_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "kv/prefix_cache.h"

typedef struct {
    duet_kv_page_hash_t *hash; /* [n_pages] id of a cached page */
    uint8_t *cached;           /* [n_pages] 1 while the cache holds the page */
    int32_t *chain;            /* [n_pages] next cached page of the same bucket, -1 */
    int32_t *buckets;          /* [mask + 1] first cached page of the bucket, -1 */
    uint32_t mask;
    /* idle cached pages (only the cache's reference), least recent first */
    int32_t *lru_prev, *lru_next; /* [n_pages], -1 */
    int32_t lru_head, lru_tail;
    int n_idle, n_cached;
    uint64_t lookups, lookup_tokens, hit_tokens, hit_pages;
    uint64_t inserted_pages, evictions;
} duet_kv_prefix_t;

struct duet_kv_pool {
    pthread_mutex_t lock;
    int n_pages;
    int n_free;
    int hint;                 /* where the next search starts */
    uint16_t *refs;           /* [n_pages] references per page; 0 = free */
    duet_kv_prefix_t *prefix; /* NULL: no prefix cache */
};

/* Lock held.  A page's count went from 2 to 1: idle if cached. */
void duet__kv_prefix_on_last_user(duet_kv_pool_t *pool, int32_t p);
/* Lock held.  A page's count is about to go from 1 to 2: busy if cached. */
void duet__kv_prefix_on_new_user(duet_kv_pool_t *pool, int32_t p);
/* Lock held.  Free the least recently used idle page; its id, or -1 when
 * none is idle.  n_free is updated. */
int32_t duet__kv_prefix_evict_one(duet_kv_pool_t *pool);
static inline int duet__kv_prefix_idle(const duet_kv_pool_t *pool)
{
    return pool->prefix != NULL ? pool->prefix->n_idle : 0;
}
void duet__kv_prefix_destroy(duet_kv_prefix_t *c);

#endif
