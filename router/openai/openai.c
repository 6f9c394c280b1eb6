#include "router/openai/openai.h"
#include "router/openai/openai_internal.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/limits.h"

#define DUET__OAI_MAX_STOP     DUET_LIMIT_STOP_STRINGS
#define DUET__OAI_MAX_STOP_IDS DUET_LIMIT_STOP_TOKEN_IDS
#define DUET__OAI_MAX_MSGS     DUET_LIMIT_CHAT_MESSAGES

duet_status_t duet_router_oai_fail(duet_router_oai_error_t *err, int status, const char *param,
                                   const char *code, const char *fmt, ...)
{
    va_list ap;

    err->status = status;
    err->param = param;
    err->code = code;
    if (status == 401)
        err->type = "authentication_error";
    else if (status == 429)
        err->type = "rate_limit_error";
    else if (status >= 500)
        err->type = "server_error";
    else
        err->type = "invalid_request_error";
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof(err->message), fmt, ap);
    va_end(ap);
    return status >= 500 && code != NULL && strcmp(code, "out_of_memory") == 0 ? DUET_ERR_NO_MEMORY
                                                                               : DUET_ERR_INVALID;
}

#define DUET__OOM(err) duet_router_oai_fail((err), 500, NULL, "out_of_memory", "out of memory")

void duet_router_oai_req_cleanup(duet_router_oai_req_t *req)
{
    duet_free(req->model);
    duet_free(req->prompt_text);
    duet_free(req->prompt_ids);
    for (size_t i = 0; i < req->n_more_prompts; i++) {
        duet_free(req->more_prompts[i].text);
        duet_free(req->more_prompts[i].ids);
    }
    duet_free(req->more_prompts);
    for (size_t i = 0; i < req->n_msgs; i++) {
        duet_free(req->msgs[i].role);
        duet_free(req->msgs[i].content);
    }
    duet_free(req->msgs);
    for (size_t i = 0; i < req->n_stop; i++)
        duet_free(req->stop[i]);
    duet_free(req->stop);
    duet_free(req->stop_ids);
    memset(req, 0, sizeof(*req));
}

bool duet__oai_int_in(const cJSON *v, double lo, double hi)
{
    return cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble) && v->valuedouble >= lo &&
           v->valuedouble <= hi;
}

/* Absent and JSON null both mean "not given". */
const cJSON *duet__oai_field(const cJSON *root, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    return cJSON_IsNull(v) ? NULL : v;
}

static duet_status_t duet__oai_parse_ids(const cJSON *arr, const char *param, int vocab,
                                         int32_t **ids_p, size_t *n_p, duet_router_oai_error_t *err)
{
    size_t n = (size_t)cJSON_GetArraySize(arr), i = 0;
    const cJSON *v;
    int32_t *ids;

    if (n == 0)
        return duet_router_oai_fail(err, 400, param, NULL, "%s must not be empty", param);
    ids = duet_malloc(n * sizeof(*ids));
    if (ids == NULL)
        return DUET__OOM(err);
    cJSON_ArrayForEach(v, arr)
    {
        if (!duet__oai_int_in(v, 0, 2147483647.0)) {
            duet_free(ids);
            return duet_router_oai_fail(
                err, 400, param, NULL, "%s[%zu] must be a non-negative integer token id", param, i);
        }
        if (vocab > 0 && v->valuedouble >= vocab) {
            duet_free(ids);
            return duet_router_oai_fail(err, 400, param, NULL,
                                        "%s[%zu]: token id %.0f is out of range 0..%d", param, i,
                                        v->valuedouble, vocab - 1);
        }
        ids[i++] = (int32_t)v->valuedouble;
    }
    *ids_p = ids;
    *n_p = n;
    return DUET_OK;
}

