#include "transfer/xfer_pack.h"

#include <stdio.h>

#include "transfer/xfer_crc32c.h"

/* Plane offset of local head h, page index i in the head-major staging. */
static uint64_t duet__pack_stage_off(const duet_kv_layout_t *l, int32_t stage0, int n_pages, int h,
                                     int i)
{
    return (uint64_t)duet_kv_page_bytes(l) * (uint64_t)stage0 +
           ((uint64_t)h * (uint64_t)n_pages + (uint64_t)i) * (uint64_t)duet_kv_head_bytes(l);
}

int duet_xfer_pack_copies(const duet_kv_layout_t *l, const int32_t *pages, int n_pages,
                          int32_t stage0, const uint8_t *heads, int unpack, duet_kv_copy_t *out)
{
    uint64_t hb = duet_kv_head_bytes(l);
    int n = 0;
    for (int h = 0; h < l->n_kv_heads; h++) {
        if (heads != NULL && !heads[h])
            continue;
        for (int i = 0; i < n_pages; i++) {
            uint64_t page_off = (uint64_t)duet_kv_page_bytes(l) * (uint64_t)pages[i] + hb * h;
            uint64_t stage_off = duet__pack_stage_off(l, stage0, n_pages, h, i);
            uint64_t src = unpack ? stage_off : page_off;
            uint64_t dst = unpack ? page_off : stage_off;
            duet_kv_copy_t *last = n > 0 ? &out[n - 1] : NULL;
            if (last && last->src + last->len == src && last->dst + last->len == dst) {
                last->len += hb;
                continue;
            }
            out[n++] = (duet_kv_copy_t){.src = src, .dst = dst, .len = hb};
        }
    }
    return n;
}

void duet_xfer_pack_src_heads(const duet_slice_run_t *runs, int n_runs, uint8_t *heads,
                              int n_kv_heads)
{
    for (int h = 0; h < n_kv_heads; h++)
        heads[h] = 0;
    for (int k = 0; k < n_runs; k++)
        for (int j = 0; j < runs[k].n_heads; j++)
            heads[runs[k].src_head + j] = 1;
}

void duet_xfer_pack_put(const duet_kv_layout_t *src, const duet_kv_layout_t *dst,
                        const duet_slice_run_t *run, int layer, int kv, int n_pages,
                        int32_t src_stage0, int32_t dst_stage0, duet_xfer_pack_put_t *put_p)
{
    put_p->src_off = duet_kv_offset(src, layer, kv, 0, 0) +
                     duet__pack_stage_off(src, src_stage0, n_pages, run->src_head, 0);
    put_p->dst_off = duet_kv_offset(dst, layer, kv, 0, 0) +
                     duet__pack_stage_off(dst, dst_stage0, n_pages, run->dst_head, 0);
    put_p->len = duet_kv_head_bytes(src) * (size_t)run->n_heads * (size_t)n_pages;
}

int duet_xfer_pack_check_stage(int32_t stage0, const int32_t *pages, int n_pages, int pool_pages,
                               char *why, size_t cap)
{
    int64_t end = (int64_t)stage0 + n_pages;
    if (stage0 < 0 || n_pages < 1 || end > pool_pages) {
        snprintf(why, cap, "staging pages [%d, %lld) outside the pool's %d", (int)stage0,
                 (long long)end, pool_pages);
        return -1;
    }
    for (int i = 0; i < n_pages; i++)
        if (pages[i] >= stage0 && pages[i] < end) {
            snprintf(why, cap, "staging pages [%d, %lld) hold request page %d", (int)stage0,
                     (long long)end, (int)pages[i]);
            return -1;
        }
    return 0;
}

uint32_t duet_xfer_pack_crc(const duet_kv_layout_t *l, const void *base,
                            const duet_slice_run_t *runs, int n_runs, int n_pages, int32_t stage0,
                            int dst)
{
    const unsigned char *b = base;
    uint32_t crc = 0;
    for (int layer = 0; layer < l->n_layers; layer++)
        for (int kv = 0; kv < 2; kv++)
            for (int k = 0; k < n_runs; k++) {
                int head = dst ? runs[k].dst_head : runs[k].src_head;
                size_t off = duet_kv_offset(l, layer, kv, 0, 0) +
                             duet__pack_stage_off(l, stage0, n_pages, head, 0);
                size_t len = duet_kv_head_bytes(l) * (size_t)runs[k].n_heads * (size_t)n_pages;
                crc = duet__crc32c(crc, b + off, len);
            }
    return crc;
}
