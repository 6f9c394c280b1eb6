/* The router's HTTP server on libmicrohttpd: epoll worker threads with
 * suspend/resume, routing, auth, body limits, and the small endpoints
 * (/health, /metrics, /workers, /v1/models).  Completions are in
 * http_gen.c. */
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "router/http/http_internal.h"

#define DUET__MAX_TICK_CANCELS 64

void duet__http_hreq_unref(duet__hreq_t *r)
{
    if (atomic_fetch_sub(&r->refs, 1) != 1)
        return;
    duet_router_buf_cleanup(&r->body);
    duet_router_buf_cleanup(&r->out);
    duet__http_gen_free(r);
    pthread_mutex_destroy(&r->lock);
    duet_free(r);
}

void duet__http_hreq_suspend_locked(duet__hreq_t *r)
{
    r->suspended = true;
    MHD_suspend_connection(r->conn);
}

void duet__http_hreq_resume_locked(duet__hreq_t *r)
{
    if (r->suspended) {
        r->suspended = false;
        if (!atomic_load(&r->http->stopped))
            MHD_resume_connection(r->conn);
    }
}

enum MHD_Result duet__http_respond(duet__hreq_t *r, unsigned status, const char *content_type,
                                   const char *data, size_t len)
{
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(len, (void *)data, MHD_RESPMEM_MUST_COPY);
    enum MHD_Result ret;

    if (resp == NULL)
        return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    if (r->id[0])
        MHD_add_response_header(resp, "X-Request-Id", r->id);
    if (status == 429 || status == 503)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    if (status == 401)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (r->close_after)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    if (status == 405)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW,
                                r->route == DUET_ROUTER_ROUTE_COMPLETIONS ||
                                        r->route == DUET_ROUTER_ROUTE_CHAT
                                    ? "POST"
                                    : "GET");
    ret = MHD_queue_response(r->conn, status, resp);
    MHD_destroy_response(resp);
    r->responded = true;
    duet_router_metrics_http(&r->http->rt->metrics, r->route, (int)status);
    return ret;
}

enum MHD_Result duet__http_respond_error(duet__hreq_t *r, const duet_router_oai_error_t *err)
{
    duet_router_buf_t b;
    enum MHD_Result ret;

    duet_router_buf_init(&b);
    duet_router_oai_render_error(&b, err);
    ret = b.oom ? MHD_NO
                : duet__http_respond(r, (unsigned)err->status, "application/json", b.data, b.len);
    duet_router_buf_cleanup(&b);
    return ret;
}

static enum MHD_Result duet__respond_buf(duet__hreq_t *r, unsigned status, const char *ctype,
                                         duet_router_buf_t *b)
{
    enum MHD_Result ret =
        b->oom ? MHD_NO : duet__http_respond(r, status, ctype, b->data ? b->data : "", b->len);
    duet_router_buf_cleanup(b);
    return ret;
}

/* ---- small endpoints ---- */

static enum MHD_Result duet__http_health(duet__hreq_t *r)
{
    duet_router_t *rt = r->http->rt;
    duet_router_workers_t *w = rt->workers;
    bool draining = atomic_load(&rt->draining), ready = duet_router_workers_ready(w);
    duet_router_buf_t b;

    duet_router_buf_init(&b);
    duet_router_buf_printf(&b, "{\"status\":\"%s\",\"model\":",
                           draining ? "draining"
                           : ready  ? "ready"
                                    : "not_ready");
    duet_router_buf_json_str(&b, rt->model_name, strlen(rt->model_name));
    duet_router_buf_printf(&b,
                           ",\"prefill\":{\"healthy\":%zu,\"total\":%zu},"
                           "\"decode\":{\"healthy\":%zu,\"total\":%zu}}\n",
                           duet_router_workers_healthy(w, DUET_ROLE_PREFILL),
                           duet_router_workers_active(w, DUET_ROLE_PREFILL),
                           duet_router_workers_healthy(w, DUET_ROLE_DECODE),
                           duet_router_workers_active(w, DUET_ROLE_DECODE));
    return duet__respond_buf(r, ready && !draining ? 200 : 503, "application/json", &b);
}

