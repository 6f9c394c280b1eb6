/* Jobs: admission (max_concurrent running, queue_limit waiting), the choice
 * of a prefill/decode pair, the Decode.Generate stream, the retry rule and
 * the hand-off of chunks and the end to the front end's sink.
 *
 * Retry rule: a failure before the first token (no chunk reached the sink)
 * with a retryable status (UNAVAILABLE, RESOURCE_EXHAUSTED, FAILED_
 * PRECONDITION, INTERNAL, UNKNOWN, ABORTED, or a CANCELLED the client did
 * not ask for) is retried once on another pair -- another prefill and/or
 * another decode, whichever exists -- within the request's deadline.  After
 * the first token the stream migrates (docs/migration.md, job_migrate.c):
 * a failure that a decode's death, stall or error explains (and not the
 * client's cancel) re-submits prompt + the ids so far to another decode
 * (and prefill), up to router.migrate_max times within the deadline; the
 * sink sees one uninterrupted stream.  Otherwise the failure goes to the
 * client.
 *
 * Fork-style n (docs/api-logprobs.md; job_fork.c): duet_router_job_start_after makes a
 * choice wait for choice 0's first token, then start pinned to choice 0's
 * prefill/decode pair (workers.h "pinned picks").
 *
 * References: the creator holds one; admission (queued or running) holds
 * one until the end; a waiting follower's leader holds one on it until it
 * starts or is cancelled; each open downstream stream holds one until its
 * on_done; a launch holds one while it runs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/daemon.h"
#include "common/log.h"
#include "router/fleet/cache_index.h"
#include "router/job/job_internal.h"

/* The job's prompt no longer waits for its first token. */
static void duet__job_prompt_done(duet_router_job_t *job)
{
    if (atomic_exchange(&job->prompt_waiting, false))
        atomic_fetch_sub(&job->rt->metrics.prompt_tokens_waiting, (int64_t)job->n_prompt);
}

void duet__job_unref(duet_router_job_t *job)
{
    if (atomic_fetch_sub(&job->refs, 1) != 1)
        return;
    duet__job_prompt_done(job);
    duet__job_held_clear(job);
    pthread_cond_destroy(&job->cond);
    pthread_mutex_destroy(&job->lock);
    duet_free(job->req);
    duet_free(job->keys);
    duet_router_ca_tokens_free(&job->toks);
    duet_free(job->request_id);
    duet_free(job->fin_raw);
    duet_free(job->gen);
    duet_free(job);
}

duet_router_job_t *duet_router_job_ref(duet_router_job_t *job)
{
    atomic_fetch_add(&job->refs, 1);
    return job;
}

void duet_router_job_release(duet_router_job_t *job)
{
    if (job)
        duet__job_unref(job);
}

duet_status_t duet_router_job_create(duet_router_t *rt, const Duet__V1__GenerateRequest *req,
                                     int64_t deadline_ns, const duet_router_sink_t *sink,
                                     void *sink_arg, duet_router_job_t **job_p)
{
    duet_router_job_t *job = DUET_NEW(duet_router_job_t);

    if (job == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "router: no memory for a job");
    job->rt = rt;
    atomic_init(&job->refs, 1);
    job->sink = sink;
    job->sink_arg = sink_arg;
    job->deadline_ns = deadline_ns;
    job->t_create = duet_now_ns();
    job->prefill = job->decode = -1;
    job->held_tail = &job->held;
    pthread_mutex_init(&job->lock, NULL);
    pthread_cond_init(&job->cond, NULL);
    /* a sampled request without a seed gets one here, not from its decode:
     * a migrated stream continues with the same one (docs/migration.md) */
    Duet__V1__GenerateRequest g = *req;
    Duet__V1__SamplingParams sp;
    if (req->sampling != NULL && req->sampling->temperature > 0 && !req->sampling->has_seed &&
        req->sampling->seed == 0) {
        sp = *req->sampling;
        sp.seed = duet_random_u64();
        sp.has_seed = true;
        g.sampling = &sp;
    }
    job->req_len = duet__v1__generate_request__get_packed_size(&g);
    job->req = duet_malloc(job->req_len ? job->req_len : 1);
    job->request_id = duet_strdup(req->request_id);
    if (job->req == NULL || job->request_id == NULL) {
        duet__job_unref(job);
        return duet_error(DUET_ERR_NO_MEMORY, "router: no memory for a job");
    }
    duet__v1__generate_request__pack(&g, job->req);
    if (req->prompt_case == DUET__V1__GENERATE_REQUEST__PROMPT_TOKEN_IDS)
        job->n_prompt = (uint32_t)req->token_ids->n_ids;
    job->max_tokens = req->max_tokens;
    job->prompt_logprobs = req->prompt_logprobs;
    if (rt->policy == DUET_ROUTER_POLICY_CACHE_AWARE &&
        req->prompt_case == DUET__V1__GENERATE_REQUEST__PROMPT_TOKEN_IDS) {
        duet_status_t st =
            duet_router_cache_keys(req->token_ids->ids, req->token_ids->n_ids,
                                   (size_t)rt->cfg->page_size, &job->keys, &job->key.n_keys);
        if (st == DUET_OK)
            st = duet_router_ca_tokens_init(&job->toks, req->token_ids->ids, req->token_ids->n_ids);
        if (st != DUET_OK) {
            duet__job_unref(job);
            return st;
        }
        job->key.keys = job->keys;
        job->key.n_tokens = req->token_ids->n_ids;
    }
    atomic_fetch_add(&rt->metrics.prompt_tokens_admitted, job->n_prompt);
    atomic_fetch_add(&rt->metrics.prompt_tokens_waiting, (int64_t)job->n_prompt);
    atomic_store(&job->prompt_waiting, true);
    *job_p = job;
    return DUET_OK;
}

