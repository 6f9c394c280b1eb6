/* The prefill phase of a decode request (DESIGN §1 steps 2-3): bootstrap
 * with the prefill daemon once, register what every rank expects (the
 * slice plan's senders), call Prefill, and learn that the KV is complete.
 *
 * Page safety: a request's pages are reused only after nothing can write
 * them any more -- all its expectations completed, or the Prefill call
 * returned (then the prefill daemon has stopped sending: it answers only
 * after every send ended) and the remaining expectations were cancelled. */
#include <assert.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/random.h"
#include "common/rpc_pb.h"
#include "decode/decode.h"
#include "duet/v1/common.pb-c.h"
#include "duet/v1/prefill.pb-c.h"
#include "kv/heads.h"
#include "transfer/xfer_pack.h"

/* ---- links ---------------------------------------------------------------- */

typedef struct {
    duet_decode_t *dc;
    duet_dc_link_t *link;
    duet_dc_ev_t *ev; /* its LINK_DONE, allocated with the task */
} duet__boot_task_t;

/* Bootstrap (worker thread): exchange descriptors, connect our ranks to
 * their senders (node/link.h), then tell the scheduler. */
static void duet__boot_task(void *arg)
{
    duet__boot_task_t *t = arg;
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

static duet_dc_link_t *duet__link_for(duet_decode_t *dc, const char *target)
{
    duet_node_link_t *found = duet_node_link_find(&dc->node, target, false);
    duet_dc_link_t *link;
    duet__boot_task_t *t;

    if (found != NULL)
        return duet_dc_link_of(found);
    t = DUET_NEW(duet__boot_task_t);
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
    if (duet_workq_post(dc->node.workq, duet__boot_task, t) != DUET_OK) {
        duet_node_link_retire(&link->base);
        duet_free(t->ev);
        duet_free(t);
        return NULL;
    }
    return link;
}

/* ---- the Prefill call ----------------------------------------------------- */

/* A failure of the prefill phase as the client sees it: the request was
 * validated here, so what the transfer layer or the prefill daemon finds
 * invalid or unknown is an internal error (retried by the router), not the
 * client's INVALID_ARGUMENT or NOT_FOUND. */
static duet_status_t duet__phase_status(duet_status_t st)
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

static void duet__kv_complete(duet_decode_t *dc, duet_dc_req_t *req);

static void duet__kv_cb(void *arg, uint64_t id, const duet_xfer_result_t *res)
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
static void duet__kv_progress_cb(void *arg, uint64_t id, int layers)
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

void duet_dc_on_kv_progress(duet_decode_t *dc, duet_dc_ev_t *ev)
{
    duet_dc_req_t *req = ev->req;
    int D = dc->node.ke.tp, least = ev->layers;

    if (ev->transfer_id != req->transfer_id || req->state != DUET_DC_PREFILL || req->stage0 < 0 ||
        req->kv_failed || req->expecting == NULL || !req->expecting[ev->rank])
        return;
    if (ev->layers > req->rank_args[ev->rank].landed)
        req->rank_args[ev->rank].landed = ev->layers;
    for (int d = 0; d < D; d++)
        if (req->rank_args[d].landed < least)
            least = req->rank_args[d].landed;
    if (least <= req->unpacked)
        return;
    duet_status_t st = duet_dc_unpack_layers(dc, req, req->unpacked, least, false);
    if (st != DUET_OK) {
        /* the final unpack runs these layers again and reports */
        DUET_LOG_WARN("decode: request %s: unpacking layers [%d, %d): %s", req->request_id,
                      req->unpacked, least, duet_error_msg());
        return;
    }
    DUET_LOG_DEBUG("decode: request %s: layers [%d, %d) unpacked early", req->request_id,
                   req->unpacked, least);
    pthread_mutex_lock(&dc->evlock);
    dc->unpacked_early += (uint64_t)(least - req->unpacked);
    pthread_mutex_unlock(&dc->evlock);
    req->unpacked = least;
}

typedef struct {
    duet_decode_t *dc;
    duet_dc_req_t *req;
    duet_dc_ev_t *ev; /* RPC_DONE, allocated with the call */
} duet__rpc_arg_t;

static void duet__rpc_message(duet_rpc_stream_t *stream, const uint8_t *data, size_t len, void *arg)
{
    /* the first token comes with the notifications; the reply's timings
     * are only logged */
    duet__rpc_arg_t *a = arg;
    duet_dc_lp_take_reply(a->dc, a->req, data, len);
    Duet__V1__PrefillResponse *r = duet__v1__prefill_response__unpack(NULL, len, data);
    if (r != NULL) {
        DUET_LOG_DEBUG("decode: prefill replied: queue %u us compute %u us transfer %u us, %llu "
                       "bytes",
                       r->queue_us, r->compute_us, r->transfer_us,
                       (unsigned long long)r->bytes_sent);
        duet__v1__prefill_response__free_unpacked(r, NULL);
    }
}

static void duet__rpc_done(duet_rpc_stream_t *stream, grpc_status_code code, const char *msg,
                           void *arg)
{
    duet__rpc_arg_t *a = arg;
    duet_dc_ev_t *ev = a->ev;
    ev->status = code == GRPC_STATUS_OK ? DUET_OK : duet_rpc_status_from_grpc(code);
    snprintf(ev->detail, sizeof(ev->detail), "%s", msg ? msg : "");
    duet_dc_post(a->dc, ev);
    duet_free(a);
}

static void duet__noop_message(duet_rpc_stream_t *stream, const uint8_t *data, size_t len,
                               void *arg)
{
}

static void duet__noop_done(duet_rpc_stream_t *stream, grpc_status_code code, const char *msg,
                            void *arg)
{
}

/* Cancel every expectation still registered (only once the Prefill call
 * returned or never started: see the file comment). */
static void duet__cancel_expectations(duet_decode_t *dc, duet_dc_req_t *req)
{
    for (int d = 0; d < dc->node.ke.tp; d++) {
        if (req->expecting != NULL && req->expecting[d]) {
            duet_xfer_recv_cancel(duet_xfer_rank(dc->node.ke.xfer, d), req->transfer_id);
            req->expecting[d] = false;
        }
    }
    req->n_expecting = 0;
}

/* A transfer id no other transfer of ours is using (scheduler thread):
 * random, so no caller can guess it (Prefill.Abort takes it), and checked
 * against the requests in the prefill phase, where ids are live. */
/* Whether every prefill rank of link has the staging a packed transfer of
 * n_pages needs there (transfer/xfer_pack.h): else it moves unpacked. */
static bool duet__stage_fits(const duet_dc_link_t *link, int n_pages)
{
    const duet_slice_plan_t *plan = link->base.plan;
    int D = duet_slice_plan_decode_tp(plan);
    for (int s = 0; s < duet_slice_plan_prefill_tp(plan); s++) {
        const duet_slice_run_t *runs;
        int n_runs = duet_slice_plan_src_runs(plan, s, &runs);
        const duet_xfer_desc_info_t *in = NULL;
        for (int d = 0; d < D && in == NULL; d++) {
            duet_xfer_peer_t *p = duet_node_link_peers(&link->base, d)[s];
            in = p != NULL ? duet_xfer_peer_info(p) : NULL;
        }
        if (n_runs > 0 && (in == NULL || duet_xfer_pack_units(&in->layout, n_pages,
                                                              duet_xfer_pack_slots(runs, n_runs)) >
                                             duet_xfer_stage_units(&in->layout, in->pool_bytes)))
            return false;
    }
    return true;
}

static duet_status_t duet__new_transfer_id(duet_decode_t *dc, uint64_t *id_p)
{
    uint64_t id;
    bool used;
    do {
        duet_status_t st = duet_random_nonzero_u64(&id);
        if (st != DUET_OK)
            return st;
        used = false;
        for (duet_dc_req_t *r = dc->prefilling; r != NULL && !used; r = r->next)
            used = r->transfer_id == id;
    } while (used);
    *id_p = id;
    return DUET_OK;
}

static void duet__begin(duet_decode_t *dc, duet_dc_req_t *req, duet_dc_link_t *link)
{
    int D = dc->node.ke.tp;
    int64_t now = duet_now_ns();
    Duet__V1__PrefillRequest pr = DUET__V1__PREFILL_REQUEST__INIT;
    Duet__V1__SamplingParams sp = DUET__V1__SAMPLING_PARAMS__INIT;
    duet__rpc_arg_t *ra = NULL;
    uint8_t grant[DUET_NODE_GRANT_LEN];
    uint8_t *buf = NULL;
    size_t len = 0;
    duet_status_t st;

    req->link = link;
    duet_node_link_hold(&link->base);
    /* equal TP sizes: every decode rank takes all its heads from one
     * prefill rank, per-page puts coalesce over consecutive pages, and
     * packing would only add two copies (measured: README "Packed
     * transfers"); the first attempt decides, a retry keeps it */
    if (req->stage0 >= 0 && !req->retried &&
        duet_slice_plan_prefill_tp(link->base.plan) == duet_slice_plan_decode_tp(link->base.plan))
        duet_dc_stage_release(dc, req);
    if (req->stage0 >= 0 && !req->retried && !duet__stage_fits(link, duet_dc_xfer_pages(req))) {
        duet_dc_unstaged(dc, req, "a prefill rank's staging arena is smaller than the request");
        duet_dc_stage_release(dc, req);
    }
    /* a retry: the first attempt's early unpacks read the staging that
     * this one's puts overwrite */
    duet_dc_unpack_wait(dc, req);
    req->unpacked = 0;
    req->kv_ok = 0;
    req->kv_failed = false;
    req->state = DUET_DC_PREFILL;
    /* (the old id of a retried attempt is not live any more) */
    req->transfer_id = 0;
    if ((st = duet__new_transfer_id(dc, &req->transfer_id)) != DUET_OK) {
        /* fail below unlinks it from the prefilling list */
        req->next = dc->prefilling;
        dc->prefilling = req;
        goto fail;
    }
    req->next = dc->prefilling;
    dc->prefilling = req;
    /* packed: announcements of landed layers, where they pay (kv_engine.h) */
    int progress = req->stage0 >= 0 ? dc->node.ke.progress_layers : 0;
    if (progress > 0 && dc->node.ke.progress_auto && link->base.shares_gpu &&
        !duet_xfer_pack_progress_pays(duet_engine_kv_layout(dc->node.ke.engine),
                                      dc->node.ke.kv_heads, duet_dc_xfer_pages(req)))
        progress = 0;
    duet_xfer_expect_t e[DUET_TP_MAX];
    duet_xfer_rank_t *ranks[DUET_TP_MAX];
    duet_status_t rank_st[DUET_TP_MAX];
    for (int d = 0; d < D; d++) {
        /* (an earlier attempt's event is reused: its expectation ended
         * without a callback, by cancellation) */
        duet_dc_ev_t *ev = req->rank_args[d].ev;
        if (ev == NULL && (ev = duet_dc_ev_new(DUET_DC_EV_KV_DONE, req)) == NULL) {
            st = duet_error(DUET_ERR_NO_MEMORY, "no memory");
            goto fail;
        }
        req->rank_args[d] = (duet_dc_rank_arg_t){dc, req, d, ev, 0};
        ranks[d] = duet_xfer_rank(dc->node.ke.xfer, d);
        e[d] = (duet_xfer_expect_t){
            .transfer_id = req->transfer_id,
            .plan = link->base.plan,
            .peers = duet_node_link_peers(&link->base, d),
            .pages = req->pages + req->n_cached_pages,
            .n_pages = duet_dc_xfer_pages(req),
            .deadline_ns =
                now + (int64_t)dc->node.args.cluster->transfer_timeout_ms * DUET_NS_PER_MS,
            .cb = duet__kv_cb,
            .arg = &req->rank_args[d],
            .flags = req->stage0 >= 0 ? DUET_XFER_EXPECT_PACKED : 0,
            .dst_stage0 = req->stage0,
            .progress = progress > 0 ? duet__kv_progress_cb : NULL,
            .progress_arg = &req->rank_args[d],
        };
    }
    /* every rank registers at once: the Prefill call waits for them */
    st = duet_xfer_recv_expect_all(ranks, e, D, rank_st);
    for (int d = 0; d < D; d++) {
        if (rank_st[d] != DUET_OK)
            continue;
        req->expecting[d] = true;
        req->n_expecting++;
    }
    if (st != DUET_OK) {
        for (int d = 0; d < D; d++)
            if (rank_st[d] != DUET_OK) {
                st = duet_error_wrap(st, "decode rank %d: ", d);
                break;
            }
        goto fail;
    }
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
    pr.sampling = &sp;
    pr.transfer_id = req->transfer_id;
    pr.packed = req->stage0 >= 0;
    pr.dst_stage_page = req->stage0 >= 0 ? req->stage0 : 0;
    pr.kv_progress_layers = (uint32_t)progress;
    pr.logprobs = req->logprobs;
    pr.top_logprobs = (uint32_t)req->top_logprobs;
    pr.prompt_logprobs = req->prompt_logprobs;
    /* the grant for exactly these pages (node/grant.h); it outlives the
     * call's deadline by nothing */
    duet_node_grant_t g = {
        .transfer_id = req->transfer_id,
        .decode_id = pr.decode_id,
        .pages = req->pages + req->n_cached_pages,
        .n_pages = (size_t)duet_dc_xfer_pages(req),
        .packed = pr.packed,
        .stage0 = pr.dst_stage_page,
        .expiry_ms = duet_node_grant_now_ms() +
                     (uint64_t)dc->node.args.cluster->transfer_timeout_ms +
                     (uint64_t)dc->node.args.cluster->rpc_timeout_ms,
    };
    duet_node_grant_sign(link->base.grant_key, &g, grant);
    pr.grant = (ProtobufCBinaryData){sizeof(grant), grant};
    pr.grant_expiry_ms = g.expiry_ms;
    ra = DUET_NEW(duet__rpc_arg_t);
    if (ra == NULL || (ra->ev = duet_dc_ev_new(DUET_DC_EV_RPC_DONE, req)) == NULL) {
        st = duet_error(DUET_ERR_NO_MEMORY, "no memory");
        goto fail;
    }
    ra->dc = dc;
    ra->req = req;
    if ((st = duet_pb_pack(&pr.base, &buf, &len)) != DUET_OK)
        goto fail;
    st = duet_rpc_client_stream(dc->node.cli, link->base.key, "/duet.v1.Prefill/Prefill", buf, len,
                                now + ((int64_t)dc->node.args.cluster->transfer_timeout_ms +
                                       dc->node.args.cluster->rpc_timeout_ms) *
                                          DUET_NS_PER_MS,
                                duet__rpc_message, duet__rpc_done, ra, &req->rpc_stream);
    duet_free(buf);
    if (st != DUET_OK) {
        st = duet_error_wrap(st, "prefill %s: ", link->base.key);
        goto fail;
    }
    req->rpc_started = true;
    req->rpc_done = false;
    req->t_called = duet_now_ns();
    return;

fail:
    if (ra != NULL)
        duet_free(ra->ev);
    duet_free(ra);
    /* no Prefill call is running: nothing will write these pages */
    duet__cancel_expectations(dc, req);
    duet_dc_fail(dc, req, duet__phase_status(st), duet_error_msg());
}

static const char *duet__pick_prefill(duet_decode_t *dc)
{
    const duet_cluster_config_t *c = dc->node.args.cluster;
    for (int i = 0; i < c->n_prefill; i++) {
        const duet_instance_config_t *p = &c->prefill[(dc->next_prefill + i) % c->n_prefill];
        if (p->address != NULL && p->address[0] != '\0') {
            dc->next_prefill = (dc->next_prefill + i + 1) % c->n_prefill;
            return p->address;
        }
    }
    return NULL;
}

void duet_dc_prefill_start(duet_decode_t *dc, duet_dc_req_t *req)
{
    const char *target = req->prefill_target[0] ? req->prefill_target : duet__pick_prefill(dc);
    duet_dc_link_t *link;

    if (target == NULL) {
        duet_dc_fail(dc, req, DUET_ERR_PEER,
                     "no prefill instance: the request names none and the config lists none");
        return;
    }
    if (target != req->prefill_target)
        snprintf(req->prefill_target, sizeof(req->prefill_target), "%s", target);
    link = duet__link_for(dc, target);
    if (link == NULL) {
        duet_dc_fail(dc, req, DUET_ERR_NO_MEMORY, "no memory for a prefill link");
        return;
    }
    if (link->base.state == DUET_NODE_LINK_READY) {
        duet__begin(dc, req, link);
        return;
    }
    /* BOOTING: wait for it */
    req->state = DUET_DC_LINKING;
    req->link = link;
    duet_node_link_hold(&link->base);
    req->next = link->waiting;
    link->waiting = req;
    atomic_fetch_add(&dc->waiting, 1);
}

void duet_dc_on_link_done(duet_decode_t *dc, duet_dc_ev_t *ev)
{
    duet_dc_link_t *link = ev->link;
    duet_dc_req_t *waiting = link->waiting;

    link->waiting = NULL;
    if (ev->status == DUET_OK)
        duet_node_link_ready(&link->base);
    while (waiting != NULL) {
        duet_dc_req_t *req = waiting;
        waiting = req->next;
        req->next = NULL;
        atomic_fetch_sub(&dc->waiting, 1);
        duet_node_link_put(&req->link->base); /* the LINKING reference */
        req->link = NULL;
        if (ev->status == DUET_OK) {
            duet__begin(dc, req, link);
        } else {
            req->state = DUET_DC_NEW;
            duet_dc_fail(dc, req,
                         ev->status == DUET_ERR_MISMATCH || ev->status == DUET_ERR_INVALID
                             ? ev->status
                             : DUET_ERR_PEER,
                         link->base.error);
        }
    }
    if (ev->status != DUET_OK)
        duet_node_link_retire(&link->base);
}

void duet_dc_on_peer_failed(duet_decode_t *dc, duet_dc_ev_t *ev)
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

void duet_dc_on_kv_done(duet_decode_t *dc, duet_dc_ev_t *ev)
{
    duet_dc_req_t *req = ev->req;
    int D = dc->node.ke.tp;

    /* a notification of an attempt that was retried (new transfer id) */
    if (ev->transfer_id != req->transfer_id)
        return;
    if (req->expecting == NULL || !req->expecting[ev->rank])
        return; /* cancelled: no longer counted */
    req->expecting[ev->rank] = false;
    req->n_expecting--;
    if (req->state == DUET_DC_ENDED) {
        duet_dc_release(dc, req);
        return;
    }
    if (ev->status != DUET_OK) {
        char msg[640];
        req->kv_failed = true;
        /* prefill refused to send (non-finite logits): its Prefill reply,
         * which follows, says why; on_rpc_done fails the request with it */
        if (ev->status == DUET_ERR_INTERNAL && req->rpc_started && !req->rpc_done &&
            req->state == DUET_DC_PREFILL)
            return;
        /* a connection of the link failed (also one whose peer error came
         * while it was booting): the next request bootstraps again */
        if (ev->status == DUET_ERR_PEER && req->link != NULL &&
            req->link->base.state == DUET_NODE_LINK_READY)
            duet_node_link_retire(&req->link->base);
        snprintf(msg, sizeof(msg), "kv transfer from prefill %s failed on decode rank %d: %s",
                 req->prefill_target, ev->rank, ev->detail);
        duet_dc_fail(dc, req, duet__phase_status(ev->status), msg);
        return;
    }
    if (req->kv_ok > 0 && ev->first_token != req->kv_first_token) {
        duet_dc_fail(dc, req, DUET_ERR_INTERNAL, "prefill ranks reported different first tokens");
        return;
    }
    req->kv_first_token = (int32_t)ev->first_token;
    if (++req->kv_ok < D)
        return;
    /* logprobs come in the Prefill reply: decode starts with both */
    if (duet_dc_lp_wants_reply(req) && !req->rpc_done)
        return;
    duet__kv_complete(dc, req);
}

/* Every rank has all its KV (and the reply its logprobs): decode can
 * start. */
static void duet__kv_complete(duet_decode_t *dc, duet_dc_req_t *req)
{
    if (!duet_dc_lp_adopt_reply(dc, req))
        return;
    for (duet_dc_req_t **pp = &dc->prefilling; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == req) {
            *pp = req->next;
            break;
        }
    }
    req->next = NULL;
    req->state = DUET_DC_NEW;
    req->t_kv = duet_now_ns();
    duet_dc_kv_ready(dc, req);
}