static void duet__model_json(duet_router_buf_t *b, const duet_router_t *rt)
{
    duet_router_buf_puts(b, "{\"id\":");
    duet_router_buf_json_str(b, rt->model_name, strlen(rt->model_name));
    duet_router_buf_printf(b,
                           ",\"object\":\"model\",\"created\":%lld,\"owned_by\":\"duet\","
                           "\"max_model_len\":%d}",
                           (long long)rt->started_unix, rt->context_len);
}

static enum MHD_Result duet__models(duet__hreq_t *r, const char *url)
{
    duet_router_t *rt = r->http->rt;
    duet_router_buf_t b;
    duet_router_oai_error_t err;

    duet_router_buf_init(&b);
    if (strcmp(url, "/v1/models") == 0) {
        duet_router_buf_puts(&b, "{\"object\":\"list\",\"data\":[");
        duet__model_json(&b, rt);
        duet_router_buf_puts(&b, "]}\n");
        return duet__respond_buf(r, 200, "application/json", &b);
    }
    if (strcmp(url + strlen("/v1/models/"), rt->model_name) == 0) {
        duet__model_json(&b, rt);
        duet_router_buf_puts(&b, "\n");
        return duet__respond_buf(r, 200, "application/json", &b);
    }
    duet_router_buf_cleanup(&b);
    duet_router_oai_fail(&err, 404, "model", "model_not_found", "the model '%s' does not exist",
                         url + strlen("/v1/models/"));
    return duet__http_respond_error(r, &err);
}

static void duet__worker_json(duet_router_buf_t *b, const duet_router_worker_info_t *wi)
{
    duet_router_buf_printf(b, "{\"role\":\"%s\",\"name\":", duet_role_name(wi->role));
    duet_router_buf_json_str(b, wi->name, strlen(wi->name));
    duet_router_buf_puts(b, ",\"address\":");
    duet_router_buf_json_str(b, wi->address, strlen(wi->address));
    duet_router_buf_puts(b, ",\"group\":");
    duet_router_buf_json_str(b, wi->group, strlen(wi->group));
    duet_router_buf_printf(b, ",\"state\":\"%s\"",
                           wi->state == DUET_ROUTER_WORKER_LEAVING ? "leaving" : "active");
    duet_router_buf_printf(b,
                           ",\"healthy\":%s,\"tp\":%u,\"load\":%.3f,\"inflight\":%lld,"
                           "\"queue_depth\":%u,\"running\":%u,\"free_pages\":%u,"
                           "\"total_pages\":%u,\"draining\":%s,\"max_context\":%u,"
                           "\"checks\":%llu,\"failures\":%llu,\"last_ok_ms_ago\":%lld,"
                           "\"instance_id\":",
                           wi->healthy ? "true" : "false", wi->tp, wi->load,
                           (long long)wi->inflight, wi->queue_depth, wi->running, wi->free_pages,
                           wi->total_pages, wi->draining ? "true" : "false", wi->max_context,
                           (unsigned long long)wi->checks, (unsigned long long)wi->failures,
                           (long long)wi->last_ok_ms_ago);
    duet_router_buf_json_str(b, wi->instance_id, strlen(wi->instance_id));
    if (wi->role == DUET_ROLE_DECODE) /* colocated mode (docs/design-notes.md) */
        duet_router_buf_printf(b,
                               ",\"prefill_local\":\"%s\",\"prefills_local\":%llu,"
                               "\"prefills_remote\":%llu",
                               wi->prefill_local == DUET_PREFILL_LOCAL_ALWAYS ? "always"
                               : wi->prefill_local == DUET_PREFILL_LOCAL_AUTO ? "auto"
                                                                              : "off",
                               (unsigned long long)wi->prefills_local,
                               (unsigned long long)wi->prefills_remote);
    duet_router_buf_puts(b, ",\"last_error\":");
    duet_router_buf_json_str(b, wi->last_error, strlen(wi->last_error));
    duet_router_buf_puts(b, "}");
}