static duet_status_t duet__parse_one_prompt(const cJSON *p, const duet_router_oai_limits_t *lim,
                                            duet_router_oai_prompt_t *out,
                                            duet_router_oai_error_t *err)
{
    if (cJSON_IsString(p)) {
        size_t n = strlen(p->valuestring);
        if (n == 0)
            return duet_router_oai_fail(err, 400, "prompt", NULL, "prompt must not be empty");
        out->text = duet_strndup(p->valuestring, n);
        if (out->text == NULL)
            return DUET__OOM(err);
        out->text_len = n;
        out->has_text = true;
        return DUET_OK;
    }
    if (cJSON_IsArray(p))
        return duet__oai_parse_ids(p, "prompt", lim->vocab_size, &out->ids, &out->n_ids, err);
    return duet_router_oai_fail(err, 400, "prompt", NULL,
                                "prompt must be a string or an array of token ids");
}

static duet_status_t duet__parse_prompt(const cJSON *p, const duet_router_oai_limits_t *lim,
                                        duet_router_oai_req_t *req, duet_router_oai_error_t *err)
{
    duet_router_oai_prompt_t first = {0};
    duet_status_t st;
    size_t n = 1;

    if (p == NULL)
        return duet_router_oai_fail(err, 400, "prompt", NULL, "prompt is required");
    if (cJSON_IsArray(p)) {
        const cJSON *c = p->child;
        if (c == NULL)
            return duet_router_oai_fail(err, 400, "prompt", NULL, "prompt must not be empty");
        if (cJSON_IsString(c) || cJSON_IsArray(c)) {
            /* a batch of prompts: each is a string or an id array */
            n = (size_t)cJSON_GetArraySize(p);
            if (n > DUET_ROUTER_OAI_PROMPTS_MAX)
                return duet_router_oai_fail(err, 400, "prompt", NULL,
                                            "at most %d prompts per request, got %zu",
                                            DUET_ROUTER_OAI_PROMPTS_MAX, n);
            if (n > 1 &&
                (req->more_prompts = DUET_NEW_ARRAY(duet_router_oai_prompt_t, n - 1)) == NULL)
                return DUET__OOM(err);
            p = c;
        }
    }
    if ((st = duet__parse_one_prompt(p, lim, &first, err)) != DUET_OK)
        return st;
    req->has_text = first.has_text;
    req->prompt_text = first.text;
    req->prompt_text_len = first.text_len;
    req->prompt_ids = first.ids;
    req->n_prompt_ids = first.n_ids;
    for (size_t i = 1; i < n; i++) {
        p = p->next;
        req->n_more_prompts = i; /* cleanup frees what was parsed */
        if ((cJSON_IsArray(p) && p->child != NULL && !cJSON_IsNumber(p->child)) ||
            (!cJSON_IsString(p) && !cJSON_IsArray(p)))
            return duet_router_oai_fail(err, 400, "prompt", NULL,
                                        "prompt[%zu] must be a string or an array of token ids", i);
        if ((st = duet__parse_one_prompt(p, lim, &req->more_prompts[i - 1], err)) != DUET_OK)
            return st;
    }
    return DUET_OK;
}

/* content: string, null, or [{type: "text", text}] parts joined. */
static duet_status_t duet__parse_content(const cJSON *c, size_t i, char **out_p,
                                         duet_router_oai_error_t *err)
{
    duet_router_buf_t b;
    const cJSON *part;

    if (c == NULL || cJSON_IsNull(c)) {
        *out_p = duet_strdup("");
        return *out_p ? DUET_OK : DUET__OOM(err);
    }
    if (cJSON_IsString(c)) {
        *out_p = duet_strdup(c->valuestring);
        return *out_p ? DUET_OK : DUET__OOM(err);
    }
    if (!cJSON_IsArray(c))
        return duet_router_oai_fail(err, 400, "messages", NULL,
                                    "messages[%zu].content must be a string or an array of parts",
                                    i);
    duet_router_buf_init(&b);
    cJSON_ArrayForEach(part, c)
    {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") != 0 ||
            !cJSON_IsString(text)) {
            duet_router_buf_cleanup(&b);
            return duet_router_oai_fail(err, 400, "messages", NULL,
                                        "messages[%zu].content: only text parts are supported", i);
        }
        duet_router_buf_puts(&b, text->valuestring);
    }
    duet_router_buf_append(&b, "", 0);
    if (b.oom) {
        duet_router_buf_cleanup(&b);
        return DUET__OOM(err);
    }
    *out_p = duet_router_buf_steal(&b, NULL);
    return *out_p ? DUET_OK : DUET__OOM(err);
}

