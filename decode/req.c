/* A decode request's one home (req.h): its states, the lists each state
 * keeps it in, and the transition function duet_dc_req_go, the only code
 * that changes a request's state (duet__req_enter) or takes and gives back
 * its pages, link, Prefill stream, staging and expectations.  Scheduler
 * thread only.
 *
 * Page safety: a request's pages are reused only after nothing can write
 * them any more -- all its expectations completed, or the Prefill call
 * returned (then the prefill daemon has stopped sending: it answers only
 * after every send ended) and the remaining expectations were cancelled
 * (duet__req_quiesce). */
#include "decode/req.h"

#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "decode/cache.h"
#include "decode/lp.h"
#include "decode/output.h"
#include "decode/prefill_path.h"
#include "decode/stage.h"
#include "node/deadline.h"

void duet_dc_req_free(duet_decode_t *dc, duet_dc_req_t *req)
{
    if (req == NULL)
        return;
    duet_free(req->prompt);
    duet_dc_lp_cleanup(req);
    duet_free(req->stop_ids);
    for (int i = 0; i < req->n_stops; i++)
        duet_free(req->stops[i]);
    duet_free(req->pages);
    duet_free(req->hashes);
    for (int d = 0; req->rank_args != NULL && d < dc->node.ke.tp; d++)
        duet_free(req->rank_args[d].ev);
    duet_free(req->rank_args);
    duet_free(req->expecting);
    duet_free(req->out);
    duet_free(req->held);
    duet_detok_destroy(req->detok);
    duet_free(req);
}

/* ---- states and their lists ---------------------------------------------- */

static void duet__list_remove(duet_dc_req_t **head, duet_dc_req_t **tail, duet_dc_req_t *req)
{
    duet_dc_req_t *prev = NULL;
    for (duet_dc_req_t *r = *head; r != NULL; prev = r, r = r->next) {
        if (r != req)
            continue;
        if (prev != NULL)
            prev->next = r->next;
        else
            *head = r->next;
        if (tail != NULL && *tail == r)
            *tail = prev;
        r->next = NULL;
        return;
    }
}

static void duet__list_append(duet_dc_req_t **head, duet_dc_req_t **tail, duet_dc_req_t *req)
{
    req->next = NULL;
    if (*tail != NULL)
        (*tail)->next = req;
    else
        *head = req;
    *tail = req;
}

/* Take the request out of whatever its state keeps it in (LINKING: with
 * the link's reference and the queue count it held). */
static void duet__req_unlink(duet_decode_t *dc, duet_dc_req_t *req)
{
    switch (req->state) {
    case DUET_DC_NEW:
        break;
    case DUET_DC_LOCAL:
        duet__list_remove(&dc->local_head, &dc->local_tail, req);
        break;
    case DUET_DC_QUEUED:
        duet__list_remove(&dc->queue_head, &dc->queue_tail, req);
        atomic_fetch_sub(&dc->waiting, 1);
        break;
    case DUET_DC_LINKING:
        duet__list_remove(&req->link->waiting, NULL, req);
        duet_node_link_put(&req->link->base);
        req->link = NULL;
        atomic_fetch_sub(&dc->waiting, 1);
        break;
    case DUET_DC_PREFILL:
        duet__list_remove(&dc->prefilling, NULL, req);
        break;
    case DUET_DC_KV_IN:
        duet__list_remove(&dc->kv_in_head, &dc->kv_in_tail, req);
        break;
    case DUET_DC_READY:
        duet__list_remove(&dc->ready_head, &dc->ready_tail, req);
        break;
    case DUET_DC_RUNNING:
        for (int i = 0; i < dc->n_running; i++) {
            if (dc->running[i] == req) {
                memmove(&dc->running[i], &dc->running[i + 1],
                        (size_t)(dc->n_running - i - 1) * sizeof(dc->running[0]));
                dc->n_running--;
                break;
            }
        }
        break;
    case DUET_DC_ENDED:
        duet__list_remove(&dc->ending, NULL, req);
        break;
    }
}

/* The one place a request's state changes: out of the old state's list,
 * into the new one's (LINKING: req->link, holding a reference, is set). */
