/* Request framing and body-size checks of the router's HTTP server
 * (docs/security.md, "Input limits" and "Strict HTTP/1.1 framing"):
 *  - a header section that RFC 9112 does not allow (http_strict.c: bare LF,
 *    obs-fold, whitespace before a colon, control bytes in a value), two
 *    Host fields, two Content-Length headers that differ, Content-Length
 *    together with Transfer-Encoding, a Transfer-Encoding other than
 *    exactly `chunked` (or one in HTTP/1.0) are refused with 400 and the
 *    connection is closed: a proxy in front could frame the request
 *    differently and smuggle a second one in its body (libmicrohttpd
 *    0.9.75 takes the first Content-Length, or the chunked encoding,
 *    without a word);
 *  - an upload (chunked, or one whose Content-Length lied) that passes
 *    router.max_body_bytes is answered 413 at once and the connection
 *    closed, not read to its end.  libmicrohttpd refuses to queue a
 *    response while a body is arriving, so the 413 is written to the socket
 *    here (plain HTTP; over TLS the connection is just closed). */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include "common/log.h"
#include "router/http/http_internal.h"

typedef struct {
    int n_length;
    bool lengths_differ;
    const char *first_length;
    int n_te;
    bool te_not_chunked;
    int n_host;
} duet__framing_t;

static enum MHD_Result duet__framing_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                            const char *value)
{
    duet__framing_t *f = cls;

    (void)kind;
    if (key == NULL)
        return MHD_YES;
    if (strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH) == 0) {
        if (f->n_length++ == 0)
            f->first_length = value ? value : "";
        else if (strcmp(f->first_length, value ? value : "") != 0)
            f->lengths_differ = true;
    } else if (strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING) == 0) {
        /* exactly one coding, chunked, and exactly as libmicrohttpd
         * recognizes it: it strips the OWS before a value, not after, and
         * reads "chunked " as an unknown coding (a body up to the close) */
        f->n_te++;
        f->te_not_chunked |= value == NULL || strcasecmp(value, "chunked") != 0;
    } else if (strcasecmp(key, MHD_HTTP_HEADER_HOST) == 0) {
        f->n_host++;
    }
    return MHD_YES;
}

/* A complete error response that closes the connection after it. */
static enum MHD_Result duet__respond_close(duet__hreq_t *r, const duet_router_oai_error_t *err)
{
    duet_router_buf_t b;
    struct MHD_Response *resp = NULL;
    enum MHD_Result ret = MHD_NO;

    duet_router_buf_init(&b);
    duet_router_oai_render_error(&b, err);
    if (!b.oom)
        resp = MHD_create_response_from_buffer(b.len, b.data, MHD_RESPMEM_MUST_COPY);
    if (resp != NULL) {
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
        ret = MHD_queue_response(r->conn, (unsigned)err->status, resp);
        MHD_destroy_response(resp);
    }
    duet_router_buf_cleanup(&b);
    r->responded = true;
    duet_router_metrics_http(&r->http->rt->metrics, r->route, err->status);
    return ret;
}

bool duet__http_framing_bad(duet__hreq_t *r, const char *method, const char *version,
                            enum MHD_Result *ret_p)
{
    duet__framing_t f = {0};
    duet_router_oai_error_t err;
    const char *why = duet__http_strict_why(r, method, version);

    MHD_get_connection_values(r->conn, MHD_HEADER_KIND, duet__framing_header, &f);
    if (why != NULL)
        duet_router_oai_fail(&err, 400, NULL, "bad_framing",
                             "the request header breaks RFC 9112: %s", why);
    else if (f.n_host > 1)
        duet_router_oai_fail(&err, 400, NULL, "bad_framing",
                             "the request has %d Host headers: send one", f.n_host);
    else if (f.n_te > 0 && (f.n_te > 1 || f.te_not_chunked))
        duet_router_oai_fail(&err, 400, NULL, "bad_framing",
                             "Transfer-Encoding must be exactly \"chunked\" (one header, one "
                             "coding)");
    else if (f.n_te > 0 && version != NULL && strcmp(version, MHD_HTTP_VERSION_1_1) != 0)
        duet_router_oai_fail(&err, 400, NULL, "bad_framing",
                             "Transfer-Encoding in an %s request (it needs HTTP/1.1)", version);
    else if (f.lengths_differ)
        duet_router_oai_fail(&err, 400, NULL, "bad_framing",
                             "the request has Content-Length headers that differ: send one");
    else if (f.n_length > 0 && f.n_te > 0)
        duet_router_oai_fail(&err, 400, NULL, "bad_framing",
                             "the request has both Content-Length and Transfer-Encoding: send "
                             "one of them");
    else {
        /* libmicrohttpd 0.9.75 takes a chunk line ended by a bare LF and
         * shows the application only the decoded body: nothing that follows
         * a chunked body on this connection is answered, so whatever a
         * proxy in front framed differently dies with it */
        r->close_after = f.n_te > 0;
        return false;
    }
    DUET_LOG_INFO("http: refused a request with ambiguous framing: %s", err.message);
    *ret_p = duet__respond_close(r, &err);
    return true;
}

