/* The prefix cache of a KV page pool (docs/prefix-cache.md): full pages of
 * computed KV kept after their request ended, found again by the hash of
 * their content and position, and shared by the requests whose prompts
 * begin with the same tokens.
 *
 * A page's id is a 128-bit hash chained over the page's tokens and its
 * parent's id (duet_kv_page_hash_chain), so equal ids mean equal tokens at
 * equal positions.  The cache holds one pool reference on each page it
 * keeps; a request that finds a page takes one more (match).  A cached
 * page that only the cache references is "idle": it sits in an LRU list and
 * is evicted (freed) by the pool's own allocation when free pages run out
 * (kv/pool.h: allocation evicts before it fails).
 *
 * Every call runs under the pool's lock (thread-safe).  The scheduler of a
 * daemon decides every lookup and insertion, and page ids mean the same
 * pages on every rank (DESIGN §3 rule 1): ranks follow, never decide. */
#ifndef DUET_KV_PREFIX_CACHE_H
#define DUET_KV_PREFIX_CACHE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "kv/pool.h"

/* A page's identity: SHA-256 of (parent id, the page's tokens) truncated
 * to 128 bits (docs/prefix-cache.md for the collision argument). */
typedef struct {
    uint64_t lo, hi;
} duet_kv_page_hash_t;

/* The ids of the first n_pages full pages of tokens (page_size tokens each;
 * the caller has at least n_pages * page_size tokens): hashes[i] covers
 * tokens [0, (i + 1) * page_size).  Thread-safe.  An error only when
 * libcrypto fails (no memory): the ids not computed are then random, so
 * that a caller that caches the pages anyway never matches them. */
duet_status_t duet_kv_page_hash_chain(const int32_t *tokens, int n_pages, int page_size,
                                      duet_kv_page_hash_t *hashes);

/* The same continued after a page whose id is parent: hashes[i] is the id
 * of the page holding tokens[i * page_size, (i + 1) * page_size) when that
 * page follows the parent's ({0, 0}: from the first page on).  As above on
 * error. */
duet_status_t duet_kv_page_hash_chain_from(duet_kv_page_hash_t parent, const int32_t *tokens,
                                           int n_pages, int page_size, duet_kv_page_hash_t *hashes);

/* Pages of a prompt of n_tokens tokens that a lookup may reuse: full pages
 * that leave at least the last token to compute (its logits give the first
 * output token), (n_tokens - 1) / page_size.  Pages a request may insert
 * after computing: n_tokens / page_size. */
int duet_kv_prefix_lookup_pages(int n_tokens, int page_size);
int duet_kv_prefix_insert_pages(int n_tokens, int page_size);

/* Turn the cache on (a pool starts without one).  DUET_ERR_NO_MEMORY. */
duet_status_t duet_kv_pool_cache_enable(duet_kv_pool_t *pool);
bool duet_kv_pool_cache_enabled(duet_kv_pool_t *pool);

/* The longest run hashes[0..k) of cached pages (k <= n): pages[0..k) get
 * their page ids, one reference each for the caller (released with
 * duet_kv_pool_release like any page).  Counts a lookup of query_tokens
 * tokens that hit k pages.  Returns k (0 without a cache). */
int duet_kv_pool_cache_match(duet_kv_pool_t *pool, const duet_kv_page_hash_t *hashes, int n,
                             int query_tokens, int page_size, int32_t *pages);

/* Keep pages[i] (held by the caller, KV computed) under hashes[i], for i
 * in [0, n): the cache adds its own reference.  A page already cached, or
 * a hash already cached on another page (two requests computed the same
 * prefix), is skipped.  Returns how many pages were added (0 without a
 * cache). */
int duet_kv_pool_cache_insert(duet_kv_pool_t *pool, const duet_kv_page_hash_t *hashes,
                              const int32_t *pages, int n);

/* Release a request's pages[0..n) (as duet_kv_pool_release), the last
 * first: the deeper pages of a cached chain become idle before its first
 * ones, so LRU eviction takes a prompt's (or a conversation's) last pages
 * before its first -- an evicted first page would leave the rest of the
 * chain unreachable.  Returns how many pages were freed. */
int duet_kv_pool_release_chain(duet_kv_pool_t *pool, const int32_t *pages, int n);

/* Evict every idle cached page (tests, and a daemon asked to drop its
 * cache).  Returns how many were freed. */
int duet_kv_pool_cache_clear(duet_kv_pool_t *pool);

/* Unpublish every cached page: idle ones are freed, ones a request holds
 * lose the cache's reference (they are freed with the request's) and are
 * never matched again.  For KV that may have been overwritten (decode: a
 * slice nobody granted landed, docs/security.md).  Returns how many pages
 * left the cache. */
int duet_kv_pool_cache_forget(duet_kv_pool_t *pool);

typedef struct {
    /* page accounting, counted independently from the reference counts:
     * free + cached_idle + in_use == total */
    int total;
    int free;        /* no reference */
    int cached_idle; /* referenced only by the cache (evictable) */
    int in_use;      /* referenced by a request (cached or not) */
    int cached;      /* every cached page, idle or in use */
    int shared;      /* cached pages that a request also holds */
    /* counters since the pool was made */
    uint64_t lookups, lookup_tokens, hit_tokens, hit_pages;
    uint64_t inserted_pages, evictions;
} duet_kv_pool_stats_t;

/* A consistent snapshot (one pass over the pages under the lock). */
void duet_kv_pool_stats(duet_kv_pool_t *pool, duet_kv_pool_stats_t *stats_p);

#endif
