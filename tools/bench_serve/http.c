/* bench-serve's OpenAI backend: /v1/completions or /v1/chat/completions with
 * `stream: true` over libcurl's multi interface (one thread drives every
 * connection; HTTPS works through libcurl).  Each SSE `data:` event is
 * parsed as it arrives; an event whose choice carries text (completions:
 * choices[0].text, chat: choices[0].delta.content) is a token chunk and is
 * timestamped when curl hands its bytes over.  `usage` (stream_options.
 * include_usage) gives the exact token counts; without it the output is
 * counted in chunks. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "tools/bench_serve/bench_serve.h"

typedef struct {
    CURL *easy;
    struct curl_slist *hdrs;
    size_t idx;
    size_t n_ids;
    duet_bs_result_t *res;
    char *buf; /* bytes not yet parsed (SSE) or the error body */
    size_t len, cap;
    bool chat;
    bool raw; /* keep the body as it came (probes) */
    bool done_seen;
    bool failed_event;
} duet__xfer_t;

struct duet_bs_backend {
    duet_bs_backend_config_t cfg;
    char *url;
    CURLM *multi;
    size_t active;
};

void duet_bs_result_chunk(duet_bs_result_t *r, int64_t now)
{
    if (r->n_chunks == 0)
        r->first_ns = now;
    if (r->n_chunks == r->cap_chunks) {
        size_t nc = r->cap_chunks ? 2 * r->cap_chunks : 64;
        int64_t *g = duet_realloc(r->chunk_ns, nc * sizeof(*g));
        if (g == NULL) {
            r->n_chunks++; /* counted, not timed (ITL skips it) */
            return;
        }
        r->chunk_ns = g;
        r->cap_chunks = nc;
    }
    r->chunk_ns[r->n_chunks++] = now;
}

void duet_bs_result_fail(duet_bs_result_t *r, const char *fmt, ...)
{
    va_list ap;
    if (!r->ok && r->error[0])
        return; /* keep the first error */
    r->ok = false;
    va_start(ap, fmt);
    vsnprintf(r->error, sizeof(r->error), fmt, ap);
    va_end(ap);
}

static const char *duet__path(duet_bs_backend_kind_t kind)
{
    return kind == DUET_BS_OPENAI_CHAT ? "/v1/chat/completions" : "/v1/completions";
}

static char *duet__join(const char *base, const char *path)
{
    size_t bl = strlen(base);
    while (bl > 0 && base[bl - 1] == '/')
        bl--;
    /* a base URL that already ends in /v1 */
    if (bl >= 3 && strncmp(base + bl - 3, "/v1", 3) == 0)
        bl -= 3;
    size_t n = bl + strlen(path) + 1;
    char *s = duet_malloc(n);
    if (s != NULL)
        snprintf(s, n, "%.*s%s", (int)bl, base, path);
    return s;
}

