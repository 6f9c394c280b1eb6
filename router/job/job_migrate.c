/* Migration of running streams (docs/migration.md): what a job keeps of
 * its stream (the ids and the text the sink got) and the request that
 * continues it on another decode.  The continuation is the prompt followed
 * by the ids so far, with what is left of max_tokens; decode resumes at
 * output index first_output_index, so the counter-based sampler
 * (engine/sampling.h) draws exactly what the first decode would have, and
 * primes its detokenizer and stop strings with those ids
 * (DecodeGenerateRequest.first_output_index, resumed_text_bytes).  The
 * decision (when, how often) is job.c's duet__job_on_done; the stall
 * watch is duet_router_jobs_watch below. */
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "router/job/job_internal.h"

const char *duet__job_migrate_reason(grpc_status_code code, const char *msg, bool stalled,
                                     bool no_fin)
{
    if (stalled)
        return "stall";
    /* its decode drains (SIGTERM) and handed the stream back (decode/sched.c) */
    if (code == GRPC_STATUS_UNAVAILABLE && msg != NULL && strstr(msg, "decode draining") != NULL)
        return "drain";
    if (no_fin)
        return "error";
    switch (code) {
    case GRPC_STATUS_UNAVAILABLE:
    case GRPC_STATUS_CANCELLED: /* not the client's: the caller checked */
    case GRPC_STATUS_UNKNOWN:
    case GRPC_STATUS_ABORTED:
        return "unavailable";
    case GRPC_STATUS_INTERNAL:
    case GRPC_STATUS_RESOURCE_EXHAUSTED:
    case GRPC_STATUS_FAILED_PRECONDITION:
        return "error";
    default:
        return NULL;
    }
}

void duet__job_migrate_count(duet_router_t *rt, const char *reason)
{
    int i = strcmp(reason, "unavailable") == 0 ? DUET_ROUTER_MIGRATE_UNAVAILABLE
            : strcmp(reason, "stall") == 0     ? DUET_ROUTER_MIGRATE_STALL
            : strcmp(reason, "drain") == 0     ? DUET_ROUTER_MIGRATE_DRAIN
                                               : DUET_ROUTER_MIGRATE_ERROR;
    atomic_fetch_add_explicit(&rt->metrics.migrations[i], 1, memory_order_relaxed);
}

duet_status_t duet__job_gen_append(duet_router_job_t *job, const int32_t *ids, size_t n,
                                   size_t text_bytes)
{
    if (job->n_gen + n > job->gen_cap) {
        size_t cap = (job->n_gen + n) * 2 + 16;
        int32_t *g = duet_realloc(job->gen, cap * sizeof(int32_t));
        if (g == NULL)
            return duet_error(DUET_ERR_NO_MEMORY, "router: no memory for a stream's ids");
        job->gen = g;
        job->gen_cap = cap;
    }
    if (n > 0)
        memcpy(job->gen + job->n_gen, ids, n * sizeof(int32_t));
    job->n_gen += n;
    job->text_bytes += text_bytes;
    return DUET_OK;
}