static void duet__job_on_message(duet_rpc_stream_t *s, const uint8_t *data, size_t len, void *arg);

/* Count the route a launch took: a whole request to a decode (colocated),
 * or a decode with a prefill for it to use (disaggregated, or conditional:
 * the decode may still prefill locally; its Info counts what it did). */
static void duet__count_route(duet_router_t *rt, bool colocated)
{
    atomic_fetch_add_explicit(colocated ? &rt->metrics.routes_colocated
                                        : &rt->metrics.routes_disaggregated,
                              1, memory_order_relaxed);
}

static void duet__job_on_done(duet_rpc_stream_t *s, grpc_status_code code, const char *msg,
                              void *arg);

duet_status_t duet__job_route(duet_router_job_t *job, int old_p, int old_d, bool need_new,
                              bool pinned, duet__route_t *r)
{
    duet_router_t *rt = job->rt;
    int p = -1, d;
    size_t cached = 0; /* the decode's matched prefix (cache_aware) */
    duet_status_t st;

    r->msg = NULL;
    /* the route (docs/design-notes.md "Colocated mode and conditional
     * disaggregation"): without a healthy prefill only decodes that prefill
     * locally qualify; a decode with prefill_local "always" gets no prefill,
     * one with "auto" gets one when there is one (it decides per request) */
    bool have_prefill = duet_router_workers_healthy(rt->workers, DUET_ROLE_PREFILL) > 0;
    const duet_router_cache_aware_config_t *bal = &rt->cfg->router.cache_aware;
    d = pinned ? duet_router_workers_pick_pinned(rt->workers, DUET_ROLE_DECODE, !have_prefill,
                                                 &job->pins.decode, bal->balance_abs_threshold,
                                                 bal->balance_rel_threshold, &job->key, &cached)
               : -1;
    if (d < 0)
        d = duet_router_workers_pick_keyed(rt->workers, DUET_ROLE_DECODE, old_d, !have_prefill,
                                           &job->key, &cached);
    duet_prefill_local_t local =
        d >= 0 ? duet_router_workers_prefill_local(rt->workers, d) : DUET_PREFILL_LOCAL_OFF;
    if (d >= 0 && local != DUET_PREFILL_LOCAL_ALWAYS && have_prefill) {
        if (pinned)
            p = duet_router_workers_pick_pinned(rt->workers, DUET_ROLE_PREFILL, false,
                                                &job->pins.prefill, bal->balance_abs_threshold,
                                                bal->balance_rel_threshold, &job->key, NULL);
        if (p < 0)
            p = duet_router_workers_pick_keyed(rt->workers, DUET_ROLE_PREFILL, old_p, false,
                                               &job->key, NULL);
    }
    if (d < 0 || (p < 0 && local == DUET_PREFILL_LOCAL_OFF) ||
        (need_new && p == old_p && d == old_d)) {
        bool decodes = duet_router_workers_healthy(rt->workers, DUET_ROLE_DECODE) > 0;
        st = duet_error(DUET_ERR_PEER,
                        d < 0 || p < 0 ? "no healthy %s worker%s"
                                       : "no other %s worker pair to retry on%s",
                        d < 0 && decodes ? "prefill"
                        : d < 0          ? "decode"
                        : p < 0          ? "prefill"
                                         : "prefill/decode",
                        d < 0 && decodes ? " (and no healthy decode that prefills locally)" : "");
        goto err_release;
    }
    /* a started stream continues from its last id (job_migrate.c) */
    st = duet__job_decode_request(
        job, p >= 0 ? duet_router_workers_address(rt->workers, DUET_ROLE_PREFILL, p) : "", p < 0,
        cached, &r->msg, &r->len);
    if (st != DUET_OK)
        goto err_release;
    r->p = p;
    r->d = d;
    r->cached = cached;
    return DUET_OK;

err_release:
    duet_router_workers_release(rt->workers, DUET_ROLE_PREFILL, p);
    duet_router_workers_release(rt->workers, DUET_ROLE_DECODE, d);
    return st;
}

