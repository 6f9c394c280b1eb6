/* The prefix cache of a KV page pool (kv/prefix_cache.h): a hash table of
 * cached pages by id and an LRU list of the idle ones, all per page id in
 * arrays the size of the pool, under the pool's lock. */
#include "kv/prefix_cache.h"

#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/random.h"
#include "common/sha256.h"
#include "kv/pool_internal.h"

duet_status_t duet_kv_page_hash_chain(const int32_t *tokens, int n_pages, int page_size,
                                      duet_kv_page_hash_t *hashes)
{
    return duet_kv_page_hash_chain_from((duet_kv_page_hash_t){0, 0}, tokens, n_pages, page_size,
                                        hashes);
}

static duet_kv_page_hash_t duet__digest_hash(const uint8_t digest[DUET_SHA256_LEN])
{
    duet_kv_page_hash_t h = {0, 0};
    for (int b = 0; b < 8; b++) {
        h.lo |= (uint64_t)digest[b] << (8 * b);
        h.hi |= (uint64_t)digest[8 + b] << (8 * b);
    }
    return h;
}

/* ids that no page has: random (libcrypto's CSPRNG, and failing that the
 * ids' own address and the clock) */
static void duet__hash_unmatchable(duet_kv_page_hash_t *hashes, int n)
{
    if (n <= 0 || duet_random_bytes(hashes, (size_t)n * sizeof(*hashes)) == DUET_OK)
        return;
    for (int i = 0; i < n; i++) {
        hashes[i].lo = (uint64_t)(uintptr_t)&hashes[i] ^ (uint64_t)duet_now_ns();
        hashes[i].hi = ~(uint64_t)i ^ (uint64_t)duet_now_ns() << 17;
    }
}

duet_status_t duet_kv_page_hash_chain_from(duet_kv_page_hash_t parent, const int32_t *tokens,
                                           int n_pages, int page_size, duet_kv_page_hash_t *hashes)
{
    duet_sha256_t s;
    duet_status_t st;

    if (n_pages <= 0)
        return DUET_OK;
    if ((st = duet_sha256_init(&s)) != DUET_OK) {
        duet__hash_unmatchable(hashes, n_pages);
        return st;
    }
    /* per page: SHA-256 of the parent's 16 bytes, then the page's tokens as
     * 32-bit little endian; the bytes go to the hash a buffer at a time
     * (one update per page up to 60 tokens: the cost is the blocks) */
    for (int i = 0; i < n_pages; i++) {
        uint8_t buf[256], digest[DUET_SHA256_LEN];
        const int32_t *tok = tokens + (size_t)i * (size_t)page_size;
        size_t n = 16;
        for (int b = 0; b < 8; b++) {
            buf[b] = (uint8_t)(parent.lo >> (8 * b));
            buf[8 + b] = (uint8_t)(parent.hi >> (8 * b));
        }
        for (int t = 0; t < page_size; t++) {
            for (int b = 0; b < 4; b++)
                buf[n + (size_t)b] = (uint8_t)((uint32_t)tok[t] >> (8 * b));
            if ((n += 4) == sizeof(buf)) {
                duet_sha256_update(&s, buf, n);
                n = 0;
            }
        }
        duet_sha256_update(&s, buf, n);
        if ((st = duet_sha256_restart(&s, digest)) != DUET_OK) {
            /* a caller that goes on caches these pages under ids that
             * match no prompt */
            duet__hash_unmatchable(hashes + i, n_pages - i);
            break;
        }
        hashes[i] = parent = duet__digest_hash(digest);
    }
    duet_sha256_cleanup(&s);
    return st;
}

int duet_kv_prefix_lookup_pages(int n_tokens, int page_size)
{
    return n_tokens > 0 ? (n_tokens - 1) / page_size : 0;
}

int duet_kv_prefix_insert_pages(int n_tokens, int page_size)
{
    return n_tokens > 0 ? n_tokens / page_size : 0;
}

void duet__kv_prefix_destroy(duet_kv_prefix_t *c)
{
    if (c == NULL)
        return;
    duet_free(c->hash);
    duet_free(c->cached);
    duet_free(c->chain);
    duet_free(c->buckets);
    duet_free(c->lru_prev);
    duet_free(c->lru_next);
    duet_free(c);
}

