/* The router's gRPC server: duet.v1.Generate/Generate (server streaming,
 * the same semantics as /v1/completions for gRPC clients) and
 * grpc.health.v1.Health (SERVING while at least one prefill and one decode
 * worker are healthy and the router is not draining).  The API key, when
 * configured, is checked in the server's admission hook against the
 * `authorization: Bearer <key>` metadata; health probes pass without it.
 *
 * With n = 1, chunks from decode are forwarded as they came (the same
 * GenerateResponse bytes); n > 1 runs n choices, each message carrying its
 * choice's index (grpc_choices.c).  The stream ends with decode's
 * `finished` message(s) and OK, or with
 * decode's status (INVALID_ARGUMENT, OUT_OF_RANGE, ...), or the router's
 * own: NOT_FOUND (model), UNAUTHENTICATED, RESOURCE_EXHAUSTED (queue full),
 * UNAVAILABLE (no healthy worker, draining), DEADLINE_EXCEEDED. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/limits.h"
#include "common/log.h"
#include "common/pb_strings.h"
#include "router/grpc/grpc_internal.h"

void duet_router_update_health(duet_router_t *rt)
{
    if (rt->health == NULL)
        return;
    duet_rpc_health_status_t s =
        duet_router_workers_ready(rt->workers) && !atomic_load(&rt->draining)
            ? DUET_RPC_HEALTH_SERVING
            : DUET_RPC_HEALTH_NOT_SERVING;
    duet_rpc_health_set(rt->health, "", s);
    duet_rpc_health_set(rt->health, "duet.v1.Generate", s);
}

static grpc_status_code duet__grpc_check_auth(duet_rpc_call_t *call, void *arg, const char **msg_p)
{
    duet_router_t *rt = arg;
    size_t len = 0;
    const char *v;

    if (strncmp(duet_rpc_call_method(call), "/grpc.health.v1.Health/", 23) == 0 ||
        rt->api_key == NULL)
        return GRPC_STATUS_OK;
    v = duet_rpc_call_metadata(call, "authorization", &len);
    if (duet_router_auth_ok(rt, v, len))
        return GRPC_STATUS_OK;
    *msg_p = v ? "incorrect API key" : "missing API key: send metadata authorization: Bearer <key>";
    duet_router_metrics_grpc(&rt->metrics, GRPC_STATUS_UNAUTHENTICATED);
    return GRPC_STATUS_UNAUTHENTICATED;
}

static grpc_status_code duet__code_of(const duet_router_oai_error_t *err)
{
    if (err->status == 400 && err->code && strcmp(err->code, "context_length_exceeded") == 0)
        return GRPC_STATUS_OUT_OF_RANGE;
    if (err->status == 400)
        return GRPC_STATUS_INVALID_ARGUMENT;
    if (err->status == 404)
        return GRPC_STATUS_NOT_FOUND;
    return GRPC_STATUS_INTERNAL;
}

/* Validate a client's request and build the one decode gets (token ids,
 * a request id, max_tokens within the limits).  On failure fills code/msg. */
