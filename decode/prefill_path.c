/* The mechanics of a remote prefill (prefill_path.h; DESIGN §1 steps
 * 2-3): bootstrap with the prefill daemon once, register what every rank
 * expects (the slice plan's senders), call Prefill, and turn the
 * completions into events.  Which of these a request does, and when, is
 * req.c's.
 *
 * Page safety: a request's pages are reused only after nothing can write
 * them any more -- all its expectations completed, or the Prefill call
 * returned (then the prefill daemon has stopped sending: it answers only
 * after every send ended) and the remaining expectations were cancelled. */
#include "decode/prefill_path.h"

#include <assert.h>
#include <limits.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/random.h"
#include "common/rpc_pb.h"
#include "decode/events.h"
#include "decode/lp.h"
#include "decode/owner.h"
#include "duet/v1/common.pb-c.h"
#include "duet/v1/prefill.pb-c.h"
#include "node/deadline.h"
#include "transfer/xfer_pack.h"

/* ---- links ---------------------------------------------------------------- */

typedef struct {
    duet_decode_t *dc;
    duet_dc_link_t *link;
    duet_dc_ev_t *ev; /* its LINK_DONE, allocated with the task */
} duet__link_boot_t;

/* Bootstrap (worker thread): exchange descriptors, connect our ranks to
 * their senders (node/link.h), then tell the scheduler. */
static void duet__link_boot(void *arg)
{
    duet__link_boot_t *t = arg;
    t->ev->link = t->link;
    /* a target not in the config was accepted pending a lookup of the
     * discover names: decide before any connection */
    t->ev->status = duet_dc_target_check(t->dc, t->link->base.key, true);
    if (t->ev->status != DUET_OK)
        snprintf(t->link->base.error, sizeof(t->link->base.error), "%s", duet_error_msg());
    else
        t->ev->status = duet_node_link_bootstrap(&t->dc->node, &t->link->base);
    duet_dc_post(t->dc, t->ev);
    duet_free(t);
}

duet_dc_link_t *duet_dc_link_get(duet_decode_t *dc, const char *target)
{
    duet_node_link_t *found = duet_node_link_find(&dc->node, target, false);
    duet_dc_link_t *link;
    duet__link_boot_t *t;

    if (found != NULL)
        return duet_dc_link_of(found);
    t = DUET_NEW(duet__link_boot_t);
    if (t == NULL || (t->ev = duet_dc_ev_new(DUET_DC_EV_LINK_DONE, NULL)) == NULL) {
        duet_free(t);
        return NULL;
    }
    link = duet_dc_link_of(duet_node_link_add(&dc->node, target, sizeof(duet_dc_link_t)));
    if (link == NULL) {
        duet_free(t->ev);
        duet_free(t);
        return NULL;
    }
    t->dc = dc;
    t->link = link;
    if (duet_workq_post(dc->node.workq, duet__link_boot, t) != DUET_OK) {
        duet_node_link_retire(&link->base);
        duet_free(t->ev);
        duet_free(t);
        return NULL;
    }
    return link;
}

/* ---- expectations and the Prefill call ---------------------------------- */

duet_status_t duet_dc_phase_status(duet_status_t st)
{
    switch (st) {
    case DUET_ERR_INVALID:
    case DUET_ERR_NOT_FOUND:
    case DUET_ERR_FORMAT:
    case DUET_ERR_UNSUPPORTED:
        return DUET_ERR_INTERNAL;
    default:
        return st;
    }
}

static void duet__expect_done_cb(void *arg, uint64_t id, const duet_xfer_result_t *res)
{
    duet_dc_rank_arg_t *ra = arg;
    /* the event allocated with the expectation (one callback per one) */
    duet_dc_ev_t *ev = ra->ev;
    ra->ev = NULL;
    assert(ev != NULL);
    ev->type = DUET_DC_EV_KV_DONE;
    ev->req = ra->req;
    ev->rank = ra->rank;
    ev->transfer_id = id;
    ev->status = res->status;
    ev->first_token = res->first_token;
    snprintf(ev->detail, sizeof(ev->detail), "%s", res->detail);
    duet_dc_post(ra->dc, ev);
}

