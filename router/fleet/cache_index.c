/* Chained page keys and the bounded LRU key set (cache_index.h).
 *
 * Nodes live in one array that doubles up to max_pages; they are linked
 * by index (NIL = none) into the LRU list, the bucket chains and the free
 * list.  Buckets are a power of two at least the node capacity (load
 * factor <= 1), rebuilt when the nodes grow. */
#include "router/fleet/cache_index.h"

#include <stdbool.h>
#include <string.h>

#include "common/alloc.h"

#define DUET__NIL UINT32_MAX

typedef struct {
    uint64_t key;
    uint32_t prev, next; /* LRU list (prev: more recent); free list: next */
    uint32_t hnext;      /* bucket chain */
} duet__ci_node_t;

struct duet_router_cache_index {
    size_t max_pages;
    duet__ci_node_t *nodes;
    uint32_t cap;  /* nodes allocated */
    uint32_t used; /* nodes ever handed out (the rest of cap is untouched) */
    uint32_t *buckets;
    uint32_t n_buckets;  /* 0 or a power of two */
    uint32_t head, tail; /* most and least recent */
    uint32_t free;
    size_t pages;
    uint64_t evicted;
};

/* fmix64 (a bijection): each step mixes the whole state. */
static uint64_t duet__mix(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h;
}

duet_status_t duet_router_cache_keys(const int32_t *ids, size_t n_ids, size_t page_size,
                                     uint64_t **keys_p, size_t *n_p)
{
    size_t n = page_size ? n_ids / page_size : 0;
    uint64_t h = 0x6475657470726678ull, *keys;

    *keys_p = NULL;
    *n_p = 0;
    if (n == 0)
        return DUET_OK;
    if ((keys = duet_malloc(n * sizeof(*keys))) == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "router: no memory for page keys");
    for (size_t k = 0; k < n; k++) {
        for (size_t t = k * page_size; t < (k + 1) * page_size; t++)
            h = duet__mix(h ^ (uint64_t)(uint32_t)ids[t]);
        keys[k] = h ? h : 1; /* 0 marks nothing */
    }
    *keys_p = keys;
    *n_p = n;
    return DUET_OK;
}

duet_status_t duet_router_cache_index_create(size_t max_pages, duet_router_cache_index_t **ci_p)
{
    duet_router_cache_index_t *ci = DUET_NEW(duet_router_cache_index_t);
    if (ci == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "router: no memory for a cache index");
    if (max_pages > UINT32_MAX / 4)
        max_pages = UINT32_MAX / 4;
    ci->max_pages = max_pages ? max_pages : 1;
    ci->head = ci->tail = ci->free = DUET__NIL;
    *ci_p = ci;
    return DUET_OK;
}

void duet_router_cache_index_destroy(duet_router_cache_index_t *ci)
{
    if (ci == NULL)
        return;
    duet_free(ci->nodes);
    duet_free(ci->buckets);
    duet_free(ci);
}

void duet_router_cache_index_clear(duet_router_cache_index_t *ci)
{
    ci->used = 0;
    ci->pages = 0;
    ci->head = ci->tail = ci->free = DUET__NIL;
    if (ci->buckets != NULL)
        memset(ci->buckets, 0xff, (size_t)ci->n_buckets * sizeof(*ci->buckets));
}

static uint32_t duet__ci_bucket(const duet_router_cache_index_t *ci, uint64_t key)
{
    return (uint32_t)(key ^ (key >> 32)) & (ci->n_buckets - 1);
}

static uint32_t duet__ci_find(const duet_router_cache_index_t *ci, uint64_t key)
{
    if (ci->n_buckets == 0)
        return DUET__NIL;
    for (uint32_t i = ci->buckets[duet__ci_bucket(ci, key)]; i != DUET__NIL; i = ci->nodes[i].hnext)
        if (ci->nodes[i].key == key)
            return i;
    return DUET__NIL;
}

size_t duet_router_cache_index_match(const duet_router_cache_index_t *ci, const uint64_t *keys,
                                     size_t n)
{
    size_t k = 0;
    while (k < n && duet__ci_find(ci, keys[k]) != DUET__NIL)
        k++;
    return k;
}