static enum MHD_Result duet__workers(duet__hreq_t *r)
{
    duet_router_t *rt = r->http->rt;
    duet_router_buf_t b;
    bool first = true;

    duet_router_buf_init(&b);
    duet_router_buf_printf(&b, "{\"policy\":\"%s\",\"workers\":[",
                           duet_router_policy_name(rt->policy));
    for (int role = 0; role < 2; role++) {
        for (size_t i = 0; i < duet_router_workers_count(rt->workers, role); i++) {
            duet_router_worker_info_t wi;
            if (!duet_router_workers_snapshot(rt->workers, role, (int)i, &wi))
                continue; /* a free slot */
            if (!first)
                duet_router_buf_puts(&b, ",");
            first = false;
            duet__worker_json(&b, &wi);
        }
    }
    duet_router_buf_puts(&b, "]}\n");
    return duet__respond_buf(r, 200, "application/json", &b);
}

static enum MHD_Result duet__metrics(duet__hreq_t *r)
{
    duet_router_t *rt = r->http->rt;
    duet_router_buf_t b;
    int running, queued;

    pthread_mutex_lock(&rt->adm_lock);
    running = rt->running;
    queued = rt->queued;
    pthread_mutex_unlock(&rt->adm_lock);
    duet_router_buf_init(&b);
    duet_router_metrics_render(&rt->metrics, &b);
    duet_router_buf_printf(&b,
                           "# HELP duet_router_queue_depth Requests waiting for admission\n"
                           "# TYPE duet_router_queue_depth gauge\nduet_router_queue_depth %d\n"
                           "# HELP duet_router_inflight_requests Requests admitted and running\n"
                           "# TYPE duet_router_inflight_requests gauge\n"
                           "duet_router_inflight_requests %d\n",
                           queued, running);
    static const char *const gauges[][2] = {
        {"worker_healthy", "1 when the worker is in rotation"},
        {"worker_load", "Load score used by the policies (lower is better)"},
        {"worker_inflight", "This router's requests on the worker"},
        {"worker_queue_depth", "Worker queue depth from its Info"},
        {"worker_running", "Requests running on the worker from its Info"},
        {"worker_free_pages", "Free KV pages from the worker's Info"},
        {"worker_total_pages", "KV pages from the worker's Info"},
        {"worker_tp", "Tensor-parallel size of the worker"},
        {"worker_prefills_local", "Decode: prompts it prefilled itself, from its Info"},
        {"worker_prefills_remote", "Decode: prompts sent to a prefill worker, from its Info"},
        {"worker_decode_steps", "Decode: scheduler steps that ran the engine, from its Info"},
        {"worker_decode_forward_seconds", "Decode: engine time in those steps, from its Info"},
        {"worker_decode_cycles", "Decode: steps that followed another within 1 s, from its Info"},
        {"worker_decode_cycle_seconds",
         "Decode: start-to-start time of those steps (the running streams' TPOT), from its Info"},
    };
    for (size_t g = 0; g < sizeof(gauges) / sizeof(gauges[0]); g++) {
        duet_router_buf_printf(&b, "# HELP duet_router_%s %s\n# TYPE duet_router_%s gauge\n",
                               gauges[g][0], gauges[g][1], gauges[g][0]);
        for (int role = 0; role < 2; role++) {
            for (size_t i = 0; i < duet_router_workers_count(rt->workers, role); i++) {
                duet_router_worker_info_t wi;
                double v;
                if (!duet_router_workers_snapshot(rt->workers, role, (int)i, &wi))
                    continue; /* a free slot */
                switch (g) {
                case 0:
                    v = wi.healthy;
                    break;
                case 1:
                    v = wi.load;
                    break;
                case 2:
                    v = (double)wi.inflight;
                    break;
                case 3:
                    v = wi.queue_depth;
                    break;
                case 4:
                    v = wi.running;
                    break;
                case 5:
                    v = wi.free_pages;
                    break;
                case 6:
                    v = wi.total_pages;
                    break;
                case 7:
                    v = wi.tp;
                    break;
                case 8:
                    v = (double)wi.prefills_local;
                    break;
                case 9:
                    v = (double)wi.prefills_remote;
                    break;
                case 10:
                    v = (double)wi.steps;
                    break;
                case 11:
                    v = (double)wi.forward_ns / 1e9;
                    break;
                case 12:
                    v = (double)wi.cycles;
                    break;
                default:
                    v = (double)wi.cycle_ns / 1e9;
                    break;
                }
                duet_router_buf_printf(&b, "duet_router_%s{role=\"%s\",name=\"%s\"} %g\n",
                                       gauges[g][0], duet_role_name(role), wi.name, v);
            }
        }
    }
    duet_router_workers_cache_render(rt->workers, &b);
    duet_router_cache_metrics_render(rt->workers, &b);
    return duet__respond_buf(r, 200, "text/plain; version=0.0.4; charset=utf-8", &b);
}