/* Progress thread: more layers landed on this rank (packed).  Losing the
 * event to a failed allocation only loses the early unpack. */
static void duet__expect_progress_cb(void *arg, uint64_t id, int layers)
{
    duet_dc_rank_arg_t *ra = arg;
    duet_dc_ev_t *ev = duet_dc_ev_new(DUET_DC_EV_KV_PROGRESS, ra->req);
    if (ev == NULL)
        return;
    ev->rank = ra->rank;
    ev->transfer_id = id;
    ev->layers = layers;
    duet_dc_post(ra->dc, ev);
}

typedef struct {
    duet_decode_t *dc;
    duet_dc_req_t *req;
    uint64_t transfer_id;
    duet_dc_ev_t *ev; /* RPC_DONE, allocated with the call */
} duet__call_arg_t;

static void duet__call_message(duet_rpc_stream_t *stream, const uint8_t *data, size_t len,
                               void *arg)
{
    /* the first token comes with the notifications; the reply's timings
     * are only logged */
    duet__call_arg_t *a = arg;
    Duet__V1__PrefillResponse *r = duet__v1__prefill_response__unpack(NULL, len, data);
    if (r != NULL && r->started) {
        /* prefill began it (announce_start): losing the event to a failed
         * allocation only keeps the first, longer deadline */
        duet_dc_ev_t *ev = duet_dc_ev_new(DUET_DC_EV_KV_STARTED, a->req);
        if (ev != NULL) {
            ev->transfer_id = a->transfer_id;
            duet_dc_post(a->dc, ev);
        }
        duet__v1__prefill_response__free_unpacked(r, NULL);
        return;
    }
    duet_dc_lp_take_reply(a->dc, a->req, data, len);
    if (r != NULL) {
        DUET_LOG_DEBUG("decode: prefill replied: queue %u us compute %u us transfer %u us, %llu "
                       "bytes",
                       r->queue_us, r->compute_us, r->transfer_us,
                       (unsigned long long)r->bytes_sent);
        duet__v1__prefill_response__free_unpacked(r, NULL);
    }
}

static void duet__call_done(duet_rpc_stream_t *stream, grpc_status_code code, const char *msg,
                            void *arg)
{
    duet__call_arg_t *a = arg;
    duet_dc_ev_t *ev = a->ev;
    ev->status = code == GRPC_STATUS_OK ? DUET_OK : duet_rpc_status_from_grpc(code);
    snprintf(ev->detail, sizeof(ev->detail), "%s", msg ? msg : "");
    duet_dc_post(a->dc, ev);
    duet_free(a);
}

static void duet__abort_message(duet_rpc_stream_t *stream, const uint8_t *data, size_t len,
                                void *arg)
{
}

static void duet__abort_done(duet_rpc_stream_t *stream, grpc_status_code code, const char *msg,
                             void *arg)
{
}

int duet_dc_stage_max_pages(const duet_dc_link_t *link)
{
    const duet_slice_plan_t *plan = link->base.plan;
    int D = duet_slice_plan_decode_tp(plan), max = INT_MAX;
    for (int s = 0; s < duet_slice_plan_prefill_tp(plan); s++) {
        const duet_slice_run_t *runs;
        int n_runs = duet_slice_plan_src_runs(plan, s, &runs);
        const duet_xfer_desc_info_t *in = NULL;
        for (int d = 0; d < D && in == NULL; d++) {
            duet_xfer_peer_t *p = duet_node_link_peers(&link->base, d)[s];
            in = p != NULL ? duet_xfer_peer_info(p) : NULL;
        }
        if (n_runs == 0)
            continue;
        if (in == NULL)
            return 0;
        /* duet_xfer_pack_units(l, n, slots) = ceil(n * slots / heads) <= units */
        int64_t units = duet_xfer_stage_units(&in->layout, in->pool_bytes);
        int64_t n = units * in->layout.n_kv_heads / duet_xfer_pack_slots(runs, n_runs);
        if (n < max)
            max = (int)n;
    }
    return max;
}

