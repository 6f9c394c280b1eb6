#include "common/alloc.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static atomic_long duet__fail_after = -1;
static atomic_long duet__live;
static atomic_long duet__failures;

static int duet__should_fail(void)
{
    long n = atomic_load_explicit(&duet__fail_after, memory_order_relaxed);
    if (n < 0)
        return 0;
    for (;;) {
        if (n == 0) {
            atomic_fetch_add(&duet__failures, 1);
            return 1;
        }
        if (atomic_compare_exchange_weak(&duet__fail_after, &n, n - 1))
            return 0;
        if (n < 0)
            return 0;
    }
}

void duet_alloc_fail_after(long n)
{
    atomic_store(&duet__fail_after, n);
}

long duet_alloc_live(void)
{
    return atomic_load(&duet__live);
}

long duet_alloc_failures(void)
{
    return atomic_load(&duet__failures);
}

void *duet_malloc(size_t size)
{
    void *p;
    if (duet__should_fail())
        return NULL;
    p = malloc(size ? size : 1);
    if (p != NULL)
        atomic_fetch_add_explicit(&duet__live, 1, memory_order_relaxed);
    return p;
}

void *duet_calloc(size_t n, size_t size)
{
    void *p;
    if (duet__should_fail())
        return NULL;
    p = calloc(n ? n : 1, size ? size : 1);
    if (p != NULL)
        atomic_fetch_add_explicit(&duet__live, 1, memory_order_relaxed);
    return p;
}

void *duet_realloc(void *ptr, size_t size)
{
    void *p;
    if (ptr == NULL)
        return duet_malloc(size);
    if (duet__should_fail())
        return NULL;
    p = realloc(ptr, size ? size : 1);
    return p;
}

void duet_free(void *ptr)
{
    if (ptr == NULL)
        return;
    atomic_fetch_sub_explicit(&duet__live, 1, memory_order_relaxed);
    free(ptr);
}

char *duet_strndup(const char *s, size_t n)
{
    size_t len = strnlen(s, n);
    char *d = duet_malloc(len + 1);
    if (d == NULL)
        return NULL;
    memcpy(d, s, len);
    d[len] = '\0';
    return d;
}

char *duet_strdup(const char *s)
{
    return duet_strndup(s, strlen(s));
}

void *duet_aligned_alloc(size_t alignment, size_t size)
{
    void *p = NULL;
    if (duet__should_fail())
        return NULL;
    if (posix_memalign(&p, alignment, size ? size : alignment) != 0)
        return NULL;
    atomic_fetch_add_explicit(&duet__live, 1, memory_order_relaxed);
    return p;
}

void duet_aligned_free(void *ptr)
{
    duet_free(ptr);
}
