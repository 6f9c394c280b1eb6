/* Make-before-break drains (docs/migration.md "Drains").  A started stream
 * whose decode drains (SIGTERM: its Info says draining and it left
 * rotation) is continued on a healthy decode -- prompt + ids so far, as a
 * migration -- while the draining decode goes on generating it; its
 * messages wait in the job meanwhile (held).  The candidate's first
 * message makes it the job's stream: the draining decode's stream is
 * cancelled and its held messages dropped (the candidate generates the
 * same ones: greedy and seeded outputs are deterministic, engine/
 * sampling.h).  When the candidate fails first (its decode drains too, as
 * in a whole-fleet stop; refused; no message within the stall timeout) it
 * is dropped, the held messages go to the client in order and the
 * draining decode finishes the stream, as a drain without hand-off does.
 * When the draining decode's stream ends first: finished (its Finished
 * held) or cancelled, the candidate is cancelled and the job ends as
 * usual; failed, the candidate carries the stream on.
 *
 * Locking: every field here is under job->lock; a candidate's callbacks
 * wait until the ticker stored its handle (stored). */
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "router/job/job_internal.h"

struct duet__handoff {
    duet_router_job_t *job;
    duet_rpc_stream_t *stream; /* the candidate's handle, once stored */
    int p, d;                  /* its pair (held until the switch or its end) */
    bool p_held;
    uint64_t inst_p, inst_d;
    size_t from; /* the ids the client had at the start */
    int64_t t0;
    bool stored;    /* stream is set (the callbacks wait for it) */
    bool switched;  /* it is the job's stream now */
    bool abandoned; /* the job ended first: it is cancelled */
    bool orphan;    /* the draining decode's stream failed: it carries on alone */
    bool timed_out;
    grpc_status_code orphan_code;
    char orphan_msg[200];
    char from_name[128];
};

/* No second hand-off of a job for this long after one failed. */
#define DUET__HANDOFF_RETRY_NS (1000 * DUET_NS_PER_MS)

void duet__job_held_clear(duet_router_job_t *job)
{
    while (job->held != NULL) {
        duet__held_t *h = job->held;
        job->held = h->next;
        duet_free(h);
    }
    job->held_tail = &job->held;
    job->held_fin = false;
}

/* Replay the held messages to the client in order, then let the primary's
 * messages through again (job->flushing set by the caller). */
static void duet__handoff_flush(duet_router_job_t *job)
{
    for (;;) {
        pthread_mutex_lock(&job->lock);
        duet__held_t *h = job->held;
        if (h == NULL) {
            job->held_tail = &job->held;
            job->held_fin = false;
            job->hold = job->flushing = false;
            pthread_cond_broadcast(&job->cond);
            pthread_mutex_unlock(&job->lock);
            return;
        }
        job->held = h->next;
        if (job->held == NULL)
            job->held_tail = &job->held;
        bool drop = job->cancelled || job->overflow;
        pthread_mutex_unlock(&job->lock);
        if (!drop)
            duet__job_message(job, NULL, h->data, h->len, true);
        duet_free(h);
    }
}

void duet__job_handoff_cancel_locked(duet_router_job_t *job)
{
    if (job->ho != NULL && job->ho->stored && job->ho->stream != NULL)
        duet_rpc_stream_cancel(job->ho->stream);
}

