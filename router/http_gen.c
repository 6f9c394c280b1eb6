/* The completion endpoints: POST /v1/completions and /v1/chat/completions.
 *
 * A request is parsed and tokenized on its MHD thread, becomes a job, and
 * the connection is suspended.  The job's sink (client CQ threads) appends
 * to the request's buffer and resumes the connection:
 *   - stream: the first event makes the access handler queue either an
 *     error status (a failure before any token) or a 200 SSE response whose
 *     content reader drains the buffer, suspending when it is empty; after
 *     the first token a failure is an SSE error event, then the stream ends;
 *   - non-stream: the text accumulates and the end produces one JSON body.
 * Backpressure: decode's tokens are small; a client that reads nothing
 * while more than DUET__MAX_PENDING bytes pile up is cut off (the job is
 * cancelled).  Disconnects: MHD's completed callback cancels the job;
 * while suspended, the ticker watches the socket (http.c). */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "router/http_internal.h"

#define DUET__MAX_PENDING (16u << 20)

void duet_router_error_from_grpc(grpc_status_code code, const char *msg, bool started,
                                 duet_router_oai_error_t *err)
{
    (void)started;
    switch (code) {
    case GRPC_STATUS_INVALID_ARGUMENT:
        duet_router_oai_fail(err, 400, NULL, NULL, "%s", msg);
        break;
    case GRPC_STATUS_OUT_OF_RANGE:
        duet_router_oai_fail(err, 400, NULL, "context_length_exceeded", "%s", msg);
        break;
    case GRPC_STATUS_NOT_FOUND:
        duet_router_oai_fail(err, 404, NULL, "not_found", "%s", msg);
        break;
    case GRPC_STATUS_RESOURCE_EXHAUSTED:
        duet_router_oai_fail(err, 429, NULL, "overloaded", "%s", msg);
        break;
    case GRPC_STATUS_UNAVAILABLE:
        duet_router_oai_fail(err, 503, NULL, "worker_unavailable", "%s", msg);
        break;
    case GRPC_STATUS_DEADLINE_EXCEEDED:
        duet_router_oai_fail(err, 504, NULL, "timeout", "%s", msg);
        break;
    case GRPC_STATUS_CANCELLED:
        duet_router_oai_fail(err, 499, NULL, "cancelled", "%s", msg);
        break;
    case GRPC_STATUS_UNIMPLEMENTED:
        duet_router_oai_fail(err, 501, NULL, "unimplemented", "%s", msg);
        break;
    default:
        duet_router_oai_fail(err, 500, NULL, "internal_error", "%s: %s", duet_rpc_code_name(code),
                             msg);
        break;
    }
}

static void duet__meta(const duet__hreq_t *r, duet_router_oai_meta_t *m)
{
    m->api = r->api;
    m->id = r->id;
    m->created = r->created;
    m->model = r->http->rt->model_name;
}

/* ---- the sink (client CQ threads, or any thread for on_end) ---- */

static bool duet__sink_chunk(void *arg, const Duet__V1__TokenChunk *chunk, const uint8_t *raw,
                             size_t len)
{
    duet__hreq_t *r = arg;
    duet_router_oai_meta_t m;
    size_t tlen = strlen(chunk->text);
    bool keep = true;

    (void)raw;
    (void)len;
    duet__meta(r, &m);
    pthread_mutex_lock(&r->lock);
    if (r->conn_gone) {
        pthread_mutex_unlock(&r->lock);
        return true;
    }
    if (r->stream) {
        if (tlen > 0 || (r->api == DUET_ROUTER_API_CHAT && !r->sent_role)) {
            duet_router_oai_render_chunk(&r->out, &m, chunk->text, tlen, NULL,
                                         r->api == DUET_ROUTER_API_CHAT && !r->sent_role);
            r->sent_role = true;
        }
        keep = !r->out.oom && duet_router_buf_unread(&r->out) <= DUET__MAX_PENDING;
        r->ready = true;
        duet__http_hreq_resume_locked(r);
    } else {
        keep = duet_router_buf_append(&r->out, chunk->text, tlen);
    }
    pthread_mutex_unlock(&r->lock);
    return keep;
}

