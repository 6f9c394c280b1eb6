/* Packed transfers (DESIGN §5): a request's KV moves in O(layers x runs)
 * transport operations whatever its page count and TP pair.
 *
 * Each side stages the request in n_pages pool pages of its own that are
 * consecutive (first id stage0, "staging pages"), laid out head-major in
 * every (layer, K|V) plane: local head h of page index i sits at plane
 * offset  stage0 * page_bytes + (h * n_pages + i) * head_bytes.
 * So a run of heads [a, a+n) of all the request's pages is one contiguous
 * block of n * n_pages * head_bytes bytes on either side, and a slice-plan
 * run (src_head a, dst_head b, n heads) moves with one put per (layer, K|V):
 *
 *   prefill  pack:   pages -> staging (the local heads some receiver needs)
 *            put:    per (layer, K|V, run) src staging -> dst staging
 *   decode   unpack: staging -> pages (every local head), once all senders
 *                    reported
 *
 * The copies are kv/copy.h lists (one list for every plane), executed on
 * the device that holds the pool.
 *
 * Packed checksum order (DUET_XFER_SEND_CRC on a packed send; CRC32C), per
 * (prefill rank, decode rank) pair: for layer 0..L-1, for K then V, for
 * each run of the pair in dst_head order, its staged block (the bytes of
 * its one put), read from the sender's staging at the run's src_head and
 * from the receiver's at its dst_head.  The sender posts in this order and
 * checksums each put's source as it posts it.
 *
 * Pure functions; thread-safe. */
#ifndef DUET_TRANSFER_XFER_PACK_H
#define DUET_TRANSFER_XFER_PACK_H

#include <stddef.h>
#include <stdint.h>

#include "kv/copy.h"
#include "kv/layout.h"
#include "transfer/slice_plan.h"

/* Copies that stage (unpack = 0: pages -> staging) or unstage (unpack = 1:
 * staging -> pages) the local heads h with heads[h] != 0 (heads == NULL:
 * all) of pages[0..n_pages).  Adjacent copies are merged.  Writes at most
 * n_pages * l->n_kv_heads entries to out and returns the count. */
int duet_xfer_pack_copies(const duet_kv_layout_t *l, const int32_t *pages, int n_pages,
                          int32_t stage0, const uint8_t *heads, int unpack, duet_kv_copy_t *out);

/* Which local heads of prefill rank s the runs send (heads[h] = 1), for
 * duet_xfer_pack_copies.  heads has l->n_kv_heads entries. */
void duet_xfer_pack_src_heads(const duet_slice_run_t *runs, int n_runs, uint8_t *heads,
                              int n_kv_heads);

/* The one put of `run` in plane (layer, kv): byte offsets into each side's
 * pool and the length. */
typedef struct {
    size_t src_off, dst_off, len;
} duet_xfer_pack_put_t;

void duet_xfer_pack_put(const duet_kv_layout_t *src, const duet_kv_layout_t *dst,
                        const duet_slice_run_t *run, int layer, int kv, int n_pages,
                        int32_t src_stage0, int32_t dst_stage0, duet_xfer_pack_put_t *put_p);

/* Whether staging pages [stage0, stage0 + n_pages) lie in a pool of
 * pool_pages pages and hold none of pages[0..n_pages).  0 when they do;
 * else -1 with the reason in why[cap] ("staging pages [40, 77) hold
 * request page 52", "staging pages [90, 127) outside the pool's 96"). */
int duet_xfer_pack_check_stage(int32_t stage0, const int32_t *pages, int n_pages, int pool_pages,
                               char *why, size_t cap);

/* CRC32C, in the packed checksum order, of one pair's slice staged in the
 * pool at base (layout l: that side's).  runs: the pair's runs in dst_head
 * order; dst != 0 reads them at dst_head (the receiver's staging), else at
 * src_head (the sender's). */
uint32_t duet_xfer_pack_crc(const duet_kv_layout_t *l, const void *base,
                            const duet_slice_run_t *runs, int n_runs, int n_pages, int32_t stage0,
                            int dst);

#endif