enum MHD_Result duet__http_upload_too_large(duet__hreq_t *r)
{
    duet_router_t *rt = r->http->rt;
    const union MHD_ConnectionInfo *tls =
        MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_GNUTLS_SESSION);
    duet_router_oai_error_t err;
    duet_router_buf_t b;

    r->too_large = true;
    r->responded = true;
    duet_router_buf_cleanup(&r->body);
    duet_router_oai_fail(&err, 413, NULL, "request_too_large",
                         "the request body is larger than %d bytes (router.max_body_bytes)",
                         rt->cfg->router.max_body_bytes);
    duet_router_metrics_http(&rt->metrics, r->route, 413);
    if (r->fd < 0 || (tls != NULL && tls->tls_session != NULL))
        return MHD_NO; /* MHD closes the connection */
    duet_router_buf_init(&b);
    duet_router_oai_render_error(&b, &err);
    if (!b.oom) {
        char head[192];
        int n = snprintf(head, sizeof(head),
                         "HTTP/1.1 413 Payload Too Large\r\nContent-Type: application/json\r\n"
                         "Connection: close\r\nContent-Length: %zu\r\n\r\n",
                         b.len);
        /* a few hundred bytes into an idle socket's buffer: best effort,
         * the connection is closed either way */
        if (send(r->fd, head, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT) == n &&
            send(r->fd, b.data, b.len, MSG_NOSIGNAL | MSG_DONTWAIT) == (ssize_t)b.len)
            shutdown(r->fd, SHUT_WR);
    }
    duet_router_buf_cleanup(&b);
    return MHD_NO; /* MHD closes the connection */
}

/* ---- connection limits ---- */

/* descriptors kept for everything but HTTP connections: gRPC server and
 * client sockets, epoll and eventfds, model and config files, logs */
#define DUET__HTTP_FD_RESERVE      256
#define DUET__HTTP_AUTO_MAX        16384
#define DUET__HTTP_AUTO_PER_CLIENT 1024
#define DUET__HTTP_MIN_CONNECTIONS 16
#define DUET__HTTP_NOFILE_CAP      (1ull << 20)

duet_status_t duet__http_limits_get(const duet_router_config_t *rc, duet__http_limits_t *out_p)
{
    struct rlimit rl;
    unsigned long long nofile, room;
    duet__http_limits_t l = {.header_timeout_s = (unsigned)rc->http_header_timeout_s};

    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return duet_error(DUET_ERR_IO, "router.http: getrlimit(RLIMIT_NOFILE): %s",
                          strerror(errno));
    /* the soft limit is often 1024 (systemd, shells) below a far higher hard
     * one, which a program that holds many sockets is meant to raise to */
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < DUET__HTTP_NOFILE_CAP &&
        rl.rlim_cur < rl.rlim_max) {
        struct rlimit want = rl;
        want.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > DUET__HTTP_NOFILE_CAP
                            ? DUET__HTTP_NOFILE_CAP
                            : rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &want) == 0)
            rl.rlim_cur = want.rlim_cur;
        else
            DUET_LOG_WARN("router.http: cannot raise RLIMIT_NOFILE from %llu to %llu: %s",
                          (unsigned long long)rl.rlim_cur, (unsigned long long)want.rlim_cur,
                          strerror(errno));
    }
    nofile = rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > DUET__HTTP_NOFILE_CAP
                 ? DUET__HTTP_NOFILE_CAP
                 : (unsigned long long)rl.rlim_cur;
    room = nofile > DUET__HTTP_FD_RESERVE ? nofile - DUET__HTTP_FD_RESERVE : 0;
    if (rc->http_max_connections > 0) {
        if ((unsigned long long)rc->http_max_connections > room)
            return duet_error(DUET_ERR_CONFIG,
                              "router.http_max_connections: %d does not fit below the "
                              "descriptor limit (RLIMIT_NOFILE %llu, less %d kept for the rest "
                              "of the router): at most %llu, or raise the limit",
                              rc->http_max_connections, nofile, DUET__HTTP_FD_RESERVE, room);
        l.max_connections = (unsigned)rc->http_max_connections;
    } else {
        l.max_connections = (unsigned)(room < DUET__HTTP_AUTO_MAX ? room : DUET__HTTP_AUTO_MAX);
        if (l.max_connections < DUET__HTTP_MIN_CONNECTIONS)
            return duet_error(DUET_ERR_CONFIG,
                              "router.http_max_connections: the descriptor limit (RLIMIT_NOFILE "
                              "%llu) leaves room for %u connections: raise it (ulimit -n)",
                              nofile, l.max_connections);
    }
    if (rc->http_max_connections_per_client > 0) {
        if ((unsigned)rc->http_max_connections_per_client > l.max_connections)
            return duet_error(DUET_ERR_CONFIG,
                              "router.http_max_connections_per_client: %d is more than "
                              "router.http_max_connections (%u)",
                              rc->http_max_connections_per_client, l.max_connections);
        l.per_client = (unsigned)rc->http_max_connections_per_client;
    } else {
        l.per_client = l.max_connections / 4;
        if (l.per_client > DUET__HTTP_AUTO_PER_CLIENT)
            l.per_client = DUET__HTTP_AUTO_PER_CLIENT;
        if (l.per_client < 1)
            l.per_client = 1;
    }
    l.nofile = nofile;
    *out_p = l;
    return DUET_OK;
}
