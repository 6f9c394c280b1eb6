/* The decode scheduler: the batch loop.  It takes the events in, admits
 * requests, sends the first tokens whose KV is complete, and runs
 * continuous batching; every change to a request goes through req.c's
 * duet_dc_req_go.  Only this thread touches requests and links after the
 * handler posted them (decode.h). */
#include "decode/sched.h"

#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/rpc_pb.h"
#include "common/sync.h"
#include "decode/cache.h"
#include "decode/events.h"
#include "decode/local_prefill.h"
#include "decode/lp.h"
#include "decode/owner.h"
#include "decode/prefill_path.h"
#include "decode/req.h"
#include "duet/v1/common.pb-c.h"

/* The live request (not yet ENDED) with this id whose abort token is
 * token; NULL: none.  Ids are namespaced by owner: another caller may
 * start a request with the same id (it cannot know whether the id is
 * taken), and it must never shadow the owner's own (issue 25). */
static duet_dc_req_t *duet__req_find(duet_decode_t *dc, const char *id, const char *token)
{
    duet_dc_req_t *lists[] = {dc->queue_head, dc->local_head, dc->prefilling, dc->kv_in_head,
                              dc->ready_head};
    for (size_t l = 0; l < sizeof(lists) / sizeof(lists[0]); l++) {
        for (duet_dc_req_t *r = lists[l]; r != NULL; r = r->next) {
            if (strcmp(r->request_id, id) == 0 && duet_dc_abort_allowed(r, token))
                return r;
        }
    }
    for (int i = 0; i < dc->n_running; i++) {
        duet_dc_req_t *r = dc->running[i];
        if (strcmp(r->request_id, id) == 0 && duet_dc_abort_allowed(r, token))
            return r;
    }
    for (duet_node_link_t *nk = dc->node.links; nk != NULL; nk = nk->next) {
        duet_dc_link_t *k = duet_dc_link_of(nk);
        for (duet_dc_req_t *r = k->waiting; r != NULL; r = r->next) {
            if (strcmp(r->request_id, id) == 0 && duet_dc_abort_allowed(r, token))
                return r;
        }
    }
    return NULL;
}

/* DRAIN: the drain began.  A draining decode finishes every request it
 * has; a router moves its started streams to another decode first
 * (make-before-break: it cancels a stream here only once another decode
 * runs it, docs/migration.md "Drains"), so from here a cancel counts as a
 * stream handed back (duet_dc_drain_report). */
static void duet__drain_begin(duet_decode_t *dc)
{
    int n = duet_dc_pending(dc);
    dc->drain_counting = true;
    atomic_store(&dc->drain_in_flight, n);
    DUET_LOG_INFO("decode: draining: %d request(s) in flight: finished here unless their router "
                  "moves them to another decode first",
                  n);
}

void duet_dc_drain_begin(void *arg)
{
    duet_decode_t *dc = arg;
    duet_dc_ev_t *ev = duet_dc_ev_new(DUET_DC_EV_DRAIN, NULL);
    if (ev != NULL)
        duet_dc_post(dc, ev); /* (without memory nothing is counted) */
}

void duet_dc_drain_report(duet_decode_t *dc)
{
    int moved = atomic_load(&dc->drain_moved), n = atomic_load(&dc->drain_in_flight);
    if (atomic_load(&dc->node.draining) && n > 0)
        DUET_LOG_INFO("decode: drained: %d stream(s) handed back to their router (taken over "
                      "by another decode), the rest of the %d in flight finished here",
                      moved, n);
}

/* LINK_DONE: the link is ready (or retired), and every request waiting
 * for it moves on. */
static void duet__link_done(duet_decode_t *dc, const duet_dc_ev_t *ev)
{
    duet_dc_link_t *link = ev->link;

    if (ev->status == DUET_OK)
        duet_node_link_ready(&link->base);
    /* (each leaves the waiting list: LINKING -> PREFILL or ENDED) */
    while (link->waiting != NULL)
        duet_dc_req_event(dc, link->waiting, DUET_DC_GO_LINKED, ev);
    if (ev->status != DUET_OK)
        duet_node_link_retire(&link->base);
}

