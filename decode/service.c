/* duet.v1.Decode: Generate, Abort, Info.  Generate validates and tokenizes
 * on the completion-queue thread, then hands the request to the scheduler;
 * every error is a gRPC status with a message naming the field. */
#include "decode/service.h"

#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/pb_strings.h"
#include "common/rpc_pb.h"
#include "decode/events.h"
#include "decode/limits.h"
#include "decode/owner.h"
#include "decode/req.h"
#include "duet/v1/decode.pb-c.h"
#include "node/info.h"

static void duet__dc_generate_on_cancel(duet_rpc_call_t *call, void *arg)
{
    duet_dc_req_t *req = arg;
    duet_decode_t *dc = req->rank_args[0].dc;
    /* a flag, not an event naming the request: the NEW event may not have
     * been posted yet.  The scheduler scans for flagged requests. */
    atomic_store(&req->cancel_requested, true);
    duet_dc_ev_t *ev = duet_dc_ev_new(DUET_DC_EV_WAKE, NULL);
    if (ev != NULL)
        duet_dc_post(dc, ev);
}

static duet_status_t duet__dc_sampling_parse(const Duet__V1__SamplingParams *sp,
                                             duet_sampling_t *out)
{
    *out = duet_sampling_greedy();
    out->seed = duet_random_u64();
    if (sp != NULL) {
        out->temperature = sp->temperature;
        out->top_k = sp->top_k;
        out->top_p = sp->top_p > 0 ? sp->top_p : 1.0f;
        if (sp->has_seed || sp->seed != 0)
            out->seed = sp->seed;
    }
    return duet_sampling_check(out);
}

static duet_status_t duet__dc_prompt_parse(duet_decode_t *dc, const Duet__V1__GenerateRequest *g,
                                           uint32_t resumed, duet_dc_req_t *req)
{
    const duet_model_config_t *cfg = &dc->node.ke.model_cfg;
    size_t n = 0;

    switch (g->prompt_case) {
    case DUET__V1__GENERATE_REQUEST__PROMPT_TEXT: {
        int32_t *ids = NULL;
        duet_status_t st = duet_tokenizer_encode(dc->tok, g->text, strlen(g->text), true, &ids, &n);
        if (st != DUET_OK)
            return duet_error_wrap(st, "prompt: ");
        req->prompt = ids;
        break;
    }
    case DUET__V1__GENERATE_REQUEST__PROMPT_TOKEN_IDS:
        n = g->token_ids != NULL ? g->token_ids->n_ids : 0;
        if (n == 0)
            break;
        for (size_t i = 0; i < n; i++) {
            if (g->token_ids->ids[i] < 0 || g->token_ids->ids[i] >= cfg->vocab)
                return duet_error(DUET_ERR_INVALID,
                                  "prompt: token id %d at %zu is out of range "
                                  "0..%d",
                                  g->token_ids->ids[i], i, cfg->vocab - 1);
        }
        req->prompt = duet_malloc(n * sizeof(int32_t));
        if (req->prompt == NULL)
            return duet_error(DUET_ERR_NO_MEMORY, "no memory");
        memcpy(req->prompt, g->token_ids->ids, n * sizeof(int32_t));
        break;
    default:
        return duet_error(DUET_ERR_INVALID, "prompt: give text or token_ids");
    }
    if (n == 0)
        return duet_error(DUET_ERR_INVALID, "prompt: empty");
    if (n > (size_t)duet_dc_limits_prompt(dc, resumed))
        return duet_error(DUET_ERR_TOO_LONG, "prompt: %zu tokens exceed the limit of %d tokens", n,
                          duet_dc_limits_prompt(dc, resumed));
    req->n_prompt = (int)n;
    return DUET_OK;
}

/* A migrated stream's resume point (docs/migration.md). */
static duet_status_t duet__dc_resume_parse(const Duet__V1__DecodeGenerateRequest *m,
                                           duet_dc_req_t *req)
{
    if (m->first_output_index >= (uint32_t)req->n_prompt)
        return duet_error(DUET_ERR_INVALID,
                          "first_output_index: %u must leave at least one of the %d prompt tokens",
                          m->first_output_index, req->n_prompt);
    if (m->first_output_index == 0 && m->resumed_text_bytes > 0)
        return duet_error(DUET_ERR_INVALID, "resumed_text_bytes: needs first_output_index");
    req->first_index = (int)m->first_output_index;
    /* (m->migratable is ignored: a draining decode finishes every stream,
     * its router moves them make-before-break: docs/migration.md) */
    req->resumed_text = m->resumed_text_bytes;
    return DUET_OK;
}