static void duet__req_enter(duet_decode_t *dc, duet_dc_req_t *req, duet_dc_state_t state)
{
    duet__req_unlink(dc, req);
    req->state = state;
    switch (state) {
    case DUET_DC_NEW:
        break;
    case DUET_DC_LOCAL:
        duet__list_append(&dc->local_head, &dc->local_tail, req);
        break;
    case DUET_DC_QUEUED:
        duet__list_append(&dc->queue_head, &dc->queue_tail, req);
        break;
    case DUET_DC_LINKING:
        req->next = req->link->waiting;
        req->link->waiting = req;
        atomic_fetch_add(&dc->waiting, 1);
        break;
    case DUET_DC_PREFILL:
        req->next = dc->prefilling;
        dc->prefilling = req;
        break;
    case DUET_DC_KV_IN:
        duet__list_append(&dc->kv_in_head, &dc->kv_in_tail, req);
        break;
    case DUET_DC_READY:
        duet__list_append(&dc->ready_head, &dc->ready_tail, req);
        break;
    case DUET_DC_RUNNING:
        dc->running[dc->n_running++] = req;
        break;
    case DUET_DC_ENDED:
        req->next = dc->ending;
        dc->ending = req;
        break;
    }
}

/* ---- resources ------------------------------------------------------------ */

/* Give back a packed request's staging units: once unpacked, or when its
 * pages go (nothing can write them any more then either), after the
 * unpacks queued from them landed.  It then moves unpacked if it has not
 * started. */
static void duet__req_stage_release(duet_decode_t *dc, duet_dc_req_t *req)
{
    duet_dc_unpack_wait(dc, req);
    if (req->stage0 >= 0)
        duet_kv_pool_release_run(dc->node.stage, req->stage0, req->stage_units);
    req->stage0 = -1;
    req->stage_units = 0;
    /* (no expectation is live: the chunk ids are not needed any more) */
    req->chunk_pages = req->n_chunks = req->chunk = 0;
}

/* Packed transfers stage the prompt in a run of free pages.  A prompt
 * larger than any free run moves in chunks through two halves of a
 * smaller one (stage.h); with no run of even two pages free it moves
 * unpacked (slower on device pools, never stuck). */
static void duet__req_stage_take(duet_decode_t *dc, duet_dc_req_t *req)
{
    int n = duet_dc_xfer_pages(req);
    req->chunk_pages = req->n_chunks = req->chunk = 0;
    req->stage_units = 0;
    if (!dc->node.ke.pack)
        return;
    if (duet_kv_pool_alloc_run(dc->node.stage, n, &req->stage0) == DUET_OK) {
        req->stage_units = n;
        return;
    }
    int half = duet_kv_pool_total(dc->node.stage) / 2;
    for (int c = n - 1 < half ? n - 1 : half; c >= 1; c /= 2) {
        if (duet_kv_pool_alloc_run(dc->node.stage, 2 * c, &req->stage0) == DUET_OK) {
            req->stage_units = 2 * c;
            req->chunk_pages = c;
            req->n_chunks = (n + c - 1) / c;
            return;
        }
    }
    duet_dc_unstaged(dc, req, duet_error_msg());
    req->stage0 = -1;
}

/* The rest of a packed request's KV into its pages, then its staging back. */
static duet_status_t duet__req_unpack(duet_decode_t *dc, duet_dc_req_t *req)
{
    int n_layers = duet_engine_kv_layout(dc->node.ke.engine)->n_layers;
    duet_status_t st = duet_dc_unpack_layers(dc, req, req->unpacked, n_layers, true);
    if (st == DUET_OK)
        duet__req_stage_release(dc, req);
    return st;
}

/* Cancel every expectation still registered (only once the Prefill call
 * returned or never started: see the file comment). */
static void duet__req_expect_cancel(duet_decode_t *dc, duet_dc_req_t *req)
{
    for (int d = 0; d < dc->node.ke.tp; d++) {
        if (req->expecting != NULL && req->expecting[d]) {
            duet_xfer_recv_cancel(duet_xfer_rank(dc->node.ke.xfer, d), duet_dc_xfer_id(req));
            req->expecting[d] = false;
        }
    }
    req->n_expecting = 0;
}

/* End the prefill phase of a request that is ending: abort on prefill,
 * cancel expectations once the Prefill call returned.  True when nothing
 * can still write its pages or call back. */
static bool duet__req_quiesce(duet_decode_t *dc, duet_dc_req_t *req)
{
    if (req->rpc_started && !req->rpc_done) {
        /* ask prefill to stop (also when our expectations timed out:
         * prefill may still be computing or sending); its Prefill reply
         * follows */
        if (!req->abort_sent && req->kv_ok < dc->node.ke.tp)
            duet_dc_prefill_abort(dc, req);
        req->abort_sent = true;
        return false;
    }
    duet__req_expect_cancel(dc, req);
    if (req->link != NULL) {
        duet_node_link_put(&req->link->base);
        req->link = NULL;
    }
    return true;
}