bool duet__job_handoff_primary_end(duet_router_job_t *job, duet_rpc_stream_t *s,
                                   grpc_status_code code)
{
    (void)s;
    pthread_mutex_lock(&job->lock);
    while (job->flushing) /* a failed candidate's replay: before this end */
        pthread_cond_wait(&job->cond, &job->lock);
    duet__handoff_t *h = job->ho;
    if (h == NULL) {
        pthread_mutex_unlock(&job->lock);
        return false;
    }
    if (job->cancelled || job->overflow || (code == GRPC_STATUS_OK && job->held_fin)) {
        /* the end is the job's: the candidate goes */
        job->ho = NULL;
        h->abandoned = true;
        if (h->stored && h->stream != NULL)
            duet_rpc_stream_cancel(h->stream);
        job->flushing = true;
        pthread_mutex_unlock(&job->lock);
        duet__handoff_flush(job);
        return false;
    }
    /* the draining decode's stream failed: the candidate carries on from
     * where the client is (the held messages are regenerated) */
    h->orphan = true;
    h->orphan_code = code;
    snprintf(h->orphan_msg, sizeof(h->orphan_msg), "%s: %s", h->from_name,
             code == GRPC_STATUS_OK ? "the stream ended without a finished message"
                                    : duet_rpc_code_name(code));
    duet__job_held_clear(job);
    duet_rpc_stream_t *mine = job->stream;
    job->stream = NULL;
    job->done_attempts++;
    duet__job_release_workers_locked(job);
    pthread_mutex_unlock(&job->lock);
    DUET_LOG_WARN("request %s: its stream on draining decode %s ended (%s) during its hand-off",
                  job->request_id, h->from_name, duet_rpc_code_name(code));
    duet_rpc_stream_release(mine);
    duet__job_unref(job); /* the stream's reference */
    return true;
}

/* The hand-off could not start (or its candidate failed before a message):
 * the draining decode keeps the stream, or, when its stream failed
 * meanwhile, the job takes that failure's path (migration or the end). */
static void duet__handoff_drop(duet_router_job_t *job, duet__handoff_t *h)
{
    pthread_mutex_lock(&job->lock);
    if (h->abandoned) { /* the job ended: nothing held */
        pthread_mutex_unlock(&job->lock);
        duet_free(h);
        return;
    }
    job->ho = NULL;
    job->ho_next_ns = duet_now_ns() + DUET__HANDOFF_RETRY_NS;
    if (h->orphan) {
        job->hold = false;
        job->attempts++; /* (a stream that ended: duet__job_done counts it) */
        pthread_mutex_unlock(&job->lock);
        atomic_fetch_add(&job->refs, 1); /* the stream's, dropped by duet__job_done */
        duet__job_done(job, NULL, h->orphan_code, h->orphan_msg);
        duet_free(h);
        return;
    }
    job->flushing = true;
    pthread_mutex_unlock(&job->lock);
    duet__handoff_flush(job);
    duet_free(h);
}

static void duet__handoff_on_message(duet_rpc_stream_t *s, const uint8_t *data, size_t len,
                                     void *arg)
{
    duet__handoff_t *h = arg;
    duet_router_job_t *job = h->job;
    duet_router_t *rt = job->rt;

    pthread_mutex_lock(&job->lock);
    while (!h->stored)
        pthread_cond_wait(&job->cond, &job->lock);
    if (h->switched) {
        pthread_mutex_unlock(&job->lock);
        duet__job_message(job, s, data, len, false);
        return;
    }
    if (h->abandoned || job->cancelled || job->overflow) {
        duet_rpc_stream_cancel(s);
        pthread_mutex_unlock(&job->lock);
        return;
    }
    /* the switch: the candidate runs the stream; the draining decode's
     * copy is cancelled, what it sent meanwhile dropped */
    h->switched = true;
    job->ho = NULL;
    duet__job_held_clear(job);
    job->hold = false;
    duet_rpc_stream_t *old = job->stream;
    if (old != NULL) {
        job->old_stream = old; /* its messages and end are ignored */
        duet_rpc_stream_cancel(old);
        job->done_attempts++;
    }
    duet__job_release_workers_locked(job);
    job->prefill = h->p;
    job->decode = h->d;
    job->prefill_held = h->p_held;
    job->decode_held = true;
    job->inst_p = h->inst_p;
    job->inst_d = h->inst_d;
    job->stream = h->stream;
    h->stream = NULL;
    job->stalled = false;
    job->att_started = false;
    job->t_last = duet_now_ns();
    job->attempts++;
    job->migrations++;
    int done = job->migrations;
    /* a chunk of the old stream on its way to the client goes first */
    while (job->emitting > 0)
        pthread_cond_wait(&job->cond, &job->lock);
    pthread_mutex_unlock(&job->lock);
    duet__job_migrate_count(rt, "drain");
    DUET_LOG_INFO("request %s: moved from draining decode %s to %s after %zu tokens in %.0f ms "
                  "(make-before-break; migration %d of %d)",
                  job->request_id, h->from_name,
                  duet_router_workers_name(rt->workers, DUET_ROLE_DECODE, h->d), h->from,
                  (double)(duet_now_ns() - h->t0) / DUET_NS_PER_MS, done,
                  rt->cfg->router.migrate_max);
    duet__job_message(job, s, data, len, false);
}