static void duet__lru_unlink(duet_router_cache_index_t *ci, uint32_t i)
{
    duet__ci_node_t *x = &ci->nodes[i];
    if (x->prev != DUET__NIL)
        ci->nodes[x->prev].next = x->next;
    else
        ci->head = x->next;
    if (x->next != DUET__NIL)
        ci->nodes[x->next].prev = x->prev;
    else
        ci->tail = x->prev;
}

static void duet__ci_lru_push(duet_router_cache_index_t *ci, uint32_t i)
{
    duet__ci_node_t *x = &ci->nodes[i];
    x->prev = DUET__NIL;
    x->next = ci->head;
    if (ci->head != DUET__NIL)
        ci->nodes[ci->head].prev = i;
    ci->head = i;
    if (ci->tail == DUET__NIL)
        ci->tail = i;
}

/* Drop the least recent key; its node goes to the free list. */
static void duet__evict(duet_router_cache_index_t *ci)
{
    uint32_t i = ci->tail, *p;
    if (i == DUET__NIL)
        return;
    duet__lru_unlink(ci, i);
    for (p = &ci->buckets[duet__ci_bucket(ci, ci->nodes[i].key)]; *p != i; p = &ci->nodes[*p].hnext)
        ;
    *p = ci->nodes[i].hnext;
    ci->nodes[i].next = ci->free;
    ci->free = i;
    ci->pages--;
    ci->evicted++;
}

/* Double the nodes (up to max_pages) and rebuild the buckets; false when
 * memory does not allow it (nothing changes then). */
static bool duet__ci_grow(duet_router_cache_index_t *ci)
{
    size_t cap = ci->cap ? (size_t)ci->cap * 2 : 64, nb = 1;
    duet__ci_node_t *nodes;
    uint32_t *buckets;

    if (cap > ci->max_pages)
        cap = ci->max_pages;
    if (cap <= ci->cap)
        return false;
    while (nb < cap)
        nb *= 2;
    if ((buckets = duet_malloc(nb * sizeof(*buckets))) == NULL)
        return false;
    if ((nodes = duet_realloc(ci->nodes, cap * sizeof(*nodes))) == NULL) {
        duet_free(buckets);
        return false;
    }
    memset(buckets, 0xff, nb * sizeof(*buckets));
    ci->nodes = nodes;
    ci->cap = (uint32_t)cap;
    duet_free(ci->buckets);
    ci->buckets = buckets;
    ci->n_buckets = (uint32_t)nb;
    for (uint32_t i = ci->head; i != DUET__NIL; i = ci->nodes[i].next) {
        uint32_t b = duet__ci_bucket(ci, ci->nodes[i].key);
        ci->nodes[i].hnext = ci->buckets[b];
        ci->buckets[b] = i;
    }
    return true;
}

/* A node for a new key: a free one, an untouched one, a new one, or the
 * least recent key's; DUET__NIL when there is none at all. */
static uint32_t duet__ci_node_alloc(duet_router_cache_index_t *ci)
{
    uint32_t i;
    if (ci->pages >= ci->max_pages)
        duet__evict(ci);
    if (ci->free == DUET__NIL && ci->used == ci->cap && !duet__ci_grow(ci))
        duet__evict(ci);
    if (ci->free != DUET__NIL) {
        i = ci->free;
        ci->free = ci->nodes[i].next;
        return i;
    }
    return ci->used < ci->cap ? ci->used++ : DUET__NIL;
}

void duet_router_cache_index_insert(duet_router_cache_index_t *ci, const uint64_t *keys, size_t n)
{
    if (n > ci->max_pages)
        n = ci->max_pages;
    for (size_t k = n; k-- > 0;) {
        uint32_t i = duet__ci_find(ci, keys[k]);
        if (i != DUET__NIL) {
            duet__lru_unlink(ci, i);
            duet__ci_lru_push(ci, i);
            continue;
        }
        if ((i = duet__ci_node_alloc(ci)) == DUET__NIL)
            return;
        ci->nodes[i].key = keys[k];
        uint32_t b = duet__ci_bucket(ci, keys[k]);
        ci->nodes[i].hnext = ci->buckets[b];
        ci->buckets[b] = i;
        duet__ci_lru_push(ci, i);
        ci->pages++;
    }
}

size_t duet_router_cache_index_pages(const duet_router_cache_index_t *ci)
{
    return ci->pages;
}

uint64_t duet_router_cache_index_evicted(const duet_router_cache_index_t *ci)
{
    return ci->evicted;
}
