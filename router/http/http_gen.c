/* The completion endpoints: POST /v1/completions and /v1/chat/completions.
 *
 * A request is parsed and tokenized on its MHD thread, becomes one job per
 * choice (n per prompt; http_choice.c has their sink), and the connection
 * is suspended.  The sinks (client CQ threads) append to the request's
 * buffer and resume the connection:
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
#include "router/http/http_internal.h"

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

void duet__http_meta(const duet__hreq_t *r, duet_router_oai_meta_t *m)
{
    m->api = r->api;
    m->id = r->id;
    m->created = r->created;
    m->model = r->http->rt->model_name;
}

void duet__http_gen_cancel(duet__hreq_t *r)
{
    duet_router_job_t *jobs[DUET_ROUTER_OAI_CHOICES_MAX];
    bool ended[DUET_ROUTER_OAI_CHOICES_MAX];
    int n = 0;

    pthread_mutex_lock(&r->lock);
    for (int i = 0; i < r->n_choices; i++) {
        duet__choice_t *c = &r->choices[i];
        if (c->job != NULL) {
            ended[n] = c->ended;
            jobs[n++] = c->job;
            c->job = NULL;
        }
    }
    r->jobs_live = false;
    pthread_mutex_unlock(&r->lock);
    for (int i = 0; i < n; i++) {
        if (!ended[i])
            duet_router_job_cancel(jobs[i]);
        duet_router_job_release(jobs[i]);
    }
}

void duet__http_gen_free(duet__hreq_t *r)
{
    for (int i = 0; i < r->n_choices; i++) {
        duet_router_buf_cleanup(&r->choices[i].text);
        duet_free(r->choices[i].lps);
    }
    duet_free(r->choices);
    for (size_t i = 0; i < r->n_prompts; i++)
        duet_free(r->prompts[i].echo);
    duet_free(r->prompts);
    r->choices = NULL;
    r->prompts = NULL;
    r->n_choices = 0;
    r->n_prompts = 0;
}

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
    if (r->close_after)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
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

static void duet__start_error(duet_status_t st, duet_router_oai_error_t *err)
{
    if (st == DUET_ERR_EXHAUSTED)
        duet_router_oai_fail(err, 429, NULL, "rate_limit_exceeded", "%s", duet_error_msg());
    else if (st == DUET_ERR_SHUTDOWN)
        duet_router_oai_fail(err, 503, NULL, "shutting_down", "%s", duet_error_msg());
    else if (st == DUET_ERR_PEER)
        duet_router_oai_fail(err, 503, NULL, "no_healthy_workers", "%s", duet_error_msg());
    else if (st == DUET_ERR_CANCELLED)
        duet_router_oai_fail(err, 499, NULL, "cancelled", "%s", duet_error_msg());
    else
        duet_router_oai_fail(err, 500, NULL, "internal_error", "%s", duet_error_msg());
}

/* Token ids (and, with echo, the text) of every prompt into r->prompts;
 * ids_p[i] are the caller's to free. */
static duet_status_t duet__prompts(duet__hreq_t *r, const duet_router_oai_req_t *req, int32_t **ids,
                                   size_t *n_ids, duet_router_oai_error_t *err)
{
    duet_router_t *rt = r->http->rt;
    char *chat_text = NULL;
    size_t chat_len = 0;
    duet_status_t st = DUET_OK;

    if (r->api == DUET_ROUTER_API_CHAT) {
        if ((st = duet_router_chat_prompt(rt, req, &chat_text, &chat_len, err)) == DUET_OK)
            st = duet_router_prompt_ids(rt, chat_text, chat_len, false, NULL, 0, "messages",
                                        &ids[0], &n_ids[0], err);
        duet_free(chat_text);
        if (st != DUET_OK)
            return st;
    }
    for (size_t i = 0; i < r->n_prompts; i++) {
        duet_router_oai_prompt_t p = duet_router_oai_prompt(req, i);
        duet__hprompt_t *hp = &r->prompts[i];
        if (r->api != DUET_ROUTER_API_CHAT &&
            (st = duet_router_prompt_ids(rt, p.has_text ? p.text : NULL, p.text_len, true, p.ids,
                                         p.n_ids, "prompt", &ids[i], &n_ids[i], err)) != DUET_OK)
            return st;
        if ((st = duet_router_fit_check(rt, n_ids[i], req->max_tokens, err)) != DUET_OK)
            return st;
        hp->n_tokens = (uint32_t)n_ids[i];
        hp->first_id = ids[i][0];
        if (!r->echo)
            continue;
        if (p.has_text) {
            hp->echo = duet_strndup(p.text, p.text_len);
            hp->echo_len = p.text_len;
        } else if (duet_tokenizer_decode(rt->tok, p.ids, p.n_ids, true, &hp->echo) == DUET_OK) {
            hp->echo_len = strlen(hp->echo);
        }
        if (hp->echo == NULL)
            return duet_router_oai_fail(err, 500, NULL, "out_of_memory", "echo: %s",
                                        duet_error_msg());
    }
    return DUET_OK;
}