duet_status_t duet_dc_transfer_id_new(duet_decode_t *dc, int span, uint64_t *id_p)
{
    uint64_t id, n = span > 1 ? (uint64_t)span : 1;
    bool used;
    do {
        duet_status_t st = duet_random_nonzero_u64(&id);
        if (st != DUET_OK)
            return st;
        used = id > UINT64_MAX - n; /* (chunk ids id .. id + span - 1 never wrap) */
        for (duet_dc_req_t *r = dc->prefilling; r != NULL && !used; r = r->next) {
            uint64_t rn = r->n_chunks > 1 ? (uint64_t)r->n_chunks : 1;
            used = id < r->transfer_id + rn && r->transfer_id < id + n;
        }
    } while (used);
    *id_p = id;
    return DUET_OK;
}

const char *duet_dc_prefill_pick(duet_decode_t *dc, const duet_dc_req_t *req)
{
    const duet_cluster_config_t *c = dc->node.args.cluster;
    if (req->prefill_target[0] != '\0')
        return req->prefill_target;
    for (int i = 0; i < c->n_prefill; i++) {
        const duet_instance_config_t *p = &c->prefill[(dc->next_prefill + i) % c->n_prefill];
        if (p->address != NULL && p->address[0] != '\0') {
            dc->next_prefill = (dc->next_prefill + i + 1) % c->n_prefill;
            return p->address;
        }
    }
    return NULL;
}

int duet_dc_progress_layers(const duet_decode_t *dc, const duet_dc_req_t *req,
                            const duet_dc_link_t *link)
{
    /* (a chunk's layers land together: no progress messages) */
    int progress = req->stage0 >= 0 && req->chunk_pages == 0 ? dc->node.ke.progress_layers : 0;
    if (progress > 0 && dc->node.ke.progress_auto && link->base.shares_gpu &&
        !duet_xfer_pack_progress_pays(duet_engine_kv_layout(dc->node.ke.engine),
                                      dc->node.ke.kv_heads, duet_dc_xfer_pages(req)))
        progress = 0;
    return progress;
}

duet_status_t duet_dc_expect_all(duet_decode_t *dc, duet_dc_req_t *req, duet_dc_link_t *link,
                                 int64_t deadline_ns, int progress, duet_status_t *rank_st)
{
    int D = dc->node.ke.tp;
    duet_xfer_expect_t e[DUET_TP_MAX] = {0};
    duet_xfer_rank_t *ranks[DUET_TP_MAX] = {0};
    duet_status_t st;
    int first;
    int32_t stage;
    int n_pages = duet_dc_xfer_span(req, &first, &stage);

    for (int d = 0; d < D; d++)
        rank_st[d] = DUET_ERR_INTERNAL; /* not registered */
    for (int d = 0; d < D; d++) {
        /* (an earlier attempt's event is reused: its expectation ended
         * without a callback, by cancellation) */
        duet_dc_ev_t *ev = req->rank_args[d].ev;
        if (ev == NULL && (ev = duet_dc_ev_new(DUET_DC_EV_KV_DONE, req)) == NULL)
            return duet_error(DUET_ERR_NO_MEMORY, "no memory");
        req->rank_args[d] = (duet_dc_rank_arg_t){dc, req, d, ev, 0};
        ranks[d] = duet_xfer_rank(dc->node.ke.xfer, d);
        e[d] = (duet_xfer_expect_t){
            .transfer_id = duet_dc_xfer_id(req),
            .plan = link->base.plan,
            .peers = duet_node_link_peers(&link->base, d),
            .pages = req->pages + req->n_cached_pages + first,
            .n_pages = n_pages,
            .deadline_ns = deadline_ns,
            .cb = duet__expect_done_cb,
            .arg = &req->rank_args[d],
            /* (a later chunk's senders have started: no announcement) */
            .flags = (req->stage0 >= 0 ? DUET_XFER_EXPECT_PACKED : 0) |
                     (req->chunk == 0 ? DUET_XFER_EXPECT_STARTS : 0),
            .dst_stage0 = stage,
            .progress = progress > 0 ? duet__expect_progress_cb : NULL,
            .progress_arg = &req->rank_args[d],
        };
    }
    /* every rank registers at once: the Prefill call waits for them */
    st = duet_xfer_recv_expect_all(ranks, e, D, rank_st);
    if (st != DUET_OK) {
        for (int d = 0; d < D; d++)
            if (rank_st[d] != DUET_OK)
                return duet_error_wrap(st, "decode rank %d: ", d);
    }
    return st;
}