static void duet__handoff_on_done(duet_rpc_stream_t *s, grpc_status_code code, const char *msg,
                                  void *arg)
{
    duet__handoff_t *h = arg;
    duet_router_job_t *job = h->job;
    duet_router_t *rt = job->rt;

    pthread_mutex_lock(&job->lock);
    while (!h->stored)
        pthread_cond_wait(&job->cond, &job->lock);
    if (h->switched) { /* the job's stream's end */
        pthread_mutex_unlock(&job->lock);
        duet_free(h);
        duet__job_done(job, s, code, msg);
        return;
    }
    duet_rpc_stream_t *handle = h->stream;
    h->stream = NULL;
    bool quiet = h->abandoned || h->orphan, abandoned = h->abandoned;
    pthread_mutex_unlock(&job->lock);
    if (!quiet)
        DUET_LOG_WARN("request %s: not moved off draining decode %s: %s ended before a first "
                      "message (%s %s); the draining decode goes on generating it",
                      job->request_id, h->from_name,
                      duet_router_workers_name(rt->workers, DUET_ROLE_DECODE, h->d),
                      duet_rpc_code_name(code), msg ? msg : "");
    if (code == GRPC_STATUS_UNAVAILABLE && !abandoned)
        duet_router_workers_suspect(rt->workers, DUET_ROLE_DECODE, h->d);
    if (h->p_held)
        duet_router_workers_release(rt->workers, DUET_ROLE_PREFILL, h->p);
    duet_router_workers_release(rt->workers, DUET_ROLE_DECODE, h->d);
    duet_rpc_stream_release(handle);
    duet__handoff_drop(job, h);
    duet__job_unref(job); /* the candidate stream's reference */
}

/* Start a hand-off of job (a reference held) off its draining decode. */
static void duet__handoff_begin(duet_router_job_t *job)
{
    duet_router_t *rt = job->rt;
    duet_rpc_stream_t *stream = NULL;
    duet__route_t r;
    duet__handoff_t *h = DUET_NEW(duet__handoff_t);

    if (h == NULL)
        return;
    h->job = job;
    h->p = h->d = -1;
    pthread_mutex_lock(&job->lock);
    if (job->ho != NULL || job->hold || job->stream == NULL || job->cancelled || job->overflow ||
        job->stalled || job->have_fin || job->old_stream != NULL) {
        pthread_mutex_unlock(&job->lock);
        duet_free(h);
        return;
    }
    int old_d = job->decode;
    h->from = job->n_gen;
    h->t0 = duet_now_ns();
    snprintf(h->from_name, sizeof(h->from_name), "%s",
             duet_router_workers_name(rt->workers, DUET_ROLE_DECODE, old_d));
    job->ho = h;
    job->hold = true; /* the ids so far are fixed from here */
    pthread_mutex_unlock(&job->lock);

    duet_status_t st = duet__job_route(job, -1, old_d, false, false, &r);
    if (st == DUET_OK && r.d == old_d) {
        duet_free(r.msg);
        duet_router_workers_release(rt->workers, DUET_ROLE_PREFILL, r.p);
        duet_router_workers_release(rt->workers, DUET_ROLE_DECODE, r.d);
        st = duet_error(DUET_ERR_PEER, "no other healthy decode");
    }
    if (st != DUET_OK) {
        DUET_LOG_DEBUG("request %s: no hand-off off draining decode %s: %s", job->request_id,
                       h->from_name, duet_error_msg());
        duet__handoff_drop(job, h);
        return;
    }
    h->p = r.p;
    h->d = r.d;
    h->p_held = r.p >= 0;
    h->inst_p = r.p >= 0 ? duet_router_workers_instance(rt->workers, DUET_ROLE_PREFILL, r.p) : 0;
    h->inst_d = duet_router_workers_instance(rt->workers, DUET_ROLE_DECODE, r.d);
    atomic_fetch_add(&job->refs, 1); /* the candidate stream's */
    st = duet_rpc_client_stream(rt->cli,
                                duet_router_workers_address(rt->workers, DUET_ROLE_DECODE, r.d),
                                "/duet.v1.Decode/Generate", r.msg, r.len, job->deadline_ns,
                                duet__handoff_on_message, duet__handoff_on_done, h, &stream);
    duet_free(r.msg);
    if (st != DUET_OK) {
        atomic_fetch_sub(&job->refs, 1);
        duet_router_workers_release(rt->workers, DUET_ROLE_PREFILL, r.p);
        duet_router_workers_release(rt->workers, DUET_ROLE_DECODE, r.d);
        duet__handoff_drop(job, h);
        return;
    }
    DUET_LOG_DEBUG("request %s: draining decode %s: continuing it on %s after %zu tokens",
                   job->request_id, h->from_name,
                   duet_router_workers_name(rt->workers, DUET_ROLE_DECODE, r.d), h->from);
    pthread_mutex_lock(&job->lock);
    h->stream = stream;
    h->stored = true;
    if (h->abandoned || job->cancelled || job->overflow)
        duet_rpc_stream_cancel(stream);
    pthread_cond_broadcast(&job->cond);
    pthread_mutex_unlock(&job->lock);
}

