#include "kv/pool.h"

#include <pthread.h>
#include <stdbool.h>

#include "common/alloc.h"
#include "common/log.h"
#include "kv/pool_internal.h"

#define DUET__KV_POOL_REFS_MAX UINT16_MAX

duet_status_t duet_kv_pool_create(int n_pages, duet_kv_pool_t **pool_p)
{
    duet_kv_pool_t *pool;

    if (n_pages <= 0)
        return duet_error(DUET_ERR_INVALID, "kv pool: n_pages %d must be positive", n_pages);
    pool = DUET_NEW(duet_kv_pool_t);
    if (pool == NULL)
        goto err;
    pool->refs = DUET_NEW_ARRAY(uint16_t, (size_t)n_pages);
    if (pool->refs == NULL)
        goto err_free_pool;
    pthread_mutex_init(&pool->lock, NULL);
    pool->n_pages = n_pages;
    pool->n_free = n_pages;
    *pool_p = pool;
    return DUET_OK;

err_free_pool:
    duet_free(pool);
err:
    return duet_error(DUET_ERR_NO_MEMORY, "kv pool: no memory for %d pages", n_pages);
}

void duet_kv_pool_destroy(duet_kv_pool_t *pool)
{
    if (pool == NULL)
        return;
    pthread_mutex_destroy(&pool->lock);
    duet__kv_prefix_destroy(pool->prefix);
    duet_free(pool->refs);
    duet_free(pool);
}

/* First contiguous run of n free pages at or after start, or -1. */
static int duet__kv_pool_find_run(const duet_kv_pool_t *pool, int start, int n)
{
    int run = 0;
    for (int i = start; i < pool->n_pages; i++) {
        run = pool->refs[i] ? 0 : run + 1;
        if (run == n)
            return i - n + 1;
    }
    return -1;
}

/* A run of n free pages that contains page p, or -1. */
static int duet__kv_pool_run_around(const duet_kv_pool_t *pool, int32_t p, int n)
{
    int lo = p, hi = p;
    while (lo > 0 && p - lo + 1 < n && pool->refs[lo - 1] == 0)
        lo--;
    while (hi + 1 < pool->n_pages && hi - lo + 1 < n && pool->refs[hi + 1] == 0)
        hi++;
    return hi - lo + 1 >= n ? lo : -1;
}

duet_status_t duet_kv_pool_alloc(duet_kv_pool_t *pool, int n, int32_t *pages)
{
    int first;

    if (n < 0)
        return duet_error(DUET_ERR_INVALID, "kv pool: negative count %d", n);
    if (n == 0)
        return DUET_OK;
    pthread_mutex_lock(&pool->lock);
    /* idle cached pages go before allocation fails (and none when it
     * would fail anyway) */
    while (n > pool->n_free && n <= pool->n_free + duet__kv_prefix_idle(pool) &&
           duet__kv_prefix_evict_one(pool) >= 0)
        ;
    if (n > pool->n_free) {
        int free_now = pool->n_free;
        pthread_mutex_unlock(&pool->lock);
        return duet_error(DUET_ERR_EXHAUSTED, "kv pool: %d pages needed, %d free of %d", n,
                          free_now, pool->n_pages);
    }
    first = duet__kv_pool_find_run(pool, pool->hint, n);
    if (first < 0 && pool->hint > 0)
        first = duet__kv_pool_find_run(pool, 0, n);
    if (first >= 0) {
        for (int i = 0; i < n; i++) {
            pool->refs[first + i] = 1;
            pages[i] = first + i;
        }
        pool->hint = first + n < pool->n_pages ? first + n : 0;
    } else {
        /* fragmented: take the lowest free pages */
        int k = 0;
        for (int i = 0; i < pool->n_pages && k < n; i++) {
            if (pool->refs[i] == 0) {
                pool->refs[i] = 1;
                pages[k++] = i;
            }
        }
    }
    pool->n_free -= n;
    pthread_mutex_unlock(&pool->lock);
    return DUET_OK;
}

