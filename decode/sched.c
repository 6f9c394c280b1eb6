/* The decode scheduler: events in, admission, continuous batching, and the
 * end of every request.  Only this thread touches requests and links after
 * the handler posted them (decode.h). */
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/rpc_pb.h"
#include "common/sync.h"
#include "duet/v1/common.pb-c.h"
#include "decode/decode.h"
#include "transfer/xfer_pack.h"

duet_dc_ev_t *duet_dc_ev_new(duet_dc_ev_type_t type, duet_dc_req_t *req)
{
    duet_dc_ev_t *ev = DUET_NEW(duet_dc_ev_t);
    if (ev != NULL) {
        ev->type = type;
        ev->req = req;
    }
    return ev;
}

/* evlock held */
static void duet__ev_append(duet_decode_t *dc, duet_dc_ev_t *ev)
{
    if (dc->ev_tail != NULL)
        dc->ev_tail->next = ev;
    else
        dc->ev_head = ev;
    dc->ev_tail = ev;
    pthread_cond_signal(&dc->evcv);
}

void duet_dc_post(duet_decode_t *dc, duet_dc_ev_t *ev)
{
    pthread_mutex_lock(&dc->evlock);
    duet__ev_append(dc, ev);
    pthread_mutex_unlock(&dc->evlock);
}

bool duet_dc_post_live(duet_decode_t *dc, duet_dc_ev_t *ev)
{
    bool live;
    pthread_mutex_lock(&dc->evlock);
    live = !dc->sched_gone;
    if (live)
        duet__ev_append(dc, ev);
    pthread_mutex_unlock(&dc->evlock);
    return live;
}

void duet_dc_counts(duet_decode_t *dc, int *queued_p, int *running_p)
{
    pthread_mutex_lock(&dc->evlock);
    *queued_p = dc->info_queued;
    *running_p = dc->info_running;
    pthread_mutex_unlock(&dc->evlock);
}

int duet_dc_pending(void *arg)
{
    int queued = 0, running = 0;
    duet_dc_counts(arg, &queued, &running);
    return queued + running;
}

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