static void duet__ev_handle(duet_decode_t *dc, duet_dc_ev_t *ev)
{
    duet_dc_req_t *req = ev->req;
    switch (ev->type) {
    case DUET_DC_EV_NEW:
        duet_dc_req_event(dc, req, DUET_DC_GO_QUEUE, NULL);
        pthread_mutex_lock(&dc->evlock);
        dc->requests_total++;
        pthread_mutex_unlock(&dc->evlock);
        break;
    case DUET_DC_EV_ABORT: {
        /* not the owner (or no such id): as if unknown */
        duet_dc_req_t *r = duet__req_find(dc, ev->request_id, ev->abort_token);
        Duet__V1__AbortResponse resp = DUET__V1__ABORT_RESPONSE__INIT;
        if (r != NULL)
            duet_dc_req_go(
                dc, r,
                &(duet_dc_input_t){.go = DUET_DC_GO_CANCEL, .msg = "aborted by Decode.Abort"});
        resp.found = r != NULL;
        duet_pb_reply(ev->call, &resp.base);
        break;
    }
    case DUET_DC_EV_KV_DONE:
        duet_dc_req_event(dc, req, DUET_DC_GO_KV_DONE, ev);
        break;
    case DUET_DC_EV_KV_PROGRESS:
        duet_dc_req_event(dc, req, DUET_DC_GO_KV_PROGRESS, ev);
        break;
    case DUET_DC_EV_KV_STARTED:
        duet_dc_req_event(dc, req, DUET_DC_GO_KV_STARTED, ev);
        break;
    case DUET_DC_EV_RPC_DONE:
        duet_dc_req_event(dc, req, DUET_DC_GO_RPC_DONE, ev);
        break;
    case DUET_DC_EV_LINK_DONE:
        duet__link_done(dc, ev);
        break;
    case DUET_DC_EV_DRAIN:
        duet__drain_begin(dc);
        break;
    case DUET_DC_EV_PEER_ERROR:
        duet_dc_on_peer_failed(dc, ev);
        break;
    case DUET_DC_EV_WAKE:
        break;
    }
}

static void duet__req_cancel(duet_decode_t *dc, duet_dc_req_t *req)
{
    if (dc->drain_counting)
        atomic_fetch_add(&dc->drain_moved, 1);
    duet_dc_req_go(dc, req,
                   &(duet_dc_input_t){.go = DUET_DC_GO_CANCEL, .msg = "cancelled by the client"});
}

/* End the requests whose client went away (flagged by on_cancel). */
static void duet__reap_cancelled(duet_decode_t *dc)
{
    duet_dc_req_t *lists[] = {dc->queue_head, dc->local_head, dc->prefilling, dc->kv_in_head,
                              dc->ready_head};
    for (size_t l = 0; l < sizeof(lists) / sizeof(lists[0]); l++) {
        duet_dc_req_t *r = lists[l];
        while (r != NULL) {
            duet_dc_req_t *next = r->next;
            if (atomic_load(&r->cancel_requested))
                duet__req_cancel(dc, r);
            r = next;
        }
    }
    for (int i = 0; i < dc->n_running; i++) {
        if (atomic_load(&dc->running[i]->cancel_requested)) {
            duet__req_cancel(dc, dc->running[i]);
            i--;
        }
    }
    for (duet_node_link_t *nk = dc->node.links; nk != NULL; nk = nk->next) {
        duet_dc_link_t *k = duet_dc_link_of(nk);
        duet_dc_req_t *r = k->waiting;
        while (r != NULL) {
            duet_dc_req_t *next = r->next;
            if (atomic_load(&r->cancel_requested))
                duet__req_cancel(dc, r);
            r = next;
        }
    }
}

/* Prefill reqs[0..n) (LOCAL) whole on our engine in one pass (chunked
 * prefill off): each moves on to KV_IN or fails; an engine failure fails
 * them all and the process goes (as a failed decode step). */
static void duet__local_run(duet_decode_t *dc, duet_dc_req_t **reqs, int n)
{
    duet_dc_local_result_t *res = dc->local_res;
    duet_status_t st = duet_dc_local_prefill(dc, reqs, n, res);

    if (st != DUET_OK) {
        /* the engine cannot run again: as a failed decode step */
        char detail[256], msg[300];
        snprintf(detail, sizeof(detail), "%s", duet_error_msg());
        snprintf(msg, sizeof(msg), "decode engine failed in a local prefill: %s", detail);
        for (int i = 0; i < n; i++)
            duet_dc_req_fail(dc, reqs[i], DUET_ERR_INTERNAL, msg);
        duet_node_fail(&dc->node, detail);
        return;
    }
    for (int i = 0; i < n; i++)
        duet_dc_req_go(dc, reqs[i],
                       &(duet_dc_input_t){
                           .go = DUET_DC_GO_PREFILLED, .status = res[i].status, .msg = res[i].msg});
}

