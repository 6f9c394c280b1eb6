/* Internals shared by http.c (server, routing, info endpoints) and
 * http_gen.c (the completion endpoints: request handling, the job sink,
 * the SSE content reader).
 *
 * One duet__hreq_t per HTTP request, reference-counted: the connection
 * holds one until MHD's completed callback, the SSE response one until its
 * free callback, a started job's sink one until on_end.  Fields marked MHD
 * are touched only on the connection's MHD thread; the rest under lock.
 *
 * Suspend/resume protocol: `suspended` is set under lock just before
 * MHD_suspend_connection (on the MHD thread) and cleared under lock just
 * before MHD_resume_connection (any thread), so every resume pairs with one
 * suspend (resuming a connection that is not suspended is undefined). */
#ifndef DUET_ROUTER_HTTP_INTERNAL_H
#define DUET_ROUTER_HTTP_INTERNAL_H

#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "router/buf.h"
#include "router/router_internal.h"

typedef struct duet__hreq duet__hreq_t;

struct duet_router_http {
    duet_router_t *rt;
    struct MHD_Daemon *daemon;
    int port;
    int64_t keepalive_ns;
    atomic_bool stopping; /* no new suspends */
    atomic_bool stopped;  /* MHD is gone: no MHD calls */
    pthread_mutex_t lock; /* the list */
    duet__hreq_t *reqs;
    size_t n_reqs;
};

struct duet__hreq {
    duet_router_http_t *http;
    struct MHD_Connection *conn;
    atomic_int refs;
    duet_router_route_t route;
    int fd;

    /* MHD */
    duet_router_buf_t body;
    bool too_large;
    bool submitted;
    bool responded;
    duet_router_api_t api;
    bool stream;
    bool include_usage;
    char id[48];
    int64_t created;

    pthread_mutex_t lock; /* the fields below */
    duet_router_job_t *job;
    bool suspended;
    bool conn_gone;        /* MHD's completed callback ran */
    bool client_gone;      /* the ticker saw the peer close */
    bool ready;            /* something for the MHD thread to act on */
    bool ended;            /* the job ended (end_* below are set) */
    bool sent_role;        /* chat stream: the role chunk went out */
    bool sse;              /* the SSE response is queued */
    duet_router_buf_t out; /* SSE bytes, or the whole text when not streaming */
    int64_t last_write_ns;
    bool end_ok;
    bool end_started;
    int end_reason;
    uint32_t end_prompt, end_completion;
    grpc_status_code end_code;
    char end_msg[256];

    duet__hreq_t *next, *prev; /* http->reqs, under http->lock */
};

void duet__http_hreq_unref(duet__hreq_t *r);
/* Queue a complete response (copied) and count it in the metrics. */
enum MHD_Result duet__http_respond(duet__hreq_t *r, unsigned status, const char *content_type,
                                   const char *data, size_t len);
enum MHD_Result duet__http_respond_error(duet__hreq_t *r, const duet_router_oai_error_t *err);
/* Suspend (MHD thread, lock held). */
void duet__http_hreq_suspend_locked(duet__hreq_t *r);
/* Resume when suspended (any thread, lock held). */
void duet__http_hreq_resume_locked(duet__hreq_t *r);

/* http_limits.c: refuse ambiguous framing (differing Content-Length
 * headers, Content-Length with Transfer-Encoding) with a 400 that closes
 * the connection; true when answered (*ret_p: the result to return). */
bool duet__http_framing_bad(duet__hreq_t *r, enum MHD_Result *ret_p);
/* http_limits.c: the upload passed router.max_body_bytes: 413 now, close. */
enum MHD_Result duet__http_upload_too_large(duet__hreq_t *r);

/* http_gen.c: the completion endpoints (MHD thread).  Called for every
 * access-handler invocation once the body is complete. */
enum MHD_Result duet__http_gen_handle(duet__hreq_t *r);

#endif