/* The JSON body of one request (owned). */
static char *duet__body(const duet_bs_backend_config_t *cfg, const duet_bs_req_t *req, bool usage)
{
    char *text = NULL, *out = NULL;
    cJSON *o = cJSON_CreateObject(), *extra = NULL;
    if (o == NULL)
        return NULL;
    if (cfg->model != NULL)
        cJSON_AddStringToObject(o, "model", cfg->model);
    if (cfg->kind == DUET_BS_OPENAI_CHAT || cfg->text_prompts) {
        if ((text = duet_bs_prompt_text(req->ids, req->n_ids)) == NULL)
            goto delete_json;
    }
    if (cfg->kind == DUET_BS_OPENAI_CHAT) {
        cJSON *msgs = cJSON_AddArrayToObject(o, "messages"), *m = cJSON_CreateObject();
        cJSON_AddItemToArray(msgs, m);
        cJSON_AddStringToObject(m, "role", "user");
        cJSON_AddStringToObject(m, "content", text);
    } else if (text != NULL) {
        cJSON_AddStringToObject(o, "prompt", text);
    } else {
        cJSON *p = cJSON_AddArrayToObject(o, "prompt");
        for (size_t i = 0; p != NULL && i < req->n_ids; i++)
            cJSON_AddItemToArray(p, cJSON_CreateNumber(req->ids[i]));
    }
    cJSON_AddNumberToObject(o, "max_tokens", req->out_len);
    cJSON_AddNumberToObject(o, "temperature", cfg->temperature);
    cJSON_AddBoolToObject(o, "stream", true);
    if (usage) {
        cJSON *so = cJSON_AddObjectToObject(o, "stream_options");
        cJSON_AddBoolToObject(so, "include_usage", true);
    }
    if (cfg->ignore_eos)
        cJSON_AddBoolToObject(o, "ignore_eos", true);
    if (cfg->extra_body != NULL && (extra = cJSON_Parse(cfg->extra_body)) != NULL) {
        cJSON *e = extra->child;
        while (e != NULL) {
            cJSON *next = e->next;
            cJSON_DeleteItemFromObjectCaseSensitive(o, e->string);
            cJSON_AddItemToObject(o, e->string, cJSON_Duplicate(e, true));
            e = next;
        }
        cJSON_Delete(extra);
    }
    out = cJSON_PrintUnformatted(o);
delete_json:
    duet_free(text);
    cJSON_Delete(o);
    return out;
}

/* One SSE event's data. */
static void duet__event(duet__xfer_t *x, const char *data, int64_t now, bool chat)
{
    duet_bs_result_t *r = x->res;
    if (strcmp(data, "[DONE]") == 0) {
        x->done_seen = true;
        r->end_ns = now;
        return;
    }
    cJSON *o = cJSON_Parse(data);
    if (o == NULL) {
        duet_bs_result_fail(r, "SSE event is not JSON: %.80s", data);
        x->failed_event = true;
        return;
    }
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(o, "error");
    if (err != NULL && !cJSON_IsNull(err)) {
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(err, "message");
        duet_bs_result_fail(r, "stream error: %.150s",
                            cJSON_IsString(m) ? m->valuestring : "(no message)");
        x->failed_event = true;
    }
    const cJSON *ch = cJSON_GetObjectItemCaseSensitive(o, "choices");
    const cJSON *c0 = cJSON_IsArray(ch) ? cJSON_GetArrayItem(ch, 0) : NULL;
    if (c0 != NULL) {
        const cJSON *t = chat ? cJSON_GetObjectItemCaseSensitive(
                                    cJSON_GetObjectItemCaseSensitive(c0, "delta"), "content")
                              : cJSON_GetObjectItemCaseSensitive(c0, "text");
        if (cJSON_IsString(t) && t->valuestring[0] != '\0')
            duet_bs_result_chunk(r, now);
    }
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(o, "usage");
    if (cJSON_IsObject(u)) {
        const cJSON *pt = cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens");
        const cJSON *ct = cJSON_GetObjectItemCaseSensitive(u, "completion_tokens");
        if (cJSON_IsNumber(pt) && cJSON_IsNumber(ct)) {
            r->prompt_tokens = (long)pt->valuedouble;
            r->output_tokens = (long)ct->valuedouble;
            r->usage = true;
        }
    }
    cJSON_Delete(o);
}