static void duet__admit(duet_decode_t *dc)
{
    int max = dc->node.args.self->max_seqs, n_local = 0, busy = dc->n_running;
    /* whole prompts: this pass's local prompt tokens; chunked: the prompt
     * tokens every LOCAL request still needs */
    int local_tokens = 0;
    duet_dc_req_t *local[max];

    /* after an engine failure the queue waits for the stop (UNAVAILABLE:
     * the router retries elsewhere) instead of making prefill work */
    if (duet_node_failed(&dc->node))
        return;
    for (duet_dc_req_t *r = dc->ready_head; r != NULL; r = r->next)
        busy++;
    for (duet_dc_req_t *r = dc->local_head; r != NULL; r = r->next) {
        busy++;
        local_tokens += r->n_prompt - r->local_done;
    }
    while (dc->queue_head != NULL && n_local < max) {
        duet_dc_req_t *req = dc->queue_head;
        /* colocated / conditional: our own engine prefills it
         * (local_prefill.c).  Whole prompts: batched with the others
         * admitted now up to max_batch_tokens prompt tokens per pass, a
         * decode step between two such batches.  Chunked: in the decode
         * steps; admitted while the LOCAL requests need less than one
         * step's chunk budget, so that pages are not held long before
         * their prompt runs */
        /* (with the prefix cache, only the pages it lacks are new, and the
         * decision counts only the tokens left to compute) */
        if (duet_dc_req_go(dc, req, &(duet_dc_input_t){.go = DUET_DC_GO_PAGES}) != DUET_OK)
            break; /* wait: finishing requests free pages */
        DUET_LOG_DEBUG("decode: %s: %d of %d prompt pages from the prefix cache", req->request_id,
                       req->n_cached_pages, req->n_prompt_pages);
        bool here = duet_dc_local_wanted(dc, req, busy + n_local);
        int uncached = duet_dc_uncached_tokens(dc, req);
        bool full = dc->chunk_tokens > 0 ? local_tokens >= dc->chunk_tokens
                                         : n_local > 0 && local_tokens + uncached >
                                                              dc->node.args.self->max_batch_tokens;
        if (here && full) {
            duet_dc_req_event(dc, req, DUET_DC_GO_UNPAGE, NULL);
            break;
        }
        if (here) {
            duet_dc_req_event(dc, req, DUET_DC_GO_LOCAL, NULL);
            local[n_local++] = req;
            local_tokens += uncached;
            continue;
        }
        duet_dc_req_event(dc, req, DUET_DC_GO_REMOTE, NULL);
    }
    if (n_local > 0 && dc->chunk_tokens == 0)
        duet__local_run(dc, local, n_local);
}

/* Send the first token of every request whose KV is complete (KV_IN:
 * recorded by the KV_DONE and RPC_DONE events, or a local prefill). */
static void duet__first_tokens(duet_decode_t *dc)
{
    while (dc->kv_in_head != NULL)
        duet_dc_req_event(dc, dc->kv_in_head, DUET_DC_GO_FIRST, NULL);
}

/* The engine cannot run again (a rank failed: collective deadline, rank
 * or device error): fail every request it was computing and have the
 * process go, so that the orchestrator restarts it (node/node.h). */
static void duet__step_failed(duet_decode_t *dc)
{
    char detail[256], msg[300];
    snprintf(detail, sizeof(detail), "%s", duet_error_msg());
    snprintf(msg, sizeof(msg), "decode engine failed: %s", detail);
    while (dc->n_running > 0)
        duet_dc_req_fail(dc, dc->running[0], DUET_ERR_INTERNAL, msg);
    while (dc->local_head != NULL)
        duet_dc_req_fail(dc, dc->local_head, DUET_ERR_INTERNAL, msg);
    duet_node_fail(&dc->node, detail);
}

/* Requests past their deadline, running or prefilling locally, end (their
 * pages go back at once: nothing else writes them). */
