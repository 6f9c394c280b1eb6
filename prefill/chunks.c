/* A packed request larger than a staging arena moves in chunks
 * (prefill.h, duet_pf_send_chunks; docs/design-notes.md
 * "Chunked packed transfers"): decode holds two staging halves of chunk_pages units and
 * prefill one run of a chunk's units.  Chunk k of the request's pages is
 * staged here, put into decode's half k % 2 as transfer transfer_id + k,
 * and notified; chunk k + 1 is staged only once every rank's send of
 * chunk k ended -- every decode rank acknowledged it, so this side's
 * staging is free again, and decode, which registers chunk k + 1's
 * expectation only after chunk k - 1's unpack landed, is done with the
 * half that chunk k + 1 writes.  Each chunk is a whole transfer: its own
 * notifications (with the first token), checksums and deadline. */
#include <time.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/fault.h"
#include "common/log.h"
#include "node/deadline.h"
#include "prefill/prefill.h"
#include "transfer/xfer_pack.h"

/* Per rank, the copies that stage pages [first, first + n) of what the
 * request sends into this rank's staging run. */
static duet_status_t duet__chunk_stage(duet_prefill_t *pf, duet_pf_req_t *req, int first, int n)
{
    const duet_kv_layout_t *l = duet_engine_kv_layout(pf->node.ke.engine);
    int P = pf->node.ke.tp, cnt[DUET_TP_MAX];
    duet_kv_copy_t *lists[DUET_TP_MAX] = {0};
    duet_status_t st = DUET_OK;

    for (int s = 0; s < P && st == DUET_OK; s++) {
        const duet_slice_run_t *runs;
        int n_runs = duet_slice_plan_src_runs(req->link->plan, s, &runs);
        size_t slots = (size_t)duet_xfer_pack_slots(runs, n_runs);
        lists[s] = DUET_NEW_ARRAY(duet_kv_copy_t, (size_t)n * slots + 1);
        if (lists[s] == NULL)
            st = duet_error(DUET_ERR_NO_MEMORY, "chunked transfer: no memory");
        else
            cnt[s] = duet_xfer_pack_copies(l, req->src_pages + req->skip + first, n,
                                           req->src_stage0, runs, n_runs, 0, lists[s]);
    }
    if (st == DUET_OK)
        st = duet_engine_kv_copy_ranks_layers(
            pf->node.ke.engine, (const duet_kv_copy_t *const *)lists, cnt, 0, l->n_layers, true);
    for (int s = 0; s < P; s++)
        duet_free(lists[s]);
    return st;
}

/* Send one staged chunk from every rank and wait until each rank's send
 * ended. */
static duet_status_t duet__chunk_send(duet_prefill_t *pf, duet_pf_req_t *req, int k, int first,
                                      int n, int32_t first_token)
{
    int P = pf->node.ke.tp;
    int n_layers = duet_engine_kv_layout(pf->node.ke.engine)->n_layers;
    uint64_t id = req->transfer_id + (uint64_t)k;
    int64_t now = duet_now_ns();
    int64_t deadline =
        duet_node_deadline_send(pf->node.args.cluster, now, duet_rpc_call_deadline_ns(req->call));
    duet_xfer_send_t snd[DUET_TP_MAX];
    duet_xfer_rank_t *ranks[DUET_TP_MAX];
    duet_status_t rank_st[DUET_TP_MAX], st;

    if (deadline <= now)
        return duet_error(DUET_ERR_TIMEOUT, "chunk %d: the decode's transfer deadline passed", k);
    for (int s = 0; s < P; s++) {
        ranks[s] = duet_xfer_rank(pf->node.ke.xfer, s);
        snd[s] = (duet_xfer_send_t){
            .transfer_id = id,
            .plan = req->link->plan,
            .peers = duet_node_link_peers(req->link, s),
            .src_pages = req->src_pages + req->skip + first,
            .dst_pages = req->dst_pages + first,
            .n_pages = n,
            .flags = DUET_XFER_SEND_PACKED |
                     (pf->node.args.cluster->transfer_checksum ? DUET_XFER_SEND_CRC : 0),
            .src_stage0 = req->src_stage0,
            .dst_stage0 = req->dst_stage0 + (k % 2) * req->chunk_pages,
            .deadline_ns = deadline,
        };
    }
    st = duet_xfer_send_begin_all(ranks, snd, P, rank_st);
    duet_status_t end = st;
    for (int s = 0; s < P; s++) {
        if (rank_st[s] != DUET_OK)
            continue;
        if (end == DUET_OK)
            duet_xfer_send_layers(ranks[s], id, 0, n_layers);
        duet_xfer_send_end(ranks[s], id, end, end == DUET_OK ? first_token : DUET_XFER_NO_TOKEN);
    }
    char why[DUET_XFER_DETAIL_MAX + 64] = "";
    if (st != DUET_OK)
        snprintf(why, sizeof(why), "%s", duet_error_msg());
    for (int s = 0; s < P; s++) {
        duet_xfer_result_t res;
        if (rank_st[s] != DUET_OK)
            continue;
        /* (the send's own deadline ends it: wait a little past that) */
        duet_status_t w = duet_xfer_send_wait(ranks[s], id, deadline + DUET_NS_PER_S, &res);
        if (w != DUET_OK) {
            /* still running past its deadline: stop it (its receivers hear) */
            duet_xfer_send_cancel(ranks[s], id);
            res.status = w;
            snprintf(res.detail, sizeof(res.detail), "prefill rank %d: no outcome by the deadline",
                     s);
            res.bytes = 0;
        }
        atomic_fetch_add(&req->bytes, res.bytes);
        if (res.status != DUET_OK && st == DUET_OK) {
            st = res.status;
            snprintf(why, sizeof(why), "%s", res.detail);
        }
    }
    if (st != DUET_OK)
        return duet_error(st, "chunk %d of %s: %s", k, req->request_id, why);
    return DUET_OK;
}

duet_status_t duet_pf_send_chunks(duet_prefill_t *pf, duet_pf_req_t *req, int32_t first_token)
{
    int total = req->n_pages - req->skip, c = req->chunk_pages;
    int n_chunks = (total + c - 1) / c;
    /* fault injection: a long chunk phase, so a test can act mid-transfer */
    long delay_ms = duet_fault_value("prefill.chunk_delay_ms", 0);
    duet_status_t st;

    DUET_LOG_DEBUG("prefill: %s: %d pages in %d chunks of %d", req->request_id, total, n_chunks, c);
    for (int k = 0; k < n_chunks; k++) {
        int first = k * c, n = total - first < c ? total - first : c;
        if (k > 0 && delay_ms > 0)
            nanosleep(&(struct timespec){delay_ms / 1000, (delay_ms % 1000) * 1000000L}, NULL);
        if (req->aborted)
            return duet_error(DUET_ERR_CANCELLED, "aborted after %d of %d chunks", k, n_chunks);
        if ((st = duet__chunk_stage(pf, req, first, n)) != DUET_OK)
            return duet_error_wrap(st, "staging chunk %d: ", k);
        if ((st = duet__chunk_send(pf, req, k, first, n, first_token)) != DUET_OK)
            return st;
    }
    return DUET_OK;
}
