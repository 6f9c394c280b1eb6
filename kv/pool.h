/* The KV page pool: hands out the page ids of one daemon's KV cache (the
 * ids are the same on every rank, DESIGN §2) and counts references to them.
 *
 * A page is free (0 references) or held by one or more owners: a request
 * takes pages with duet_kv_pool_alloc (1 reference each), another owner that
 * shares them (the prefix cache, a second request reading a shared prefix)
 * adds one with duet_kv_pool_ref, and every owner drops its own with
 * duet_kv_pool_release; a page is free again when its last reference goes.
 * Allocation is all-or-nothing and prefers the lowest contiguous run, so
 * transfers coalesce.  With a prefix cache (kv/prefix_cache.h) a page the
 * cache alone still references is idle: allocation evicts idle pages (least
 * recently used first) before it reports DUET_ERR_EXHAUSTED.  Thread-safe
 * (an internal mutex). */
#ifndef DUET_KV_POOL_H
#define DUET_KV_POOL_H

#include <stdint.h>

#include "common/status.h"

typedef struct duet_kv_pool duet_kv_pool_t;

/* DUET_ERR_INVALID for n_pages <= 0, DUET_ERR_NO_MEMORY. */
duet_status_t duet_kv_pool_create(int n_pages, duet_kv_pool_t **pool_p);
/* Accepts NULL. */
void duet_kv_pool_destroy(duet_kv_pool_t *pool);

/* Take n free pages into pages[0..n), one reference each.
 * DUET_ERR_EXHAUSTED (nothing taken) when fewer than n are free. */
duet_status_t duet_kv_pool_alloc(duet_kv_pool_t *pool, int n, int32_t *pages);

/* Take n consecutive free pages [*first_p, *first_p + n), one reference
 * each (staging for packed transfers, transfer/xfer_pack.h).
 * DUET_ERR_EXHAUSTED (nothing taken) when no such run is free, even if n
 * scattered pages are. */
duet_status_t duet_kv_pool_alloc_run(duet_kv_pool_t *pool, int n, int32_t *first_p);

/* duet_kv_pool_release of the n pages [first, first + n), under one lock. */
int duet_kv_pool_release_run(duet_kv_pool_t *pool, int32_t first, int n);

/* Add one reference to each of pages[0..n), which must be held already.
 * All-or-nothing: a page out of range or free is DUET_ERR_INVALID and no
 * count changes. */
duet_status_t duet_kv_pool_ref(duet_kv_pool_t *pool, const int32_t *pages, int n);

/* Drop one reference from each page; a page whose last reference goes is
 * free again.  A page out of range or already free is a bug in the caller:
 * it is logged and skipped, never double-freed.  Returns how many pages
 * became free. */
int duet_kv_pool_release(duet_kv_pool_t *pool, const int32_t *pages, int n);

/* References held on one page (0 = free; -1 out of range). */
int duet_kv_pool_refs(duet_kv_pool_t *pool, int32_t page);

/* Pages an allocation can take: free ones and idle cached ones. */
int duet_kv_pool_free_count(duet_kv_pool_t *pool);
int duet_kv_pool_total(const duet_kv_pool_t *pool);

#endif