static void duet__sink_end(void *arg, const duet_router_job_end_t *end)
{
    duet__hreq_t *r = arg;
    duet_router_oai_meta_t m;

    duet__meta(r, &m);
    pthread_mutex_lock(&r->lock);
    r->ended = true;
    r->end_ok = end->ok;
    r->end_started = end->started;
    r->end_reason = end->reason;
    r->end_prompt = end->prompt_tokens;
    r->end_completion = end->completion_tokens;
    r->end_code = end->code;
    snprintf(r->end_msg, sizeof(r->end_msg), "%s", end->message ? end->message : "");
    if (r->stream && !r->conn_gone) {
        duet_router_oai_usage_t u = {end->prompt_tokens, end->completion_tokens};
        if (end->ok) {
            if (r->api == DUET_ROUTER_API_CHAT && !r->sent_role)
                duet_router_oai_render_chunk(&r->out, &m, "", 0, NULL, true);
            duet_router_oai_render_chunk(&r->out, &m, "", 0,
                                         duet_router_oai_finish_name(end->reason), false);
            if (r->include_usage)
                duet_router_oai_render_usage_chunk(&r->out, &m, &u);
            duet_router_sse_done(&r->out);
        } else if (end->started) {
            duet_router_oai_error_t err;
            duet_router_error_from_grpc(end->code, r->end_msg, true, &err);
            duet_router_sse_error(&r->out, &err);
        }
    }
    r->ready = true;
    duet__http_hreq_resume_locked(r);
    pthread_mutex_unlock(&r->lock);
    duet__http_hreq_unref(r); /* the sink's reference */
}

static const duet_router_sink_t duet__http_sink = {duet__sink_chunk, duet__sink_end};

/* ---- the SSE body (MHD thread) ---- */

static ssize_t duet__sse_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    duet__hreq_t *r = cls;
    ssize_t n;

    (void)pos;
    pthread_mutex_lock(&r->lock);
    if (duet_router_buf_unread(&r->out) > 0) {
        n = (ssize_t)duet_router_buf_take(&r->out, buf, max);
        r->last_write_ns = duet_now_ns();
    } else if (r->ended) {
        n = MHD_CONTENT_READER_END_OF_STREAM;
    } else if (atomic_load(&r->http->stopping)) {
        n = MHD_CONTENT_READER_END_WITH_ERROR;
    } else {
        duet__http_hreq_suspend_locked(r);
        n = 0;
    }
    pthread_mutex_unlock(&r->lock);
    return n;
}

static void duet__sse_free(void *cls)
{
    duet__http_hreq_unref(cls);
}

static enum MHD_Result duet__respond_sse(duet__hreq_t *r)
{
    struct MHD_Response *resp;
    enum MHD_Result ret;