static void duet__step_deadlines(duet_decode_t *dc, int64_t now)
{
    for (int i = 0; i < dc->n_running; i++) {
        duet_dc_req_t *req = dc->running[i];
        if (req->deadline_ns != INT64_MAX && now > req->deadline_ns) {
            duet_dc_req_fail(dc, req, DUET_ERR_TIMEOUT, "request deadline exceeded");
            i--;
        }
    }
    for (duet_dc_req_t *r = dc->local_head, *next; r != NULL; r = next) {
        next = r->next;
        if (r->deadline_ns != INT64_MAX && now > r->deadline_ns)
            duet_dc_req_fail(dc, r, DUET_ERR_TIMEOUT, "request deadline exceeded");
    }
}

/* The local chunks of the step that ran: each request stays LOCAL with
 * more of its prompt computed, or, after its last chunk, moves on with
 * its first token (KV_IN) or fails. */
static void duet__step_chunks(duet_decode_t *dc, int n_loc, const duet_engine_seq_t *seqs,
                              const int32_t *sampled)
{
    for (int i = 0; i < n_loc; i++) {
        duet_dc_req_t *req = dc->local_batch[i];
        duet_dc_local_result_t res;
        if (!seqs[i].sample) {
            duet_dc_req_go(
                dc, req, &(duet_dc_input_t){.go = DUET_DC_GO_CHUNK, .n_tokens = seqs[i].n_tokens});
            continue;
        }
        duet_dc_local_first(dc, req, sampled[i], &res);
        duet_dc_req_go(
            dc, req,
            &(duet_dc_input_t){.go = DUET_DC_GO_PREFILLED, .status = res.status, .msg = res.msg});
    }
}

/* One decode step over the running batch, with the next chunks of the
 * local prefills (chunked prefill) in the same forward. */
/* Info's step timing: the forward's time, and the cycle from the previous
 * step's forward start to this one's (when it followed within a second:
 * the time between two tokens of a running stream). */
static void duet__step_timing(duet_decode_t *dc, int64_t t0, int64_t t1)
{
    int64_t gap = dc->last_step_ns > 0 ? t0 - dc->last_step_ns : -1;
    dc->last_step_ns = t0;
    pthread_mutex_lock(&dc->evlock);
    dc->steps++;
    dc->forward_ns += (uint64_t)(t1 - t0);
    if (gap >= 0 && gap < DUET_NS_PER_S) {
        dc->cycles++;
        dc->cycle_ns += (uint64_t)gap;
    }
    pthread_mutex_unlock(&dc->evlock);
}

static void duet__step(duet_decode_t *dc)
{
    int max = dc->node.args.self->max_seqs, n_loc = 0;
    duet_status_t st;

    while (dc->n_running < max && dc->ready_head != NULL)
        duet_dc_req_event(dc, dc->ready_head, DUET_DC_GO_RUN, NULL);
    duet__step_deadlines(dc, duet_now_ns());
    int n = dc->n_running;
    if (dc->chunk_tokens > 0 && dc->local_head != NULL)
        n_loc = duet_dc_local_chunks(dc, n, max, dc->local_batch, dc->seqs + n);
    if (n + n_loc == 0)
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
            .sample_index = (uint64_t)(req->first_index + req->n_out),
            .logits = req->logits, /* logprobs asked (lp.c) */
        };
    }
    int64_t t0 = duet_now_ns();
    st = duet_engine_forward(dc->node.ke.engine, dc->seqs, n + n_loc, dc->sampled);
    int64_t t1 = duet_now_ns();
    duet__step_timing(dc, t0, t1);
    if (st != DUET_OK) {
        duet__step_failed(dc);
        return;
    }
    /* emit in batch order; requests that end leave the array */
    duet_dc_req_t **batch = dc->running;
    duet_dc_req_t *snapshot[n > 0 ? n : 1];
    memcpy(snapshot, batch, (size_t)n * sizeof(snapshot[0]));
    for (int i = 0; i < n; i++) {
        duet_logprob_t lp;
        duet_dc_req_go(dc, snapshot[i],
                       &(duet_dc_input_t){
                           .go = DUET_DC_GO_TOKEN,
                           .token = dc->sampled[i],
                           .lp = duet_dc_lp_step(dc, snapshot[i], dc->sampled[i], &lp),
                       });
    }
    duet__step_chunks(dc, n_loc, dc->seqs + n, dc->sampled + n);
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
    for (duet_dc_req_t *r = dc->local_head; r != NULL; r = r->next)
        running++;
    for (duet_dc_req_t *r = dc->prefilling; r != NULL; r = r->next)
        running++;
    for (duet_dc_req_t *r = dc->kv_in_head; r != NULL; r = r->next)
        running++;
    for (duet_dc_req_t *r = dc->ready_head; r != NULL; r = r->next)
        running++;
    for (duet_dc_req_t *r = dc->ending; r != NULL; r = r->next)
        running++;
    pthread_mutex_lock(&dc->evlock);
    /* requests posted and not taken yet (duet_dc_post_new): every one taken
     * before was handled in this pass and is in a list above */
    for (duet_dc_ev_t *ev = dc->ev_head; ev != NULL; ev = ev->next)
        queued += ev->type == DUET_DC_EV_NEW;
    dc->info_queued = queued;
    dc->info_running = running;
    pthread_mutex_unlock(&dc->evlock);
}