/* Pick a pair (avoiding the previous one where possible) and open the
 * stream.  The job is RUNNING and holds no worker.  DUET_ERR_PEER when no
 * healthy pair exists, or when need_new and the only pair is the previous
 * one. */
static duet_status_t duet__launch_ref(duet_router_job_t *job, bool need_new)
{
    duet_router_t *rt = job->rt;
    duet_rpc_stream_t *stream = NULL;
    duet__route_t r;
    duet_status_t st;

    /* a follower's first launch prefers its leader's pair; a retry does not */
    st = duet__job_route(job, job->prefill, job->decode, need_new, job->pins.on && !need_new, &r);
    if (st != DUET_OK)
        return st;
    int p = r.p, d = r.d;
    duet__count_route(rt, p < 0);
    pthread_mutex_lock(&job->lock);
    job->prefill = p;
    job->decode = d;
    job->prefill_held = p >= 0;
    job->decode_held = true;
    job->inst_p = p >= 0 ? duet_router_workers_instance(rt->workers, DUET_ROLE_PREFILL, p) : 0;
    job->inst_d = duet_router_workers_instance(rt->workers, DUET_ROLE_DECODE, d);
    job->stalled = false;
    job->att_started = false;
    job->t_last = duet_now_ns(); /* the stall watch counts from here until its first id */
    int my_attempt = ++job->attempts;
    pthread_mutex_unlock(&job->lock);
    DUET_LOG_DEBUG(
        "request %s -> prefill %s decode %s (attempt %d, router_cached_tokens %zu)",
        job->request_id,
        p >= 0 ? duet_router_workers_name(rt->workers, DUET_ROLE_PREFILL, p) : "(the decode's own)",
        duet_router_workers_name(rt->workers, DUET_ROLE_DECODE, d), job->attempts, r.cached);
    atomic_fetch_add(&job->refs, 1); /* the stream's */
    st = duet_rpc_client_stream(rt->cli,
                                duet_router_workers_address(rt->workers, DUET_ROLE_DECODE, d),
                                "/duet.v1.Decode/Generate", r.msg, r.len, job->deadline_ns,
                                duet__job_on_message, duet__job_on_done, job, &stream);
    duet_free(r.msg);
    if (st != DUET_OK) {
        atomic_fetch_sub(&job->refs, 1);
        pthread_mutex_lock(&job->lock);
        job->prefill_held = job->decode_held = false;
        job->attempts--;
        pthread_mutex_unlock(&job->lock);
        duet_router_workers_release(rt->workers, DUET_ROLE_PREFILL, p);
        duet_router_workers_release(rt->workers, DUET_ROLE_DECODE, d);
        return st;
    }
    pthread_mutex_lock(&job->lock);
    /* only while this attempt's stream is still the live one: when it ended
     * already, a retry may have launched and stored its own stream */
    if (job->done_attempts < my_attempt && job->attempts == my_attempt) {
        job->stream = stream;
        stream = NULL;
        if (job->cancelled || job->overflow)
            duet_rpc_stream_cancel(job->stream);
    }
    pthread_mutex_unlock(&job->lock);
    /* non-NULL only when this stream's on_done already ran: drop the handle */
    duet_rpc_stream_release(stream);
    return DUET_OK;
}

static duet_status_t duet__launch(duet_router_job_t *job, bool need_new)
{
    atomic_fetch_add(&job->refs, 1);
    duet_status_t st = duet__launch_ref(job, need_new);
    duet__job_unref(job);
    return st;
}

void duet__job_release_workers_locked(duet_router_job_t *job)
{
    duet_router_t *rt = job->rt;
    if (job->prefill_held)
        duet_router_workers_release(rt->workers, DUET_ROLE_PREFILL, job->prefill);
    if (job->decode_held)
        duet_router_workers_release(rt->workers, DUET_ROLE_DECODE, job->decode);
    job->prefill_held = job->decode_held = false;
}

static void duet__active_remove(duet_router_t *rt, duet_router_job_t *job)
{
    if (job->aprev)
        job->aprev->anext = job->anext;
    else if (rt->active == job)
        rt->active = job->anext;
    if (job->anext)
        job->anext->aprev = job->aprev;
    job->anext = job->aprev = NULL;
}

static void duet__job_end(duet_router_job_t *job, duet_router_job_end_t *end, bool was_running);
static bool duet__dequeue_locked(duet_router_t *rt, duet_router_job_t *job);

