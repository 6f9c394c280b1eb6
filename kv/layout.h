/* The paged KV cache layout of one rank (DESIGN §2).
 *
 * One contiguous region per rank holds every layer:
 *   [n_layers][2 (0 = K, 1 = V)][n_pages][n_kv_heads][page_size][head_dim]
 * so one head's slice of one page is contiguous ("HND"), and within a
 * (layer, K|V) a run of pages is contiguous when it covers all local heads.
 * Page ids are shared by every rank of a daemon. */
#ifndef DUET_KV_LAYOUT_H
#define DUET_KV_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int n_layers;
    int n_pages;
    int page_size;  /* tokens per page */
    int n_kv_heads; /* local to the rank */
    int head_dim;
    int elem_size;  /* bytes per element: 4 (f32, cpu) or 2 (bf16/f16, cuda) */
} duet_kv_layout_t;

/* Bytes of one head's slice of one page. */
static inline size_t duet_kv_head_bytes(const duet_kv_layout_t *l)
{
    return (size_t)l->page_size * (size_t)l->head_dim * (size_t)l->elem_size;
}

/* Bytes of one page of one (layer, K|V): all local heads. */
static inline size_t duet_kv_page_bytes(const duet_kv_layout_t *l)
{
    return duet_kv_head_bytes(l) * (size_t)l->n_kv_heads;
}

/* Bytes of one (layer, K|V) plane. */
static inline size_t duet_kv_plane_bytes(const duet_kv_layout_t *l)
{
    return duet_kv_page_bytes(l) * (size_t)l->n_pages;
}

static inline size_t duet_kv_total_bytes(const duet_kv_layout_t *l)
{
    return duet_kv_plane_bytes(l) * 2u * (size_t)l->n_layers;
}

/* Byte offset of (layer, kv, page, local head, token-in-page 0). */
static inline size_t duet_kv_offset(const duet_kv_layout_t *l, int layer, int kv, int page,
                                    int head)
{
    return duet_kv_plane_bytes(l) * (size_t)(layer * 2 + kv) +
           duet_kv_page_bytes(l) * (size_t)page + duet_kv_head_bytes(l) * (size_t)head;
}

#endif
