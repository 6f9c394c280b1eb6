/* The rank's KV pool (allocated by UCX or registered), descriptors and
 * counters.  Pools are set up by the rank's owner before any transfer, on
 * the owner's thread: ucp_mem_map and ucp_rkey_pack are context calls, made
 * thread-safe by the context's mt_workers_shared. */
#include "transfer/xfer_internal.h"

#include <string.h>

#include "common/log.h"

static duet_status_t pool_map(duet_xfer_rank_t *r, void *base, size_t bytes, int allocate,
                              int device)
{
    size_t need = duet_kv_total_bytes(&r->info.layout);
    ucp_mem_map_params_t mp;
    ucp_mem_attr_t ma;
    ucs_status_t us;

    if (r->pool_kind != 0)
        return duet_error(DUET_ERR_INVALID, "xfer rank %d: the pool is already set", r->index);
    if (bytes < need || (!allocate && base == NULL))
        return duet_error(DUET_ERR_INVALID, "xfer rank %d: pool of %zu bytes, the layout needs %zu",
                          r->index, bytes, need);
    memset(&mp, 0, sizeof(mp));
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                    UCP_MEM_MAP_PARAM_FIELD_FLAGS;
    mp.address = base;
    mp.length = bytes;
    mp.flags = allocate ? UCP_MEM_MAP_ALLOCATE : 0;
    if (device) {
        mp.field_mask |= UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
        mp.memory_type = UCS_MEMORY_TYPE_CUDA;
    }
    us = ucp_mem_map(r->x->ucp, &mp, &r->memh);
    if (us != UCS_OK) {
        r->memh = NULL;
        return duet_error(allocate ? DUET_ERR_NO_MEMORY : DUET_ERR_IO,
                          "xfer rank %d: ucp_mem_map of %zu bytes: %s", r->index, bytes,
                          ucs_status_string(us));
    }
    memset(&ma, 0, sizeof(ma));
    ma.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
    us = ucp_mem_query(r->memh, &ma);
    if (us == UCS_OK && ma.length < bytes)
        us = UCS_ERR_NO_MEMORY;
    if (us == UCS_OK)
        us = ucp_rkey_pack(r->x->ucp, r->memh, &r->rkey_buf, &r->rkey_len);
    if (us != UCS_OK) {
        ucp_mem_unmap(r->x->ucp, r->memh);
        r->memh = NULL;
        r->rkey_buf = NULL;
        return duet_error(DUET_ERR_IO, "xfer rank %d: pool query/rkey: %s", r->index,
                          ucs_status_string(us));
    }
    r->base = ma.address;
    r->bytes = bytes;
    r->info.pool_bytes = bytes;
    r->pool_kind = allocate ? 1 : device ? 3 : 2;
    r->info.pool_device = device != 0;
    DUET_LOG_INFO("xfer rank %d: pool %zu bytes at %p (%s), rkey %zu bytes", r->index, bytes,
                  (void *)r->base, duet_xfer_pool_kind(r), r->rkey_len);
    return DUET_OK;
}

duet_status_t duet_xfer_pool_alloc(duet_xfer_rank_t *r, size_t bytes, void **base_p)
{
    duet_status_t st = pool_map(r, NULL, bytes, 1, 0);
    if (st == DUET_OK)
        *base_p = r->base;
    return st;
}

duet_status_t duet_xfer_pool_register(duet_xfer_rank_t *r, void *base, size_t bytes)
{
    return pool_map(r, base, bytes, 0, 0);
}

duet_status_t duet_xfer_pool_register_device(duet_xfer_rank_t *r, void *base, size_t bytes)
{
    const char *why;
    if (!duet_xfer_device_puts(r->x, &why))
        return duet_error(DUET_ERR_UNSUPPORTED, "xfer rank %d: no puts from device memory: %s",
                          r->index, why);
    return pool_map(r, base, bytes, 0, 1);
}

void duet_xfer_pool_unregister(duet_xfer_rank_t *r)
{
    if (r->pool_kind != 2 && r->pool_kind != 3)
        return;
    ucp_rkey_buffer_release(r->rkey_buf);
    ucp_mem_unmap(r->x->ucp, r->memh);
    r->rkey_buf = NULL;
    r->memh = NULL;
    r->base = NULL;
    r->bytes = 0;
    r->pool_kind = 0;
}

const char *duet_xfer_pool_kind(const duet_xfer_rank_t *r)
{
    static const char *const names[] = {"none", "ucx-alloc", "registered", "registered-cuda"};
    return names[r->pool_kind];
}

duet_status_t duet_xfer_desc_pack(duet_xfer_rank_t *r, void **blob_p, size_t *len_p)
{
    duet__desc_t d;
    if (r->pool_kind == 0)
        return duet_error(DUET_ERR_INVALID, "xfer rank %d: descriptor needs the pool first",
                          r->index);
    memset(&d, 0, sizeof(d));
    d.info = r->info;
    d.pool_base = (uint64_t)(uintptr_t)r->base;
    d.rkey = r->rkey_buf;
    d.rkey_len = (uint32_t)r->rkey_len;
    d.addr = r->addr;
    d.addr_len = (uint32_t)r->addr_len;
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

void duet_xfer_debug_corrupt_put(duet_xfer_rank_t *r, long n)
{
    atomic_store(&r->corrupt_at, n);
}