/* Admission's view of the prefills (docs/migration.md "Overload"): a new
 * job starts only while some prefill's queue is shorter than
 * router.prefill_wait_max_ms (then it could start before decode's
 * transfer.queue_timeout_ms), or nothing of ours runs (so a job always
 * progresses).  Read without adm_lock (it takes the workers' locks). */
static bool duet__prefill_room(duet_router_t *rt)
{
    int max = rt->cfg->router.prefill_wait_max_ms;
    return max <= 0 || duet_router_workers_prefill_wait_ms(rt->workers) <= max;
}

/* A queued job that has spent half of its deadline in the router's queue
 * is refused, not started: it would have at most the other half to run,
 * and under overload it would wait out its deadline here and end with a
 * timeout (DEADLINE_EXCEEDED) where the client should get a clean 429 and
 * retry later (docs/migration.md "Overload"). */
static bool duet__job_overdue(const duet_router_job_t *job, int64_t now)
{
    return now - job->t_create >= (job->deadline_ns - job->t_create) / 2;
}

static void duet__job_refuse_late(duet_router_job_t *job, int64_t now)
{
    char msg[160];
    snprintf(msg, sizeof(msg),
             "overloaded: the request waited %lld ms in the router's queue (half its deadline) "
             "while every prefill was busy",
             (long long)((now - job->t_create) / DUET_NS_PER_MS));
    duet_router_job_end_t end = {
        .ok = false, .code = GRPC_STATUS_RESOURCE_EXHAUSTED, .message = msg};
    duet__job_end(job, &end, false);
}

/* A running slot was freed, or the ticker came: start queued jobs while
 * slots are free and the prefills have room. */
static void duet__admit_next(duet_router_t *rt)
{
    for (;;) {
        duet_router_job_t *job;
        bool room = duet__prefill_room(rt);
        pthread_mutex_lock(&rt->adm_lock);
        job = rt->q_head;
        if (job == NULL || rt->running >= rt->cfg->router.max_concurrent ||
            (!room && rt->running > 0)) {
            pthread_mutex_unlock(&rt->adm_lock);
            return;
        }
        int64_t now = duet_now_ns();
        if (duet__job_overdue(job, now)) {
            duet__dequeue_locked(rt, job);
            pthread_mutex_unlock(&rt->adm_lock);
            duet__job_refuse_late(job, now);
            continue;
        }
        rt->q_head = job->qnext;
        if (rt->q_head == NULL)
            rt->q_tail = NULL;
        job->qnext = NULL;
        rt->queued--;
        rt->running++;
        job->state = DUET__JOB_RUNNING;
        pthread_mutex_unlock(&rt->adm_lock);
        job->t_admit = now;
        duet_router_hist_observe(&rt->metrics.queue_wait, job->t_admit - job->t_create);
        duet_status_t st = duet__launch(job, false);
        if (st != DUET_OK) {
            duet_router_job_end_t end = {.ok = false,
                                         .code = st == DUET_ERR_PEER ? GRPC_STATUS_UNAVAILABLE
                                                                     : GRPC_STATUS_INTERNAL,
                                         .message = duet_error_msg()};
            duet__job_end(job, &end, true);
        }
    }
}

/* The job is over: tell the sink, free its slot, admit the next one. */
static void duet__job_end(duet_router_job_t *job, duet_router_job_end_t *end, bool was_running)
{
    duet_router_t *rt = job->rt;

    pthread_mutex_lock(&job->lock);
    duet__job_release_workers_locked(job);
    end->started = job->started;
    pthread_mutex_unlock(&job->lock);

    duet__job_prompt_done(job);
    duet_router_hist_observe(&rt->metrics.duration, duet_now_ns() - job->t_create);
    if (end->ok && end->completion_tokens >= 2 && end->started) {
        pthread_mutex_lock(&job->lock);
        int64_t span = job->t_last - job->t_first;
        pthread_mutex_unlock(&job->lock);
        duet_router_hist_observe(&rt->metrics.tpot, span / (int64_t)(end->completion_tokens - 1));
    }
    if (end->ok) {
        atomic_fetch_add(&rt->metrics.prompt_tokens, end->prompt_tokens);
        atomic_fetch_add(&rt->metrics.generation_tokens, end->completion_tokens);
    } else if (end->code == GRPC_STATUS_CANCELLED) {
        atomic_fetch_add(&rt->metrics.disconnects, 1);
    } else if (end->started) {
        atomic_fetch_add(&rt->metrics.stream_errors, 1);
    }
    job->sink->on_end(job->sink_arg, end);
    duet__job_fork(job, false); /* no first token came: followers start unpinned */

    pthread_mutex_lock(&rt->adm_lock);
    job->state = DUET__JOB_ENDED;
    duet__active_remove(rt, job);
    if (was_running)
        rt->running--;
    pthread_cond_broadcast(&rt->adm_cond);
    pthread_mutex_unlock(&rt->adm_lock);
    duet__job_unref(job); /* the admission reference */
    if (was_running)
        duet__admit_next(rt);
}