static bool duet__decode_draining(duet_router_t *rt, int d)
{
    duet_router_worker_info_t info;
    return d >= 0 && duet_router_workers_snapshot(rt->workers, DUET_ROLE_DECODE, d, &info) &&
           info.draining && !info.healthy;
}

void duet_router_jobs_handoff(duet_router_t *rt)
{
    const duet_router_config_t *rc = &rt->cfg->router;
    if (!rc->migrate_on_drain || rc->migrate_max <= 0)
        return;
    /* a candidate with no message for this long goes (the stall rule) */
    int64_t limit =
        (int64_t)(rc->stall_timeout_ms > 0 ? rc->stall_timeout_ms : 30000) * DUET_NS_PER_MS;
    bool room = duet_router_workers_healthy(rt->workers, DUET_ROLE_DECODE) > 0;
    for (;;) {
        int64_t now = duet_now_ns();
        duet_router_job_t *job = NULL;
        pthread_mutex_lock(&rt->adm_lock);
        for (duet_router_job_t *j = rt->active; j != NULL && job == NULL; j = j->anext) {
            pthread_mutex_lock(&j->lock);
            duet__handoff_t *h = j->ho;
            if (h != NULL && h->stored && !h->timed_out && now - h->t0 > limit) {
                h->timed_out = true;
                DUET_LOG_WARN("request %s: no message from decode %s %lld ms after its hand-off "
                              "began: it stays on draining decode %s",
                              j->request_id,
                              duet_router_workers_name(rt->workers, DUET_ROLE_DECODE, h->d),
                              (long long)((now - h->t0) / DUET_NS_PER_MS), h->from_name);
                duet_rpc_stream_cancel(h->stream); /* its on_done replays the held */
            } else if (room && h == NULL && !j->hold && j->stream != NULL && j->started &&
                       j->att_started && !j->cancelled && !j->overflow && !j->stalled &&
                       !j->have_fin && j->old_stream == NULL && j->migrations < rc->migrate_max &&
                       now < j->deadline_ns && now >= j->ho_next_ns &&
                       (j->max_tokens == 0 || j->n_gen < j->max_tokens) &&
                       duet__decode_draining(rt, j->decode)) {
                j->ho_next_ns = now + DUET__HANDOFF_RETRY_NS; /* (once per scan) */
                job = duet_router_job_ref(j);
            }
            pthread_mutex_unlock(&j->lock);
        }
        pthread_mutex_unlock(&rt->adm_lock);
        if (job == NULL)
            return;
        duet__handoff_begin(job);
        duet__job_unref(job);
    }
}