/* ---- routing ---- */

static duet_router_route_t duet__route(const char *url)
{
    if (strcmp(url, "/v1/completions") == 0)
        return DUET_ROUTER_ROUTE_COMPLETIONS;
    if (strcmp(url, "/v1/chat/completions") == 0)
        return DUET_ROUTER_ROUTE_CHAT;
    if (strcmp(url, "/v1/models") == 0 || (strncmp(url, "/v1/models/", 11) == 0 && url[11] != '\0'))
        return DUET_ROUTER_ROUTE_MODELS;
    if (strcmp(url, "/health") == 0)
        return DUET_ROUTER_ROUTE_HEALTH;
    if (strcmp(url, "/metrics") == 0)
        return DUET_ROUTER_ROUTE_METRICS;
    if (strcmp(url, "/workers") == 0)
        return DUET_ROUTER_ROUTE_WORKERS;
    return DUET_ROUTER_ROUTE_OTHER;
}

static duet__hreq_t *duet__hreq_new(duet_router_http_t *http, struct MHD_Connection *conn)
{
    duet__hreq_t *r = DUET_NEW(duet__hreq_t);
    const union MHD_ConnectionInfo *ci;

    if (r == NULL)
        return NULL;
    r->http = http;
    r->conn = conn;
    atomic_init(&r->refs, 1);
    r->fd = -1;
    ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci)
        r->fd = ci->connect_fd;
    duet_router_buf_init(&r->body);
    duet_router_buf_init(&r->out);
    pthread_mutex_init(&r->lock, NULL);
    pthread_mutex_lock(&http->lock);
    r->next = http->reqs;
    if (http->reqs)
        http->reqs->prev = r;
    http->reqs = r;
    http->n_reqs++;
    pthread_mutex_unlock(&http->lock);
    return r;
}