duet_status_t duet__job_start(duet_router_job_t *job, bool follower)
{
    duet_router_t *rt = job->rt;
    duet_status_t st;

    if (!follower && atomic_load(&rt->draining))
        return duet_error(DUET_ERR_SHUTDOWN, "the router is shutting down");
    pthread_mutex_lock(&job->lock);
    bool cancelled = job->cancelled;
    pthread_mutex_unlock(&job->lock);
    if (cancelled)
        return duet_error(DUET_ERR_CANCELLED, "cancelled");
    if (!duet_router_workers_ready(rt->workers))
        return duet_error(DUET_ERR_PEER, "no healthy %s",
                          duet_router_workers_healthy(rt->workers, DUET_ROLE_DECODE) == 0
                              ? "decode worker"
                              : "prefill worker (and no healthy decode that prefills locally)");
    bool room = duet__prefill_room(rt);
    pthread_mutex_lock(&rt->adm_lock);
    if (rt->running < rt->cfg->router.max_concurrent && rt->q_head == NULL &&
        (room || rt->running == 0)) {
        rt->running++;
        job->state = DUET__JOB_RUNNING;
    } else if (rt->queued < rt->cfg->router.queue_limit) {
        rt->queued++;
        job->state = DUET__JOB_QUEUED;
        if (rt->q_tail)
            rt->q_tail->qnext = job;
        else
            rt->q_head = job;
        rt->q_tail = job;
    } else {
        pthread_mutex_unlock(&rt->adm_lock);
        return duet_error(DUET_ERR_EXHAUSTED, "too many requests: %d running and %d queued",
                          rt->cfg->router.max_concurrent, rt->cfg->router.queue_limit);
    }
    job->anext = rt->active;
    if (rt->active)
        rt->active->aprev = job;
    rt->active = job;
    atomic_fetch_add(&job->refs, 1); /* the admission reference */
    bool run = job->state == DUET__JOB_RUNNING;
    pthread_mutex_unlock(&rt->adm_lock);
    if (!run)
        return DUET_OK;
    job->t_admit = duet_now_ns();
    duet_router_hist_observe(&rt->metrics.queue_wait, 0);
    st = duet__launch(job, false);
    if (st != DUET_OK) {
        pthread_mutex_lock(&rt->adm_lock);
        job->state = DUET__JOB_NEW;
        duet__active_remove(rt, job);
        rt->running--;
        pthread_cond_broadcast(&rt->adm_cond);
        pthread_mutex_unlock(&rt->adm_lock);
        atomic_fetch_sub(&job->refs, 1); /* the creator still holds one */
        duet__admit_next(rt);
        duet__job_fork(job, false);
        return st;
    }
    return DUET_OK;
}

duet_status_t duet_router_job_start(duet_router_job_t *job)
{
    return duet__job_start(job, false);
}

/* Take job out of the queue (adm_lock held); false when it is not queued. */
static bool duet__dequeue_locked(duet_router_t *rt, duet_router_job_t *job)
{
    duet_router_job_t **pp = &rt->q_head, *prev = NULL;

    if (job->state != DUET__JOB_QUEUED)
        return false;
    while (*pp && *pp != job) {
        prev = *pp;
        pp = &(*pp)->qnext;
    }
    if (*pp != job)
        return false;
    *pp = job->qnext;
    if (rt->q_tail == job)
        rt->q_tail = prev;
    job->qnext = NULL;
    rt->queued--;
    job->state = DUET__JOB_RUNNING; /* ending; it holds no running slot */
    return true;
}

void duet_router_job_cancel(duet_router_job_t *job)
{
    duet_router_t *rt = job->rt;
    bool dequeued;

    pthread_mutex_lock(&job->lock);
    job->cancelled = true;
    if (job->stream)
        duet_rpc_stream_cancel(job->stream);
    duet__job_handoff_cancel_locked(job);
    pthread_mutex_unlock(&job->lock);

    pthread_mutex_lock(&rt->adm_lock);
    dequeued = duet__dequeue_locked(rt, job);
    bool waited = !dequeued && duet__job_unwait_locked(job);
    pthread_mutex_unlock(&rt->adm_lock);
    if (dequeued) {
        duet_router_job_end_t end = {
            .ok = false, .code = GRPC_STATUS_CANCELLED, .message = "cancelled while queued"};
        duet__job_end(job, &end, false);
    } else if (waited) {
        duet_router_job_end_t end = {.ok = false,
                                     .code = GRPC_STATUS_CANCELLED,
                                     .message = "cancelled while waiting for choice 0's prompt"};
        atomic_fetch_add(&rt->metrics.disconnects, 1);
        job->sink->on_end(job->sink_arg, &end);
        duet__job_unref(job); /* the leader's reference */
    }
}

