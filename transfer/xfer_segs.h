/* Coalescing a slice run into puts, and the checksum order (pure).
 *
 * Within one (layer, K|V) plane of the HND layout a run of heads [h, h+n) of
 * one page is contiguous on either side.  A run of consecutive pages is
 * contiguous on a side when n covers all of that side's local heads.  So a
 * put spans g pages when both sides' page ids are consecutive for those g
 * pages and both sides cover all their heads; otherwise it spans one page.
 *
 * Posting order: for layer, for K then V, for page index i, for each
 * receiving rank, its runs at page i.  The source plane is read front to
 * back, and the receivers' slices of one source page go out together: on
 * this machine a copy that reads a source with holes (8 of every 16 KiB) is
 * a quarter slower than one that writes a destination with holes.
 *
 * Checksum order (sender over source bytes, receiver over destination
 * bytes, same order), per (src, dst) pair: for layer 0..L-1, for K then V,
 * for page index i = 0..n_pages-1, for each run of the pair in dst_head
 * order, the n_heads head slices of page pages[i] starting at the run's head
 * on that side.  A pair's puts in posting order read their sources in
 * exactly this order (a put spans several pages only for a pair with a
 * single run), so the sender checksums as it posts. */
#ifndef DUET_TRANSFER_XFER_SEGS_H
#define DUET_TRANSFER_XFER_SEGS_H

#include <stddef.h>
#include <stdint.h>

#include "kv/layout.h"
#include "transfer/slice_plan.h"

typedef struct {
    size_t src_off, dst_off; /* byte offsets into each side's pool */
    size_t len;
    int n_pages; /* page indices consumed */
} duet__seg_t;

/* The longest put of `run` in plane (layer, kv) starting at page index i. */
void duet__seg_at(const duet_kv_layout_t *src, const duet_kv_layout_t *dst,
                  const duet_slice_run_t *run, int layer, int kv, const int32_t *src_pages,
                  const int32_t *dst_pages, int n_pages, int i, duet__seg_t *seg_p);

/* Puts needed for `runs` over all layers and K/V. */
uint64_t duet__seg_count(const duet_kv_layout_t *src, const duet_kv_layout_t *dst,
                         const duet_slice_run_t *runs, int n_runs, const int32_t *src_pages,
                         const int32_t *dst_pages, int n_pages);

/* Bytes `runs` move over all layers and K/V (either side's layout: they
 * share page_size, head_dim and elem_size). */
uint64_t duet__seg_bytes(const duet_kv_layout_t *l, const duet_slice_run_t *runs, int n_runs,
                         int n_pages);

/* CRC32C in checksum order over one side's pool.  dst != 0 reads the
 * destination heads (run.dst_head), else the source heads. */
uint32_t duet__seg_crc(const duet_kv_layout_t *l, const void *base, const duet_slice_run_t *runs,
                       int n_runs, const int32_t *pages, int n_pages, int dst);

#endif