/* ENDED: free pages and links once nothing can still write or call back;
 * else the KV_DONE or RPC_DONE still to come calls again. */
static void duet__req_release(duet_decode_t *dc, duet_dc_req_t *req)
{
    if (!duet__req_quiesce(dc, req))
        return;
    duet__list_remove(&dc->ending, NULL, req);
    duet_dc_unpack_wait(dc, req);
    if (req->pages_held) {
        duet_kv_pool_release_chain(dc->node.pages, req->pages, req->n_pages);
        req->pages_held = false;
    }
    duet__req_stage_release(dc, req);
    req->next = dc->zombies;
    dc->zombies = req;
}

static void duet__req_end(duet_decode_t *dc, duet_dc_req_t *req)
{
    if (req->state == DUET_DC_ENDED)
        return;
    duet_dc_cache_keep_generated(dc, req);
    duet__req_enter(dc, req, DUET_DC_ENDED);
    duet__req_release(dc, req);
}

/* End a request with an error status (terminal call), then release it
 * once safe. */
static void duet__req_fail(duet_decode_t *dc, duet_dc_req_t *req, duet_status_t st, const char *msg)
{
    /* a cancel or a deadline stops between steps (the KV written so far is
     * whole); any other failure may leave it incomplete: nothing is kept */
    if (st != DUET_ERR_CANCELLED && st != DUET_ERR_TIMEOUT)
        req->kv_whole = false;
    if (req->call != NULL) {
        DUET_LOG_DEBUG("decode: request %s failed: %s: %s", req->request_id, duet_status_str(st),
                       msg);
        duet_rpc_call_fail_status(req->call, st, msg);
        req->call = NULL;
        pthread_mutex_lock(&dc->evlock);
        dc->requests_failed++;
        pthread_mutex_unlock(&dc->evlock);
    }
    duet__req_end(dc, req);
}

/* What output.c did with a token: true when the request has ended. */
static bool duet__req_emitted(duet_decode_t *dc, duet_dc_req_t *req, const duet_dc_emit_t *r)
{
    switch (r->kind) {
    case DUET_DC_EMIT_MORE:
        return false;
    case DUET_DC_EMIT_FINISH:
        duet_rpc_call_finish(req->call, GRPC_STATUS_OK, NULL);
        req->call = NULL;
        return true;
    case DUET_DC_EMIT_ENDED:
        return true;
    case DUET_DC_EMIT_FAIL:
        duet__req_fail(dc, req, r->status, r->msg);
        return true;
    }
    return true;
}

/* ---- the prefill phase ------------------------------------------------------ */

/* Staging, decided by the first attempt (a retry keeps it).  Equal TP
 * sizes: every decode rank takes all its heads from one prefill rank,
 * per-page puts coalesce over consecutive pages, and packing would only
 * add two copies (measured: README "Packed transfers"). */
static void duet__req_stage_choose(duet_decode_t *dc, duet_dc_req_t *req, duet_dc_link_t *link)
{
    if (req->stage0 < 0 || req->retried)
        return;
    if (duet_slice_plan_prefill_tp(link->base.plan) == duet_slice_plan_decode_tp(link->base.plan)) {
        duet__req_stage_release(dc, req);
        return;
    }
    /* larger than a prefill rank's arena: in chunks that fit both sides */
    int n = duet_dc_xfer_pages(req), cap = duet_dc_stage_max_pages(link);
    if (req->chunk_pages == 0 && n <= cap)
        return;
    int c = req->chunk_pages > 0 ? req->chunk_pages : req->stage_units / 2;
    if (c > cap)
        c = cap;
    if (c < 1) {
        duet_dc_unstaged(dc, req, "a prefill rank's staging arena holds no page of it");
        duet__req_stage_release(dc, req);
        req->chunk_pages = req->n_chunks = 0;
        return;
    }
    req->chunk_pages = c;
    req->n_chunks = (n + c - 1) / c;
    pthread_mutex_lock(&dc->evlock);
    bool first = dc->chunked++ == 0;
    pthread_mutex_unlock(&dc->evlock);
    if (first)
        DUET_LOG_INFO("decode: %s is larger than a staging arena: it moves in %d chunks of %d "
                      "pages, one round trip each (the first such request; stage_pages on both "
                      "sides moves it whole: Info kv_transfers_chunked counts them)",
                      req->request_id, req->n_chunks, c);
    DUET_LOG_DEBUG("decode: %s: packed in %d chunks of %d pages (staging: %d units here, %d pages "
                   "on each prefill rank)",
                   req->request_id, req->n_chunks, c, req->stage_units, cap);
}