void duet_router_jobs_expire(duet_router_t *rt)
{
    int64_t now = duet_now_ns();
    for (;;) {
        duet_router_job_t *job = NULL;
        pthread_mutex_lock(&rt->adm_lock);
        for (duet_router_job_t *j = rt->q_head; j; j = j->qnext) {
            if (duet__job_overdue(j, now)) {
                job = j;
                break;
            }
        }
        if (job)
            duet__dequeue_locked(rt, job);
        pthread_mutex_unlock(&rt->adm_lock);
        if (job == NULL)
            return;
        duet__job_refuse_late(job, now);
    }
}

void duet_router_jobs_admit(duet_router_t *rt)
{
    duet__admit_next(rt);
}

void duet_router_jobs_cancel_all(duet_router_t *rt)
{
    for (;;) {
        duet_router_job_t *job = NULL;
        pthread_mutex_lock(&rt->adm_lock);
        for (duet_router_job_t *j = rt->active; j; j = j->anext) {
            pthread_mutex_lock(&j->lock);
            bool done = j->cancelled;
            pthread_mutex_unlock(&j->lock);
            if (!done) {
                job = j;
                atomic_fetch_add(&job->refs, 1);
                break;
            }
        }
        pthread_mutex_unlock(&rt->adm_lock);
        if (job == NULL)
            return;
        duet_router_job_cancel(job);
        duet__job_unref(job);
    }
}

/* ---- the Decode.Generate stream ---- */

void duet__job_message(duet_router_job_t *job, duet_rpc_stream_t *s, const uint8_t *data,
                       size_t len, bool replay)
{
    duet_router_t *rt = job->rt;
    Duet__V1__GenerateResponse *resp = duet__v1__generate_response__unpack(NULL, len, data);

    pthread_mutex_lock(&job->lock);
    /* a superseded stream (a hand-off moved the job on): nothing counts */
    bool stale = s != NULL && s == job->old_stream;
    /* a hand-off runs: the primary's messages wait (job_handoff.c) */
    bool held = !stale && !replay && job->hold && resp != NULL &&
                resp->kind_case != DUET__V1__GENERATE_RESPONSE__KIND__NOT_SET;
    if (held) {
        duet__held_t *h = duet_malloc(sizeof(*h) + (len ? len : 1));
        if (h != NULL) {
            h->next = NULL;
            h->len = len;
            memcpy(h->data, data, len);
            *job->held_tail = h;
            job->held_tail = &h->next;
            if (resp->kind_case == DUET__V1__GENERATE_RESPONSE__KIND_FINISHED)
                job->held_fin = true;
        } else {
            job->overflow = true; /* as a sink that cannot keep up */
            duet_rpc_stream_cancel(s);
        }
    }
    pthread_mutex_unlock(&job->lock);
    if (stale || held) {
        if (resp)
            duet__v1__generate_response__free_unpacked(resp, NULL);
        return;
    }
    if (resp == NULL || resp->kind_case == DUET__V1__GENERATE_RESPONSE__KIND__NOT_SET) {
        DUET_LOG_WARN("request %s: malformed message from decode", job->request_id);
        pthread_mutex_lock(&job->lock);
        job->bad_message = true;
        pthread_mutex_unlock(&job->lock);
        if (s != NULL)
            duet_rpc_stream_cancel(s);
        if (resp)
            duet__v1__generate_response__free_unpacked(resp, NULL);
        return;
    }
    if (resp->kind_case == DUET__V1__GENERATE_RESPONSE__KIND_FINISHED) {
        pthread_mutex_lock(&job->lock);
        if (!job->have_fin && (job->fin_raw = duet_malloc(len ? len : 1)) != NULL) {
            memcpy(job->fin_raw, data, len);
            job->fin_len = len;
            job->fin_reason = resp->finished->reason;
            job->fin_prompt = resp->finished->prompt_tokens;
            job->fin_completion = resp->finished->completion_tokens;
            job->have_fin = true;
        }
        pthread_mutex_unlock(&job->lock);
        duet__v1__generate_response__free_unpacked(resp, NULL);
        return;
    }
    int64_t now = duet_now_ns();
    size_t n_ids = resp->chunk->n_ids ? resp->chunk->n_ids : 1;
    pthread_mutex_lock(&job->lock);
    bool first = !job->started;
    if (!job->att_started) {
        job->att_started = true;
        if (job->prefill_held) { /* prefill's part is done */
            duet_router_workers_release(rt->workers, DUET_ROLE_PREFILL, job->prefill);
            job->prefill_held = false;
        }
    }
    if (!job->started) {
        job->started = true;
        job->t_first = now;
        duet_router_hist_observe(&rt->metrics.ttft, now - job->t_create);
    } else {
        int64_t per = (now - job->t_last) / (int64_t)n_ids;
        for (size_t i = 0; i < n_ids; i++)
            duet_router_hist_observe(&rt->metrics.itl, per);
    }
    job->t_last = now;
    if (first)
        duet__job_prompt_done(job);
    duet_router_ca_tokens_append(&job->toks, resp->chunk->ids, resp->chunk->n_ids);
    bool cancelled = job->cancelled;
    /* what the sink gets, for a migration; without it the stream could
     * not continue: the job ends as if the client could not keep up */
    bool kept = duet__job_gen_append(job, resp->chunk->ids, resp->chunk->n_ids,
                                     resp->chunk->text ? strlen(resp->chunk->text) : 0) == DUET_OK;
    job->emitting++; /* a hand-off's switch waits for it (job_handoff.c) */
    pthread_mutex_unlock(&job->lock);
    bool keep = cancelled || (kept && job->sink->on_chunk(job->sink_arg, resp->chunk, data, len));
    duet__v1__generate_response__free_unpacked(resp, NULL);
    pthread_mutex_lock(&job->lock);
    if (--job->emitting == 0)
        pthread_cond_broadcast(&job->cond);
    if (!keep) {
        job->overflow = true;
        if (s != NULL)
            duet_rpc_stream_cancel(s);
        else if (job->stream != NULL)
            duet_rpc_stream_cancel(job->stream);
    }
    pthread_mutex_unlock(&job->lock);
    if (first) /* the prompt's KV is complete and cached on this decode */
        duet__job_fork(job, true);
}