/* Take the request out of whatever its state keeps it in. */
static void duet__unlink(duet_decode_t *dc, duet_dc_req_t *req)
{
    switch (req->state) {
    case DUET_DC_NEW:
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

/* Give back a packed request's staging units: once unpacked, or when its
 * pages go (nothing can write them any more then either), after the
 * unpacks queued from them landed. */
void duet_dc_stage_release(duet_decode_t *dc, duet_dc_req_t *req)
{
    duet_dc_unpack_wait(dc, req);
    if (req->stage0 >= 0)
        duet_kv_pool_release_run(dc->node.stage, req->stage0, duet_dc_xfer_pages(req));
    req->stage0 = -1;
}

/* A packed request's KV is in its staging: move layers [l0, l1) into the
 * request's pages on every rank (each rank's staging is laid out by the
 * runs it receives).  Layers that landed early are queued as their
 * progress comes (duet_dc_on_kv_progress), the rest once the transfer
 * completed, with a wait that covers them all. */
duet_status_t duet_dc_unpack_layers(duet_decode_t *dc, duet_dc_req_t *req, int l0, int l1,
                                    bool wait)
{
    const duet_kv_layout_t *l = duet_engine_kv_layout(dc->node.ke.engine);
    int D = dc->node.ke.tp, n[DUET_TP_MAX];
    duet_kv_copy_t *lists[DUET_TP_MAX];
    duet_kv_copy_t *copies = DUET_NEW_ARRAY(
        duet_kv_copy_t, (size_t)D * (size_t)duet_dc_xfer_pages(req) * (size_t)l->n_kv_heads);
    duet_status_t st;
    if (copies == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "unpack: no memory");
    for (int d = 0; d < D; d++) {
        const duet_slice_run_t *runs;
        int n_runs = duet_slice_plan_dst_runs(req->link->base.plan, d, &runs);
        lists[d] = copies + (size_t)d * (size_t)duet_dc_xfer_pages(req) * (size_t)l->n_kv_heads;
        n[d] = duet_xfer_pack_copies(l, req->pages + req->n_cached_pages, duet_dc_xfer_pages(req),
                                     req->stage0, runs, n_runs, 1, lists[d]);
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

static duet_status_t duet__unpack(duet_decode_t *dc, duet_dc_req_t *req)
{
    int n_layers = duet_engine_kv_layout(dc->node.ke.engine)->n_layers;
    duet_status_t st = duet_dc_unpack_layers(dc, req, req->unpacked, n_layers, true);
    if (st == DUET_OK)
        duet_dc_stage_release(dc, req);
    return st;
}

/* Free pages and links once nothing can still write or call back. */
void duet_dc_release(duet_decode_t *dc, duet_dc_req_t *req)
{
    if (!duet_dc_prefill_quiesce(dc, req))
        return;
    duet__list_remove(&dc->ending, NULL, req);
    duet_dc_unpack_wait(dc, req);
    if (req->pages_held) {
        duet_kv_pool_release_chain(dc->node.pages, req->pages, req->n_pages);
        req->pages_held = false;
    }
    duet_dc_stage_release(dc, req);
    req->next = dc->zombies;
    dc->zombies = req;
}

static void duet__end(duet_decode_t *dc, duet_dc_req_t *req)
{
    if (req->state == DUET_DC_ENDED)
        return;
    duet_dc_cache_keep_generated(dc, req);
    duet__unlink(dc, req);
    req->state = DUET_DC_ENDED;
    req->next = dc->ending;
    dc->ending = req;
    duet_dc_release(dc, req);
}

void duet_dc_fail(duet_decode_t *dc, duet_dc_req_t *req, duet_status_t st, const char *msg)
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
    duet__end(dc, req);
}

/* A stream finished normally: duet_dc_emit made the terminal call. */
static void duet__finished(duet_decode_t *dc, duet_dc_req_t *req)
{
    duet__end(dc, req);
}

void duet_dc_kv_ready(duet_decode_t *dc, duet_dc_req_t *req)
{
    duet_status_t st = duet_dc_output_init(dc, req);
    if (st != DUET_OK) {
        duet_dc_fail(dc, req, st, duet_error_msg());
        return;
    }
    /* the prefill daemon (or our local prefill) sampled output 0: it goes
     * out before the KV is unpacked or imported, which only the next
     * decode step needs (TTFT does not wait for the copy) */
    bool ended =
        duet_dc_emit_lp(dc, req, req->kv_first_token, req->have_first_lp ? &req->first_lp : NULL);
    int64_t t_first = duet_now_ns();
    if (req->state == DUET_DC_ENDED)
        return; /* failed while sending it */
    /* packed: from the staging pages; device pools with a mirror: from the
     * host mirror; prefilled locally: already in the pool */
    st = req->prefill_local ? DUET_OK
         : dc->fault_kv_copy
             ? duet_error(DUET_ERR_INTERNAL, "fault injection: the KV copy failed")
         : req->stage0 >= 0 ? duet__unpack(dc, req)
                            : duet_engine_kv_import(dc->node.ke.engine,
                                                    req->pages + req->n_cached_pages,
                                                    duet_dc_xfer_pages(req));
    if (req->t_kv > 0)
        DUET_LOG_DEBUG("decode: %s: first token %lld us after arrival: Prefill call +%lld us, KV "
                       "in +%lld us; imported +%lld us",
                       req->request_id, (long long)(t_first - req->t_arrival) / 1000,
                       (long long)(req->t_called - req->t_arrival) / 1000,
                       (long long)(req->t_kv - req->t_arrival) / 1000,
                       (long long)(duet_now_ns() - req->t_arrival) / 1000);
    if (st != DUET_OK && !ended) {
        duet_dc_fail(dc, req, st, duet_error_msg());
        return;
    }
    if (st != DUET_OK) /* answered already; its KV is not whole: not cached */
        DUET_LOG_WARN("decode: %s: after its last token: %s", req->request_id, duet_error_msg());
    else {
        duet_dc_cache_keep(dc, req);
        req->kv_whole = true;
    }
    if (ended) {
        duet__finished(dc, req);
        return;
    }
    req->state = DUET_DC_READY;
    duet__list_append(&dc->ready_head, &dc->ready_tail, req);
}

static duet_dc_req_t *duet__find(duet_decode_t *dc, const char *id)
{
    duet_dc_req_t *lists[] = {dc->queue_head, dc->prefilling, dc->ready_head};
    for (size_t l = 0; l < sizeof(lists) / sizeof(lists[0]); l++) {
        for (duet_dc_req_t *r = lists[l]; r != NULL; r = r->next) {
            if (strcmp(r->request_id, id) == 0)
                return r;
        }
    }
    for (int i = 0; i < dc->n_running; i++) {
        if (strcmp(dc->running[i]->request_id, id) == 0)
            return dc->running[i];
    }
    for (duet_node_link_t *nk = dc->node.links; nk != NULL; nk = nk->next) {
        duet_dc_link_t *k = duet_dc_link_of(nk);
        for (duet_dc_req_t *r = k->waiting; r != NULL; r = r->next) {
            if (strcmp(r->request_id, id) == 0)
                return r;
        }
    }
    return NULL;
}

static void duet__handle(duet_decode_t *dc, duet_dc_ev_t *ev)
{
    duet_dc_req_t *req = ev->req;
    switch (ev->type) {
    case DUET_DC_EV_NEW:
        req->state = DUET_DC_QUEUED;
        duet__list_append(&dc->queue_head, &dc->queue_tail, req);
        pthread_mutex_lock(&dc->evlock);
        dc->requests_total++;
        pthread_mutex_unlock(&dc->evlock);
        break;
    case DUET_DC_EV_ABORT: {
        duet_dc_req_t *r = duet__find(dc, ev->request_id);
        Duet__V1__AbortResponse resp = DUET__V1__ABORT_RESPONSE__INIT;
        if (r != NULL && !duet_dc_abort_allowed(r, ev->abort_token))
            r = NULL; /* not the owner: as if unknown */
        if (r != NULL) {
            r->cancelled = true;
            duet_dc_fail(dc, r, DUET_ERR_CANCELLED, "aborted by Decode.Abort");
        }
        resp.found = r != NULL;
        duet_pb_reply(ev->call, &resp.base);
        break;
    }
    case DUET_DC_EV_KV_DONE:
        duet_dc_on_kv_done(dc, ev);
        break;
    case DUET_DC_EV_KV_PROGRESS:
        duet_dc_on_kv_progress(dc, ev);
        break;
    case DUET_DC_EV_RPC_DONE:
        duet_dc_on_rpc_done(dc, ev);
        break;
    case DUET_DC_EV_LINK_DONE:
        duet_dc_on_link_done(dc, ev);
        break;
    case DUET_DC_EV_PEER_ERROR:
        duet_dc_on_peer_failed(dc, ev);
        break;
    case DUET_DC_EV_WAKE:
        break;
    }
}

/* End the requests whose client went away (flagged by on_cancel). */
static void duet__reap_cancelled(duet_decode_t *dc)
{
    duet_dc_req_t *lists[] = {dc->queue_head, dc->prefilling, dc->ready_head};
    for (size_t l = 0; l < sizeof(lists) / sizeof(lists[0]); l++) {
        duet_dc_req_t *r = lists[l];
        while (r != NULL) {
            duet_dc_req_t *next = r->next;
            if (atomic_load(&r->cancel_requested))
                duet_dc_fail(dc, r, DUET_ERR_CANCELLED, "cancelled by the client");
            r = next;
        }
    }
    for (int i = 0; i < dc->n_running; i++) {
        if (atomic_load(&dc->running[i]->cancel_requested)) {
            duet_dc_fail(dc, dc->running[i], DUET_ERR_CANCELLED, "cancelled by the client");
            i--;
        }
    }
    for (duet_node_link_t *nk = dc->node.links; nk != NULL; nk = nk->next) {
        duet_dc_link_t *k = duet_dc_link_of(nk);
        duet_dc_req_t *r = k->waiting;
        while (r != NULL) {
            duet_dc_req_t *next = r->next;
            if (atomic_load(&r->cancel_requested))
                duet_dc_fail(dc, r, DUET_ERR_CANCELLED, "cancelled by the client");
            r = next;
        }
    }
}

static void duet__admit(duet_decode_t *dc)
{
    int max = dc->node.args.self->max_seqs, n_local = 0, busy = dc->n_running;
    int local_tokens = 0;
    duet_dc_req_t *local[max];

    /* after an engine failure the queue waits for the stop (UNAVAILABLE:
     * the router retries elsewhere) instead of making prefill work */
    if (duet_node_failed(&dc->node))
        return;
    for (duet_dc_req_t *r = dc->ready_head; r != NULL; r = r->next)
        busy++;
    while (dc->queue_head != NULL && n_local < max) {
        duet_dc_req_t *req = dc->queue_head;
        /* colocated / conditional: our own engine prefills it
         * (local_prefill.c), batched with the others admitted now up to
         * max_batch_tokens prompt tokens per pass: a decode step comes
         * between two such batches, which bounds the stall of the running
         * sequences */
        /* (with the prefix cache, only the pages it lacks are new, and the
         * decision counts only the tokens left to compute) */
        if (duet_dc_cache_take(dc, req) != DUET_OK)
            break; /* wait: finishing requests free pages */
        DUET_LOG_DEBUG("decode: %s: %d of %d prompt pages from the prefix cache", req->request_id,
                       req->n_cached_pages, req->n_prompt_pages);
        bool here = duet_dc_local_wanted(dc, req, busy + n_local);
        int uncached = duet_dc_uncached_tokens(dc, req);
        if (here && n_local > 0 && local_tokens + uncached > dc->node.args.self->max_batch_tokens) {
            duet_kv_pool_release_chain(dc->node.pages, req->pages, req->n_pages);
            req->pages_held = false;
            break;
        }
        duet__list_remove(&dc->queue_head, &dc->queue_tail, req);
        atomic_fetch_sub(&dc->waiting, 1);
        if (here) {
            local[n_local++] = req;
            local_tokens += uncached;
            continue;
        }
        pthread_mutex_lock(&dc->evlock);
        dc->prefills_remote++;
        pthread_mutex_unlock(&dc->evlock);
        /* packed transfers stage the prompt in a run of free pages; with no
         * such run the request moves unpacked (slower on device pools, never
         * stuck) */
        if (dc->node.ke.pack && duet_kv_pool_alloc_run(dc->node.stage, duet_dc_xfer_pages(req),
                                                       &req->stage0) != DUET_OK) {
            duet_dc_unstaged(dc, req, duet_error_msg());
            req->stage0 = -1;
        }
        duet_dc_prefill_start(dc, req);
    }
    if (n_local > 0)
        duet_dc_local_prefill(dc, local, n_local);
}

/* One decode step over the running batch. */
static void duet__step(duet_decode_t *dc)
{
    int max = dc->node.args.self->max_seqs;
    int64_t now = duet_now_ns();
    duet_status_t st;

    while (dc->n_running < max && dc->ready_head != NULL) {
        duet_dc_req_t *req = dc->ready_head;
        duet__list_remove(&dc->ready_head, &dc->ready_tail, req);
        req->state = DUET_DC_RUNNING;
        dc->running[dc->n_running++] = req;
    }
    for (int i = 0; i < dc->n_running; i++) {
        duet_dc_req_t *req = dc->running[i];
        if (req->deadline_ns != INT64_MAX && now > req->deadline_ns) {
            duet_dc_fail(dc, req, DUET_ERR_TIMEOUT, "request deadline exceeded");
            i--;
        }
    }
    int n = dc->n_running;
    if (n == 0)
        return;
    if (dc->fault_step_delay_ms > 0) /* fault injection: a slow decode */
        nanosleep(&(struct timespec){dc->fault_step_delay_ms / 1000,
                                     (dc->fault_step_delay_ms % 1000) * 1000000L},
                  NULL);
    for (int i = 0; i < n; i++) {
        duet_dc_req_t *req = dc->running[i];
        dc->inputs[i] = req->out[req->n_out - 1];
        dc->seqs[i] = (duet_engine_seq_t){
            .tokens = &dc->inputs[i],
            .n_tokens = 1,
            .start_pos = req->n_prompt + req->n_out - 1,
            .pages = req->pages,
            .n_pages = req->n_pages,
            .sample = true,
            .sampling = req->sampling,
            .sample_index = (uint64_t)req->n_out,
            .logits = req->logits, /* logprobs asked (lp.c) */
        };
    }
    st = duet_engine_forward(dc->node.ke.engine, dc->seqs, n, dc->sampled);
    if (st != DUET_OK) {
        /* the engine cannot run again (a rank failed: collective deadline,
         * rank or device error): fail the batch and have the process go, so
         * that the orchestrator restarts it (node/node.h) */
        char detail[256], msg[300];
        snprintf(detail, sizeof(detail), "%s", duet_error_msg());
        snprintf(msg, sizeof(msg), "decode engine failed: %s", detail);
        while (dc->n_running > 0)
            duet_dc_fail(dc, dc->running[0], DUET_ERR_INTERNAL, msg);
        duet_node_fail(&dc->node, detail);
        return;
    }
    /* emit in batch order; requests that end leave the array */
    duet_dc_req_t **batch = dc->running;
    duet_dc_req_t *snapshot[n];
    memcpy(snapshot, batch, (size_t)n * sizeof(snapshot[0]));
    for (int i = 0; i < n; i++) {
        duet_logprob_t lp;
        if (duet_dc_emit_lp(dc, snapshot[i], dc->sampled[i],
                            duet_dc_lp_step(dc, snapshot[i], dc->sampled[i], &lp)))
            duet__finished(dc, snapshot[i]);
    }
}

static void duet__update_info(duet_decode_t *dc)
{
    int queued = 0, running = dc->n_running;
    for (duet_dc_req_t *r = dc->queue_head; r != NULL; r = r->next)
        queued++;
    for (duet_node_link_t *nk = dc->node.links; nk != NULL; nk = nk->next) {
        duet_dc_link_t *k = duet_dc_link_of(nk);
        for (duet_dc_req_t *r = k->waiting; r != NULL; r = r->next)
            queued++;
    }
    for (duet_dc_req_t *r = dc->prefilling; r != NULL; r = r->next)
        running++;
    for (duet_dc_req_t *r = dc->ready_head; r != NULL; r = r->next)
        running++;
    for (duet_dc_req_t *r = dc->ending; r != NULL; r = r->next)
        running++;
    pthread_mutex_lock(&dc->evlock);
    dc->info_queued = queued;
    dc->info_running = running;
    pthread_mutex_unlock(&dc->evlock);
}

static bool duet__idle(duet_decode_t *dc)
{
    return dc->queue_head == NULL && dc->prefilling == NULL && dc->ready_head == NULL &&
           dc->n_running == 0 && dc->ending == NULL;
}

/* At stop: end everything still here. */
static void duet__abort_all(duet_decode_t *dc)
{
    duet_dc_req_t *r;
    while ((r = dc->queue_head) != NULL)
        duet_dc_fail(dc, r, DUET_ERR_SHUTDOWN, "decode is shutting down");
    while ((r = dc->ready_head) != NULL)
        duet_dc_fail(dc, r, DUET_ERR_SHUTDOWN, "decode is shutting down");
    while (dc->n_running > 0)
        duet_dc_fail(dc, dc->running[0], DUET_ERR_SHUTDOWN, "decode is shutting down");
    while ((r = dc->prefilling) != NULL)
        duet_dc_fail(dc, r, DUET_ERR_SHUTDOWN, "decode is shutting down");
    for (duet_node_link_t *nk = dc->node.links; nk != NULL; nk = nk->next) {
        duet_dc_link_t *k = duet_dc_link_of(nk);
        while ((r = k->waiting) != NULL)
            duet_dc_fail(dc, r, DUET_ERR_SHUTDOWN, "decode is shutting down");
    }
}

static void *duet__sched_main(void *arg)
{
    duet_decode_t *dc = arg;
    bool stopping = false; /* the stop has been seen: what is left waits for events */

    duet_thread_set_name("dc-sched");
    for (;;) {
        duet_dc_req_t *zombies = dc->zombies;
        duet_dc_ev_t *evs;
        bool stop;

        dc->zombies = NULL;
        pthread_mutex_lock(&dc->evlock);
        if (dc->ev_head == NULL && (!dc->stop || stopping) && dc->n_running == 0 &&
            dc->ready_head == NULL && zombies == NULL) {
            /* idle: sleep until an event (or a while, to stay responsive) */
            struct timespec ts = duet_deadline_timespec(duet_now_ns() + 500 * DUET_NS_PER_MS);
            pthread_cond_timedwait(&dc->evcv, &dc->evlock, &ts);
        }
        evs = dc->ev_head;
        dc->ev_head = dc->ev_tail = NULL;
        stop = dc->stop;
        pthread_mutex_unlock(&dc->evlock);

        while (evs != NULL) {
            duet_dc_ev_t *ev = evs;
            evs = ev->next;
            duet__handle(dc, ev);
            duet_free(ev);
        }
        /* every event that could name these was posted before they became
         * zombies, and has now been handled */
        while (zombies != NULL) {
            duet_dc_req_t *z = zombies;
            zombies = z->next;
            duet_dc_req_free(dc, z);
        }
        duet__reap_cancelled(dc);
        if (stop) {
            duet__abort_all(dc);
            stopping = true;
        }
        duet__admit(dc);
        /* before the step: a request admitted and prefilled locally in this
         * pass is counted while the step runs (the drain reads the counts) */
        duet__update_info(dc);
        duet__step(dc);
        duet__update_info(dc);
        if (stop && duet__idle(dc) && dc->zombies == NULL) {
            pthread_mutex_lock(&dc->evlock);
            bool more = dc->ev_head != NULL;
            dc->sched_gone = !more;
            pthread_mutex_unlock(&dc->evlock);
            if (!more)
                break;
        }
    }
    return NULL;
}

duet_status_t duet_dc_sched_start(duet_decode_t *dc)
{
    int max = dc->node.args.self->max_seqs;
    dc->running = DUET_NEW_ARRAY(duet_dc_req_t *, (size_t)max);
    dc->seqs = DUET_NEW_ARRAY(duet_engine_seq_t, (size_t)max);
    dc->sampled = DUET_NEW_ARRAY(int32_t, (size_t)max);
    dc->inputs = DUET_NEW_ARRAY(int32_t, (size_t)max);
    if (!dc->running || !dc->seqs || !dc->sampled || !dc->inputs)
        return duet_error(DUET_ERR_NO_MEMORY, "decode: no memory for the scheduler");
    if (pthread_create(&dc->sched_thread, NULL, duet__sched_main, dc) != 0)
        return duet_error(DUET_ERR_NO_MEMORY, "decode: cannot start the scheduler");
    dc->sched_started = true;
    return DUET_OK;
}

void duet_dc_sched_stop(duet_decode_t *dc)
{
    if (!dc->sched_started)
        return;
    pthread_mutex_lock(&dc->evlock);
    dc->stop = true;
    pthread_cond_signal(&dc->evcv);
    pthread_mutex_unlock(&dc->evlock);
    pthread_join(dc->sched_thread, NULL);
    dc->sched_started = false;
    duet_free(dc->running);
    duet_free(dc->seqs);
    duet_free(dc->sampled);
    duet_free(dc->inputs);
}