void duet_dc_on_rpc_done(duet_decode_t *dc, duet_dc_ev_t *ev)
{
    duet_dc_req_t *req = ev->req;

    req->rpc_done = true;
    duet_rpc_stream_release(req->rpc_stream);
    req->rpc_stream = NULL;
    if (req->state == DUET_DC_ENDED) {
        duet_dc_release(dc, req);
        return;
    }
    if (ev->status == DUET_OK && req->state == DUET_DC_PREFILL && duet_dc_lp_wants_reply(req) &&
        req->kv_ok == dc->node.ke.tp) {
        duet__kv_complete(dc, req); /* the KV was waiting for this reply */
        return;
    }
    if (ev->status == DUET_OK || req->state != DUET_DC_PREFILL)
        return; /* the KV arrived (or will): the notifications decide */
    /* prefill refused or failed before the KV was complete; it is not
     * sending any more, so the expectations can go */
    duet__cancel_expectations(dc, req);
    if (ev->status == DUET_ERR_MISMATCH && strstr(ev->detail, "bootstrap") != NULL &&
        !req->retried && req->link != NULL) {
        /* the prefill daemon restarted (it does not know us): bootstrap
         * again and retry once */
        DUET_LOG_INFO("decode: prefill %s lost our bootstrap; bootstrapping again",
                      req->prefill_target);
        duet_dc_link_t *old = req->link;
        for (duet_dc_req_t **pp = &dc->prefilling; *pp != NULL; pp = &(*pp)->next) {
            if (*pp == req) {
                *pp = req->next;
                break;
            }
        }
        req->next = NULL;
        req->state = DUET_DC_NEW;
        req->link = NULL;
        req->retried = true;
        req->rpc_started = false;
        if (old->base.state != DUET_NODE_LINK_DEAD)
            duet_node_link_retire(&old->base);
        duet_node_link_put(&old->base);
        duet_dc_prefill_start(dc, req);
        return;
    }
    char msg[640];
    snprintf(msg, sizeof(msg), "prefill %s: %s", req->prefill_target, ev->detail);
    duet_dc_fail(dc, req, duet__phase_status(ev->status), msg);
}