static enum MHD_Result duet__submit(duet__hreq_t *r)
{
    duet_router_t *rt = r->http->rt;
    duet_router_oai_limits_t lim = {rt->max_tokens_limit, rt->vocab, 16};
    duet_router_oai_req_t req;
    duet_router_oai_error_t err;
    int32_t *ids[DUET_ROUTER_OAI_PROMPTS_MAX] = {0};
    size_t n_ids[DUET_ROUTER_OAI_PROMPTS_MAX] = {0};
    int started = 0;
    duet_status_t st = DUET_OK;

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
    r->logprobs = req.logprobs;
    r->echo = req.echo;
    if (req.model != NULL && strcmp(req.model, rt->model_name) != 0) {
        duet_router_oai_fail(&err, 404, "model", "model_not_found",
                             "the model '%s' does not exist (this server serves '%s')", req.model,
                             rt->model_name);
        goto respond_err;
    }
    r->n_prompts = duet_router_oai_n_prompts(&req);
    r->n_choices = (int)r->n_prompts * req.n;
    r->prompts = DUET_NEW_ARRAY(duet__hprompt_t, r->n_prompts);
    r->choices = DUET_NEW_ARRAY(duet__choice_t, (size_t)r->n_choices);
    if (r->prompts == NULL || r->choices == NULL) {
        duet_router_oai_fail(&err, 500, NULL, "out_of_memory", "out of memory");
        goto respond_err;
    }
    if (duet__prompts(r, &req, ids, n_ids, &err) != DUET_OK)
        goto respond_err;
    for (size_t i = 0; i < r->n_prompts; i++)
        r->end_prompt += r->prompts[i].n_tokens;
    for (int i = 0; i < r->n_choices; i++) {
        duet__choice_t *c = &r->choices[i];
        duet_router_gen_t gen;
        c->r = r;
        c->index = i;
        c->prompt = (size_t)(i / req.n);
        duet_router_buf_init(&c->text);
        duet_router_gen_from_oai(&gen, rt, &req, ids[c->prompt], n_ids[c->prompt]);
        if (duet_router_job_create_choice(rt, &gen.g, r->id, i, r->n_choices,
                                          duet_deadline_in_ms(rt->request_timeout_ms),
                                          &duet__http_choice_sink, c, &c->job) != DUET_OK) {
            duet_router_oai_fail(&err, 500, NULL, "out_of_memory", "out of memory");
            goto respond_err;
        }
    }
    pthread_mutex_lock(&r->lock);
    r->jobs_live = true;
    pthread_mutex_unlock(&r->lock);
    for (; started < r->n_choices; started++) {
        /* choices 1..n-1 of a prompt follow its choice 0 (fork-style) */
        int j = started % req.n;
        duet_router_job_t *leader = j > 0 ? r->choices[started - j].job : NULL;
        atomic_fetch_add(&r->refs, 1); /* the sink's, dropped by on_end */
        if ((st = duet_router_job_start_after(r->choices[started].job, leader)) != DUET_OK) {
            atomic_fetch_sub(&r->refs, 1);
            break;
        }
    }
    if (st != DUET_OK) {
        duet__start_error(st, &err);
        if (started == 0) { /* nothing runs: answer now */
            duet__http_gen_cancel(r);
            goto respond_err;
        }
        /* the running ones end the request: this failure is its error */
        duet_router_job_end_t end = {.ok = false,
                                     .code = st == DUET_ERR_EXHAUSTED
                                                 ? GRPC_STATUS_RESOURCE_EXHAUSTED
                                                 : GRPC_STATUS_UNAVAILABLE,
                                     .message = err.message};
        for (int i = started; i < r->n_choices; i++) {
            atomic_fetch_add(&r->refs, 1);
            duet__http_choice_sink.on_end(&r->choices[i], &end);
        }
    }
    r->submitted = true;
    for (size_t i = 0; i < r->n_prompts; i++)
        duet_free(ids[i]);
    duet_router_oai_req_cleanup(&req);
    return MHD_YES;

respond_err:
    duet__http_gen_cancel(r); /* jobs created but not started */
    for (size_t i = 0; i < r->n_prompts; i++)
        duet_free(ids[i]);
    duet_router_oai_req_cleanup(&req);
    return duet__http_respond_error(r, &err);
}

/* The whole non-streaming body: every choice in index order. */
static bool duet__render_all(duet__hreq_t *r, duet_router_buf_t *b)
{
    duet_router_oai_meta_t m;
    duet_router_oai_usage_t u = {r->end_prompt, r->end_completion};
    duet_router_buf_t lp;

    duet__http_meta(r, &m);
    duet_router_oai_render_response_head(b, &m);
    duet_router_buf_init(&lp);
    for (int i = 0; i < r->n_choices; i++) {
        duet__choice_t *c = &r->choices[i];
        size_t off = 0;
        lp.len = lp.off = 0;
        if (r->logprobs)
            duet_router_oai_render_logprobs(&lp, r->api, c->lps, c->n_lps, duet__http_tok_bytes,
                                            r->http->rt, &off);
        if (i > 0)
            duet_router_buf_puts(b, ",");
        duet_router_oai_render_choice(b, r->api, c->index, c->text.data ? c->text.data : "",
                                      c->text.len, r->logprobs ? lp.data : NULL, lp.len,
                                      duet_router_oai_finish_name(c->end_reason));
    }
    duet_router_oai_render_response_tail(b, &u);
    if (lp.oom)
        b->oom = true;
    duet_router_buf_cleanup(&lp);
    return !b->oom;
}

/* The first event of the choices (or their end) arrived: answer. */
static enum MHD_Result duet__answer(duet__hreq_t *r)
{
    duet_router_oai_error_t err;
    duet_router_buf_t b;
    bool ended, failed, started;

    pthread_mutex_lock(&r->lock);
    ended = r->ended;
    failed = r->failed;
    started = r->end_started || duet_router_buf_unread(&r->out) > 0;
    pthread_mutex_unlock(&r->lock);
    if (r->stream && !(failed && !started))
        return duet__respond_sse(r);
    if (!ended) /* answered at the end only (a failure: once the others stopped) */
        return MHD_YES;
    if (failed) {
        duet_router_error_from_grpc(r->end_code, r->end_msg, false, &err);
        return duet__http_respond_error(r, &err);
    }
    duet_router_buf_init(&b);
    pthread_mutex_lock(&r->lock);
    duet__render_all(r, &b);
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
