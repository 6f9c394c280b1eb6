/* Prefill side: the put loop (xfer_send_state.h).  The progress loop calls
 * duet__send_post_some; it walks the sends with puts to issue and moves
 * each one's cursor over (layer, K|V, page, dst, run) -- the order of
 * transfer/xfer_segs.h -- or, packed, over (chunk, dst, run), issuing puts
 * up to the layers released, within a budget of puts and bytes per round.
 * The per-pair checksum is taken here, put by put, where it is inline. */
#include "transfer/xfer_send_state.h"

#include <inttypes.h>
#include <stdio.h>

#include "common/fault.h"
#include "transfer/xfer_crc32c.h"
#include "transfer/xfer_pack.h"
#include "transfer/xfer_segs.h"

/* ---- posting ---------------------------------------------------------------------- */

static void duet__send_put_done(void *arg, duet_status_t st, const char *why)
{
    duet__send_dst_t *dst = arg;
    duet__send_t *s = dst->s;
    duet_xfer_rank_t *r = s->r;
    s->inflight--;
    r->put_reqs--;
    if (st != DUET_OK)
        duet__send_dst_fail(r, dst, DUET_ERR_PEER, "request %" PRIu64 ": put to decode rank %d: %s",
                            s->o.transfer_id, dst->d, why);
    duet__send_check_done(r, s);
    duet__send_maybe_free(r, s);
}

/* Move the cursor to the next receiver at this page, or the next page, or
 * the next plane (packed: a receiver's puts span every page). */
static void duet__send_cursor_next(duet__send_t *s)
{
    s->c_run = 0;
    if (++s->c_dst < s->n_dst)
        return;
    s->c_dst = 0;
    if (s->flags & DUET_XFER_SEND_PACKED) {
        for (int k = 0; k < s->n_dst; k++)
            s->dst[k].next_page = 0;
        s->c_layer = s->c_end;
        return;
    }
    if (!(s->flags & DUET_XFER_SEND_PACKED) && ++s->c_page < s->n_pages)
        return;
    s->c_page = 0;
    for (int k = 0; k < s->n_dst; k++)
        s->dst[k].next_page = 0;
    if (++s->c_kv == 2) {
        s->c_kv = 0;
        s->c_layer++;
    }
}

/* The put at the cursor: the run's slice of a page (or of consecutive
 * pages), or for a packed send its staged block over the chunk's planes. */
static void duet__send_seg(const duet_xfer_rank_t *r, const duet__send_t *s,
                           const duet__send_dst_t *dst, duet__seg_t *seg_p)
{
    const duet_kv_layout_t *src = &r->info.layout, *dl = &dst->peer->info.layout;
    const duet_slice_run_t *run = &dst->runs[s->c_run];
    if (s->flags & DUET_XFER_SEND_PACKED) {
        duet_xfer_pack_put_t put;
        int slot = dst->slot0;
        for (int k = 0; k < s->c_run; k++)
            slot += dst->runs[k].n_heads;
        duet_xfer_pack_put(src, dl, s->n_pages, s->src_stage0, slot, s->dst_stage0, run,
                           2 * s->c_layer, 2 * (s->c_end - s->c_layer), &put);
        seg_p->src_off = put.src_off;
        seg_p->dst_off = put.dst_off;
        seg_p->len = put.len;
        seg_p->n_pages = s->n_pages;
        return;
    }
    duet__seg_at(src, dl, run, s->c_layer, s->c_kv, s->pages, s->pages + s->n_pages, s->n_pages,
                 s->c_page, seg_p);
}

/* Issue puts of s until its released layers are posted or the budget is
 * spent.  Returns the puts issued. */
static int duet__send_post(duet_xfer_rank_t *r, duet__send_t *s, int *budget, size_t *bytes)
{
    uint64_t put_bytes = 0;
    int n = 0;

    while (*budget > 0 && *bytes > 0 && s->c_layer < s->limit && !s->stop_posting &&
           r->put_reqs < DUET__PUT_INFLIGHT) {
        duet__send_dst_t *dst = &s->dst[s->c_dst];
        const char *why = NULL;
        duet_xfer_op_t op;
        duet__seg_t seg;
        unsigned char *src;
        int corrupt_now;

        if ((s->flags & DUET_XFER_SEND_PACKED) && s->c_dst == 0 && s->c_run == 0)
            s->c_end = s->limit; /* a chunk starts: every layer released so far */
        if (dst->state != DUET__DST_POSTING || dst->peer == NULL || dst->next_page != s->c_page) {
            duet__send_cursor_next(s); /* failed, or this page went out in a longer put */
            continue;
        }
        duet__send_seg(r, s, dst, &seg);
        src = r->base + seg.src_off;
        if ((s->flags & DUET_XFER_SEND_CRC) && !s->crc_flush)
            dst->crc = duet__crc32c(dst->crc, src, seg.len);
        /* fault point (duet_xfer_debug_corrupt_put; a constant false where
         * fault injection is compiled out): after the checksum, or by a put
         * after this one where the source must stay intact */
        corrupt_now = duet_fault_count_hit(&r->corrupt);
        if (corrupt_now && r->crc_fn == NULL && !r->info.pool_device &&
            !(s->flags & DUET_XFER_SEND_PACKED)) {
            src[seg.len / 2] ^= 0x5a;
            corrupt_now = 0;
        }
        op = r->ops->put(dst->peer->data_ep, r->mem, src, seg.len,
                         dst->peer->remote_base + seg.dst_off, dst->peer->rkey, duet__send_put_done,
                         dst, &why);
        if (op == DUET_XFER_OP_FAILED) {
            duet__send_dst_fail(r, dst, DUET_ERR_PEER,
                                "request %" PRIu64 ": put to decode rank %d: %s", s->o.transfer_id,
                                dst->d, why);
            duet__send_cursor_next(s);
            continue;
        }
        if (op == DUET_XFER_OP_PENDING) {
            s->inflight++;
            r->put_reqs++;
        }
        if (corrupt_now && duet__corrupt_put(r, dst->peer, src, &seg, duet__send_put_done, dst) ==
                               DUET_XFER_OP_PENDING) {
            s->inflight++;
            r->put_reqs++;
        }
        dst->bytes += seg.len;
        dst->puts++;
        put_bytes += seg.len;
        n++;
        (*budget)--;
        *bytes = seg.len >= *bytes ? 0 : *bytes - seg.len;
        if (++s->c_run >= dst->n_runs) {
            dst->next_page = s->c_page + seg.n_pages;
            if (s->flags & DUET_XFER_SEND_PACKED)
                duet__send_progress(r, s, dst, s->c_end);
            duet__send_cursor_next(s);
        }
    }
    DUET__STAT_ADD(r, puts, (uint64_t)n);
    DUET__STAT_ADD(r, put_bytes, put_bytes);
    return n;
}

int duet__send_post_some(duet_xfer_rank_t *r)
{
    int budget = DUET__PUT_BUDGET, n = 0;
    size_t bytes = DUET__PUT_BYTES;
    duet__send_t *s = r->posting, *next;
    for (; s != NULL && budget > 0 && bytes > 0; s = next) {
        next = s->post_next;
        n += duet__send_post(r, s, &budget, &bytes);
        if (s->c_layer >= s->limit || s->stop_posting) {
            duet__send_posting_remove(r, s);
            duet__send_advance(r, s);
            duet__send_maybe_free(r, s);
        }
    }
    return n > 0;
}