duet_status_t duet__job_resume_request(duet_router_job_t *job, uint8_t **out_p, size_t *len_p,
                                       uint32_t *first_p, uint32_t *text_p)
{
    Duet__V1__GenerateRequest *g = NULL;
    Duet__V1__TokenIds tids = DUET__V1__TOKEN_IDS__INIT, *orig = NULL;
    int32_t *ids = NULL;
    uint8_t *out = NULL;
    duet_status_t st = DUET_OK;

    *out_p = NULL;
    pthread_mutex_lock(&job->lock);
    size_t n_gen = job->n_gen, text = job->text_bytes;
    if (n_gen > 0 && (ids = duet_malloc((job->n_prompt + n_gen) * sizeof(int32_t))) != NULL)
        memcpy(ids + job->n_prompt, job->gen, n_gen * sizeof(int32_t));
    pthread_mutex_unlock(&job->lock);
    if (n_gen == 0)
        return DUET_OK;
    if (ids == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "router: no memory to migrate a stream");
    g = duet__v1__generate_request__unpack(NULL, job->req_len, job->req);
    if (g == NULL || g->prompt_case != DUET__V1__GENERATE_REQUEST__PROMPT_TOKEN_IDS ||
        g->token_ids == NULL || g->token_ids->n_ids != job->n_prompt) {
        st = duet_error(DUET_ERR_INTERNAL, "router: the request to migrate has no token ids");
        goto out;
    }
    memcpy(ids, g->token_ids->ids, job->n_prompt * sizeof(int32_t));
    tids.ids = ids;
    tids.n_ids = job->n_prompt + n_gen;
    orig = g->token_ids; /* put back before free_unpacked */
    g->token_ids = &tids;
    uint32_t max = job->max_tokens;
    g->max_tokens = max > n_gen ? (uint32_t)(max - n_gen) : 1;
    g->prompt_logprobs = false; /* the first attempt's first chunk had them */
    size_t len = duet__v1__generate_request__get_packed_size(g);
    if ((out = duet_malloc(len ? len : 1)) == NULL) {
        st = duet_error(DUET_ERR_NO_MEMORY, "router: no memory to migrate a stream");
        goto out;
    }
    duet__v1__generate_request__pack(g, out);
    *out_p = out;
    *len_p = len;
    *first_p = n_gen > UINT32_MAX ? UINT32_MAX : (uint32_t)n_gen;
    *text_p = text > UINT32_MAX ? UINT32_MAX : (uint32_t)text;
out:
    if (g != NULL) {
        if (orig != NULL)
            g->token_ids = orig;
        duet__v1__generate_request__free_unpacked(g, NULL);
    }
    duet_free(ids);
    return st;
}

static size_t duet__varint(uint8_t *p, uint64_t v)
{
    size_t n = 0;
    do {
        p[n++] = (uint8_t)((v & 0x7F) | (v > 0x7F ? 0x80 : 0));
        v >>= 7;
    } while (v);
    return n;
}

/* A migrated stream's resume point (DecodeGenerateRequest fields 6, 7). */
typedef struct {
    const uint8_t *req; /* the packed GenerateRequest */
    size_t req_len;
    uint32_t first, text;
} duet__resume_t;

/* DecodeGenerateRequest{request = 1: the packed GenerateRequest,
 * prefill_target = 2, prefill_local = 4 when set, router_cached_tokens = 5
 * when not 0, first_output_index = 6 and resumed_text_bytes = 7 when
 * not 0}: written directly around the already packed request. */
static uint8_t *duet__decode_request_pack(const duet__resume_t *rq, const char *target, bool local,
                                          size_t cached, size_t *len_p)
{
    size_t tlen = strlen(target);
    uint8_t *out = duet_malloc(rq->req_len + tlen + 60), *p = out;
    if (out == NULL)
        return NULL;
    *p++ = (1 << 3) | 2;
    p += duet__varint(p, rq->req_len);
    memcpy(p, rq->req, rq->req_len);
    p += rq->req_len;
    *p++ = (2 << 3) | 2;
    p += duet__varint(p, tlen);
    memcpy(p, target, tlen);
    p += tlen;
    if (local) {
        *p++ = (4 << 3) | 0;
        *p++ = 1;
    }
    if (cached > 0) {
        *p++ = (5 << 3) | 0;
        p += duet__varint(p, cached > UINT32_MAX ? UINT32_MAX : cached);
    }
    if (rq->first > 0) {
        *p++ = (6 << 3) | 0;
        p += duet__varint(p, rq->first);
    }
    if (rq->text > 0) {
        *p++ = (7 << 3) | 0;
        p += duet__varint(p, rq->text);
    }
    *len_p = (size_t)(p - out);
    return out;
}

duet_status_t duet__job_decode_request(duet_router_job_t *job, const char *target, bool local,
                                       size_t cached, uint8_t **msg_p, size_t *len_p)
{
    duet__resume_t rq = {.req = job->req, .req_len = job->req_len};
    uint8_t *resumed = NULL;
    duet_status_t st = duet__job_resume_request(job, &resumed, &rq.req_len, &rq.first, &rq.text);
    if (st != DUET_OK)
        return st;
    if (resumed != NULL)
        rq.req = resumed;
    /* (DecodeGenerateRequest.migratable stays unset: a draining decode
     * finishes every stream, the router moves them make-before-break:
     * docs/migration.md "Drains", job_handoff.c) */
    *msg_p = duet__decode_request_pack(&rq, target, local, cached, len_p);
    duet_free(resumed);
    if (*msg_p == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "router: no memory for a request");
    return DUET_OK;
}

