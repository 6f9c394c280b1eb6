#include "transfer/xfer_pack.h"

#include <stdio.h>

#include "transfer/xfer_crc32c.h"

size_t duet_xfer_stage_unit_bytes(const duet_kv_layout_t *l)
{
    return duet_kv_page_bytes(l) * 2u * (size_t)l->n_layers;
}

int duet_xfer_stage_units(const duet_kv_layout_t *l, uint64_t pool_bytes)
{
    uint64_t total = duet_kv_total_bytes(l), unit = duet_xfer_stage_unit_bytes(l);
    if (unit == 0 || pool_bytes <= total)
        return 0;
    uint64_t n = (pool_bytes - total) / unit;
    return n > INT32_MAX ? INT32_MAX : (int)n;
}

int duet_xfer_pack_slots(const duet_slice_run_t *runs, int n_runs)
{
    int n = 0;
    for (int k = 0; k < n_runs; k++)
        n += runs[k].n_heads;
    return n;
}

int duet_xfer_pack_units(const duet_kv_layout_t *l, int n_pages, int slots)
{
    int64_t heads = (int64_t)n_pages * slots;
    return (int)((heads + l->n_kv_heads - 1) / l->n_kv_heads);
}

uint64_t duet_xfer_pack_block(const duet_kv_layout_t *l, int n_pages, int32_t stage0, int slot,
                              int nh, int plane)
{
    uint64_t slice = (uint64_t)n_pages * duet_kv_head_bytes(l); /* one head, one plane */
    return duet_kv_total_bytes(l) + (uint64_t)stage0 * duet_xfer_stage_unit_bytes(l) +
           (uint64_t)slot * 2u * (uint64_t)l->n_layers * slice +
           (uint64_t)plane * (uint64_t)nh * slice;
}

int duet_xfer_pack_copies(const duet_kv_layout_t *l, const int32_t *pages, int n_pages,
                          int32_t stage0, const duet_slice_run_t *runs, int n_runs, int unpack,
                          duet_kv_copy_t *out)
{
    uint64_t hb = duet_kv_head_bytes(l);
    int n = 0, slot = 0;
    for (int k = 0; k < n_runs; k++) {
        int nh = runs[k].n_heads;
        int head0 = unpack ? runs[k].dst_head : runs[k].src_head;
        int at = unpack ? runs[k].dst_head : slot;
        uint64_t blk = duet_xfer_pack_block(l, n_pages, stage0, at, nh, 0);
        uint64_t step = (uint64_t)nh * (uint64_t)n_pages * hb;
        for (int i = 0; i < n_pages; i++)
            for (int j = 0; j < nh; j++) {
                uint64_t page_off = duet_kv_offset(l, 0, 0, pages[i], head0 + j);
                uint64_t stage_off = blk + ((uint64_t)i * (uint64_t)nh + (uint64_t)j) * hb;
                duet_kv_copy_t c = {.src = unpack ? stage_off : page_off,
                                    .dst = unpack ? page_off : stage_off,
                                    .len = hb,
                                    .src_step = unpack ? step : 0,
                                    .dst_step = unpack ? 0 : step};
                duet_kv_copy_t *last = n > 0 ? &out[n - 1] : NULL;
                if (last && last->src + last->len == c.src && last->dst + last->len == c.dst &&
                    last->src_step == c.src_step && last->dst_step == c.dst_step) {
                    last->len += hb;
                    continue;
                }
                out[n++] = c;
            }
        slot += nh;
    }
    return n;
}

void duet_xfer_pack_put(const duet_kv_layout_t *src, const duet_kv_layout_t *dst, int n_pages,
                        int32_t src_stage0, int src_slot, int32_t dst_stage0,
                        const duet_slice_run_t *run, int plane0, int n_planes,
                        duet_xfer_pack_put_t *put_p)
{
    put_p->src_off = duet_xfer_pack_block(src, n_pages, src_stage0, src_slot, run->n_heads, plane0);
    put_p->dst_off =
        duet_xfer_pack_block(dst, n_pages, dst_stage0, run->dst_head, run->n_heads, plane0);
    put_p->len =
        duet_kv_head_bytes(src) * (size_t)run->n_heads * (size_t)n_pages * (size_t)n_planes;
}

int duet_xfer_pack_check_stage(const duet_kv_layout_t *l, uint64_t pool_bytes, int32_t stage0,
                               int units, char *why, size_t cap)
{
    int arena = duet_xfer_stage_units(l, pool_bytes);
    int64_t end = (int64_t)stage0 + units;
    if (stage0 < 0 || units < 1 || end > arena) {
        snprintf(why, cap, "staging units [%d, %lld) outside the %d-unit arena", (int)stage0,
                 (long long)end, arena);
        return -1;
    }
    return 0;
}

uint32_t duet_xfer_pack_crc(const duet_kv_layout_t *l, const void *base,
                            const duet_slice_run_t *runs, int n_runs, int n_pages, int32_t stage0,
                            int dst, int slot0)
{
    const unsigned char *b = base;
    size_t hb = duet_kv_head_bytes(l);
    uint32_t crc = 0;
    for (int p = 0; p < 2 * l->n_layers; p++)
        for (int k = 0, slot = slot0; k < n_runs; slot += runs[k].n_heads, k++) {
            int at = dst ? runs[k].dst_head : slot;
            uint64_t off = duet_xfer_pack_block(l, n_pages, stage0, at, runs[k].n_heads, p);
            crc = duet__crc32c(crc, b + off, hb * (size_t)runs[k].n_heads * (size_t)n_pages);
        }
    return crc;
}

bool duet_xfer_pack_progress_pays(const duet_kv_layout_t *l, int kv_heads, int n_pages)
{
    uint64_t bytes = (uint64_t)n_pages * (uint64_t)l->page_size * (uint64_t)l->head_dim *
                     (uint64_t)l->elem_size * 2u * (uint64_t)l->n_layers * (uint64_t)kv_heads;
    return n_pages > 0 && kv_heads > 0 && bytes >= DUET_XFER_PROGRESS_MIN_BYTES;
}