duet_status_t duet_kv_pool_cache_enable(duet_kv_pool_t *pool)
{
    size_t n = (size_t)pool->n_pages, nb = 1;
    duet_kv_prefix_t *c;

    if (pool->prefix != NULL)
        return DUET_OK;
    while (nb < n)
        nb <<= 1;
    c = DUET_NEW(duet_kv_prefix_t);
    if (c == NULL)
        goto err;
    c->hash = DUET_NEW_ARRAY(duet_kv_page_hash_t, n);
    c->cached = DUET_NEW_ARRAY(uint8_t, n);
    c->chain = DUET_NEW_ARRAY(int32_t, n);
    c->buckets = DUET_NEW_ARRAY(int32_t, nb);
    c->lru_prev = DUET_NEW_ARRAY(int32_t, n);
    c->lru_next = DUET_NEW_ARRAY(int32_t, n);
    if (c->hash == NULL || c->cached == NULL || c->chain == NULL || c->buckets == NULL ||
        c->lru_prev == NULL || c->lru_next == NULL)
        goto err_destroy;
    memset(c->buckets, 0xff, nb * sizeof(int32_t));
    c->mask = (uint32_t)(nb - 1);
    c->lru_head = c->lru_tail = -1;
    pthread_mutex_lock(&pool->lock);
    pool->prefix = c;
    pthread_mutex_unlock(&pool->lock);
    return DUET_OK;

err_destroy:
    duet__kv_prefix_destroy(c);
err:
    return duet_error(DUET_ERR_NO_MEMORY, "prefix cache: no memory for %d pages", pool->n_pages);
}

bool duet_kv_pool_cache_enabled(duet_kv_pool_t *pool)
{
    pthread_mutex_lock(&pool->lock);
    bool on = pool->prefix != NULL;
    pthread_mutex_unlock(&pool->lock);
    return on;
}

static uint32_t duet__bucket(const duet_kv_prefix_t *c, duet_kv_page_hash_t h)
{
    return (uint32_t)h.lo & c->mask; /* the hash is uniform already */
}

static int32_t duet__find(const duet_kv_prefix_t *c, duet_kv_page_hash_t h)
{
    for (int32_t p = c->buckets[duet__bucket(c, h)]; p >= 0; p = c->chain[p]) {
        if (c->hash[p].lo == h.lo && c->hash[p].hi == h.hi)
            return p;
    }
    return -1;
}

static void duet__lru_remove(duet_kv_prefix_t *c, int32_t p)
{
    int32_t prev = c->lru_prev[p], next = c->lru_next[p];
    if (prev >= 0)
        c->lru_next[prev] = next;
    else
        c->lru_head = next;
    if (next >= 0)
        c->lru_prev[next] = prev;
    else
        c->lru_tail = prev;
    c->n_idle--;
}

static void duet__lru_push(duet_kv_prefix_t *c, int32_t p)
{
    c->lru_prev[p] = c->lru_tail;
    c->lru_next[p] = -1;
    if (c->lru_tail >= 0)
        c->lru_next[c->lru_tail] = p;
    else
        c->lru_head = p;
    c->lru_tail = p;
    c->n_idle++;
}

void duet__kv_prefix_on_last_user(duet_kv_pool_t *pool, int32_t p)
{
    duet_kv_prefix_t *c = pool->prefix;
    if (c != NULL && c->cached[p])
        duet__lru_push(c, p);
}

void duet__kv_prefix_on_new_user(duet_kv_pool_t *pool, int32_t p)
{
    duet_kv_prefix_t *c = pool->prefix;
    if (c != NULL && c->cached[p])
        duet__lru_remove(c, p);
}

int32_t duet__kv_prefix_evict_one(duet_kv_pool_t *pool)
{
    duet_kv_prefix_t *c = pool->prefix;
    int32_t p;

    if (c == NULL || (p = c->lru_head) < 0)
        return -1;
    duet__lru_remove(c, p);
    for (int32_t *pp = &c->buckets[duet__bucket(c, c->hash[p])]; *pp >= 0; pp = &c->chain[*pp]) {
        if (*pp == p) {
            *pp = c->chain[p];
            break;
        }
    }
    c->cached[p] = 0;
    c->n_cached--;
    c->evictions++;
    pool->refs[p] = 0; /* idle: the cache's reference was the only one */
    pool->n_free++;
    return p;
}

