/* The rank's KV pool (allocated by the transport or registered),
 * descriptors and counters.  Pools are set up by the rank's owner before any
 * transfer, on the owner's thread: mapping memory is a context call of the
 * transport, thread-safe. */
#include "transfer/xfer_internal.h"

#include <string.h>

#include "common/log.h"

static duet_status_t duet__pool_map(duet_xfer_rank_t *r, void *base, size_t bytes, int allocate,
                                    int device)
{
    size_t need = duet_kv_total_bytes(&r->info.layout);
    unsigned flags =
        (allocate ? DUET_XFER_MEM_ALLOCATE : 0u) | (device ? DUET_XFER_MEM_DEVICE : 0u);
    duet_xfer_mem_info_t mi;
    duet_status_t st;

    if (r->pool_kind != DUET__POOL_NONE)
        return duet_error(DUET_ERR_INVALID, "xfer rank %d: the pool is already set", r->index);
    if (bytes < need || (!allocate && base == NULL))
        return duet_error(DUET_ERR_INVALID, "xfer rank %d: pool of %zu bytes, the layout needs %zu",
                          r->index, bytes, need);
    st = r->ops->mem_map(r->x->transport, base, bytes, flags, &r->mem, &mi);
    if (st != DUET_OK) {
        r->mem = NULL;
        return duet_error_wrap(st, "xfer rank %d: ", r->index);
    }
    r->base = mi.base;
    r->rkey_buf = mi.rkey;
    r->rkey_len = mi.rkey_len;
    r->bytes = bytes;
    r->info.pool_bytes = bytes;
    r->pool_kind = allocate ? DUET__POOL_ALLOC : device ? DUET__POOL_DEVICE : DUET__POOL_REGISTERED;
    r->info.pool_device = device != 0;
    DUET_LOG_INFO("xfer rank %d: pool %zu bytes at %p (%s), rkey %zu bytes", r->index, bytes,
                  (void *)r->base, duet_xfer_pool_kind(r), r->rkey_len);
    return DUET_OK;
}

duet_status_t duet_xfer_pool_alloc(duet_xfer_rank_t *r, size_t bytes, void **base_p)
{
    duet_status_t st = duet__pool_map(r, NULL, bytes, 1, 0);
    if (st == DUET_OK)
        *base_p = r->base;
    return st;
}

duet_status_t duet_xfer_pool_register(duet_xfer_rank_t *r, void *base, size_t bytes)
{
    return duet__pool_map(r, base, bytes, 0, 0);
}

duet_status_t duet_xfer_pool_register_device(duet_xfer_rank_t *r, void *base, size_t bytes)
{
    const char *why;
    if (!r->ops->device_puts(r->x->transport, &why))
        return duet_error(DUET_ERR_UNSUPPORTED, "xfer rank %d: no puts from device memory: %s",
                          r->index, why);
    return duet__pool_map(r, base, bytes, 0, 1);
}

void duet_xfer_pool_unregister(duet_xfer_rank_t *r)
{
    if (r->pool_kind != DUET__POOL_REGISTERED && r->pool_kind != DUET__POOL_DEVICE)
        return;
    r->ops->mem_unmap(r->x->transport, r->mem);
    r->rkey_buf = NULL;
    r->mem = NULL;
    r->base = NULL;
    r->bytes = 0;
    r->pool_kind = DUET__POOL_NONE;
}

const char *duet_xfer_pool_kind(const duet_xfer_rank_t *r)
{
    static const char *const names[] = {"none", "ucx-alloc", "registered", "registered-cuda"};
    return names[r->pool_kind];
}

duet_status_t duet_xfer_desc_pack(duet_xfer_rank_t *r, void **blob_p, size_t *len_p)
{
    duet__desc_t d;
    const void *addr;
    size_t addr_len;
    if (r->pool_kind == DUET__POOL_NONE)
        return duet_error(DUET_ERR_INVALID, "xfer rank %d: descriptor needs the pool first",
                          r->index);
    memset(&d, 0, sizeof(d));
    d.info = r->info;
    d.pool_base = (uint64_t)(uintptr_t)r->base;
    d.rkey = r->rkey_buf;
    d.rkey_len = (uint32_t)r->rkey_len;
    r->ops->worker_address(r->worker, &addr, &addr_len);
    d.addr = addr;
    d.addr_len = (uint32_t)addr_len;
    return duet__desc_encode(&d, blob_p, len_p);
}

duet_status_t duet_xfer_desc_peek(const void *blob, size_t len, duet_xfer_desc_info_t *info_p)
{
    duet__desc_t d;
    duet_status_t st = duet__desc_decode(blob, len, &d);
    if (st == DUET_OK)
        *info_p = d.info;
    return st;
}

/* ---- observation -------------------------------------------------------------- */

void duet_xfer_rank_stats(const duet_xfer_rank_t *r, duet_xfer_stats_t *s)
{
#define DUET__STAT_COPY(name)                                                                      \
    s->name = atomic_load_explicit(&((duet_xfer_rank_t *)r)->stats.name, memory_order_relaxed);
    DUET__STATS(DUET__STAT_COPY)
#undef DUET__STAT_COPY
}

duet_status_t duet_xfer_debug_corrupt_put(duet_xfer_rank_t *r, long n)
{
    return duet_fault_count_arm(&r->corrupt, n);
}