/* First call for a request: route, method, auth, declared body size. */
static enum MHD_Result duet__hreq_begin(duet__hreq_t *r, const char *url, const char *method,
                                        const char *version)
{
    duet_router_t *rt = r->http->rt;
    duet_router_oai_error_t err;
    bool post = r->route == DUET_ROUTER_ROUTE_COMPLETIONS || r->route == DUET_ROUTER_ROUTE_CHAT;
    bool want_post = strcmp(method, MHD_HTTP_METHOD_POST) == 0;
    bool want_get = strcmp(method, MHD_HTTP_METHOD_GET) == 0;
    enum MHD_Result framing_ret;

    if (duet__http_framing_bad(r, method, version, &framing_ret))
        return framing_ret;
    if (r->route == DUET_ROUTER_ROUTE_OTHER) {
        duet_router_oai_fail(&err, 404, NULL, "not_found", "no route %s %s", method, url);
        return duet__http_respond_error(r, &err);
    }
    if ((post && !want_post) || (!post && !want_get)) {
        duet_router_oai_fail(&err, 405, NULL, "method_not_allowed",
                             "%s is not allowed on %s (use %s)", method, url,
                             post ? "POST" : "GET");
        return duet__http_respond_error(r, &err);
    }
    if (r->route != DUET_ROUTER_ROUTE_HEALTH && r->route != DUET_ROUTER_ROUTE_METRICS) {
        const char *auth =
            MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
        if (!duet_router_auth_ok(rt, auth, auth ? strlen(auth) : 0)) {
            duet_router_oai_fail(&err, 401, NULL, "invalid_api_key",
                                 auth ? "incorrect API key provided"
                                      : "missing API key: send Authorization: Bearer <key>");
            return duet__http_respond_error(r, &err);
        }
    }
    switch (r->route) {
    case DUET_ROUTER_ROUTE_HEALTH:
        return duet__http_health(r);
    case DUET_ROUTER_ROUTE_METRICS:
        return duet__metrics(r);
    case DUET_ROUTER_ROUTE_WORKERS:
        return duet__workers(r);
    case DUET_ROUTER_ROUTE_MODELS:
        return duet__models(r, url);
    default:
        break;
    }
    const char *cl =
        MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl != NULL && strtoull(cl, NULL, 10) > (unsigned long long)rt->cfg->router.max_body_bytes) {
        duet_router_oai_fail(&err, 413, NULL, "request_too_large",
                             "the request body (%s bytes) is larger than %d bytes", cl,
                             rt->cfg->router.max_body_bytes);
        return duet__http_respond_error(r, &err);
    }
    return MHD_YES;
}

static enum MHD_Result duet__access(void *cls, struct MHD_Connection *conn, const char *url,
                                    const char *method, const char *version,
                                    const char *upload_data, size_t *upload_data_size,
                                    void **con_cls)
{
    duet_router_http_t *http = cls;
    duet__hreq_t *r = *con_cls;
    duet_router_oai_error_t err;

    if (r == NULL) {
        if ((r = duet__hreq_new(http, conn)) == NULL)
            return MHD_NO;
        *con_cls = r;
        /* the header is complete: from here on the long timeout (the
         * completed callback restores the header timeout) */
        MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT,
                                  (unsigned)DUET__HTTP_REQUEST_TIMEOUT_S);
        r->route = duet__route(url);
        return duet__hreq_begin(r, url, method, version);
    }
    if (r->responded)
        return MHD_YES; /* discarding the rest of an upload we already answered */
    if (*upload_data_size > 0) {
        if (!r->too_large) {
            if (r->body.len + *upload_data_size > (size_t)http->rt->cfg->router.max_body_bytes)
                return duet__http_upload_too_large(r);
            if (!duet_router_buf_append(&r->body, upload_data, *upload_data_size)) {
                return MHD_NO;
            }
        }
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (r->too_large) {
        duet_router_oai_fail(&err, 413, NULL, "request_too_large",
                             "the request body is larger than %d bytes",
                             http->rt->cfg->router.max_body_bytes);
        return duet__http_respond_error(r, &err);
    }
    return duet__http_gen_handle(r);
}

static void duet__completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                            enum MHD_RequestTerminationCode toe)
{
    duet_router_http_t *http = cls;
    duet__hreq_t *r = *con_cls;

    /* a keep-alive connection waits for its next request header under the
     * header timeout again (COMPLETED_OK: the connection is MHD's and in
     * its timeout lists; not on shutdown or error paths) */
    if (toe == MHD_REQUEST_TERMINATED_COMPLETED_OK)
        MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT, http->header_timeout_s);
    if (r == NULL)
        return;
    *con_cls = NULL;
    pthread_mutex_lock(&r->lock);
    r->conn_gone = true;
    pthread_mutex_unlock(&r->lock);
    pthread_mutex_lock(&http->lock);
    if (r->prev)
        r->prev->next = r->next;
    else
        http->reqs = r->next;
    if (r->next)
        r->next->prev = r->prev;
    http->n_reqs--;
    pthread_mutex_unlock(&http->lock);
    DUET_LOG_DEBUG("request %s: connection completed (%d)", r->id, (int)toe);
    duet__http_gen_cancel(r);
    duet__http_hreq_unref(r);
}