static duet_status_t duet__dc_generate_validate(duet_decode_t *dc,
                                                const Duet__V1__DecodeGenerateRequest *m,
                                                duet_dc_req_t *req)
{
    const Duet__V1__GenerateRequest *g = m->request;
    const duet_model_config_t *cfg = &dc->node.ke.model_cfg;
    int ps = dc->node.args.cluster->page_size;
    duet_status_t st;

    if (g == NULL)
        return duet_error(DUET_ERR_INVALID, "request: missing");
    /* request id and abort token (owner.c) */
    if ((st = duet_dc_request_owner(dc, g->request_id, m->abort_token, req)) != DUET_OK)
        return st;
    if (m->prefill_target != NULL && strlen(m->prefill_target) >= sizeof(req->prefill_target))
        return duet_error(DUET_ERR_INVALID, "prefill_target: too long");
    snprintf(req->prefill_target, sizeof(req->prefill_target), "%s",
             m->prefill_target ? m->prefill_target : "");
    if ((st = duet_dc_limits_check(dc, g, m->first_output_index)) != DUET_OK)
        return st;
    if (g->n > 1) /* the router serves n (docs/api-logprobs.md) */
        return duet_error(DUET_ERR_INVALID,
                          "n: %u choices asked; Decode.Generate generates one "
                          "(duet-router serves n > 1)",
                          g->n);
    if (m->prefill_local && dc->node.args.self != NULL &&
        duet_cluster_prefill_local(dc->node.args.self) == DUET_PREFILL_LOCAL_OFF)
        return duet_error(DUET_ERR_MISMATCH,
                          "prefill_local: this decode does not prefill locally (its "
                          "prefill_local is off)");
    req->local_asked = m->prefill_local;
    /* only prefill instances of the cluster (a discovered one is checked
     * before its bootstrap) */
    if (req->prefill_target[0] != '\0' &&
        (st = duet_dc_target_check(dc, req->prefill_target, false)) == DUET_ERR_INVALID)
        return st;
    if ((st = duet__dc_prompt_parse(dc, g, m->first_output_index, req)) != DUET_OK ||
        (st = duet__dc_resume_parse(m, req)) != DUET_OK)
        return st;
    if ((st = duet__dc_sampling_parse(g->sampling, &req->sampling)) != DUET_OK)
        return duet_error_wrap(st, "sampling: ");
    req->max_tokens =
        g->max_tokens > 0 ? (int)g->max_tokens : dc->node.args.self->max_tokens_default;
    if (g->max_tokens > (1u << 24))
        return duet_error(DUET_ERR_INVALID, "max_tokens: %u is too large", g->max_tokens);
    /* generation stops at the context: reserve no more than it */
    if (req->n_prompt + req->max_tokens > dc->max_ctx)
        req->max_tokens = dc->max_ctx - req->n_prompt + 1;
    req->ignore_eos = g->ignore_eos;
    if ((g->logprobs || g->prompt_logprobs || g->top_logprobs > 0) &&
        (st = duet_logprob_params_check(g->top_logprobs > INT32_MAX ? -1 : (int)g->top_logprobs,
                                        g->prompt_logprobs, req->n_prompt,
                                        dc->node.ke.model_cfg.vocab)) != DUET_OK)
        return st;
    req->logprobs = g->logprobs;
    req->prompt_logprobs = g->prompt_logprobs;
    req->top_logprobs = (int)g->top_logprobs;
    if (g->n_stop > DUET_DC_MAX_STOPS)
        return duet_error(DUET_ERR_INVALID, "stop: at most %d strings", DUET_DC_MAX_STOPS);
    for (size_t i = 0; i < g->n_stop; i++) {
        size_t len = strlen(g->stop[i]);
        if (len == 0 || len > DUET_DC_STOP_MAX_LEN)
            return duet_error(DUET_ERR_INVALID, "stop[%zu]: must be 1..%d bytes", i,
                              DUET_DC_STOP_MAX_LEN);
        if ((req->stops[req->n_stops++] = duet_strdup(g->stop[i])) == NULL)
            return duet_error(DUET_ERR_NO_MEMORY, "no memory");
    }
    if (g->n_stop_token_ids > 0) {
        req->stop_ids = duet_malloc(g->n_stop_token_ids * sizeof(int32_t));
        if (req->stop_ids == NULL)
            return duet_error(DUET_ERR_NO_MEMORY, "no memory");
        for (size_t i = 0; i < g->n_stop_token_ids; i++) {
            if (g->stop_token_ids[i] < 0 || g->stop_token_ids[i] >= cfg->vocab)
                return duet_error(DUET_ERR_INVALID, "stop_token_ids[%zu]: %d out of range", i,
                                  g->stop_token_ids[i]);
            req->stop_ids[i] = g->stop_token_ids[i];
        }
        req->n_stop_ids = (int)g->n_stop_token_ids;
    }
    /* pages for the prompt and every token but the last (whose KV is never
     * written) */
    int span = req->n_prompt + req->max_tokens - 1;
    req->n_pages = (span + ps - 1) / ps;
    req->n_prompt_pages = (req->n_prompt + ps - 1) / ps;
    req->stage0 = -1;
    /* one that can never fit is refused now, not queued (docs/limits.md) */
    if (req->n_pages > duet_kv_pool_total(dc->node.pages))
        return duet_error(DUET_ERR_INVALID,
                          "request needs %d KV pages (%d prompt tokens + max_tokens %d), this "
                          "decode's pool holds %d pages of %d tokens (n_pages): shorten the "
                          "prompt or lower max_tokens",
                          req->n_pages, req->n_prompt, req->max_tokens,
                          duet_kv_pool_total(dc->node.pages), ps);
    req->pages = DUET_NEW_ARRAY(int32_t, (size_t)req->n_pages);
    req->rank_args = DUET_NEW_ARRAY(duet_dc_rank_arg_t, (size_t)dc->node.ke.tp);
    req->expecting = DUET_NEW_ARRAY(bool, (size_t)dc->node.ke.tp);
    if (req->pages == NULL || req->rank_args == NULL || req->expecting == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "no memory");
    return DUET_OK;
}

