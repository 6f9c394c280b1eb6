#include "engine/page_alloc.h"

#include <pthread.h>

#include "common/alloc.h"
#include "common/log.h"

struct duet_page_alloc {
    pthread_mutex_t lock;
    int n_pages;
    int n_free;
    int hint; /* where the next search starts */
    uint8_t *used; /* [n_pages] */
};

duet_status_t duet_page_alloc_create(int n_pages, duet_page_alloc_t **pa_p)
{
    duet_page_alloc_t *pa;

    if (n_pages <= 0)
        return duet_error(DUET_ERR_INVALID, "page allocator: n_pages %d must be positive",
                          n_pages);
    pa = DUET_NEW(duet_page_alloc_t);
    if (pa == NULL)
        goto err;
    pa->used = DUET_NEW_ARRAY(uint8_t, (size_t)n_pages);
    if (pa->used == NULL)
        goto err_free_pa;
    pthread_mutex_init(&pa->lock, NULL);
    pa->n_pages = n_pages;
    pa->n_free = n_pages;
    *pa_p = pa;
    return DUET_OK;

err_free_pa:
    duet_free(pa);
err:
    return duet_error(DUET_ERR_NO_MEMORY, "page allocator: no memory for %d pages", n_pages);
}

void duet_page_alloc_destroy(duet_page_alloc_t *pa)
{
    if (pa == NULL)
        return;
    pthread_mutex_destroy(&pa->lock);
    duet_free(pa->used);
    duet_free(pa);
}

/* First contiguous run of n free pages at or after start, or -1. */
static int duet__find_run(const duet_page_alloc_t *pa, int start, int n)
{
    int run = 0;
    for (int i = start; i < pa->n_pages; i++) {
        run = pa->used[i] ? 0 : run + 1;
        if (run == n)
            return i - n + 1;
    }
    return -1;
}

duet_status_t duet_page_alloc_get(duet_page_alloc_t *pa, int n, int32_t *pages)
{
    int first;

    if (n < 0)
        return duet_error(DUET_ERR_INVALID, "page allocator: negative count %d", n);
    if (n == 0)
        return DUET_OK;
    pthread_mutex_lock(&pa->lock);
    if (n > pa->n_free) {
        int free_now = pa->n_free;
        pthread_mutex_unlock(&pa->lock);
        return duet_error(DUET_ERR_EXHAUSTED, "kv pool: %d pages needed, %d free of %d", n,
                          free_now, pa->n_pages);
    }
    first = duet__find_run(pa, pa->hint, n);
    if (first < 0 && pa->hint > 0)
        first = duet__find_run(pa, 0, n);
    if (first >= 0) {
        for (int i = 0; i < n; i++) {
            pa->used[first + i] = 1;
            pages[i] = first + i;
        }
        pa->hint = first + n < pa->n_pages ? first + n : 0;
    } else {
        /* fragmented: take the lowest free pages */
        int k = 0;
        for (int i = 0; i < pa->n_pages && k < n; i++) {
            if (!pa->used[i]) {
                pa->used[i] = 1;
                pages[k++] = i;
            }
        }
    }
    pa->n_free -= n;
    pthread_mutex_unlock(&pa->lock);
    return DUET_OK;
}

int duet_page_alloc_put(duet_page_alloc_t *pa, const int32_t *pages, int n)
{
    int returned = 0;
    pthread_mutex_lock(&pa->lock);
    for (int i = 0; i < n; i++) {
        int32_t p = pages[i];
        if (p < 0 || p >= pa->n_pages || !pa->used[p]) {
            DUET_LOG_ERROR("page allocator: bad free of page %d (of %d)", (int)p, pa->n_pages);
            continue;
        }
        pa->used[p] = 0;
        returned++;
    }
    pa->n_free += returned;
    pthread_mutex_unlock(&pa->lock);
    return returned;
}

int duet_page_alloc_free_count(duet_page_alloc_t *pa)
{
    pthread_mutex_lock(&pa->lock);
    int n = pa->n_free;
    pthread_mutex_unlock(&pa->lock);
    return n;
}

int duet_page_alloc_total(const duet_page_alloc_t *pa)
{
    return pa->n_pages;
}