/* A new attempt starts from nothing landed.  A retry: the first attempt's
 * early unpacks read the staging that this one's puts overwrite. */
static void duet__req_attempt_reset(duet_decode_t *dc, duet_dc_req_t *req)
{
    duet_dc_unpack_wait(dc, req);
    req->unpacked = 0;
    req->chunk = 0;
    req->kv_ok = 0;
    req->kv_failed = false;
}

/* Into PREFILL with a fresh transfer id (the old id of a retried attempt
 * is not live any more). */
static duet_status_t duet__req_transfer_open(duet_decode_t *dc, duet_dc_req_t *req)
{
    req->transfer_id = 0;
    duet__req_enter(dc, req, DUET_DC_PREFILL);
    return duet_dc_transfer_id_new(dc, req->chunk_pages > 0 ? req->n_chunks : 1, &req->transfer_id);
}

/* Every rank's expectation; on failure the ones registered are cancelled
 * (no Prefill call is running: nothing will write these pages). */
static duet_status_t duet__req_expect(duet_decode_t *dc, duet_dc_req_t *req, duet_dc_link_t *link,
                                      int64_t now, int progress)
{
    duet_status_t rank_st[DUET_TP_MAX];
    duet_status_t st = duet_dc_expect_all(
        dc, req, link, duet_node_deadline_transfer(dc->node.args.cluster, now), progress, rank_st);
    for (int d = 0; d < dc->node.ke.tp; d++) {
        if (rank_st[d] != DUET_OK)
            continue;
        req->expecting[d] = true;
        req->n_expecting++;
    }
    if (st != DUET_OK)
        duet__req_expect_cancel(dc, req);
    return st;
}

/* The Prefill call: its stream is the request's until RPC_DONE. */
static duet_status_t duet__req_call(duet_decode_t *dc, duet_dc_req_t *req, duet_dc_link_t *link,
                                    int64_t now, int progress)
{
    duet_status_t st = duet_dc_prefill_call(dc, req, link, now, progress, &req->rpc_stream);
    if (st != DUET_OK)
        return st;
    req->rpc_started = true;
    req->rpc_done = false;
    req->t_called = duet_now_ns();
    req->call_deadline_ns = duet_node_deadline_prefill_call(dc->node.args.cluster, now);
    req->kv_started = false;
    req->kv_timed_out_queued = false;
    return DUET_OK;
}

/* Start an attempt over a READY link: -> PREFILL, or ENDED on failure. */
static void duet__req_attempt_begin(duet_decode_t *dc, duet_dc_req_t *req, duet_dc_link_t *link)
{
    int64_t now = duet_now_ns();
    duet_status_t st;

    req->link = link;
    duet_node_link_hold(&link->base);
    duet__req_stage_choose(dc, req, link);
    duet__req_attempt_reset(dc, req);
    if ((st = duet__req_transfer_open(dc, req)) != DUET_OK)
        goto err_fail;
    /* packed: announcements of landed layers, where they pay */
    int progress = duet_dc_progress_layers(dc, req, link);
    if ((st = duet__req_expect(dc, req, link, now, progress)) != DUET_OK)
        goto err_fail;
    if ((st = duet__req_call(dc, req, link, now, progress)) != DUET_OK)
        goto err_cancel_expect;
    return;

err_cancel_expect:
    /* no Prefill call is running: nothing will write these pages */
    duet__req_expect_cancel(dc, req);
err_fail:
    duet__req_fail(dc, req, duet_dc_phase_status(st), duet_error_msg());
}

static void duet__req_recompute_go(duet_decode_t *dc, duet_dc_req_t *req);

/* Pick the prefill, get its link: begin now, or wait for its bootstrap
 * (LINKING).  req is NEW (in no list). */
static void duet__req_prefill_start(duet_decode_t *dc, duet_dc_req_t *req)
{
    const char *target = duet_dc_prefill_pick(dc, req);
    duet_dc_link_t *link;

    if (target == NULL) {
        duet__req_fail(dc, req, DUET_ERR_PEER,
                       "no prefill instance: the request names none and the config lists none");
        return;
    }
    if (target != req->prefill_target)
        snprintf(req->prefill_target, sizeof(req->prefill_target), "%s", target);
    link = duet_dc_link_get(dc, target);
    if (link == NULL) {
        duet__req_fail(dc, req, DUET_ERR_NO_MEMORY, "no memory for a prefill link");
        return;
    }
    if (link->base.state == DUET_NODE_LINK_READY) {
        duet__req_attempt_begin(dc, req, link);
        return;
    }
    /* BOOTING: wait for it */
    req->link = link;
    duet_node_link_hold(&link->base);
    duet__req_enter(dc, req, DUET_DC_LINKING);
}