static void duet__dc_generate_serve(duet_rpc_call_t *call, const uint8_t *data, size_t len,
                                    void *arg)
{
    duet_decode_t *dc = arg;
    Duet__V1__DecodeGenerateRequest *m = NULL;
    duet_dc_req_t *req = NULL;
    duet_dc_ev_t *ev = NULL;
    duet_status_t st;

    if (!atomic_load(&dc->node.ready)) {
        duet_rpc_call_fail(call, GRPC_STATUS_UNAVAILABLE, "decode is starting");
        return;
    }
    if (atomic_load(&dc->node.draining)) {
        duet_rpc_call_fail(call, GRPC_STATUS_UNAVAILABLE, "decode is draining");
        return;
    }
    if ((st = duet_pb_check_nul(&duet__v1__decode_generate_request__descriptor, data, len)) !=
        DUET_OK) {
        duet_rpc_call_fail_status(call, st, duet_error_msg());
        return;
    }
    m = duet__v1__decode_generate_request__unpack(NULL, len, data);
    if (m == NULL) {
        duet_rpc_call_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "malformed DecodeGenerateRequest");
        return;
    }
    req = DUET_NEW(duet_dc_req_t);
    ev = duet_dc_ev_new(DUET_DC_EV_NEW, req);
    if (req == NULL || ev == NULL) {
        duet_rpc_call_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "no memory");
        goto err;
    }
    req->call = call;
    req->t_arrival = duet_now_ns();
    int64_t dl = duet_rpc_call_deadline_ns(call);
    req->deadline_ns = dl > 0 ? dl : INT64_MAX;
    if ((st = duet__dc_generate_validate(dc, m, req)) != DUET_OK) {
        duet_rpc_call_fail_status(call, st, duet_error_msg());
        goto err;
    }
    int max_queue = dc->node.args.self->max_queue;
    if (atomic_fetch_add(&dc->waiting, 1) >= max_queue && max_queue > 0) {
        atomic_fetch_sub(&dc->waiting, 1);
        duet_rpc_call_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED,
                           "decode queue is full: retry later");
        goto err;
    }
    req->rank_args[0].dc = dc; /* for on_cancel */
    duet__v1__decode_generate_request__free_unpacked(m, NULL);
    /* already cancelled: on_cancel will not run, so flag it here */
    if (duet_rpc_call_on_cancel(call, duet__dc_generate_on_cancel, req) != DUET_OK)
        atomic_store(&req->cancel_requested, true);
    if (duet_dc_post_new(dc, ev) != DUET_OK) {
        atomic_fetch_sub(&dc->waiting, 1);
        duet_rpc_call_fail(call, GRPC_STATUS_UNAVAILABLE, duet_error_msg());
        duet_free(ev);
        duet_dc_req_free(dc, req);
    }
    return;
err:
    duet__v1__decode_generate_request__free_unpacked(m, NULL);
    duet_free(ev);
    duet_dc_req_free(dc, req);
}