duet_status_t duet__job_finish_made(duet_router_job_t *job)
{
    Duet__V1__GenerateResponse resp = DUET__V1__GENERATE_RESPONSE__INIT;
    Duet__V1__Finished fin = DUET__V1__FINISHED__INIT;

    pthread_mutex_lock(&job->lock);
    fin.reason = DUET__V1__FINISH_REASON__FINISH_REASON_LENGTH;
    fin.prompt_tokens = job->n_prompt;
    fin.completion_tokens = (uint32_t)job->n_gen;
    fin.request_id = job->request_id;
    resp.kind_case = DUET__V1__GENERATE_RESPONSE__KIND_FINISHED;
    resp.finished = &fin;
    size_t len = duet__v1__generate_response__get_packed_size(&resp);
    uint8_t *raw = job->have_fin ? NULL : duet_malloc(len ? len : 1);
    if (raw != NULL) {
        duet__v1__generate_response__pack(&resp, raw);
        job->fin_raw = raw;
        job->fin_len = len;
        job->fin_reason = (int)fin.reason;
        job->fin_prompt = fin.prompt_tokens;
        job->fin_completion = fin.completion_tokens;
        job->have_fin = true;
    }
    bool ok = job->have_fin;
    pthread_mutex_unlock(&job->lock);
    return ok ? DUET_OK : duet_error(DUET_ERR_NO_MEMORY, "router: no memory for a finish");
}

/* ---- the stall watch (ticker) ---- */

static bool duet__decode_healthy(duet_router_t *rt, int d)
{
    duet_router_worker_info_t info;
    return d >= 0 && duet_router_workers_snapshot(rt->workers, DUET_ROLE_DECODE, d, &info) &&
           info.healthy;
}

void duet_router_jobs_watch(duet_router_t *rt)
{
    int64_t stall = (int64_t)rt->cfg->router.stall_timeout_ms * DUET_NS_PER_MS;
    if (stall <= 0 || rt->cfg->router.migrate_max <= 0)
        return;
    for (;;) {
        int64_t now = duet_now_ns();
        duet_router_job_t *job = NULL;
        int attempt = 0;
        /* a stream moves only where another decode is healthy: with none,
         * cutting it would turn a slow (overloaded) or stopped decode into
         * a failed request, and its decode may yet answer (the request's
         * deadline still bounds it) */
        size_t healthy = duet_router_workers_healthy(rt->workers, DUET_ROLE_DECODE);
        pthread_mutex_lock(&rt->adm_lock);
        for (duet_router_job_t *j = rt->active; j != NULL && job == NULL; j = j->anext) {
            pthread_mutex_lock(&j->lock);
            /* a stream whose decode sent nothing for stall (counted from
             * its last token, or from its launch): a started one migrates;
             * one still waiting for its first token (a prompt may queue
             * long on a busy prefill) only when its decode is out of
             * rotation too (a failed health check: stopped, hung,
             * draining), and then takes the one retry before a first
             * token */
            if (j->stream != NULL && !j->stalled && !j->cancelled && !j->hold &&
                now - j->t_last > stall) {
                bool own = duet__decode_healthy(rt, j->decode);
                if ((j->started || !own) && healthy > (own ? 1u : 0u)) {
                    j->stalled = true;
                    attempt = j->attempts;
                    job = duet_router_job_ref(j);
                }
            }
            pthread_mutex_unlock(&j->lock);
        }
        pthread_mutex_unlock(&rt->adm_lock);
        if (job == NULL)
            return;
        pthread_mutex_lock(&job->lock);
        DUET_LOG_WARN("request %s: no %stoken from decode %s for %lld ms: moving it",
                      job->request_id, job->started ? "" : "first ",
                      duet_router_workers_name(rt->workers, DUET_ROLE_DECODE, job->decode),
                      (long long)((now - job->t_last) / DUET_NS_PER_MS));
        /* (only the stalled attempt's stream: when it ended meanwhile, a
         * migration may have opened the next one) */
        if (job->stream != NULL && job->stalled && job->attempts == attempt)
            duet_rpc_stream_cancel(job->stream); /* on_done (migration) follows */
        pthread_mutex_unlock(&job->lock);
        duet__job_unref(job);
    }
}