duet_status_t duet_kv_pool_alloc_run(duet_kv_pool_t *pool, int n, int32_t *first_p)
{
    int first;

    if (n <= 0)
        return duet_error(DUET_ERR_INVALID, "kv pool: run of %d pages", n);
    pthread_mutex_lock(&pool->lock);
    while (n > pool->n_free && n <= pool->n_free + duet__kv_prefix_idle(pool) &&
           duet__kv_prefix_evict_one(pool) >= 0)
        ;
    first = n <= pool->n_free ? duet__kv_pool_find_run(pool, 0, n) : -1;
    /* evict idle cached pages until one completes a run */
    while (first < 0 && n <= pool->n_free) {
        int32_t p = duet__kv_prefix_evict_one(pool);
        if (p < 0)
            break;
        first = duet__kv_pool_run_around(pool, p, n);
    }
    if (first < 0) {
        int free_now = pool->n_free;
        pthread_mutex_unlock(&pool->lock);
        return duet_error(DUET_ERR_EXHAUSTED,
                          "kv pool: no run of %d consecutive pages (%d free of %d)", n, free_now,
                          pool->n_pages);
    }
    for (int i = 0; i < n; i++)
        pool->refs[first + i] = 1;
    pool->n_free -= n;
    pthread_mutex_unlock(&pool->lock);
    *first_p = first;
    return DUET_OK;
}

duet_status_t duet_kv_pool_ref(duet_kv_pool_t *pool, const int32_t *pages, int n)
{
    pthread_mutex_lock(&pool->lock);
    for (int i = 0; i < n; i++) {
        int32_t p = pages[i];
        if (p < 0 || p >= pool->n_pages || pool->refs[p] == 0 ||
            pool->refs[p] == DUET__KV_POOL_REFS_MAX) {
            int held = p >= 0 && p < pool->n_pages ? pool->refs[p] : -1;
            pthread_mutex_unlock(&pool->lock);
            return duet_error(DUET_ERR_INVALID,
                              "kv pool: cannot reference page %d (of %d, %d references)", (int)p,
                              pool->n_pages, held);
        }
    }
    for (int i = 0; i < n; i++) {
        if (pool->refs[pages[i]] == 1)
            duet__kv_prefix_on_new_user(pool, pages[i]);
        pool->refs[pages[i]]++;
    }
    pthread_mutex_unlock(&pool->lock);
    return DUET_OK;
}

/* Drop one reference from page p (lock held); true when it became free. */
static bool duet__kv_pool_unref(duet_kv_pool_t *pool, int32_t p)
{
    if (p < 0 || p >= pool->n_pages || pool->refs[p] == 0) {
        DUET_LOG_ERROR("kv pool: bad release of page %d (of %d)", (int)p, pool->n_pages);
        return false;
    }
    if (--pool->refs[p] == 1)
        duet__kv_prefix_on_last_user(pool, p);
    return pool->refs[p] == 0;
}

int duet_kv_pool_release(duet_kv_pool_t *pool, const int32_t *pages, int n)
{
    int freed = 0;
    pthread_mutex_lock(&pool->lock);
    for (int i = 0; i < n; i++)
        freed += duet__kv_pool_unref(pool, pages[i]);
    pool->n_free += freed;
    pthread_mutex_unlock(&pool->lock);
    return freed;
}

int duet_kv_pool_release_run(duet_kv_pool_t *pool, int32_t first, int n)
{
    int freed = 0;
    pthread_mutex_lock(&pool->lock);
    for (int i = 0; i < n; i++)
        freed += duet__kv_pool_unref(pool, first + i);
    pool->n_free += freed;
    pthread_mutex_unlock(&pool->lock);
    return freed;
}

int duet_kv_pool_refs(duet_kv_pool_t *pool, int32_t page)
{
    if (page < 0 || page >= pool->n_pages)
        return -1;
    pthread_mutex_lock(&pool->lock);
    int refs = pool->refs[page];
    pthread_mutex_unlock(&pool->lock);
    return refs;
}

int duet_kv_pool_free_count(duet_kv_pool_t *pool)
{
    pthread_mutex_lock(&pool->lock);
    int n = pool->n_free + (pool->prefix != NULL ? pool->prefix->n_idle : 0);
    pthread_mutex_unlock(&pool->lock);
    return n;
}

int duet_kv_pool_total(const duet_kv_pool_t *pool)
{
    return pool->n_pages;
}
