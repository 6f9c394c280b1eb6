/* Checksums through the rank's hook (duet_xfer_rank_set_checksum): the
 * slice's byte ranges in checksum order, handed to whoever can read the
 * pool (a GPU kernel for device pools).  The inline path -- the CPU reading
 * a host pool -- is in xfer_send_post.c (as puts are posted) and xfer_recv.c. */
#include "transfer/xfer_internal.h"

#include <inttypes.h>

#include "common/alloc.h"
#include "common/log.h"
#include "transfer/xfer_pack.h"

void duet_xfer_rank_set_checksum(duet_xfer_rank_t *r, duet_xfer_checksum_fn fn, void *ctx)
{
    r->crc_fn = fn;
    r->crc_ctx = fn != NULL ? ctx : NULL;
}

/* Append [off, off + len) to out[0..n), merged with the last range when it
 * continues it. */
static int duet__crc_range_add(duet_crc32c_range_t *out, int n, uint64_t off, uint64_t len)
{
    if (n > 0 && out[n - 1].off + out[n - 1].len == off) {
        out[n - 1].len += len;
        return n;
    }
    out[n] = (duet_crc32c_range_t){off, len};
    return n + 1;
}

int duet__crc_ranges(const duet_kv_layout_t *l, const duet_slice_run_t *runs, int n_runs,
                     const int32_t *pages, int n_pages, int32_t stage0, int dst, int slot0,
                     duet_crc32c_range_t *out)
{
    size_t hb = duet_kv_head_bytes(l);
    int n = 0;
    for (int layer = 0; layer < l->n_layers; layer++)
        for (int kv = 0; kv < 2; kv++) {
            if (pages == NULL) {
                for (int k = 0, slot = slot0; k < n_runs; slot += runs[k].n_heads, k++) {
                    int nh = runs[k].n_heads;
                    n = duet__crc_range_add(out, n,
                                            duet_xfer_pack_block(l, n_pages, stage0,
                                                                 dst ? runs[k].dst_head : slot, nh,
                                                                 2 * layer + kv),
                                            hb * (size_t)nh * (size_t)n_pages);
                }
                continue;
            }
            for (int i = 0; i < n_pages; i++)
                for (int k = 0; k < n_runs; k++) {
                    int head = dst ? runs[k].dst_head : runs[k].src_head;
                    n = duet__crc_range_add(out, n, duet_kv_offset(l, layer, kv, pages[i], head),
                                            hb * (size_t)runs[k].n_heads);
                }
        }
    return n;
}

duet_status_t duet__crc_hook(duet_xfer_rank_t *r, const duet_slice_run_t *runs, int n_runs,
                             const int32_t *pages, int n_pages, int32_t stage0, int dst, int slot0,
                             uint32_t *crc_p)
{
    const duet_kv_layout_t *l = &r->info.layout;
    size_t cap = 2u * (size_t)l->n_layers * (size_t)(n_runs > 0 ? n_runs : 1) *
                 (pages != NULL ? (size_t)n_pages : 1u);
    duet_crc32c_range_t *ranges = DUET_NEW_ARRAY(duet_crc32c_range_t, cap);
    duet_status_t st;
    int n;

    if (ranges == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "xfer rank %d: checksum ranges", r->index);
    n = duet__crc_ranges(l, runs, n_runs, pages, n_pages, stage0, dst, slot0, ranges);
    duet_error_clear(); /* a hook that fails without a message reports its status */
    st = r->crc_fn(r->crc_ctx, ranges, n, crc_p);
    duet_free(ranges);
    if (st != DUET_OK)
        return duet_error_wrap(st, "xfer rank %d: checksum hook: ", r->index);
    return DUET_OK;
}

duet_xfer_op_t duet__corrupt_put(duet_xfer_rank_t *r, duet_xfer_peer_t *peer,
                                 const unsigned char *src, const duet__seg_t *seg,
                                 duet_xfer_op_cb_t cb, void *arg)
{
    size_t mid = seg->len / 2, n = seg->len - mid - 1 < 64 ? seg->len - mid - 1 : 64;
    const char *why = NULL;
    duet_xfer_op_t op;
    if (seg->len < 2 || r->ops->fence(r->worker) != DUET_OK) {
        DUET_LOG_WARN("xfer rank %d: debug corruption skipped: %s", r->index,
                      seg->len < 2 ? "a 1-byte put" : duet_error_msg());
        return DUET_XFER_OP_DONE;
    }
    op = r->ops->put(peer->data_ep, r->mem, src + mid + 1, n,
                     peer->remote_base + seg->dst_off + mid, peer->rkey, cb, arg, &why);
    if (op == DUET_XFER_OP_FAILED)
        DUET_LOG_WARN("xfer rank %d: debug corruption put failed: %s", r->index, why);
    return op;
}