duet_status_t duet_dc_prefill_call(duet_decode_t *dc, duet_dc_req_t *req, duet_dc_link_t *link,
                                   int64_t now_ns, int progress, duet_rpc_stream_t **stream_p)
{
    const duet_cluster_config_t *c = dc->node.args.cluster;
    Duet__V1__PrefillRequest pr = DUET__V1__PREFILL_REQUEST__INIT;
    Duet__V1__SamplingParams sp = DUET__V1__SAMPLING_PARAMS__INIT;
    duet__call_arg_t *ca;
    uint8_t grant[DUET_NODE_GRANT_LEN];
    uint8_t *buf = NULL;
    size_t len = 0;
    duet_status_t st;

    sp.temperature = req->sampling.temperature;
    sp.top_k = req->sampling.top_k;
    sp.top_p = req->sampling.top_p;
    sp.seed = req->sampling.seed;
    sp.has_seed = true;
    pr.request_id = req->request_id;
    pr.decode_id = dc->node.args.instance_id;
    pr.n_prompt_ids = (size_t)req->n_prompt;
    pr.prompt_ids = req->prompt;
    pr.n_dst_pages = (size_t)duet_dc_xfer_pages(req);
    pr.dst_pages = req->pages + req->n_cached_pages;
    pr.cached_pages = (uint32_t)req->n_cached_pages;
    pr.first_output_index = (uint32_t)req->first_index;
    pr.sampling = &sp;
    pr.transfer_id = req->transfer_id;
    pr.packed = req->stage0 >= 0;
    pr.dst_stage_page = req->stage0 >= 0 ? req->stage0 : 0;
    pr.kv_progress_layers = (uint32_t)progress;
    pr.chunk_pages = req->stage0 >= 0 ? (uint32_t)req->chunk_pages : 0;
    pr.logprobs = req->logprobs;
    pr.top_logprobs = (uint32_t)req->top_logprobs;
    pr.prompt_logprobs = req->prompt_logprobs;
    pr.announce_start = true;
    /* the grant for exactly these pages (node/grant.h); it outlives the
     * call's deadline by nothing (node/deadline.h) */
    duet_node_grant_t g = {
        .transfer_id = req->transfer_id,
        .decode_id = pr.decode_id,
        .pages = req->pages + req->n_cached_pages,
        .n_pages = (size_t)duet_dc_xfer_pages(req),
        .packed = pr.packed,
        .stage0 = pr.dst_stage_page,
        .chunk_pages = pr.chunk_pages,
        .expiry_ms = duet_node_deadline_grant_expiry(c),
        .prompt = pr.prompt_ids,
        .n_prompt = pr.n_prompt_ids,
        .cached_pages = pr.cached_pages,
        .temperature = sp.temperature,
        .top_p = sp.top_p,
        .top_k = sp.top_k,
        .seed = sp.seed,
    };
    if ((st = duet_node_grant_sign(link->base.grant_key, &g, grant)) != DUET_OK)
        return duet_error_wrap(st, "prefill %s: signing the grant: ", link->base.key);
    pr.grant = (ProtobufCBinaryData){sizeof(grant), grant};
    pr.grant_expiry_ms = g.expiry_ms;
    ca = DUET_NEW(duet__call_arg_t);
    if (ca == NULL || (ca->ev = duet_dc_ev_new(DUET_DC_EV_RPC_DONE, req)) == NULL) {
        st = duet_error(DUET_ERR_NO_MEMORY, "no memory");
        goto err_free_arg;
    }
    ca->dc = dc;
    ca->req = req;
    ca->transfer_id = req->transfer_id;
    if ((st = duet_pb_pack(&pr.base, &buf, &len)) != DUET_OK)
        goto err_free_event;
    st = duet_rpc_client_stream(dc->node.cli, link->base.key, "/duet.v1.Prefill/Prefill", buf, len,
                                duet_node_deadline_prefill_call(c, now_ns), duet__call_message,
                                duet__call_done, ca, stream_p);
    duet_free(buf);
    if (st != DUET_OK) {
        st = duet_error_wrap(st, "prefill %s: ", link->base.key);
        goto err_free_event;
    }
    return DUET_OK;

err_free_event:
    duet_free(ca->ev);
err_free_arg:
    duet_free(ca);
    return st;
}