/* LINKING: the link's bootstrap ended (ev->status). */
static void duet__req_linked(duet_decode_t *dc, duet_dc_req_t *req, const duet_dc_ev_t *ev)
{
    duet__req_enter(dc, req, DUET_DC_NEW); /* (drops the LINKING reference) */
    if (ev->status == DUET_OK) {
        duet__req_attempt_begin(dc, req, ev->link);
        return;
    }
    /* the prefill is unreachable (died, restarting): nothing was asked of
     * it, so recompute here as after a lost transfer (transfer.on_failure
     * recompute) instead of failing a request the router may have no
     * retry left for */
    if (ev->status != DUET_ERR_MISMATCH && ev->status != DUET_ERR_INVALID && !req->recompute &&
        dc->node.args.cluster->transfer_on_failure == DUET_XFER_ON_FAILURE_RECOMPUTE) {
        DUET_LOG_WARN("decode: request %s: bootstrap with prefill %s failed (%s); recomputing its "
                      "prompt here (transfer.on_failure recompute)",
                      req->request_id, req->prefill_target, ev->link->base.error);
        req->recompute = true;
        duet__req_recompute_go(dc, req);
        return;
    }
    duet__req_fail(dc, req,
                   ev->status == DUET_ERR_MISMATCH || ev->status == DUET_ERR_INVALID
                       ? ev->status
                       : DUET_ERR_PEER,
                   ev->link->base.error);
}

/* ---- KV transfer failure: transfer.on_failure (docs/migration.md) ---------- */

/* A recomputing request whose prefill phase is over (quiesced: nothing
 * writes its pages any more) gives its pages back and queues again; the
 * admission pass then prefills it locally (duet_dc_local_wanted). */
static void duet__req_recompute_go(duet_decode_t *dc, duet_dc_req_t *req)
{
    if (!duet__req_quiesce(dc, req))
        return; /* the Prefill call's end (RPC_DONE) calls again */
    duet_dc_unpack_wait(dc, req);
    duet__req_stage_release(dc, req);
    if (req->pages_held) {
        duet_kv_pool_release_chain(dc->node.pages, req->pages, req->n_pages);
        req->pages_held = false;
    }
    req->kv_ok = 0;
    req->kv_failed = false;
    req->unpacked = 0;
    req->chunk = 0;
    req->rpc_started = false;
    atomic_fetch_add(&dc->waiting, 1); /* (QUEUED's count) */
    duet__req_enter(dc, req, DUET_DC_QUEUED);
}

/* The KV transfer of a request in PREFILL failed (st, msg): true when it
 * is handled here -- recomputed locally, or failed retryably for the
 * router to retry on another pair -- per transfer.on_failure; false: the
 * caller fails it as it is.  Not for a cancel, an invalid request, or
 * logits prefill found non-finite (a recompute would meet them too). */
static bool duet__req_kv_lost(duet_decode_t *dc, duet_dc_req_t *req, duet_status_t st,
                              const char *msg)
{
    duet_xfer_on_failure_t policy = dc->node.args.cluster->transfer_on_failure;
    if (req->state != DUET_DC_PREFILL || req->recompute || st == DUET_ERR_CANCELLED ||
        st == DUET_ERR_INVALID || st == DUET_ERR_TOO_LONG || strstr(msg, "non-finite") != NULL ||
        policy == DUET_XFER_ON_FAILURE_FAIL)
        return false;
    if (policy == DUET_XFER_ON_FAILURE_RETRY) {
        duet__req_fail(dc, req, DUET_ERR_PEER, msg); /* UNAVAILABLE: the router retries */
        return true;
    }
    DUET_LOG_WARN("decode: request %s: %s; recomputing its prompt here (transfer.on_failure "
                  "recompute)",
                  req->request_id, msg);
    req->recompute = true;
    duet__req_recompute_go(dc, req);
    return true;
}

/* Every rank has all its KV (and the reply its logprobs): the loop sends
 * the first token (KV_IN). */
static void duet__req_kv_in(duet_decode_t *dc, duet_dc_req_t *req)
{
    if (duet_dc_lp_adopt_reply(dc, req) != DUET_OK) {
        duet__req_fail(dc, req, DUET_ERR_INTERNAL, duet_error_msg());
        return;
    }
    duet__req_enter(dc, req, DUET_DC_KV_IN);
    req->t_kv = duet_now_ns();
}