static bool duet__prepare(duet_router_t *rt, Duet__V1__GenerateRequest *in, char *id_buf,
                          size_t id_cap, int32_t **ids_p, size_t *n_p, grpc_status_code *code_p,
                          char *msg, size_t msg_cap)
{
    duet_router_oai_error_t err;
    const Duet__V1__SamplingParams *sp = in->sampling;

    if (in->model[0] != '\0' && strcmp(in->model, rt->model_name) != 0) {
        snprintf(msg, msg_cap, "the model '%s' does not exist (this server serves '%s')", in->model,
                 rt->model_name);
        *code_p = GRPC_STATUS_NOT_FOUND;
        return false;
    }
    if (sp && (!isfinite(sp->temperature) || sp->temperature < 0 || !isfinite(sp->top_p) ||
               sp->top_p < 0 || sp->top_p > 1 || sp->top_k < 0)) {
        snprintf(msg, msg_cap, "sampling: temperature must be >= 0, top_p in [0, 1], top_k >= 0");
        *code_p = GRPC_STATUS_INVALID_ARGUMENT;
        return false;
    }
    if (in->max_tokens > rt->max_tokens_limit) {
        snprintf(msg, msg_cap, "max_tokens must be at most %lld, got %u",
                 (long long)rt->max_tokens_limit, in->max_tokens);
        *code_p = GRPC_STATUS_INVALID_ARGUMENT;
        return false;
    }
    if (in->top_logprobs > DUET_ROUTER_OAI_TOP_MAX_CHAT ||
        (in->top_logprobs > 0 && !in->logprobs && !in->prompt_logprobs)) {
        if (in->top_logprobs > DUET_ROUTER_OAI_TOP_MAX_CHAT)
            snprintf(msg, msg_cap, "top_logprobs must be at most %d, got %u",
                     DUET_ROUTER_OAI_TOP_MAX_CHAT, in->top_logprobs);
        else
            snprintf(msg, msg_cap, "top_logprobs (%u) needs logprobs or prompt_logprobs",
                     in->top_logprobs);
        *code_p = GRPC_STATUS_INVALID_ARGUMENT;
        return false;
    }
    if (in->n > DUET_ROUTER_GRPC_N_MAX) {
        snprintf(msg, msg_cap, "n must be 1..%d (0: 1), got %u", DUET_ROUTER_GRPC_N_MAX, in->n);
        *code_p = GRPC_STATUS_INVALID_ARGUMENT;
        return false;
    }
    if (in->n_stop > DUET_LIMIT_STOP_STRINGS || in->n_stop_token_ids > DUET_LIMIT_STOP_TOKEN_IDS) {
        snprintf(msg, msg_cap, "%s: %zu given, at most %d are allowed",
                 in->n_stop > DUET_LIMIT_STOP_STRINGS ? "stop" : "stop_token_ids",
                 in->n_stop > DUET_LIMIT_STOP_STRINGS ? in->n_stop : in->n_stop_token_ids,
                 in->n_stop > DUET_LIMIT_STOP_STRINGS ? DUET_LIMIT_STOP_STRINGS
                                                      : DUET_LIMIT_STOP_TOKEN_IDS);
        *code_p = GRPC_STATUS_INVALID_ARGUMENT;
        return false;
    }
    for (size_t i = 0; i < in->n_stop_token_ids; i++) {
        if (in->stop_token_ids[i] < 0 || in->stop_token_ids[i] >= rt->vocab) {
            snprintf(msg, msg_cap, "stop_token_ids[%zu]: %d is out of range", i,
                     in->stop_token_ids[i]);
            *code_p = GRPC_STATUS_INVALID_ARGUMENT;
            return false;
        }
    }
    if (in->prompt_case == DUET__V1__GENERATE_REQUEST__PROMPT_TEXT && in->text[0] != '\0') {
        if (duet_router_prompt_ids(rt, in->text, strlen(in->text), true, NULL, 0, "text", ids_p,
                                   n_p, &err) != DUET_OK)
            goto err;
    } else if (in->prompt_case == DUET__V1__GENERATE_REQUEST__PROMPT_TOKEN_IDS &&
               in->token_ids->n_ids > 0) {
        if (duet_router_prompt_ids(rt, NULL, 0, false, in->token_ids->ids, in->token_ids->n_ids,
                                   "token_ids", ids_p, n_p, &err) != DUET_OK)
            goto err;
    } else {
        snprintf(msg, msg_cap, "the prompt is empty (set text or token_ids)");
        *code_p = GRPC_STATUS_INVALID_ARGUMENT;
        return false;
    }
    if (duet_router_fit_check(rt, *n_p, in->max_tokens, &err) != DUET_OK)
        goto err;
    if (in->request_id[0] == '\0') {
        if (duet_router_new_id(rt, "cmpl", id_buf, id_cap) != DUET_OK) {
            snprintf(msg, msg_cap, "request id: %s", duet_error_msg());
            *code_p = GRPC_STATUS_INTERNAL;
            return false;
        }
    } else
        snprintf(id_buf, id_cap, "%s", in->request_id);
    return true;

err:
    snprintf(msg, msg_cap, "%s", err.message);
    *code_p = duet__code_of(&err);
    return false;
}