static void duet__job_on_message(duet_rpc_stream_t *s, const uint8_t *data, size_t len, void *arg)
{
    duet__job_message(arg, s, data, len, false);
}

static bool duet__retryable(grpc_status_code code)
{
    switch (code) {
    case GRPC_STATUS_UNAVAILABLE:
    case GRPC_STATUS_RESOURCE_EXHAUSTED:
    case GRPC_STATUS_FAILED_PRECONDITION:
    case GRPC_STATUS_INTERNAL:
    case GRPC_STATUS_UNKNOWN:
    case GRPC_STATUS_ABORTED:
    case GRPC_STATUS_CANCELLED:
        return true;
    default:
        return false;
    }
}

/* A started stream failed (end): continue it on another decode
 * (docs/migration.md).  true: it goes on (or finished: every token came),
 * and the finished stream's reference is dropped; false: end goes to the
 * client. */
static bool duet__job_migrate(duet_router_job_t *job, duet_router_job_end_t *end, bool stalled,
                              bool no_fin)
{
    duet_router_t *rt = job->rt;
    const char *reason = duet__job_migrate_reason(end->code, end->message, stalled, no_fin);
    /* broken weights fail the same way on every decode (docs/security.md) */
    if (end->message != NULL && strstr(end->message, "non-finite") != NULL)
        reason = NULL;

    pthread_mutex_lock(&job->lock);
    int done = job->migrations;
    size_t n_gen = job->n_gen;
    pthread_mutex_unlock(&job->lock);
    if (reason == NULL || done >= rt->cfg->router.migrate_max || duet_now_ns() >= job->deadline_ns)
        return false;
    if (job->max_tokens > 0 && n_gen >= job->max_tokens) {
        /* every token came, the Finished did not: the stream is complete */
        if (duet__job_finish_made(job) != DUET_OK)
            return false;
        *end = (duet_router_job_end_t){.ok = true,
                                       .reason = job->fin_reason,
                                       .prompt_tokens = job->fin_prompt,
                                       .completion_tokens = job->fin_completion,
                                       .raw = job->fin_raw,
                                       .raw_len = job->fin_len};
        return false;
    }
    char from[160];
    snprintf(from, sizeof(from), "%s",
             duet_router_workers_name(rt->workers, DUET_ROLE_DECODE, job->decode));
    pthread_mutex_lock(&job->lock);
    duet__job_release_workers_locked(job); /* prefill/decode stay as the pair to avoid */
    job->migrations++;
    pthread_mutex_unlock(&job->lock);
    if (duet__launch(job, true) != DUET_OK) {
        DUET_LOG_WARN("request %s: not migrated (%s %s): %s", job->request_id,
                      duet_rpc_code_name(end->code), end->message, duet_error_msg());
        return false;
    }
    duet__job_migrate_count(rt, reason);
    pthread_mutex_lock(&job->lock);
    DUET_LOG_WARN("request %s: migrated from decode %s to %s after %zu tokens (reason %s: %s %s; "
                  "migration %d of %d)",
                  job->request_id, from,
                  duet_router_workers_name(rt->workers, DUET_ROLE_DECODE, job->decode), n_gen,
                  reason, duet_rpc_code_name(end->code), end->message, job->migrations,
                  rt->cfg->router.migrate_max);
    pthread_mutex_unlock(&job->lock);
    duet__job_unref(job); /* the finished stream's reference */
    return true;
}