/* Chunked: every rank has the chunk in flight.  Unpack it, then expect
 * the next one into the other staging half.  The next chunk but one goes
 * into this chunk's half: its senders start it only once every rank
 * acknowledged the next chunk, which needs its expectation -- registered
 * only now, after this chunk's unpack landed (a notification that comes
 * first waits for its expectation in the transfer layer: early_ttl_ms). */
static void duet__req_chunk_next(duet_decode_t *dc, duet_dc_req_t *req)
{
    int n_layers = duet_engine_kv_layout(dc->node.ke.engine)->n_layers;
    duet_status_t st = duet_dc_unpack_layers(dc, req, 0, n_layers, true);
    if (st != DUET_OK) {
        duet__req_fail(dc, req, st, duet_error_msg());
        return;
    }
    req->chunk++;
    req->kv_ok = 0;
    if ((st = duet__req_expect(dc, req, req->link, duet_now_ns(), 0)) != DUET_OK)
        duet__req_fail(dc, req, duet_dc_phase_status(st), duet_error_msg());
}

static void duet__req_kv_done(duet_decode_t *dc, duet_dc_req_t *req, const duet_dc_ev_t *ev)
{
    int D = dc->node.ke.tp;

    /* a notification of an attempt that was retried (new transfer id) */
    if (ev->transfer_id != duet_dc_xfer_id(req))
        return;
    if (req->expecting == NULL || !req->expecting[ev->rank])
        return; /* cancelled: no longer counted */
    req->expecting[ev->rank] = false;
    req->n_expecting--;
    if (req->state == DUET_DC_ENDED) {
        duet__req_release(dc, req);
        return;
    }
    if (req->recompute) /* this attempt is over: its end waits for RPC_DONE */
        return;
    if (ev->status != DUET_OK) {
        char msg[640];
        req->kv_failed = true;
        if (ev->status == DUET_ERR_TIMEOUT && !req->kv_started)
            req->kv_timed_out_queued = true; /* the link stayed up (rpc_done) */
        /* prefill refused to send (non-finite logits): its Prefill reply,
         * which follows, says why; RPC_DONE fails the request with it */
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
        if (!duet__req_kv_lost(dc, req, ev->status, msg))
            duet__req_fail(dc, req, duet_dc_phase_status(ev->status), msg);
        return;
    }
    if (req->kv_ok > 0 && ev->first_token != req->kv_first_token) {
        duet__req_fail(dc, req, DUET_ERR_INTERNAL, "prefill ranks reported different first tokens");
        return;
    }
    req->kv_first_token = (int32_t)ev->first_token;
    if (++req->kv_ok < D)
        return;
    if (req->chunk_pages > 0 && req->chunk + 1 < req->n_chunks) {
        duet__req_chunk_next(dc, req);
        return;
    }
    /* logprobs come in the Prefill reply: decode starts with both */
    if (duet_dc_lp_wants_reply(req) && !req->rpc_done)
        return;
    duet__req_kv_in(dc, req);
}