static void duet__grpc_generate(duet_rpc_call_t *call, const uint8_t *req, size_t req_len,
                                void *arg)
{
    duet_router_t *rt = arg;
    Duet__V1__GenerateRequest *in = duet__v1__generate_request__unpack(NULL, req_len, req);
    duet_router_gen_t gen;
    grpc_status_code code = GRPC_STATUS_INTERNAL;
    char msg[320], id[160];
    int32_t *ids = NULL;
    size_t n_ids = 0;

    if (in == NULL) {
        duet_router_metrics_grpc(&rt->metrics, GRPC_STATUS_INVALID_ARGUMENT);
        duet_rpc_call_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "malformed GenerateRequest");
        return;
    }
    /* protobuf-c cuts a string at a NUL: refuse rather than truncate */
    if (duet_pb_check_nul(&duet__v1__generate_request__descriptor, req, req_len) != DUET_OK) {
        snprintf(msg, sizeof(msg), "%s", duet_error_msg());
        code = GRPC_STATUS_INVALID_ARGUMENT;
        goto fail;
    }
    if (!duet__prepare(rt, in, id, sizeof(id), &ids, &n_ids, &code, msg, sizeof(msg)))
        goto fail;
    /* decode gets token ids, a request id and the clamped max_tokens */
    duet_router_gen_from_client(&gen, rt, in, id, ids, n_ids);
    int64_t deadline = duet_deadline_in_ms(rt->request_timeout_ms);
    if (duet_rpc_call_deadline_ns(call) < deadline)
        deadline = duet_rpc_call_deadline_ns(call);
    duet_router_grpc_run(rt, call, &gen.g, deadline); /* ends the call, now or later */
    duet__v1__generate_request__free_unpacked(in, NULL);
    duet_free(ids);
    return;

fail:
    duet_router_metrics_grpc(&rt->metrics, code);
    duet_rpc_call_fail(call, code, msg);
    duet_free(ids);
    duet__v1__generate_request__free_unpacked(in, NULL);
}

duet_status_t duet_router_grpc_start(duet_router_t *rt, const char *addr, int threads)
{
    duet_rpc_server_config_t cfg;
    duet_status_t st;

    duet_rpc_server_config_init(&cfg);
    cfg.bind_addr = addr;
    cfg.n_threads = threads > 0 ? threads : 2;
    cfg.stream_queue_limit = 8192;
    cfg.shutdown_grace_ms = 1000;
    cfg.max_message_bytes = duet_limit_router_message_bytes(rt->cfg);
    cfg.check = duet__grpc_check_auth;
    cfg.check_arg = rt;
    cfg.auth = rt->auth;
    if ((st = duet_rpc_server_create(&cfg, &rt->grpc)) != DUET_OK)
        return duet_error_wrap(st, "router.grpc: ");
    if ((st = duet_rpc_health_create(rt->grpc, DUET_RPC_HEALTH_NOT_SERVING, &rt->health)) !=
            DUET_OK ||
        (st = duet_rpc_server_add_method(rt->grpc, "/duet.v1.Generate/Generate",
                                         DUET_RPC_SERVER_STREAMING, duet__grpc_generate, rt)) !=
            DUET_OK)
        return st;
    duet_router_update_health(rt);
    return duet_rpc_server_start(rt->grpc);
}

bool duet_router_grpc_prepare(duet_router_t *rt, Duet__V1__GenerateRequest *in, char *id_buf,
                              size_t id_cap, int32_t **ids_p, size_t *n_p, grpc_status_code *code_p,
                              char *msg, size_t msg_cap)
{
    return duet__prepare(rt, in, id_buf, id_cap, ids_p, n_p, code_p, msg, msg_cap);
}