/* Parse the complete events in x->buf, keep the rest. */
static void duet__parse(duet__xfer_t *x, int64_t now, bool chat)
{
    size_t start = 0;
    for (;;) {
        char *b = x->buf + start, *end = NULL;
        size_t sep = 0;
        for (char *p = b; p + 1 < x->buf + x->len; p++) {
            if (p[0] == '\n' && p[1] == '\n') {
                end = p, sep = 2;
                break;
            }
            if (p + 3 < x->buf + x->len && memcmp(p, "\r\n\r\n", 4) == 0) {
                end = p, sep = 4;
                break;
            }
        }
        if (end == NULL)
            break;
        *end = '\0';
        /* the data: lines of the event, joined with \n */
        char *data = duet_malloc((size_t)(end - b) + 1), *d = data;
        if (data == NULL)
            break;
        for (char *line = b; line < end;) {
            char *nl = strchr(line, '\n');
            char *le = nl ? nl : end;
            if (le > line && le[-1] == '\r')
                le[-1] = '\0';
            if (strncmp(line, "data:", 5) == 0) {
                const char *v = line[5] == ' ' ? line + 6 : line + 5;
                size_t vl = strnlen(v, (size_t)(le - v));
                if (d != data)
                    *d++ = '\n';
                memcpy(d, v, vl);
                d += vl;
            }
            line = le + 1;
        }
        *d = '\0';
        if (d != data)
            duet__event(x, data, now, chat);
        duet_free(data);
        start = (size_t)(end - x->buf) + sep;
    }
    memmove(x->buf, x->buf + start, x->len - start);
    x->len -= start;
}

static size_t duet__on_write(char *ptr, size_t size, size_t nmemb, void *arg)
{
    duet__xfer_t *x = arg;
    int64_t now = duet_now_ns();
    size_t n = size * nmemb;
    long code = 0;
    curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &code);
    if (x->len + n + 1 > x->cap) {
        size_t nc = x->cap ? x->cap : 4096;
        while (nc < x->len + n + 1)
            nc *= 2;
        char *g = duet_realloc(x->buf, nc);
        if (g == NULL)
            return 0; /* curl fails the transfer */
        x->buf = g;
        x->cap = nc;
    }
    memcpy(x->buf + x->len, ptr, n);
    x->len += n;
    x->buf[x->len] = '\0';
    if (code == 200 && !x->raw)
        duet__parse(x, now, x->chat);
    return n;
}

static duet_status_t duet__http_create(const duet_bs_backend_config_t *cfg,
                                       duet_bs_backend_t **be_p)
{
    duet_bs_backend_t *be = DUET_NEW(duet_bs_backend_t);
    if (be == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "bench-serve: backend");
    be->cfg = *cfg;
    be->url = duet__join(cfg->base_url, duet__path(cfg->kind));
    be->multi = curl_multi_init();
    if (be->url == NULL || be->multi == NULL) {
        curl_multi_cleanup(be->multi);
        duet_free(be->url);
        duet_free(be);
        return duet_error(DUET_ERR_NO_MEMORY, "bench-serve: libcurl multi handle");
    }
    *be_p = be;
    return DUET_OK;
}

static void duet__xfer_free(duet__xfer_t *x)
{
    curl_slist_free_all(x->hdrs);
    curl_easy_cleanup(x->easy);
    duet_free(x->buf);
    duet_free(x);
}

/* The common headers of a JSON request (owned list). */
static struct curl_slist *duet__headers(const duet_bs_backend_config_t *cfg)
{
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    h = curl_slist_append(h, "Accept: text/event-stream");
    if (cfg->api_key != NULL && cfg->api_key[0]) {
        char auth[1024];
        snprintf(auth, sizeof(auth), "Authorization: Bearer %s", cfg->api_key);
        h = curl_slist_append(h, auth);
    }
    return h;
}