int duet_kv_pool_cache_match(duet_kv_pool_t *pool, const duet_kv_page_hash_t *hashes, int n,
                             int query_tokens, int page_size, int32_t *pages)
{
    duet_kv_prefix_t *c;
    int k = 0;

    pthread_mutex_lock(&pool->lock);
    c = pool->prefix;
    if (c == NULL) {
        pthread_mutex_unlock(&pool->lock);
        return 0;
    }
    for (; k < n; k++) {
        int32_t p = duet__find(c, hashes[k]);
        if (p < 0 || pool->refs[p] == UINT16_MAX)
            break;
        if (pool->refs[p] == 1)
            duet__lru_remove(c, p);
        pool->refs[p]++;
        pages[k] = p;
    }
    c->lookups++;
    c->lookup_tokens += (uint64_t)(query_tokens > 0 ? query_tokens : 0);
    c->hit_pages += (uint64_t)k;
    c->hit_tokens += (uint64_t)k * (uint64_t)page_size;
    pthread_mutex_unlock(&pool->lock);
    return k;
}

int duet_kv_pool_cache_insert(duet_kv_pool_t *pool, const duet_kv_page_hash_t *hashes,
                              const int32_t *pages, int n)
{
    duet_kv_prefix_t *c;
    int added = 0;

    pthread_mutex_lock(&pool->lock);
    c = pool->prefix;
    for (int i = 0; c != NULL && i < n; i++) {
        int32_t p = pages[i];
        if (p < 0 || p >= pool->n_pages || pool->refs[p] == 0 || pool->refs[p] == UINT16_MAX ||
            c->cached[p] || duet__find(c, hashes[i]) >= 0)
            continue;
        uint32_t b = duet__bucket(c, hashes[i]);
        c->hash[p] = hashes[i];
        c->cached[p] = 1;
        c->chain[p] = c->buckets[b];
        c->buckets[b] = p;
        c->n_cached++;
        pool->refs[p]++; /* the cache's own; the caller still holds one */
        added++;
    }
    if (c != NULL)
        c->inserted_pages += (uint64_t)added;
    pthread_mutex_unlock(&pool->lock);
    return added;
}

int duet_kv_pool_release_chain(duet_kv_pool_t *pool, const int32_t *pages, int n)
{
    int freed = 0;
    for (int i = n - 1; i >= 0; i--)
        freed += duet_kv_pool_release(pool, &pages[i], 1);
    return freed;
}

int duet_kv_pool_cache_clear(duet_kv_pool_t *pool)
{
    int n = 0;
    pthread_mutex_lock(&pool->lock);
    while (duet__kv_prefix_evict_one(pool) >= 0)
        n++;
    pthread_mutex_unlock(&pool->lock);
    return n;
}

int duet_kv_pool_cache_forget(duet_kv_pool_t *pool)
{
    duet_kv_prefix_t *c;
    int n = 0;

    pthread_mutex_lock(&pool->lock);
    c = pool->prefix;
    while (c != NULL && duet__kv_prefix_evict_one(pool) >= 0)
        n++;
    for (int32_t p = 0; c != NULL && p < pool->n_pages; p++) {
        if (!c->cached[p])
            continue;
        /* held by a request (idle ones went above): its count stays >= 1 */
        c->cached[p] = 0;
        c->chain[p] = -1;
        c->n_cached--;
        c->evictions++;
        pool->refs[p]--;
        n++;
    }
    if (c != NULL)
        for (uint32_t b = 0; b <= c->mask; b++)
            c->buckets[b] = -1;
    pthread_mutex_unlock(&pool->lock);
    return n;
}

void duet_kv_pool_stats(duet_kv_pool_t *pool, duet_kv_pool_stats_t *stats_p)
{
    duet_kv_pool_stats_t s;
    memset(&s, 0, sizeof(s));
    pthread_mutex_lock(&pool->lock);
    const duet_kv_prefix_t *c = pool->prefix;
    s.total = pool->n_pages;
    for (int p = 0; p < pool->n_pages; p++) {
        bool cached = c != NULL && c->cached[p];
        if (pool->refs[p] == 0)
            s.free++;
        else if (cached && pool->refs[p] == 1)
            s.cached_idle++;
        else
            s.in_use++;
        s.cached += cached;
        s.shared += cached && pool->refs[p] >= 2;
    }
    if (c != NULL) {
        s.lookups = c->lookups;
        s.lookup_tokens = c->lookup_tokens;
        s.hit_tokens = c->hit_tokens;
        s.hit_pages = c->hit_pages;
        s.inserted_pages = c->inserted_pages;
        s.evictions = c->evictions;
    }
    pthread_mutex_unlock(&pool->lock);
    *stats_p = s;
}