static void duet__dc_abort_serve(duet_rpc_call_t *call, const uint8_t *data, size_t len, void *arg)
{
    duet_decode_t *dc = arg;
    Duet__V1__AbortRequest *m;
    duet_dc_ev_t *ev;

    /* only the scheduler answers an Abort: not before it runs */
    if (!atomic_load(&dc->node.ready)) {
        duet_rpc_call_fail(call, GRPC_STATUS_UNAVAILABLE, "decode is starting");
        return;
    }
    /* "abc\0..." must not abort request "abc" */
    if (duet_pb_check_nul(&duet__v1__abort_request__descriptor, data, len) != DUET_OK) {
        duet_rpc_call_fail_status(call, DUET_ERR_INVALID, duet_error_msg());
        return;
    }
    m = duet__v1__abort_request__unpack(NULL, len, data);
    if (m == NULL || m->request_id == NULL || m->request_id[0] == '\0') {
        duet_rpc_call_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "abort: request_id required");
        goto out;
    }
    /* only the owner: who holds the token given at Generate (an unknown
     * id and a wrong token answer alike: found = false) */
    if (m->abort_token == NULL || m->abort_token[0] == '\0') {
        duet_rpc_call_fail(call, GRPC_STATUS_PERMISSION_DENIED,
                           "abort: abort_token required (the one the request was started with; "
                           "a request without one is stopped by cancelling its stream)");
        goto out;
    }
    if (strlen(m->abort_token) > DUET_DC_ABORT_TOKEN_MAX) {
        duet_rpc_call_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "abort: abort_token too long");
        goto out;
    }
    ev = duet_dc_ev_new(DUET_DC_EV_ABORT, NULL);
    if (ev == NULL) {
        duet_rpc_call_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "no memory");
        goto out;
    }
    ev->call = call;
    snprintf(ev->request_id, sizeof(ev->request_id), "%s", m->request_id);
    snprintf(ev->abort_token, sizeof(ev->abort_token), "%s", m->abort_token);
    if (!duet_dc_post_live(dc, ev)) { /* else the scheduler answers */
        duet_rpc_call_fail(call, GRPC_STATUS_UNAVAILABLE, "decode is shutting down");
        duet_free(ev);
    }
out:
    if (m != NULL)
        duet__v1__abort_request__free_unpacked(m, NULL);
}

static void duet__dc_info_serve(duet_rpc_call_t *call, const uint8_t *data, size_t len, void *arg)
{
    duet_decode_t *dc = arg;
    Duet__V1__InfoResponse r = DUET__V1__INFO_RESPONSE__INIT;
    int queued, running;

    if (!atomic_load(&dc->node.ready)) {
        duet_rpc_call_fail(call, GRPC_STATUS_UNAVAILABLE, "decode is starting");
        return;
    }
    duet_dc_counts(dc, &queued, &running);
    duet_node_info_fill(&dc->node, &r);
    r.queue_depth = (uint32_t)queued;
    r.running = (uint32_t)running;
    r.max_context = (uint32_t)dc->max_ctx;
    pthread_mutex_lock(&dc->evlock);
    r.requests_total = dc->requests_total;
    r.requests_failed = dc->requests_failed;
    r.prefills_local = dc->prefills_local;
    r.prefills_remote = dc->prefills_remote;
    r.prefill_chunks_local = dc->chunks_local;
    r.kv_unpacked_early_layers = dc->unpacked_early;
    r.kv_transfers_unstaged = dc->unstaged;
    r.kv_transfers_chunked = dc->chunked;
    r.decode_steps = dc->steps;
    r.decode_forward_ns = dc->forward_ns;
    r.decode_cycles = dc->cycles;
    r.decode_cycle_ns = dc->cycle_ns;
    pthread_mutex_unlock(&dc->evlock);
    r.transfer_progress_layers = (uint32_t)dc->node.ke.progress_layers;
    r.prefill_local = dc->node.args.self->prefill_local;
    duet_pb_reply(call, &r.base);
}

duet_status_t duet_dc_service_register(duet_decode_t *dc)
{
    duet_status_t st;
    if ((st = duet_rpc_server_add_method(dc->node.srv, "/duet.v1.Decode/Generate",
                                         DUET_RPC_SERVER_STREAMING, duet__dc_generate_serve, dc)) ||
        (st = duet_rpc_server_add_method(dc->node.srv, "/duet.v1.Decode/Abort", DUET_RPC_UNARY,
                                         duet__dc_abort_serve, dc)) ||
        (st = duet_rpc_server_add_method(dc->node.srv, "/duet.v1.Decode/Info", DUET_RPC_UNARY,
                                         duet__dc_info_serve, dc)))
        return st;
    return DUET_OK;
}

duet_status_t duet_dc_validate(duet_decode_t *dc, const Duet__V1__DecodeGenerateRequest *m,
                               duet_dc_req_t *req)
{
    return duet__dc_generate_validate(dc, m, req);
}