static duet_status_t duet__http_start(duet_bs_backend_t *be, size_t idx, const duet_bs_req_t *req,
                                      duet_bs_result_t *res)
{
    duet__xfer_t *x = DUET_NEW(duet__xfer_t);
    char *body = duet__body(&be->cfg, req, be->cfg.usage);
    memset(res, 0, sizeof(*res));
    res->ok = true;
    if (x == NULL || body == NULL || (x->easy = curl_easy_init()) == NULL ||
        (x->hdrs = duet__headers(&be->cfg)) == NULL) {
        free(body);
        if (x != NULL)
            duet__xfer_free(x);
        return duet_error(DUET_ERR_NO_MEMORY, "bench-serve: request %zu", idx);
    }
    x->idx = idx;
    x->res = res;
    x->n_ids = req->n_ids;
    x->chat = be->cfg.kind == DUET_BS_OPENAI_CHAT;
    curl_easy_setopt(x->easy, CURLOPT_URL, be->url);
    curl_easy_setopt(x->easy, CURLOPT_HTTPHEADER, x->hdrs);
    curl_easy_setopt(x->easy, CURLOPT_COPYPOSTFIELDS, body);
    curl_easy_setopt(x->easy, CURLOPT_WRITEFUNCTION, duet__on_write);
    curl_easy_setopt(x->easy, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(x->easy, CURLOPT_PRIVATE, x);
    curl_easy_setopt(x->easy, CURLOPT_NOSIGNAL, 1L);
    if (be->cfg.timeout_ms > 0)
        curl_easy_setopt(x->easy, CURLOPT_TIMEOUT_MS, be->cfg.timeout_ms);
    free(body);
    res->start_ns = duet_now_ns();
    if (curl_multi_add_handle(be->multi, x->easy) != CURLM_OK) {
        duet__xfer_free(x);
        return duet_error(DUET_ERR_INTERNAL, "bench-serve: curl_multi_add_handle");
    }
    be->active++;
    return DUET_OK;
}

static void duet__finish(duet_bs_backend_t *be, duet__xfer_t *x, CURLcode cc)
{
    duet_bs_result_t *r = x->res;
    long code = 0;
    int64_t now = duet_now_ns();
    curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &code);
    if (cc != CURLE_OK) {
        duet_bs_result_fail(r, "%s", curl_easy_strerror(cc));
    } else if (code != 200) {
        duet_bs_result_fail(r, "HTTP %ld: %.150s", code, x->buf ? x->buf : "");
    } else if (!x->done_seen && !x->failed_event) {
        duet_bs_result_fail(r, "the stream ended without data: [DONE]");
    } else if (r->ok && r->n_chunks == 0) {
        duet_bs_result_fail(r, "no tokens streamed");
    }
    if (r->end_ns == 0)
        r->end_ns = now;
    if (!r->usage) {
        r->prompt_tokens = (long)x->n_ids;
        r->output_tokens = (long)r->n_chunks;
    }
    curl_multi_remove_handle(be->multi, x->easy);
    be->active--;
    duet__xfer_free(x);
}

static void duet__http_poll(duet_bs_backend_t *be, int64_t timeout_ns, duet_bs_done_cb done,
                            void *arg)
{
    int running = 0, left = 0;
    CURLMsg *m;
    int ms = (int)(timeout_ns / DUET_NS_PER_MS);
    curl_multi_perform(be->multi, &running);
    while ((m = curl_multi_info_read(be->multi, &left)) != NULL) {
        if (m->msg != CURLMSG_DONE)
            continue;
        duet__xfer_t *x = NULL;
        curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&x);
        size_t idx = x->idx;
        duet__finish(be, x, m->data.result);
        done(idx, arg);
    }
    if (ms > 0)
        curl_multi_poll(be->multi, NULL, 0, ms, NULL);
}

static void duet__http_destroy(duet_bs_backend_t *be)
{
    if (be == NULL)
        return;
    curl_multi_cleanup(be->multi);
    duet_free(be->url);
    duet_free(be);
}