static duet_status_t duet__parse_messages(const cJSON *m, duet_router_oai_req_t *req,
                                          duet_router_oai_error_t *err)
{
    size_t n, i = 0;
    const cJSON *msg;
    duet_status_t st;

    if (m == NULL)
        return duet_router_oai_fail(err, 400, "messages", NULL, "messages is required");
    if (!cJSON_IsArray(m))
        return duet_router_oai_fail(err, 400, "messages", NULL, "messages must be an array");
    n = (size_t)cJSON_GetArraySize(m);
    if (n == 0)
        return duet_router_oai_fail(err, 400, "messages", NULL, "messages must not be empty");
    if (n > DUET__OAI_MAX_MSGS)
        return duet_router_oai_fail(err, 400, "messages", NULL, "more than %d messages",
                                    DUET__OAI_MAX_MSGS);
    req->msgs = DUET_NEW_ARRAY(duet_router_chat_msg_t, n);
    if (req->msgs == NULL)
        return DUET__OOM(err);
    cJSON_ArrayForEach(msg, m)
    {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(msg, "role");
        if (!cJSON_IsObject(msg) || !cJSON_IsString(role) || role->valuestring[0] == '\0')
            return duet_router_oai_fail(err, 400, "messages", NULL,
                                        "messages[%zu] must be an object with a role", i);
        req->msgs[i].role = duet_strdup(role->valuestring);
        req->n_msgs = i + 1;
        if (req->msgs[i].role == NULL)
            return DUET__OOM(err);
        st = duet__parse_content(cJSON_GetObjectItemCaseSensitive(msg, "content"), i,
                                 &req->msgs[i].content, err);
        if (st != DUET_OK)
            return st;
        i++;
    }
    return DUET_OK;
}

static duet_status_t duet__parse_stop(const cJSON *s, duet_router_oai_req_t *req,
                                      duet_router_oai_error_t *err)
{
    const cJSON *v;
    size_t n, i = 0;

    if (s == NULL)
        return DUET_OK;
    if (cJSON_IsString(s)) {
        n = 1;
    } else if (cJSON_IsArray(s)) {
        n = (size_t)cJSON_GetArraySize(s);
        if (n > DUET__OAI_MAX_STOP)
            return duet_router_oai_fail(err, 400, "stop", NULL, "at most %d stop sequences",
                                        DUET__OAI_MAX_STOP);
    } else {
        return duet_router_oai_fail(err, 400, "stop", NULL,
                                    "stop must be a string or an array of strings");
    }
    if (n == 0)
        return DUET_OK;
    req->stop = DUET_NEW_ARRAY(char *, n);
    if (req->stop == NULL)
        return DUET__OOM(err);
    for (v = cJSON_IsString(s) ? s : s->child; i < n && v != NULL; v = v->next, i++) {
        if (!cJSON_IsString(v) || v->valuestring[0] == '\0')
            return duet_router_oai_fail(err, 400, "stop", NULL,
                                        "stop sequences must be non-empty strings");
        if ((req->stop[i] = duet_strdup(v->valuestring)) == NULL)
            return DUET__OOM(err);
        req->n_stop = i + 1;
    }
    return DUET_OK;
}

static duet_status_t duet__parse_bool(const cJSON *root, const char *key, bool *out,
                                      duet_router_oai_error_t *err)
{
    const cJSON *v = duet__oai_field(root, key);
    if (v == NULL)
        return DUET_OK;
    if (!cJSON_IsBool(v))
        return duet_router_oai_fail(err, 400, key, NULL, "%s must be a boolean", key);
    *out = cJSON_IsTrue(v);
    return DUET_OK;
}

