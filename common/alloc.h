/* The one allocator.  All duet heap memory goes through these so that tests
 * can make allocations fail (duet_alloc_fail_after) and exercise every
 * out-of-memory path, in the manner of SQLite's test_malloc.
 *
 * Thread-safe.  duet_free/duet_aligned_free accept NULL. */
#ifndef DUET_COMMON_ALLOC_H
#define DUET_COMMON_ALLOC_H

#include <stddef.h>

void *duet_malloc(size_t size);
void *duet_calloc(size_t n, size_t size);
void *duet_realloc(void *ptr, size_t size);
void duet_free(void *ptr);
char *duet_strdup(const char *s);
char *duet_strndup(const char *s, size_t n);

/* alignment is a power of two >= sizeof(void *); free with duet_aligned_free */
void *duet_aligned_alloc(size_t alignment, size_t size);
void duet_aligned_free(void *ptr);

/* Test hooks.  After n more successful allocations every allocation fails
 * (n < 0 disables injection).  duet_alloc_live() is the number of blocks
 * allocated and not yet freed, for leak checks in tests. */
void duet_alloc_fail_after(long n);
long duet_alloc_live(void);
long duet_alloc_failures(void);

#define DUET_NEW(type) ((type *)duet_calloc(1, sizeof(type)))
#define DUET_NEW_ARRAY(type, n) ((type *)duet_calloc((n), sizeof(type)))

#endif