/* ---- ticker: keepalives and disconnects ---- */

void duet_router_http_tick(duet_router_http_t *http)
{
    duet__hreq_t *cancel[DUET__MAX_TICK_CANCELS];
    size_t n_cancel = 0;
    int64_t now = duet_now_ns();

    pthread_mutex_lock(&http->lock);
    for (duet__hreq_t *r = http->reqs; r; r = r->next) {
        pthread_mutex_lock(&r->lock);
        if (r->sse && !r->ended && now - r->last_write_ns >= http->keepalive_ns) {
            duet_router_sse_comment(&r->out, "keepalive");
            r->last_write_ns = now;
            duet__http_hreq_resume_locked(r);
        }
        /* A suspended connection is not watched by MHD: look for the peer's
         * FIN ourselves.  While suspended (under lock) MHD cannot close the
         * socket, so the fd is still this connection's. */
        if (r->suspended && !r->client_gone && r->jobs_live && r->fd >= 0 &&
            n_cancel < DUET__MAX_TICK_CANCELS) {
            struct pollfd pfd = {.fd = r->fd, .events = POLLRDHUP};
            if (poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR))) {
                r->client_gone = true;
                atomic_fetch_add(&r->refs, 1);
                cancel[n_cancel++] = r;
            }
        }
        pthread_mutex_unlock(&r->lock);
    }
    pthread_mutex_unlock(&http->lock);
    for (size_t i = 0; i < n_cancel; i++) {
        DUET_LOG_DEBUG("a client closed its connection while waiting; cancelling");
        duet__http_gen_cancel(cancel[i]);
        duet__http_hreq_unref(cancel[i]);
    }
}

/* ---- lifecycle ---- */

static duet_status_t duet__parse_addr(const char *addr, struct sockaddr_storage *ss,
                                      socklen_t *len_p)
{
    char host[256];
    const char *colon = strrchr(addr, ':');
    struct addrinfo hints, *res = NULL;
    size_t hl;
    int rc;

    if (colon == NULL || colon[1] == '\0')
        return duet_error(DUET_ERR_CONFIG, "router.http: '%s' is not host:port", addr);
    hl = (size_t)(colon - addr);
    if (hl >= 2 && addr[0] == '[' && addr[hl - 1] == ']') {
        addr++;
        hl -= 2;
    }
    if (hl >= sizeof(host))
        return duet_error(DUET_ERR_CONFIG, "router.http: host too long");
    memcpy(host, addr, hl);
    host[hl] = '\0';
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    rc = getaddrinfo(hl ? host : NULL, colon + 1, &hints, &res);
    if (rc != 0 || res == NULL)
        return duet_error(DUET_ERR_CONFIG, "router.http: cannot resolve '%s': %s", addr,
                          gai_strerror(rc));
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *len_p = res->ai_addrlen;
    freeaddrinfo(res);
    return DUET_OK;
}