/* Packed: more layers landed on one rank; unpack those every rank has. */
static void duet__req_kv_progress(duet_decode_t *dc, duet_dc_req_t *req, const duet_dc_ev_t *ev)
{
    int D = dc->node.ke.tp, least = ev->layers;

    if (ev->transfer_id != duet_dc_xfer_id(req) || req->state != DUET_DC_PREFILL ||
        req->stage0 < 0 || req->kv_failed || req->expecting == NULL || !req->expecting[ev->rank])
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

/* Prefill took the request off its queue: the transfer has
 * transfer.timeout_ms from now (node/deadline.h); a wait in prefill's
 * queue no longer counts against it. */
static void duet__req_kv_started(duet_decode_t *dc, duet_dc_req_t *req, const duet_dc_ev_t *ev)
{
    if (ev->transfer_id != req->transfer_id || req->state != DUET_DC_PREFILL ||
        req->expecting == NULL)
        return;
    int64_t deadline = duet_node_deadline_started(dc->node.args.cluster, duet_now_ns());
    req->kv_started = true;
    for (int d = 0; d < dc->node.ke.tp; d++)
        if (req->expecting[d])
            (void)duet_xfer_recv_started(duet_xfer_rank(dc->node.ke.xfer, d), duet_dc_xfer_id(req),
                                         deadline); /* (NOT_FOUND: it has ended) */
}

static void duet__req_rpc_done(duet_decode_t *dc, duet_dc_req_t *req, const duet_dc_ev_t *ev)
{
    req->rpc_done = true;
    duet_rpc_stream_release(req->rpc_stream);
    req->rpc_stream = NULL;
    /* its transfer timed out while it waited in prefill's queue, so the
     * link stayed up; prefill's answer means it sends nothing more, but
     * a call that ended without one (connection lost, our own deadline:
     * a partition?) leaves its sends unknown: cut the link before the
     * pages go back */
    if (req->kv_timed_out_queued && req->link != NULL &&
        (ev->status == DUET_ERR_PEER ||
         (ev->status == DUET_ERR_TIMEOUT && duet_now_ns() >= req->call_deadline_ns)))
        duet_dc_link_cut(dc, req->link, "a Prefill call ended without its answer");
    if (req->state == DUET_DC_ENDED) {
        duet__req_release(dc, req);
        return;
    }
    if (req->recompute && req->state == DUET_DC_PREFILL) {
        duet__req_recompute_go(dc, req); /* prefill stopped: now it can */
        return;
    }
    if (ev->status == DUET_OK && req->state == DUET_DC_PREFILL && duet_dc_lp_wants_reply(req) &&
        req->kv_ok == dc->node.ke.tp) {
        duet__req_kv_in(dc, req); /* the KV was waiting for this reply */
        return;
    }
    if (ev->status == DUET_OK || req->state != DUET_DC_PREFILL)
        return; /* the KV arrived (or will): the notifications decide */
    /* prefill refused or failed before the KV was complete; it is not
     * sending any more, so the expectations can go */
    duet__req_expect_cancel(dc, req);
    if (ev->status == DUET_ERR_MISMATCH && strstr(ev->detail, "bootstrap") != NULL &&
        !req->retried && req->link != NULL) {
        /* the prefill daemon restarted (it does not know us): bootstrap
         * again and retry once */
        DUET_LOG_INFO("decode: prefill %s lost our bootstrap; bootstrapping again",
                      req->prefill_target);
        duet_dc_link_t *old = req->link;
        duet__req_enter(dc, req, DUET_DC_NEW);
        req->link = NULL;
        req->retried = true;
        req->rpc_started = false;
        if (old->base.state != DUET_NODE_LINK_DEAD)
            duet_node_link_retire(&old->base);
        duet_node_link_put(&old->base);
        duet__req_prefill_start(dc, req);
        return;
    }
    char msg[640];
    snprintf(msg, sizeof(msg), "prefill %s: %s", req->prefill_target, ev->detail);
    if (!duet__req_kv_lost(dc, req, ev->status, msg))
        duet__req_fail(dc, req, duet_dc_phase_status(ev->status), msg);
}

/* ---- admission ---------------------------------------------------------- */

/* QUEUED, pages held: a prefill instance computes its KV. */
static void duet__req_remote(duet_decode_t *dc, duet_dc_req_t *req)
{
    duet__req_enter(dc, req, DUET_DC_NEW);
    pthread_mutex_lock(&dc->evlock);
    dc->prefills_remote++;
    pthread_mutex_unlock(&dc->evlock);
    duet__req_stage_take(dc, req);
    duet__req_prefill_start(dc, req);
}

/* QUEUED, pages held: our engine computes its KV into its pages
 * (local_prefill.c): whole in this pass, or chunk by chunk in the decode
 * steps from the end of its cached prefix. */
static void duet__req_local(duet_decode_t *dc, duet_dc_req_t *req)
{
    duet__req_enter(dc, req, DUET_DC_LOCAL);
    req->prefill_local = true;
    req->local_done = req->n_prompt - duet_dc_uncached_tokens(dc, req);
    pthread_mutex_lock(&dc->evlock);
    dc->prefills_local++;
    pthread_mutex_unlock(&dc->evlock);
}

/* ---- output ------------------------------------------------------------- */

/* KV_IN: the prefill daemon (or our local prefill) sampled output 0: it
 * goes out before the KV is unpacked or imported, which only the next
 * decode step needs (TTFT does not wait for the copy). */
static void duet__req_first(duet_decode_t *dc, duet_dc_req_t *req)
{
    duet_status_t st = duet_dc_output_init(dc, req);
    if (st != DUET_OK) {
        duet__req_fail(dc, req, st, duet_error_msg());
        return;
    }
    duet_dc_emit_t r = duet_dc_output_emit(dc, req, req->kv_first_token,
                                           req->have_first_lp ? &req->first_lp : NULL);
    bool ended = duet__req_emitted(dc, req, &r);
    int64_t t_first = duet_now_ns();
    if (r.kind == DUET_DC_EMIT_FAIL)
        return; /* failed while sending it */
    /* packed: from the staging pages; device pools with a mirror: from the
     * host mirror; prefilled locally: already in the pool */
    st = req->prefill_local  ? DUET_OK
         : dc->fault_kv_copy ? duet_error(DUET_ERR_INTERNAL, "fault injection: the KV copy failed")
         : req->stage0 >= 0
             ? duet__req_unpack(dc, req)
             : duet_engine_kv_import(dc->node.ke.engine, req->pages + req->n_cached_pages,
                                     duet_dc_xfer_pages(req));
    if (req->t_kv > 0)
        DUET_LOG_DEBUG("decode: %s: first token %lld us after arrival: Prefill call +%lld us, KV "
                       "in +%lld us; imported +%lld us",
                       req->request_id, (long long)(t_first - req->t_arrival) / 1000,
                       (long long)(req->t_called - req->t_arrival) / 1000,
                       (long long)(req->t_kv - req->t_arrival) / 1000,
                       (long long)(duet_now_ns() - req->t_arrival) / 1000);
    if (st != DUET_OK && !ended) {
        duet__req_fail(dc, req, st, duet_error_msg());
        return;
    }
    if (st != DUET_OK) /* answered already; its KV is not whole: not cached */
        DUET_LOG_WARN("decode: %s: after its last token: %s", req->request_id, duet_error_msg());
    else {
        duet_dc_cache_keep(dc, req);
        req->kv_whole = true;
    }
    if (ended) {
        duet__req_end(dc, req);
        return;
    }
    duet__req_enter(dc, req, DUET_DC_READY);
}

/* RUNNING: the decode step sampled token. */
static void duet__req_token(duet_decode_t *dc, duet_dc_req_t *req, int32_t token,
                            const duet_logprob_t *lp)
{
    duet_dc_emit_t r = duet_dc_output_emit(dc, req, token, lp);
    if (duet__req_emitted(dc, req, &r))
        duet__req_end(dc, req);
}

/* ---- the transition function ---------------------------------------------- */

duet_status_t duet_dc_req_go(duet_decode_t *dc, duet_dc_req_t *req, const duet_dc_input_t *in)
{
    switch (in->go) {
    case DUET_DC_GO_QUEUE:
        duet__req_enter(dc, req, DUET_DC_QUEUED);
        break;
    case DUET_DC_GO_PAGES:
        return duet_dc_cache_take(dc, req);
    case DUET_DC_GO_UNPAGE:
        duet_kv_pool_release_chain(dc->node.pages, req->pages, req->n_pages);
        req->pages_held = false;
        break;
    case DUET_DC_GO_REMOTE:
        duet__req_remote(dc, req);
        break;
    case DUET_DC_GO_LOCAL:
        duet__req_local(dc, req);
        break;
    case DUET_DC_GO_CHUNK:
        /* its pages hold the KV of [0, local_done): nothing is published
         * to the prefix cache before the whole prompt is in (FIRST) */
        DUET_LOG_DEBUG("decode: %s: prompt tokens [%d, %d) of %d computed here", req->request_id,
                       req->local_done, req->local_done + in->n_tokens, req->n_prompt);
        req->local_done += in->n_tokens;
        break;
    case DUET_DC_GO_PREFILLED:
        req->local_done = req->n_prompt;
        if (in->status != DUET_OK)
            duet__req_fail(dc, req, in->status, in->msg);
        else
            duet__req_enter(dc, req, DUET_DC_KV_IN);
        break;
    case DUET_DC_GO_LINKED:
        duet__req_linked(dc, req, in->ev);
        break;
    case DUET_DC_GO_KV_DONE:
        duet__req_kv_done(dc, req, in->ev);
        break;
    case DUET_DC_GO_KV_PROGRESS:
        duet__req_kv_progress(dc, req, in->ev);
        break;
    case DUET_DC_GO_KV_STARTED:
        duet__req_kv_started(dc, req, in->ev);
        break;
    case DUET_DC_GO_RPC_DONE:
        duet__req_rpc_done(dc, req, in->ev);
        break;
    case DUET_DC_GO_FIRST:
        duet__req_first(dc, req);
        break;
    case DUET_DC_GO_RUN:
        duet__req_enter(dc, req, DUET_DC_RUNNING);
        break;
    case DUET_DC_GO_TOKEN:
        duet__req_token(dc, req, in->token, in->lp);
        break;
    case DUET_DC_GO_CANCEL:
        req->cancelled = true;
        duet__req_fail(dc, req, DUET_ERR_CANCELLED, in->msg);
        break;
    case DUET_DC_GO_FAIL:
        duet__req_fail(dc, req, in->status, in->msg);
        break;
    }
    return DUET_OK;
}
