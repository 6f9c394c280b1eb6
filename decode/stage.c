/* Unpacking a packed request's staging into its pages (stage.h). */
#include "decode/stage.h"

#include "common/alloc.h"
#include "common/log.h"
#include "transfer/xfer_pack.h"

void duet_dc_unstaged(duet_decode_t *dc, duet_dc_req_t *req, const char *why)
{
    pthread_mutex_lock(&dc->evlock);
    bool first = dc->unstaged++ == 0;
    pthread_mutex_unlock(&dc->evlock);
    /* on GPUs the unpacked path costs one transport operation per page and
     * head run: a hundred times slower (README "Packed transfers") */
    if (first)
        DUET_LOG_WARN("decode: %s moves unpacked, page by page: %s (the first such request; "
                      "raise stage_pages on both sides if it recurs: Info "
                      "kv_transfers_unstaged counts them)",
                      req->request_id, why);
    else
        DUET_LOG_DEBUG("decode: %s moves unpacked: %s", req->request_id, why);
}

/* A packed request's KV is in its staging: move layers [l0, l1) into the
 * request's pages on every rank (each rank's staging is laid out by the
 * runs it receives).  Layers that landed early are queued as their
 * progress comes (req.c, KV_PROGRESS), the rest once the transfer
 * completed, with a wait that covers them all. */
duet_status_t duet_dc_unpack_layers(duet_decode_t *dc, duet_dc_req_t *req, int l0, int l1,
                                    bool wait)
{
    const duet_kv_layout_t *l = duet_engine_kv_layout(dc->node.ke.engine);
    int D = dc->node.ke.tp, n[DUET_TP_MAX], first;
    int32_t stage;
    /* (a chunked request: the chunk in flight, from its staging half) */
    int n_pages = duet_dc_xfer_span(req, &first, &stage);
    duet_kv_copy_t *lists[DUET_TP_MAX];
    duet_kv_copy_t *copies =
        DUET_NEW_ARRAY(duet_kv_copy_t, (size_t)D * (size_t)n_pages * (size_t)l->n_kv_heads);
    duet_status_t st;
    if (copies == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "unpack: no memory");
    for (int d = 0; d < D; d++) {
        const duet_slice_run_t *runs;
        int n_runs = duet_slice_plan_dst_runs(req->link->base.plan, d, &runs);
        lists[d] = copies + (size_t)d * (size_t)n_pages * (size_t)l->n_kv_heads;
        n[d] = duet_xfer_pack_copies(l, req->pages + req->n_cached_pages + first, n_pages, stage,
                                     runs, n_runs, 1, lists[d]);
    }
    st = duet_engine_kv_copy_ranks_layers(dc->node.ke.engine, (const duet_kv_copy_t *const *)lists,
                                          n, l0, l1, wait);
    duet_free(copies);
    /* a failed queue may still have queued some ranks' copies */
    req->unpack_queued = !wait || (st != DUET_OK && req->unpack_queued);
    return st;
}

void duet_dc_unpack_wait(duet_decode_t *dc, duet_dc_req_t *req)
{
    int n[DUET_TP_MAX] = {0};
    const duet_kv_copy_t *lists[DUET_TP_MAX] = {0};
    if (!req->unpack_queued)
        return;
    duet_status_t st = duet_engine_kv_copy_ranks_layers(dc->node.ke.engine, lists, n, 0, 0, true);
    if (st != DUET_OK) /* a device error: the engine has failed, the process ends */
        DUET_LOG_WARN("decode: request %s: waiting for its unpack: %s", req->request_id,
                      duet_error_msg());
    req->unpack_queued = false;
}