bool duet_dc_prefill_quiesce(duet_decode_t *dc, duet_dc_req_t *req)
{
    if (req->rpc_started && !req->rpc_done) {
        if (!req->abort_sent && req->kv_ok < dc->node.ke.tp) {
            /* ask prefill to stop (also when our expectations timed out:
             * prefill may still be computing or sending); its Prefill
             * reply follows */
            Duet__V1__AbortRequest ab = DUET__V1__ABORT_REQUEST__INIT;
            uint8_t *buf = NULL;
            size_t len = 0;
            ab.request_id = req->request_id;
            ab.caller_id = dc->node.args.instance_id;
            ab.transfer_id = req->transfer_id;
            if (duet_pb_pack(&ab.base, &buf, &len) != DUET_OK ||
                duet_rpc_client_stream(
                    dc->node.cli, req->prefill_target, "/duet.v1.Prefill/Abort", buf, len,
                    duet_now_ns() + (int64_t)dc->node.args.cluster->rpc_timeout_ms * DUET_NS_PER_MS,
                    duet__noop_message, duet__noop_done, NULL, NULL) != DUET_OK)
                DUET_LOG_WARN("decode: cannot ask prefill %s to abort %s: %s", req->prefill_target,
                              req->request_id, duet_error_msg());
            duet_free(buf);
        }
        req->abort_sent = true;
        return false;
    }
    duet__cancel_expectations(dc, req);
    if (req->link != NULL) {
        duet_node_link_put(&req->link->base);
        req->link = NULL;
    }
    return true;
}