static duet_status_t duet__parse_number(const cJSON *root, const char *key, double lo, double hi,
                                        bool lo_open, double *out, duet_router_oai_error_t *err)
{
    const cJSON *v = duet__oai_field(root, key);
    if (v == NULL)
        return DUET_OK;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return duet_router_oai_fail(err, 400, key, NULL, "%s must be a number", key);
    if (v->valuedouble < lo || v->valuedouble > hi || (lo_open && v->valuedouble == lo))
        return duet_router_oai_fail(err, 400, key, NULL, "%s must be in %s%g, %g]: got %g", key,
                                    lo_open ? "(" : "[", lo, hi, v->valuedouble);
    *out = v->valuedouble;
    return DUET_OK;
}

/* Options this server does not implement: refuse non-default values rather
 * than silently ignoring them. */
static duet_status_t duet__parse_unsupported(const cJSON *root, duet_router_oai_error_t *err)
{
    const cJSON *v;

    /* n, best_of, echo, logprobs, top_logprobs: openai_choices.c */
    if ((v = duet__oai_field(root, "suffix")) != NULL &&
        !(cJSON_IsString(v) && v->valuestring[0] == '\0'))
        return duet_router_oai_fail(err, 400, "suffix", NULL, "suffix is not supported");
    /* null and {} change nothing: accepted; any bias is refused */
    if ((v = duet__oai_field(root, "logit_bias")) != NULL &&
        !(cJSON_IsObject(v) && v->child == NULL))
        return duet_router_oai_fail(err, 400, "logit_bias", NULL,
                                    "logit_bias is not supported (only {} or null)");
    if ((v = duet__oai_field(root, "tools")) != NULL && cJSON_GetArraySize(v) > 0)
        return duet_router_oai_fail(err, 400, "tools", NULL, "tools are not supported");
    static const char *const penalties[] = {"presence_penalty", "frequency_penalty"};
    for (size_t i = 0; i < 2; i++) {
        v = duet__oai_field(root, penalties[i]);
        if (v != NULL && !(cJSON_IsNumber(v) && v->valuedouble == 0.0))
            return duet_router_oai_fail(err, 400, penalties[i], NULL, "%s is not supported",
                                        penalties[i]);
    }
    return DUET_OK;
}

static duet_status_t duet__parse_sampling(const cJSON *root, const duet_router_oai_limits_t *lim,
                                          duet_router_oai_req_t *req, duet_router_oai_error_t *err)
{
    const cJSON *v;
    const char *mt_key = "max_tokens";
    duet_status_t st;

    v = duet__oai_field(root, "max_tokens");
    if (v == NULL && req->api == DUET_ROUTER_API_CHAT) {
        mt_key = "max_completion_tokens";
        v = duet__oai_field(root, mt_key);
    }
    if (v != NULL) {
        if (!duet__oai_int_in(v, -9.0e15, 9.0e15))
            return duet_router_oai_fail(err, 400, mt_key, NULL, "%s must be an integer", mt_key);
        if (v->valuedouble < 1)
            return duet_router_oai_fail(err, 400, mt_key, NULL, "%s must be at least 1, got %.0f",
                                        mt_key, v->valuedouble);
        if (v->valuedouble > (double)lim->max_tokens_limit)
            return duet_router_oai_fail(err, 400, mt_key, NULL, "%s must be at most %lld, got %.0f",
                                        mt_key, (long long)lim->max_tokens_limit, v->valuedouble);
        req->max_tokens = (int64_t)v->valuedouble;
    } else if (req->api == DUET_ROUTER_API_COMPLETIONS) {
        req->max_tokens = lim->default_max_tokens;
    }
    req->temperature = 1.0;
    req->top_p = 1.0;
    if ((st = duet__parse_number(root, "temperature", 0, 1e6, false, &req->temperature, err)) ||
        (st = duet__parse_number(root, "top_p", 0, 1, true, &req->top_p, err)))
        return st;
    if ((v = duet__oai_field(root, "top_k")) != NULL) {
        if (!duet__oai_int_in(v, -1, 2147483647.0))
            return duet_router_oai_fail(err, 400, "top_k", NULL,
                                        "top_k must be an integer >= -1 (-1 or 0 = off)");
        req->top_k = v->valuedouble < 0 ? 0 : (int)v->valuedouble;
    }
    if ((v = duet__oai_field(root, "seed")) != NULL) {
        if (!duet__oai_int_in(v, -9.2e18, 1.8e19))
            return duet_router_oai_fail(err, 400, "seed", NULL, "seed must be an integer");
        req->has_seed = true;
        req->seed =
            v->valuedouble < 0 ? (uint64_t)(int64_t)v->valuedouble : (uint64_t)v->valuedouble;
    }
    if ((st = duet__parse_stop(duet__oai_field(root, "stop"), req, err)) != DUET_OK)
        return st;
    if ((v = duet__oai_field(root, "stop_token_ids")) != NULL) {
        if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) > DUET__OAI_MAX_STOP_IDS)
            return duet_router_oai_fail(err, 400, "stop_token_ids", NULL,
                                        "stop_token_ids must be an array of at most %d ids",
                                        DUET__OAI_MAX_STOP_IDS);
        if (cJSON_GetArraySize(v) > 0 &&
            (st = duet__oai_parse_ids(v, "stop_token_ids", lim->vocab_size, &req->stop_ids,
                                      &req->n_stop_ids, err)) != DUET_OK)
            return st;
    }
    return duet__parse_bool(root, "ignore_eos", &req->ignore_eos, err);
}