void duet_dc_prefill_abort(duet_decode_t *dc, const duet_dc_req_t *req)
{
    Duet__V1__AbortRequest ab = DUET__V1__ABORT_REQUEST__INIT;
    uint8_t *buf = NULL;
    size_t len = 0;
    ab.request_id = (char *)req->request_id;
    ab.caller_id = dc->node.args.instance_id;
    ab.transfer_id = req->transfer_id;
    if (duet_pb_pack(&ab.base, &buf, &len) != DUET_OK ||
        duet_rpc_client_stream(dc->node.cli, req->prefill_target, "/duet.v1.Prefill/Abort", buf,
                               len, duet_node_deadline_rpc(dc->node.args.cluster, duet_now_ns()),
                               duet__abort_message, duet__abort_done, NULL, NULL) != DUET_OK)
        DUET_LOG_WARN("decode: cannot ask prefill %s to abort %s: %s", req->prefill_target,
                      req->request_id, duet_error_msg());
    duet_free(buf);
}

void duet_dc_link_cut(duet_decode_t *dc, duet_dc_link_t *link, const char *why)
{
    if (link->base.peers == NULL)
        return;
    for (int d = 0; d < dc->node.ke.tp; d++) {
        duet_xfer_peer_t *const *peers = duet_node_link_peers(&link->base, d);
        for (int s = 0; s < link->base.remote_tp; s++)
            if (peers[s] != NULL)
                (void)duet_xfer_peer_cut(duet_xfer_rank(dc->node.ke.xfer, d), peers[s], why);
    }
    if (link->base.state == DUET_NODE_LINK_READY)
        duet_node_link_retire(&link->base);
}

void duet_dc_on_peer_failed(duet_decode_t *dc, const duet_dc_ev_t *ev)
{
    char target[128];
    if (duet_node_link_retire_peer(&dc->node, ev->peer, ev->peer_instance, ev->rank, target,
                                   sizeof(target)))
        DUET_LOG_WARN("decode: transfer connection to prefill %s failed: %s; the next request "
                      "bootstraps again",
                      target, ev->detail);
}

void duet_dc_on_peer_error(void *arg, duet_xfer_peer_t *peer, duet_status_t st, const char *detail)
{
    duet_decode_t *dc = arg;
    duet_dc_ev_t *ev = duet_dc_ev_new(DUET_DC_EV_PEER_ERROR, NULL);
    if (ev == NULL)
        return;
    ev->peer = peer;
    ev->peer_instance = duet_xfer_peer_info(peer)->instance; /* valid during the callback */
    ev->rank = duet_xfer_peer_info(peer)->rank;
    ev->status = st;
    snprintf(ev->detail, sizeof(ev->detail), "%s", detail);
    duet_dc_post(dc, ev);
}