duet_status_t duet_router_http_start(duet_router_t *rt, const char *addr, int threads,
                                     int keepalive_ms, duet_router_http_t **http_p)
{
    duet_router_http_t *http = DUET_NEW(duet_router_http_t);
    struct sockaddr_storage ss;
    socklen_t sl;
    duet_status_t st;
    unsigned flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ITC;
#if MHD_VERSION >= 0x00097700
    /* RFC 9112 as strictly as libmicrohttpd goes (bare LF, obs-fold,
     * whitespace before a colon, no Host); http_strict.c adds the rest */
    const int strict_opt = MHD_OPTION_CLIENT_DISCIPLINE_LVL, strict_lvl = 2;
#else
    /* 1: HTTP/1.1 without Host and spaces in the URI are 400 (0.9.75's
     * -1 would refuse whitespace before a colon instead: http_strict.c
     * does that) */
    const int strict_opt = MHD_OPTION_STRICT_FOR_CLIENT, strict_lvl = 1;
#endif

    if (http == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "router: no memory");
    http->rt = rt;
    http->keepalive_ns = (int64_t)(keepalive_ms > 0 ? keepalive_ms : 2000) * DUET_NS_PER_MS;
    atomic_init(&http->stopping, false);
    atomic_init(&http->stopped, false);
    pthread_mutex_init(&http->lock, NULL);
    if ((st = duet__parse_addr(addr, &ss, &sl)) != DUET_OK) {
        duet_router_http_destroy(http);
        return st;
    }
    if (ss.ss_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    duet__http_limits_t lim;
    if ((st = duet__http_limits_get(&rt->cfg->router, &lim)) != DUET_OK) {
        duet_router_http_destroy(http);
        return st;
    }
    http->header_timeout_s = lim.header_timeout_s;
    /* router.https_cert/https_key (router.c checked them) */
    struct MHD_OptionItem tls[] = {{MHD_OPTION_HTTPS_MEM_KEY, 0, rt->https_key_pem},
                                   {MHD_OPTION_HTTPS_MEM_CERT, 0, rt->https_cert_pem},
                                   {MHD_OPTION_END, 0, NULL}};
    if (rt->https_cert_pem != NULL)
        flags |= MHD_USE_TLS;
    http->daemon = MHD_start_daemon(
        flags, 0, NULL, NULL, duet__access, http, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
        MHD_OPTION_THREAD_POOL_SIZE, (unsigned)(threads > 0 ? threads : 2),
        MHD_OPTION_NOTIFY_COMPLETED, duet__completed, http, MHD_OPTION_CONNECTION_TIMEOUT,
        lim.header_timeout_s, MHD_OPTION_CONNECTION_LIMIT, lim.max_connections,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, lim.per_client, strict_opt, strict_lvl,
        MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned)1024, MHD_OPTION_ARRAY,
        rt->https_cert_pem != NULL ? tls : &tls[2], MHD_OPTION_END);
    if (http->daemon == NULL) {
        duet_router_http_destroy(http);
        return duet_error(DUET_ERR_IO, "router.http: cannot listen on %s (in use?)", addr);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(http->daemon, MHD_DAEMON_INFO_BIND_PORT);
    http->port = di ? di->port : 0;
    DUET_LOG_INFO("router.http: at most %u connections, %u per client address, header timeout "
                  "%u s (RLIMIT_NOFILE %llu)",
                  lim.max_connections, lim.per_client, lim.header_timeout_s, lim.nofile);
    (void)sl;
    *http_p = http;
    return DUET_OK;
}

int duet_router_http_bound_port(const duet_router_http_t *http)
{
    return http->port;
}

void duet_router_http_quiesce(duet_router_http_t *http)
{
    if (http->daemon) {
        MHD_socket s = MHD_quiesce_daemon(http->daemon);
        (void)s; /* closed by MHD_stop_daemon's caller: see http_stop */
    }
}

size_t duet_router_http_active(duet_router_http_t *http)
{
    pthread_mutex_lock(&http->lock);
    size_t n = http->n_reqs;
    pthread_mutex_unlock(&http->lock);
    return n;
}

void duet_router_http_stop(duet_router_http_t *http)
{
    if (http == NULL || http->daemon == NULL)
        return;
    atomic_store(&http->stopping, true);
    /* MHD_stop_daemon with a suspended connection is undefined: resume all
     * (no new suspend happens once `stopping` is set). */
    pthread_mutex_lock(&http->lock);
    for (duet__hreq_t *r = http->reqs; r; r = r->next) {
        pthread_mutex_lock(&r->lock);
        r->ready = true;
        duet__http_hreq_resume_locked(r);
        pthread_mutex_unlock(&r->lock);
    }
    pthread_mutex_unlock(&http->lock);
    MHD_stop_daemon(http->daemon);
    http->daemon = NULL;
    atomic_store(&http->stopped, true);
}

void duet_router_http_destroy(duet_router_http_t *http)
{
    if (http == NULL)
        return;
    duet_router_http_stop(http);
    pthread_mutex_destroy(&http->lock);
    duet_free(http);
}