static bool duet__idle(duet_decode_t *dc)
{
    return dc->queue_head == NULL && dc->local_head == NULL && dc->prefilling == NULL &&
           dc->kv_in_head == NULL && dc->ready_head == NULL && dc->n_running == 0 &&
           dc->ending == NULL;
}

/* At stop: end everything still here. */
static void duet__abort_all(duet_decode_t *dc)
{
    duet_dc_req_t *r;
    while ((r = dc->queue_head) != NULL)
        duet_dc_req_fail(dc, r, DUET_ERR_SHUTDOWN, "decode is shutting down");
    while ((r = dc->local_head) != NULL)
        duet_dc_req_fail(dc, r, DUET_ERR_SHUTDOWN, "decode is shutting down");
    while ((r = dc->kv_in_head) != NULL)
        duet_dc_req_fail(dc, r, DUET_ERR_SHUTDOWN, "decode is shutting down");
    while ((r = dc->ready_head) != NULL)
        duet_dc_req_fail(dc, r, DUET_ERR_SHUTDOWN, "decode is shutting down");
    while (dc->n_running > 0)
        duet_dc_req_fail(dc, dc->running[0], DUET_ERR_SHUTDOWN, "decode is shutting down");
    while ((r = dc->prefilling) != NULL)
        duet_dc_req_fail(dc, r, DUET_ERR_SHUTDOWN, "decode is shutting down");
    for (duet_node_link_t *nk = dc->node.links; nk != NULL; nk = nk->next) {
        duet_dc_link_t *k = duet_dc_link_of(nk);
        while ((r = k->waiting) != NULL)
            duet_dc_req_fail(dc, r, DUET_ERR_SHUTDOWN, "decode is shutting down");
    }
}

static void *duet__dc_sched_main(void *arg)
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
            dc->local_head == NULL && dc->kv_in_head == NULL && dc->ready_head == NULL &&
            zombies == NULL) {
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
            duet__ev_handle(dc, ev);
            duet_free(ev);
        }
        /* every event that could name these was posted before they became
         * zombies, and has now been handled */
        while (zombies != NULL) {
            duet_dc_req_t *z = zombies;
            zombies = z->next;
            duet_dc_req_free(dc, z);
        }
        /* the first tokens whose KV the events completed */
        duet__first_tokens(dc);
        duet__reap_cancelled(dc);
        if (stop) {
            duet__abort_all(dc);
            stopping = true;
        }
        duet_dc_cache_check_writes(dc); /* before admission looks pages up */
        duet__admit(dc);
        duet__first_tokens(dc); /* those prefilled locally */
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
    /* a step: the running sequences, then at most max_seqs local chunks */
    dc->seqs = DUET_NEW_ARRAY(duet_engine_seq_t, 2 * (size_t)max);
    dc->sampled = DUET_NEW_ARRAY(int32_t, 2 * (size_t)max);
    dc->inputs = DUET_NEW_ARRAY(int32_t, (size_t)max);
    dc->local_res = DUET_NEW_ARRAY(duet_dc_local_result_t, (size_t)max);
    dc->local_batch = DUET_NEW_ARRAY(duet_dc_req_t *, (size_t)max);
    if (!dc->running || !dc->seqs || !dc->sampled || !dc->inputs || !dc->local_res ||
        !dc->local_batch)
        return duet_error(DUET_ERR_NO_MEMORY, "decode: no memory for the scheduler");
    if (pthread_create(&dc->sched_thread, NULL, duet__dc_sched_main, dc) != 0)
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
    duet_free(dc->local_res);
    duet_free(dc->local_batch);
}
