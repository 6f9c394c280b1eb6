/* KV page allocator: hands out page ids of one pool.  All-or-nothing, and
 * prefers the lowest contiguous run so that transfers coalesce.
 * Thread-safe (an internal mutex). */
#ifndef DUET_ENGINE_PAGE_ALLOC_H
#define DUET_ENGINE_PAGE_ALLOC_H

#include <stdint.h>

#include "common/status.h"

typedef struct duet_page_alloc duet_page_alloc_t;

duet_status_t duet_page_alloc_create(int n_pages, duet_page_alloc_t **pa_p);
void duet_page_alloc_destroy(duet_page_alloc_t *pa);

/* Take n pages into pages[0..n).  DUET_ERR_EXHAUSTED (nothing taken) when
 * fewer than n are free. */
duet_status_t duet_page_alloc_get(duet_page_alloc_t *pa, int n, int32_t *pages);

/* Return pages.  A page that is out of range or already free is a bug in
 * the caller: it is logged and ignored, never double-freed. Returns the
 * number of pages actually returned. */
int duet_page_alloc_put(duet_page_alloc_t *pa, const int32_t *pages, int n);

int duet_page_alloc_free_count(duet_page_alloc_t *pa);
int duet_page_alloc_total(const duet_page_alloc_t *pa);

#endif