/* A blocking request: GET when body is NULL.  *resp owned (NUL-terminated). */
static duet_status_t duet__once(const duet_bs_backend_config_t *cfg, const char *url,
                                const char *body, long *code, char **resp)
{
    duet__xfer_t x = {0};
    duet_status_t st = DUET_OK;
    CURLcode cc;
    *resp = NULL;
    if ((x.easy = curl_easy_init()) == NULL || (x.hdrs = duet__headers(cfg)) == NULL) {
        st = duet_error(DUET_ERR_NO_MEMORY, "bench-serve: libcurl handle");
        goto cleanup_easy;
    }
    curl_easy_setopt(x.easy, CURLOPT_URL, url);
    curl_easy_setopt(x.easy, CURLOPT_HTTPHEADER, x.hdrs);
    if (body != NULL)
        curl_easy_setopt(x.easy, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(x.easy, CURLOPT_WRITEFUNCTION, duet__on_write);
    curl_easy_setopt(x.easy, CURLOPT_WRITEDATA, &x);
    curl_easy_setopt(x.easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(x.easy, CURLOPT_TIMEOUT_MS, cfg->timeout_ms > 0 ? cfg->timeout_ms : 60000L);
    x.raw = true;
    if ((cc = curl_easy_perform(x.easy)) != CURLE_OK) {
        st = duet_error(DUET_ERR_PEER, "bench-serve: %s %s: %s", body ? "POST" : "GET", url,
                        curl_easy_strerror(cc));
        goto cleanup_easy;
    }
    curl_easy_getinfo(x.easy, CURLINFO_RESPONSE_CODE, code);
    *resp = x.buf ? x.buf : duet_strdup("");
    x.buf = NULL;
cleanup_easy:
    curl_slist_free_all(x.hdrs);
    curl_easy_cleanup(x.easy);
    duet_free(x.buf);
    return st;
}

duet_status_t duet_bs_http_probe(duet_bs_backend_config_t *cfg, char **model_p)
{
    duet_status_t st;
    long code = 0;
    char *resp = NULL, *url = NULL, *body = NULL;
    *model_p = NULL;
    if (cfg->model == NULL) {
        cJSON *o = NULL;
        const cJSON *id = NULL;
        if ((url = duet__join(cfg->base_url, "/v1/models")) == NULL)
            return duet_error(DUET_ERR_NO_MEMORY, "bench-serve: url");
        if ((st = duet__once(cfg, url, NULL, &code, &resp)) != DUET_OK)
            goto free_probe;
        if (code == 200 && (o = cJSON_Parse(resp)) != NULL)
            id = cJSON_GetObjectItemCaseSensitive(
                cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "data"), 0), "id");
        if (!cJSON_IsString(id)) {
            cJSON_Delete(o);
            st = duet_error(DUET_ERR_PEER,
                            "bench-serve: GET %s: HTTP %ld, no model id (pass --model): %.200s",
                            url, code, resp);
            goto free_probe;
        }
        *model_p = duet_strdup(id->valuestring);
        cJSON_Delete(o);
        cfg->model = *model_p;
        duet_free(url);
        duet_free(resp);
        url = resp = NULL;
    }
    int32_t ids[4] = {10, 11, 12, 13};
    duet_bs_req_t req = {.ids = ids, .n_ids = 4, .out_len = 2};
    if ((url = duet__join(cfg->base_url, duet__path(cfg->kind))) == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "bench-serve: url");
    for (int attempt = 0; attempt < 2; attempt++) {
        free(body);
        duet_free(resp);
        resp = NULL;
        if ((body = duet__body(cfg, &req, cfg->usage)) == NULL) {
            st = duet_error(DUET_ERR_NO_MEMORY, "bench-serve: request body");
            goto free_probe;
        }
        if ((st = duet__once(cfg, url, body, &code, &resp)) != DUET_OK)
            goto free_probe;
        if (code == 400 && cfg->usage && strstr(resp, "stream_options") != NULL) {
            fprintf(stderr, "bench-serve: the server refuses stream_options; token counts "
                            "come from the streamed chunks\n");
            cfg->usage = false;
            continue;
        }
        break;
    }
    if (code != 200 || strstr(resp, "data:") == NULL)
        st = duet_error(DUET_ERR_PEER, "bench-serve: POST %s: HTTP %ld: %.300s", url, code, resp);
free_probe:
    if (st != DUET_OK) {
        if (*model_p != NULL)
            cfg->model = NULL;
        duet_free(*model_p);
        *model_p = NULL;
    }
    free(body);
    duet_free(resp);
    duet_free(url);
    return st;
}

const duet_bs_backend_ops_t duet_bs_http_ops = {
    .create = duet__http_create,
    .start = duet__http_start,
    .poll = duet__http_poll,
    .destroy = duet__http_destroy,
};
