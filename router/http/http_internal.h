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
#ifndef DUET_ROUTER_HTTP_HTTP_INTERNAL_H
#define DUET_ROUTER_HTTP_HTTP_INTERNAL_H

#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "router/base/buf.h"
#include "router/http/http.h"
#include "router/job/job.h"
#include "router/job/request.h"

typedef struct duet__hreq duet__hreq_t;

/* One prompt of a request (completions may send several). */
typedef struct {
    uint32_t n_tokens;
    int32_t first_id; /* its first token (echo's logprobs: no logprob) */
    char *echo;       /* echo: the prompt's text */
    size_t echo_len;
} duet__hprompt_t;

/* One choice: a job of its own (docs/api-logprobs.md "Fan-out").  The
 * fields after `job` are under the request's lock. */
typedef struct {
    duet__hreq_t *r;
    int index; /* the choice's index: prompt * n + j */
    size_t prompt;
    duet_router_job_t *job; /* the creator's reference; NULL once taken */
    bool got_chunk;         /* a chunk came */
    bool ended;
    bool end_ok;
    int end_reason;
    uint32_t end_completion;
    bool sent_role;            /* chat stream: its role chunk went out */
    size_t text_offset;        /* completions stream: of its next token */
    duet_router_buf_t text;    /* non-stream: the whole text */
    duet_router_oai_lp_t *lps; /* non-stream: every token's logprob */
    size_t n_lps, cap_lps;
} duet__choice_t;

struct duet_router_http {
    duet_router_t *rt;
    struct MHD_Daemon *daemon;
    int port;
    int64_t keepalive_ns;
    unsigned header_timeout_s; /* MHD's timeout until a request header is complete */
    atomic_bool stopping;      /* no new suspends */
    atomic_bool stopped;       /* MHD is gone: no MHD calls */
    pthread_mutex_t lock;      /* the list */
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
    bool close_after; /* chunked upload: Connection: close on the answer */
    bool too_large;
    bool submitted;
    bool responded;
    duet_router_api_t api;
    bool stream;
    bool include_usage;
    char id[48];
    int64_t created;

    /* set before the first job starts, then read-only */
    duet__choice_t *choices; /* [n_choices] */
    int n_choices;
    duet__hprompt_t *prompts; /* [n_prompts] */
    size_t n_prompts;
    bool logprobs, echo;

    pthread_mutex_t lock; /* the fields below (and the choices') */
    bool jobs_live;       /* choices hold jobs (not yet taken by a cancel) */
    int n_ended;          /* choices ended */
    bool failed;          /* a choice failed: end_code/end_msg say how */
    bool err_sent;        /* the stream's error event went out */
    bool suspended;
    bool conn_gone;        /* MHD's completed callback ran */
    bool client_gone;      /* the ticker saw the peer close */
    bool ready;            /* something for the MHD thread to act on */
    bool ended;            /* every choice ended (end_* below are set) */
    bool sse;              /* the SSE response is queued */
    duet_router_buf_t out; /* SSE bytes (stream) */
    int64_t last_write_ns;
    bool end_ok;      /* every choice finished normally */
    bool end_started; /* a token reached the client (or a chunk came) */
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

/* http_limits.c: the connection limits of router.http (docs/security.md
 * "Connection limits"). */
typedef struct {
    unsigned max_connections;
    unsigned per_client;
    unsigned header_timeout_s;
    unsigned long long nofile; /* RLIMIT_NOFILE (soft) they were derived from */
} duet__http_limits_t;

/* Raise the soft RLIMIT_NOFILE to the hard one (at most 2^20) and derive
 * the limits from rc: 0 = auto.  DUET_ERR_CONFIG naming the key when
 * http_max_connections does not fit below the descriptor limit or the
 * per-client cap is above it. */
duet_status_t duet__http_limits_get(const duet_router_config_t *rc, duet__http_limits_t *out_p);

/* Time a connection out after this long without activity once its
 * request header is complete (uploads, slow readers; as before issue
 * 25): the header timeout applies before and between requests. */
#define DUET__HTTP_REQUEST_TIMEOUT_S 300

/* http_limits.c: refuse a header section RFC 9112 does not allow and
 * ambiguous framing (two Host, differing Content-Length headers,
 * Content-Length with Transfer-Encoding, a Transfer-Encoding other than
 * chunked) with a 400 that closes the connection; true when answered
 * (*ret_p: the result to return).  method and version: as MHD passed them
 * to the access handler (pointers into its read buffer). */
bool duet__http_framing_bad(duet__hreq_t *r, const char *method, const char *version,
                            enum MHD_Result *ret_p);
/* http_strict.c: what in the header section RFC 9112 forbids (bare LF,
 * obs-fold, whitespace before a colon, a name that is not a token, a
 * control byte or NUL in a value), or NULL.  First access call only. */
const char *duet__http_strict_why(duet__hreq_t *r, const char *method, const char *version);
/* http_limits.c: the upload passed router.max_body_bytes: 413 now, close. */
enum MHD_Result duet__http_upload_too_large(duet__hreq_t *r);

/* http_gen.c: the response's id, model and timestamps for the renderers. */
void duet__http_meta(const duet__hreq_t *r, duet_router_oai_meta_t *m);
/* http_gen.c: map a job failure to an HTTP error. */
void duet_router_error_from_grpc(grpc_status_code code, const char *msg, bool started,
                                 duet_router_oai_error_t *err);
/* http_gen.c: the completion endpoints (MHD thread).  Called for every
 * access-handler invocation once the body is complete. */
enum MHD_Result duet__http_gen_handle(duet__hreq_t *r);
/* http_gen.c: the client went away: cancel the choices' jobs that have
 * not ended and drop the references (any thread, no lock held; once). */
void duet__http_gen_cancel(duet__hreq_t *r);
/* http_gen.c: free the choices and prompts (last reference). */
void duet__http_gen_free(duet__hreq_t *r);

/* http_choice.c: the job sink of a choice (arg: duet__choice_t). */
extern const duet_router_sink_t duet__http_choice_sink;
/* Append to the choice's logprobs (lock held); false: no memory. */
bool duet__http_choice_add_lps(duet__choice_t *c, const duet_router_oai_lp_t *lps, size_t n);
/* The bytes of a token (duet_router_oai_tok_fn; ud: the router). */
size_t duet__http_tok_bytes(void *ud, int32_t id, char *buf, size_t cap);

#endif
