/* Packed transfers (DESIGN §5): a request's KV moves in O(runs x layer
 * chunks) transport operations whatever its page count and TP pair.
 *
 * Each rank's pool has a staging arena after its (layer, K|V) planes
 * (pool bytes beyond duet_kv_total_bytes), cut into units of one page's
 * size in every plane (duet_xfer_stage_unit_bytes); a request stages in
 * consecutive units [stage0, stage0 + units).  Its staging holds "head
 * slots" of n_pages * head_bytes per plane; a block of nh slots starting at
 * slot o is laid out plane-major:
 *
 *   arena + stage0 * unit + o * n_planes * n_pages * head_bytes
 *         + plane * nh * n_pages * head_bytes + (i * nh + j) * head_bytes
 *
 * for head j of the block and page index i.  So a block's planes
 * [p0, p1) -- layers [l0, l1), K and V -- are one contiguous range on
 * either side, and a slice-plan run moves with one put per chunk of
 * released layers.  Within a plane the block is page-major, as a pool
 * page is (kv/layout.h): a page's heads of the run are one copy, and a
 * run of consecutive pages that covers all of a rank's heads is one copy
 * for all of them (a head-major block would need one copy per page and
 * head, 4 KiB each for 16 tokens x 128 bf16 -- the unpack kernel then
 * moved a 1024-token request at about half the speed):
 *
 *   prefill  pack:   pages -> staging, per layer, one block per run it sends
 *                    (its runs in plan order, (dst_rank, dst_head); slots
 *                    counted up from 0, so a head replicated to several
 *                    receivers is staged once per receiver)
 *            put:    per (run, chunk of layers) src block -> dst block
 *   decode   unpack: staging -> pages once all senders reported; the
 *                    receiver's block for a run starts at slot dst_head
 *                    (its runs partition its local heads)
 *
 * The copies are kv/copy.h lists with a step on the staging side, executed
 * by the pool's owner.
 *
 * Packed checksum order (DUET_XFER_SEND_CRC on a packed send; CRC32C), per
 * (prefill rank, decode rank) pair: for layer 0..L-1, for K then V, for
 * each run of the pair in dst_head order, the run's block in that plane,
 * read from the sender's staging and the receiver's.
 *
 * Pure functions; thread-safe. */
#ifndef DUET_TRANSFER_XFER_PACK_H
#define DUET_TRANSFER_XFER_PACK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv/copy.h"
#include "kv/layout.h"
#include "transfer/slice_plan.h"

/* Bytes of one staging unit: a page of every plane (local heads). */
size_t duet_xfer_stage_unit_bytes(const duet_kv_layout_t *l);

/* Units in the arena of a pool of pool_bytes (0 when it has none). */
int duet_xfer_stage_units(const duet_kv_layout_t *l, uint64_t pool_bytes);

/* Head slots a sender stages for runs[0..n_runs): the sum of their heads. */
int duet_xfer_pack_slots(const duet_slice_run_t *runs, int n_runs);

/* Units that hold `slots` head slots of n_pages pages. */
int duet_xfer_pack_units(const duet_kv_layout_t *l, int n_pages, int slots);

/* Byte offset (from the pool's start) of plane `plane` of the block at
 * slot `slot` of nh slots, in a staging of n_pages pages from unit stage0. */
uint64_t duet_xfer_pack_block(const duet_kv_layout_t *l, int n_pages, int32_t stage0, int slot,
                              int nh, int plane);

/* Copies that stage (unpack = 0: pages -> staging; runs: the sender's, in
 * plan order) or unstage (unpack = 1: staging -> pages; runs: the
 * receiver's) pages[0..n_pages).  Adjacent copies are merged.  Writes at
 * most n_pages * duet_xfer_pack_slots(runs) entries; returns the count. */
int duet_xfer_pack_copies(const duet_kv_layout_t *l, const int32_t *pages, int n_pages,
                          int32_t stage0, const duet_slice_run_t *runs, int n_runs, int unpack,
                          duet_kv_copy_t *out);

/* The one put of `run` over planes [plane0, plane0 + n_planes): byte
 * offsets into each side's pool and the length.  src_slot: the run's first
 * slot in the sender's staging. */
typedef struct {
    size_t src_off, dst_off, len;
} duet_xfer_pack_put_t;

void duet_xfer_pack_put(const duet_kv_layout_t *src, const duet_kv_layout_t *dst, int n_pages,
                        int32_t src_stage0, int src_slot, int32_t dst_stage0,
                        const duet_slice_run_t *run, int plane0, int n_planes,
                        duet_xfer_pack_put_t *put_p);

/* Whether units [stage0, stage0 + units) lie in the arena of a pool of
 * pool_bytes.  0 when they do; else -1 with the reason in why[cap]
 * ("staging units [40, 77) outside the 64-unit arena"). */
int duet_xfer_pack_check_stage(const duet_kv_layout_t *l, uint64_t pool_bytes, int32_t stage0,
                               int units, char *why, size_t cap);

/* CRC32C, in the packed checksum order, of one pair's slice staged in the
 * pool at base (layout l: that side's).  runs: the pair's runs in dst_head
 * order; dst != 0 reads the receiver's blocks (slot dst_head), else the
 * sender's, the first at slot slot0 and each next one after it. */
uint32_t duet_xfer_pack_crc(const duet_kv_layout_t *l, const void *base,
                            const duet_slice_run_t *runs, int n_runs, int n_pages, int32_t stage0,
                            int dst, int slot0);

/* Progress messages (duet_xfer_send_t.progress_layers) pay off from this
 * much KV per request.  Measured on 2x H200 with Llama-3-8B KV (docs/performance-gpu-transfer.md,
 * "Unpacking as layers land"): a mid-transfer announcement costs ~0.2 ms
 * at 1024-2048 tokens (128-256 MiB: e2e / cudaMemcpyPeer 0.40-0.50 ->
 * 0.35-0.39), while from 4096 tokens (512 MiB) the early unpack gains
 * (8192: 1.13-1.15 -> 1.33-1.47). */
#define DUET_XFER_PROGRESS_MIN_BYTES (512ull << 20)

/* Whether a packed request of n_pages pages is large enough for progress
 * messages: its KV over every layer and all kv_heads of the model (l: a
 * rank's layout; its n_kv_heads is not used) is at least
 * DUET_XFER_PROGRESS_MIN_BYTES. */
bool duet_xfer_pack_progress_pays(const duet_kv_layout_t *l, int kv_heads, int n_pages);

#endif