duet_status_t duet_router_oai_parse(const char *body, size_t len, duet_router_api_t api,
                                    const duet_router_oai_limits_t *limits,
                                    duet_router_oai_req_t *req, duet_router_oai_error_t *err)
{
    cJSON *root;
    const cJSON *v;
    duet_status_t st;

    memset(req, 0, sizeof(*req));
    req->api = api;
    req->add_generation_prompt = true;
    if ((st = duet_router_oai_check_body(body, len, err)) != DUET_OK)
        return st;
    const char *end = NULL;
    root = cJSON_ParseWithLengthOpts(body, len, &end, false);
    if (root == NULL)
        return duet_router_oai_fail(err, 400, NULL, NULL,
                                    "the request body is not valid JSON (near byte %zu)",
                                    (size_t)(cJSON_GetErrorPtr() ? cJSON_GetErrorPtr() - body : 0));
    while (end != NULL && end < body + len &&
           (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r'))
        end++;
    if (end != NULL && end < body + len) {
        st = duet_router_oai_fail(err, 400, NULL, NULL,
                                  "the request body has content after the JSON object (at byte "
                                  "%zu): send exactly one JSON object",
                                  (size_t)(end - body));
        goto err;
    }
    if (!cJSON_IsObject(root)) {
        st = duet_router_oai_fail(err, 400, NULL, NULL, "the request body must be a JSON object");
        goto err;
    }
    if ((v = duet__oai_field(root, "model")) != NULL) {
        if (!cJSON_IsString(v)) {
            st = duet_router_oai_fail(err, 400, "model", NULL, "model must be a string");
            goto err;
        }
        if ((req->model = duet_strdup(v->valuestring)) == NULL) {
            st = DUET__OOM(err);
            goto err;
        }
    }
    if (api == DUET_ROUTER_API_CHAT) {
        st = duet__parse_messages(duet__oai_field(root, "messages"), req, err);
        if (st == DUET_OK)
            st = duet__parse_bool(root, "add_generation_prompt", &req->add_generation_prompt, err);
    } else {
        st = duet__parse_prompt(duet__oai_field(root, "prompt"), limits, req, err);
    }
    if (st != DUET_OK || (st = duet__parse_unsupported(root, err)) != DUET_OK ||
        (st = duet_router_oai_parse_choices(root, req, err)) != DUET_OK ||
        (st = duet__parse_sampling(root, limits, req, err)) != DUET_OK ||
        (st = duet__parse_bool(root, "stream", &req->stream, err)) != DUET_OK)
        goto err;
    if ((v = duet__oai_field(root, "stream_options")) != NULL) {
        if (!cJSON_IsObject(v)) {
            st = duet_router_oai_fail(err, 400, "stream_options", NULL,
                                      "stream_options must be an object");
            goto err;
        }
        if ((st = duet__parse_bool(v, "include_usage", &req->include_usage, err)) != DUET_OK)
            goto err;
    }
    cJSON_Delete(root);
    return DUET_OK;

err:
    cJSON_Delete(root);
    duet_router_oai_req_cleanup(req);
    return st;
}

/* ---- responses ---- */

const char *duet_router_oai_finish_name(int reason)
{
    switch (reason) {
    case 1:
        return "length";
    case 2:
        return "stop";
    case 3:
        return "abort";
    default:
        return "stop";
    }
}

static void duet__meta_head(duet_router_buf_t *b, const duet_router_oai_meta_t *m,
                            const char *object)
{
    duet_router_buf_puts(b, "{\"id\":");
    duet_router_buf_json_str(b, m->id, strlen(m->id));
    duet_router_buf_printf(b, ",\"object\":\"%s\",\"created\":%lld,\"model\":", object,
                           (long long)m->created);
    duet_router_buf_json_str(b, m->model, strlen(m->model));
}

static void duet__oai_usage(duet_router_buf_t *b, const duet_router_oai_usage_t *u)
{
    duet_router_buf_printf(b,
                           "\"usage\":{\"prompt_tokens\":%u,\"completion_tokens\":%u,"
                           "\"total_tokens\":%u}",
                           u->prompt_tokens, u->completion_tokens,
                           u->prompt_tokens + u->completion_tokens);
}

bool duet_router_oai_render_response(duet_router_buf_t *b, const duet_router_oai_meta_t *m,
                                     const char *text, size_t len, const char *finish,
                                     const duet_router_oai_usage_t *usage)
{
    return duet_router_oai_render_response_head(b, m) &&
           duet_router_oai_render_choice(b, m->api, 0, text, len, NULL, 0, finish) &&
           duet_router_oai_render_response_tail(b, usage);
}

bool duet_router_oai_render_response_head(duet_router_buf_t *b, const duet_router_oai_meta_t *m)
{
    duet__meta_head(b, m, m->api == DUET_ROUTER_API_CHAT ? "chat.completion" : "text_completion");
    duet_router_buf_puts(b, ",\"choices\":[");
    return !b->oom;
}

bool duet_router_oai_render_response_tail(duet_router_buf_t *b,
                                          const duet_router_oai_usage_t *usage)
{
    duet_router_buf_puts(b, "],");
    duet__oai_usage(b, usage);
    duet_router_buf_puts(b, "}");
    return !b->oom;
}

bool duet_router_oai_render_chunk(duet_router_buf_t *b, const duet_router_oai_meta_t *m,
                                  const char *text, size_t len, const char *finish, bool role_first)
{
    return duet_router_oai_render_chunk_choice(b, m, 0, text, len, NULL, 0, finish, role_first);
}

void duet_router_oai_put_logprobs(duet_router_buf_t *b, const char *lp_json, size_t lp_len)
{
    duet_router_buf_puts(b, "\"logprobs\":");
    if (lp_json != NULL)
        duet_router_buf_append(b, lp_json, lp_len);
    else
        duet_router_buf_puts(b, "null");
}

bool duet_router_oai_render_chunk_choice(duet_router_buf_t *b, const duet_router_oai_meta_t *m,
                                         int index, const char *text, size_t len,
                                         const char *lp_json, size_t lp_len, const char *finish,
                                         bool role_first)
{
    bool chat = m->api == DUET_ROUTER_API_CHAT;

    duet_router_buf_puts(b, "data: ");
    duet__meta_head(b, m, chat ? "chat.completion.chunk" : "text_completion");
    duet_router_buf_printf(b, ",\"choices\":[{\"index\":%d,", index);
    if (chat) {
        duet_router_buf_puts(b, "\"delta\":{");
        if (role_first)
            duet_router_buf_puts(b, "\"role\":\"assistant\"");
        if (len > 0 || (role_first && finish == NULL)) {
            duet_router_buf_puts(b, role_first ? ",\"content\":" : "\"content\":");
            duet_router_buf_json_str(b, text, len);
        }
        duet_router_buf_puts(b, "},");
    } else {
        duet_router_buf_puts(b, "\"text\":");
        duet_router_buf_json_str(b, text, len);
        duet_router_buf_puts(b, ",");
    }
    duet_router_oai_put_logprobs(b, lp_json, lp_len);
    duet_router_buf_puts(b, ",\"finish_reason\":");
    if (finish)
        duet_router_buf_printf(b, "\"%s\"", finish);
    else
        duet_router_buf_puts(b, "null");
    duet_router_buf_puts(b, "}]}\n\n");
    return !b->oom;
}

bool duet_router_oai_render_usage_chunk(duet_router_buf_t *b, const duet_router_oai_meta_t *m,
                                        const duet_router_oai_usage_t *usage)
{
    bool chat = m->api == DUET_ROUTER_API_CHAT;

    duet_router_buf_puts(b, "data: ");
    duet__meta_head(b, m, chat ? "chat.completion.chunk" : "text_completion");
    duet_router_buf_puts(b, ",\"choices\":[],");
    duet__oai_usage(b, usage);
    duet_router_buf_puts(b, "}\n\n");
    return !b->oom;
}

bool duet_router_oai_render_error(duet_router_buf_t *b, const duet_router_oai_error_t *err)
{
    duet_router_buf_puts(b, "{\"error\":{\"message\":");
    duet_router_buf_json_str(b, err->message, strlen(err->message));
    duet_router_buf_puts(b, ",\"type\":");
    duet_router_buf_json_str(b, err->type, strlen(err->type));
    duet_router_buf_puts(b, ",\"param\":");
    if (err->param)
        duet_router_buf_json_str(b, err->param, strlen(err->param));
    else
        duet_router_buf_puts(b, "null");
    duet_router_buf_puts(b, ",\"code\":");
    if (err->code)
        duet_router_buf_json_str(b, err->code, strlen(err->code));
    else
        duet_router_buf_puts(b, "null");
    duet_router_buf_puts(b, "}}");
    return !b->oom;
}

/* ---- SSE ---- */

bool duet_router_sse_data(duet_router_buf_t *b, const char *payload, size_t len)
{
    size_t start = 0;

    for (size_t i = 0; i <= len; i++) {
        if (i == len || payload[i] == '\n') {
            size_t end = i;
            if (end > start && payload[end - 1] == '\r')
                end--;
            duet_router_buf_puts(b, "data: ");
            duet_router_buf_append(b, payload + start, end - start);
            duet_router_buf_puts(b, "\n");
            start = i + 1;
        }
    }
    duet_router_buf_puts(b, "\n");
    return !b->oom;
}

bool duet_router_sse_comment(duet_router_buf_t *b, const char *text)
{
    duet_router_buf_puts(b, ": ");
    for (const char *p = text; *p; p++) /* a comment is one line */
        duet_router_buf_append(b, (*p == '\n' || *p == '\r') ? " " : p, 1);
    duet_router_buf_puts(b, "\n\n");
    return !b->oom;
}

bool duet_router_sse_done(duet_router_buf_t *b)
{
    return duet_router_buf_puts(b, "data: [DONE]\n\n");
}

bool duet_router_sse_error(duet_router_buf_t *b, const duet_router_oai_error_t *err)
{
    duet_router_buf_t tmp;
    bool ok;

    duet_router_buf_init(&tmp);
    ok = duet_router_oai_render_error(&tmp, err) &&
         duet_router_sse_data(b, tmp.data + tmp.off, duet_router_buf_unread(&tmp));
    duet_router_buf_cleanup(&tmp);
    return ok;
}