    atomic_fetch_add(&r->refs, 1); /* the response's */
    resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, duet__sse_read, r,
                                             duet__sse_free);
    if (resp == NULL) {
        duet__http_hreq_unref(r);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    MHD_add_response_header(resp, "X-Request-Id", r->id);
    pthread_mutex_lock(&r->lock);
    r->sse = true;
    r->last_write_ns = duet_now_ns();
    pthread_mutex_unlock(&r->lock);
    ret = MHD_queue_response(r->conn, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    r->responded = true;
    duet_router_metrics_http(&r->http->rt->metrics, r->route, 200);
    return ret;
}

/* ---- submission (MHD thread) ---- */

static enum MHD_Result duet__submit(duet__hreq_t *r)
{
    duet_router_t *rt = r->http->rt;
    duet_router_oai_limits_t lim = {rt->max_tokens_limit, rt->vocab, 16};
    duet_router_oai_req_t req;
    duet_router_oai_error_t err;
    Duet__V1__GenerateRequest g = DUET__V1__GENERATE_REQUEST__INIT;
    Duet__V1__SamplingParams sp = DUET__V1__SAMPLING_PARAMS__INIT;
    Duet__V1__TokenIds tids = DUET__V1__TOKEN_IDS__INIT;
    duet_router_job_t *job = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    char *chat_text = NULL;
    size_t chat_len = 0;
    enum MHD_Result ret;
    duet_status_t st;

    r->api =
        r->route == DUET_ROUTER_ROUTE_CHAT ? DUET_ROUTER_API_CHAT : DUET_ROUTER_API_COMPLETIONS;
    r->created = (int64_t)time(NULL);
    if (duet_router_new_id(rt, r->api == DUET_ROUTER_API_CHAT ? "chatcmpl" : "cmpl", r->id,
                           sizeof(r->id)) != DUET_OK) {
        duet_router_oai_fail(&err, 500, NULL, "internal_error", "request id: %s", duet_error_msg());
        return duet__http_respond_error(r, &err);
    }
    if (duet_router_oai_parse(r->body.data ? r->body.data : "", r->body.len, r->api, &lim, &req,
                              &err) != DUET_OK)
        return duet__http_respond_error(r, &err);
    duet_router_buf_cleanup(&r->body);
    r->stream = req.stream;
    r->include_usage = req.include_usage;
    if (req.model != NULL && strcmp(req.model, rt->model_name) != 0) {
        duet_router_oai_fail(&err, 404, "model", "model_not_found",
                             "the model '%s' does not exist (this server serves '%s')", req.model,
                             rt->model_name);
        goto respond_err;
    }
    if (r->api == DUET_ROUTER_API_CHAT) {
        if (duet_router_chat_prompt(rt, &req, &chat_text, &chat_len, &err) != DUET_OK ||
            duet_router_prompt_ids(rt, chat_text, chat_len, false, NULL, 0, "messages", &ids,
                                   &n_ids, &err) != DUET_OK)
            goto respond_err;
    } else if (duet_router_prompt_ids(rt, req.has_text ? req.prompt_text : NULL,
                                      req.prompt_text_len, true, req.prompt_ids, req.n_prompt_ids,
                                      "prompt", &ids, &n_ids, &err) != DUET_OK) {
        goto respond_err;
    }
    tids.n_ids = n_ids;
    tids.ids = ids;
    sp.temperature = (float)req.temperature;
    sp.top_k = req.top_k;
    sp.top_p = req.top_p >= 1.0 ? 0.0f : (float)req.top_p;
    sp.seed = req.seed;
    sp.has_seed = req.has_seed;
    g.request_id = r->id;
    g.prompt_case = DUET__V1__GENERATE_REQUEST__PROMPT_TOKEN_IDS;
    g.token_ids = &tids;
    g.sampling = &sp;
    g.max_tokens = duet_router_max_tokens(rt, n_ids, req.max_tokens);
    g.n_stop = req.n_stop;
    g.stop = req.stop;
    g.n_stop_token_ids = req.n_stop_ids;
    g.stop_token_ids = req.stop_ids;
    g.ignore_eos = req.ignore_eos;
    if (duet_router_job_create(rt, &g, duet_deadline_in_ms(rt->request_timeout_ms),
                               &duet__http_sink, r, &job) != DUET_OK) {
        duet_router_oai_fail(&err, 500, NULL, "out_of_memory", "out of memory");
        goto respond_err;
    }
    pthread_mutex_lock(&r->lock);
    r->job = job;
    pthread_mutex_unlock(&r->lock);
    atomic_fetch_add(&r->refs, 1); /* the sink's, dropped by on_end */
    st = duet_router_job_start(job);
    if (st != DUET_OK) {
        atomic_fetch_sub(&r->refs, 1);
        if (st == DUET_ERR_EXHAUSTED)
            duet_router_oai_fail(&err, 429, NULL, "rate_limit_exceeded", "%s", duet_error_msg());
        else if (st == DUET_ERR_SHUTDOWN)
            duet_router_oai_fail(&err, 503, NULL, "shutting_down", "%s", duet_error_msg());
        else if (st == DUET_ERR_PEER)
            duet_router_oai_fail(&err, 503, NULL, "no_healthy_workers", "%s", duet_error_msg());
        else if (st == DUET_ERR_CANCELLED)
            duet_router_oai_fail(&err, 499, NULL, "cancelled", "%s", duet_error_msg());
        else
            duet_router_oai_fail(&err, 500, NULL, "internal_error", "%s", duet_error_msg());
        goto respond_err;
    }
    r->submitted = true;
    duet_free(ids);
    duet_free(chat_text);
    duet_router_oai_req_cleanup(&req);
    return MHD_YES;

respond_err:
    duet_free(ids);
    duet_free(chat_text);
    duet_router_oai_req_cleanup(&req);
    ret = duet__http_respond_error(r, &err);
    return ret;
}

/* The job's first event (or its end) arrived: answer. */
static enum MHD_Result duet__answer(duet__hreq_t *r)
{
    duet_router_oai_error_t err;
    duet_router_oai_meta_t m;
    duet_router_buf_t b;
    bool ended, ok, started;

    pthread_mutex_lock(&r->lock);
    ended = r->ended;
    ok = r->end_ok;
    started = r->end_started || duet_router_buf_unread(&r->out) > 0;
    pthread_mutex_unlock(&r->lock);
    if (r->stream && (!ended || ok || started))
        return duet__respond_sse(r);
    if (!ended) /* a non-stream request is answered at the end only */
        return MHD_YES;
    if (!ok) {
        duet_router_error_from_grpc(r->end_code, r->end_msg, false, &err);
        return duet__http_respond_error(r, &err);
    }
    duet__meta(r, &m);
    duet_router_oai_usage_t u = {r->end_prompt, r->end_completion};
    duet_router_buf_init(&b);
    pthread_mutex_lock(&r->lock);
    duet_router_oai_render_response(&b, &m, r->out.data ? r->out.data + r->out.off : "",
                                    duet_router_buf_unread(&r->out),
                                    duet_router_oai_finish_name(r->end_reason), &u);
    pthread_mutex_unlock(&r->lock);
    duet_router_buf_puts(&b, "\n");
    enum MHD_Result ret =
        b.oom ? MHD_NO : duet__http_respond(r, 200, "application/json", b.data, b.len);
    duet_router_buf_cleanup(&b);
    return ret;
}

enum MHD_Result duet__http_gen_handle(duet__hreq_t *r)
{
    if (!r->submitted) {
        enum MHD_Result ret = duet__submit(r);
        if (r->responded || ret != MHD_YES)
            return ret;
    }
    pthread_mutex_lock(&r->lock);
    bool ready = r->ready;
    if (!ready) {
        if (atomic_load(&r->http->stopping)) {
            pthread_mutex_unlock(&r->lock);
            duet_router_oai_error_t err;
            duet_router_oai_fail(&err, 503, NULL, "shutting_down", "the router is shutting down");
            return duet__http_respond_error(r, &err);
        }
        duet__http_hreq_suspend_locked(r);
        pthread_mutex_unlock(&r->lock);
        return MHD_YES;
    }
    r->ready = false;
    pthread_mutex_unlock(&r->lock);
    enum MHD_Result ret = duet__answer(r);
    if (!r->responded && ret == MHD_YES) { /* not ready to answer yet: wait again */
        pthread_mutex_lock(&r->lock);
        if (!r->ready && !atomic_load(&r->http->stopping))
            duet__http_hreq_suspend_locked(r);
        pthread_mutex_unlock(&r->lock);
    }
    return ret;
}
