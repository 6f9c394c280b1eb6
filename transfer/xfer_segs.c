#include "transfer/xfer_segs.h"

#include "transfer/xfer_crc32c.h"

void duet__seg_at(const duet_kv_layout_t *src, const duet_kv_layout_t *dst,
                  const duet_slice_run_t *run, int layer, int kv, const int32_t *src_pages,
                  const int32_t *dst_pages, int n_pages, int i, duet__seg_t *seg_p)
{
    int g = 1;
    if (run->n_heads == src->n_kv_heads && run->n_heads == dst->n_kv_heads) {
        while (i + g < n_pages && src_pages[i + g] == src_pages[i + g - 1] + 1 &&
               dst_pages[i + g] == dst_pages[i + g - 1] + 1)
            g++;
    }
    seg_p->src_off = duet_kv_offset(src, layer, kv, src_pages[i], run->src_head);
    seg_p->dst_off = duet_kv_offset(dst, layer, kv, dst_pages[i], run->dst_head);
    seg_p->len = duet_kv_head_bytes(src) * (size_t)run->n_heads * (size_t)g;
    seg_p->n_pages = g;
}

uint64_t duet__seg_count(const duet_kv_layout_t *src, const duet_kv_layout_t *dst,
                         const duet_slice_run_t *runs, int n_runs, const int32_t *src_pages,
                         const int32_t *dst_pages, int n_pages)
{
    uint64_t per_plane = 0;
    for (int k = 0; k < n_runs; k++) {
        for (int i = 0; i < n_pages;) {
            duet__seg_t seg;
            duet__seg_at(src, dst, &runs[k], 0, 0, src_pages, dst_pages, n_pages, i, &seg);
            i += seg.n_pages;
            per_plane++;
        }
    }
    return per_plane * 2u * (uint64_t)src->n_layers;
}

uint64_t duet__seg_bytes(const duet_kv_layout_t *l, const duet_slice_run_t *runs, int n_runs,
                         int n_pages)
{
    uint64_t heads = 0;
    for (int k = 0; k < n_runs; k++)
        heads += (uint64_t)runs[k].n_heads;
    return heads * duet_kv_head_bytes(l) * (uint64_t)n_pages * 2u * (uint64_t)l->n_layers;
}

uint32_t duet__seg_crc(const duet_kv_layout_t *l, const void *base, const duet_slice_run_t *runs,
                       int n_runs, const int32_t *pages, int n_pages, int dst)
{
    const unsigned char *b = base;
    uint32_t crc = 0;
    for (int layer = 0; layer < l->n_layers; layer++)
        for (int kv = 0; kv < 2; kv++)
            for (int i = 0; i < n_pages; i++)
                for (int k = 0; k < n_runs; k++) {
                    int head = dst ? runs[k].dst_head : runs[k].src_head;
                    size_t len = duet_kv_head_bytes(l) * (size_t)runs[k].n_heads;
                    crc = duet__crc32c(crc, b + duet_kv_offset(l, layer, kv, pages[i], head), len);
                }
    return crc;
}