void duet__job_done(duet_router_job_t *job, duet_rpc_stream_t *s, grpc_status_code code,
                    const char *msg)
{
    duet_router_t *rt = job->rt;
    duet_router_job_end_t end = {.ok = false, .code = code, .message = msg};
    char buf[320];

    pthread_mutex_lock(&job->lock);
    if (s != NULL && s == job->old_stream) { /* superseded by a hand-off */
        job->old_stream = NULL;
        pthread_mutex_unlock(&job->lock);
        duet_rpc_stream_release(s);
        duet__job_unref(job); /* the stream's reference */
        return;
    }
    pthread_mutex_unlock(&job->lock);
    if (duet__job_handoff_primary_end(job, s, code))
        return;
    pthread_mutex_lock(&job->lock);
    duet_rpc_stream_t *mine = job->stream; /* NULL: the launch releases it */
    job->stream = NULL;
    job->done_attempts++;
    bool cancelled = job->cancelled, overflow = job->overflow, started = job->started;
    bool have_fin = job->have_fin, bad = job->bad_message, stalled = job->stalled;
    int p = job->prefill, d = job->decode;
    pthread_mutex_unlock(&job->lock);
    duet_rpc_stream_release(mine);

    /* (a stalled stream whose Finished came before the cut is complete) */
    if (have_fin && (code == GRPC_STATUS_OK || (stalled && !cancelled && !overflow))) {
        end.ok = true;
        end.reason = job->fin_reason;
        end.prompt_tokens = job->fin_prompt;
        end.completion_tokens = job->fin_completion;
        end.raw = job->fin_raw;
        end.raw_len = job->fin_len;
    } else if (overflow) {
        end.code = GRPC_STATUS_RESOURCE_EXHAUSTED;
        end.message = "the client is not reading the stream";
    } else if (cancelled) {
        end.code = GRPC_STATUS_CANCELLED;
        end.message = "cancelled by the client";
    } else if (stalled) {
        snprintf(buf, sizeof(buf), "%s: no token for %d ms",
                 duet_router_workers_name(rt->workers, DUET_ROLE_DECODE, d),
                 rt->cfg->router.stall_timeout_ms);
        end.code = GRPC_STATUS_UNAVAILABLE;
        end.message = buf;
        duet_router_workers_suspect(rt->workers, DUET_ROLE_DECODE, d);
    } else if (bad || code == GRPC_STATUS_OK) {
        end.code = GRPC_STATUS_INTERNAL;
        end.message = bad ? "malformed message from the decode worker"
                          : "the decode stream ended without a finished message";
    } else {
        snprintf(buf, sizeof(buf), "%s: %s",
                 duet_router_workers_name(rt->workers, DUET_ROLE_DECODE, d),
                 msg && *msg ? msg : duet_rpc_code_name(code));
        end.message = buf;
        if (code == GRPC_STATUS_UNAVAILABLE) {
            duet_router_workers_suspect(rt->workers, DUET_ROLE_DECODE, d);
            duet_router_workers_suspect(rt->workers, DUET_ROLE_PREFILL, p);
        }
    }
    if (!end.ok && !cancelled && !overflow && started &&
        duet__job_migrate(job, &end, stalled, !bad && code == GRPC_STATUS_OK))
        return;
    if (!end.ok && !cancelled && !overflow && !started && duet__retryable(end.code) &&
        job->attempts < 2 && duet_now_ns() < job->deadline_ns) {
        DUET_LOG_WARN("request %s failed before its first token (%s %s); retrying", job->request_id,
                      duet_rpc_code_name(end.code), end.message);
        pthread_mutex_lock(&job->lock);
        duet__job_release_workers_locked(job); /* prefill/decode stay as the pair to avoid */
        pthread_mutex_unlock(&job->lock);
        if (duet__launch(job, true) == DUET_OK) {
            atomic_fetch_add(&rt->metrics.retries, 1);
            duet__job_unref(job); /* the finished stream's reference */
            return;
        }
        DUET_LOG_DEBUG("request %s not retried: %s", job->request_id, duet_error_msg());
    }
    /* the decode keeps the pages of what it generated (stopped, finished or
     * cancelled after output); the prefill never saw the output */
    if (started && (end.ok || cancelled || overflow))
        duet_router_workers_cache_record_output(rt->workers, DUET_ROLE_DECODE, d, &job->toks);
    duet__job_end(job, &end, true);
    duet__job_unref(job); /* the stream's reference */
}

static void duet__job_on_done(duet_rpc_stream_t *s, grpc_status_code code, const char *msg,
                              void *arg)
{
    duet__job_done(arg, s, code, msg);
}
