/* Internals shared by the router's modules: the daemon context, the job
 * (one client request routed to a prefill/decode pair), the HTTP and gRPC
 * front ends.
 *
 * Lock order (never the reverse): an HTTP request's lock is never held
 * while calling a job function; a job's lock is never held while calling
 * a sink; rt->adm_lock may be taken under neither and is never held while
 * calling a sink or the rpc client. */
#ifndef DUET_ROUTER_ROUTER_INTERNAL_H
#define DUET_ROUTER_ROUTER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/cluster.h"
#include "common/rpc.h"
#include "duet/v1/generate.pb-c.h"
#include "tokenizer/tokenizer.h"
#include "router/chat_template.h"
#include "router/metrics.h"
#include "router/openai.h"
#include "router/policy.h"
#include "router/router.h"
#include "router/workers.h"

typedef struct duet_router_job duet_router_job_t;
typedef struct duet_router_http duet_router_http_t;

struct duet_router {
    duet_router_options_t opt;
    duet_cluster_config_t *cfg;
    duet_router_policy_t policy;
    char *model_name; /* served model id */
    int context_len;  /* model max_position_embeddings */
    int vocab;
    int prompt_limit; /* longest prompt accepted */
    int64_t max_tokens_limit;
    int64_t default_max_tokens; /* gRPC max_tokens 0 */
    int64_t request_timeout_ms;
    char *api_key;                        /* NULL = no auth */
    duet_rpc_auth_t *auth;                /* cluster auth (rpc_auth.h), NULL = off */
    char *https_cert_pem, *https_key_pem; /* router.https_*, NULL = plain HTTP */
    duet_tokenizer_t *tok;
    duet_router_chat_tmpl_t *chat; /* NULL: no (usable) template */
    char chat_unavailable[256];    /* why, for the 400 */
    char *bos_str, *eos_str;
    int64_t started_unix;

    duet_rpc_client_t *cli;
    duet_router_workers_t *workers;
    duet_router_metrics_t metrics;

    pthread_mutex_t adm_lock; /* admission: the fields below */
    pthread_cond_t adm_cond;  /* signalled when a job ends */
    int running, queued;
    duet_router_job_t *q_head, *q_tail;
    duet_router_job_t *active; /* every admitted job (for drain) */

    atomic_bool draining;

    duet_router_http_t *http;
    duet_rpc_server_t *grpc;
    duet_rpc_health_t *health;

    pthread_t ticker;
    bool ticker_started;
    pthread_mutex_t tick_lock;
    pthread_cond_t tick_cond;
    bool tick_stop;
};

/* ---- request preparation (router.c) ---- */

/* A fresh request id "<prefix>-<32 random hex digits>" into buf;
 * DUET_ERR_IO when the kernel gives no randomness (never a guessable id). */
duet_status_t duet_router_new_id(duet_router_t *rt, const char *prefix, char *buf, size_t cap);
/* Check the bearer token in an Authorization header value (NULL: absent). */
bool duet_router_auth_ok(const duet_router_t *rt, const char *header, size_t len);
/* Token ids for a prompt: text is tokenized (BOS as the tokenizer says when
 * add_special), ids are range-checked; then the prompt limit.  *ids_p is
 * duet_malloc'd.  Errors fill err (400 + context_length_exceeded...). */
duet_status_t duet_router_prompt_ids(duet_router_t *rt, const char *text, size_t len,
                                     bool add_special, const int32_t *ids, size_t n,
                                     const char *param, int32_t **ids_p, size_t *n_p,
                                     duet_router_oai_error_t *err);
/* max_tokens to send: requested (0 = default) capped by the context room. */
uint32_t duet_router_max_tokens(const duet_router_t *rt, size_t n_prompt, int64_t requested);
/* Render a chat request's messages into a prompt (400 when the model has
 * no usable template or the template raises). */
duet_status_t duet_router_chat_prompt(duet_router_t *rt, const duet_router_oai_req_t *req,
                                      char **text_p, size_t *len_p, duet_router_oai_error_t *err);

/* The seed of choice i of a request seeded with seed, on HTTP and gRPC
 * (docs/api-logprobs.md "Seeds"): choice 0 uses it as given (so n = 1 is
 * unchanged), the others a splitmix64 mix of it and their index. */
uint64_t duet_router_choice_seed(uint64_t seed, int i);

/* ---- jobs (job.c) ---- */

typedef struct {
    bool ok;               /* finished normally (then the fields below) */
    grpc_status_code code; /* the failure, when !ok */
    const char *message;
    bool started; /* a token reached the sink before the end */
    int reason;   /* duet.v1.FinishReason */
    uint32_t prompt_tokens, completion_tokens;
    const uint8_t *raw; /* the finished GenerateResponse bytes (ok only) */
    size_t raw_len;
} duet_router_job_end_t;

typedef struct {
    /* A chunk, on a client CQ thread, in order.  raw: the GenerateResponse
     * bytes.  Return false when the client cannot keep up: the job is
     * cancelled and ends with RESOURCE_EXHAUSTED. */
    bool (*on_chunk)(void *arg, const Duet__V1__TokenChunk *chunk, const uint8_t *raw, size_t len);
    /* Exactly once per started job, from any thread (also from inside
     * duet_router_job_cancel). */
    void (*on_end)(void *arg, const duet_router_job_end_t *end);
} duet_router_sink_t;

/* A job for req (packed and copied; request_id must be set) with a deadline
 * (CLOCK_MONOTONIC ns).  The caller holds one reference. */
duet_status_t duet_router_job_create(duet_router_t *rt, const Duet__V1__GenerateRequest *req,
                                     int64_t deadline_ns, const duet_router_sink_t *sink,
                                     void *sink_arg, duet_router_job_t **job_p);
/* Admit: run now, or queue.  DUET_OK: on_end will follow exactly once.
 * Otherwise nothing is called: DUET_ERR_EXHAUSTED (queue full: 429),
 * DUET_ERR_PEER (no healthy worker: 503), DUET_ERR_SHUTDOWN (draining: 503),
 * DUET_ERR_CANCELLED (cancelled before start). */
duet_status_t duet_router_job_start(duet_router_job_t *job);
/* Start job as a follower of leader (started already; NULL: as
 * duet_router_job_start): an n > 1 request's choices 1..n-1 after its
 * choice 0 (docs/api-logprobs.md "Fork-style sharing").  When the prompt
 * can share its pages (a full page before its last token, no prompt
 * logprobs, a decode of the config with prefix_cache on) job waits for the
 * leader's first token -- its prompt's KV then sits in its decode's prefix
 * cache -- and starts pinned to the leader's prefill/decode pair
 * (duet_router_workers_pick_pinned); when the leader ends before a first
 * token it starts unpinned.  Otherwise it starts at once.  Returns as
 * duet_router_job_start; after DUET_OK on_end follows exactly once (a
 * waiting job that later cannot start ends with the reason: UNAVAILABLE,
 * RESOURCE_EXHAUSTED, ...; cancelled while waiting: CANCELLED). */
duet_status_t duet_router_job_start_after(duet_router_job_t *job, duet_router_job_t *leader);
/* The client went away: abort downstream (or leave the queue).  Any thread,
 * idempotent; on_end follows (maybe on this thread, before it returns). */
void duet_router_job_cancel(duet_router_job_t *job);
/* Another reference (returns job). */
duet_router_job_t *duet_router_job_ref(duet_router_job_t *job);
void duet_router_job_release(duet_router_job_t *job);
/* End queued jobs whose deadline passed (ticker). */
void duet_router_jobs_expire(duet_router_t *rt);
/* Cancel every admitted job (end of drain). */
void duet_router_jobs_cancel_all(duet_router_t *rt);

/* ---- HTTP (http.c) ---- */
duet_status_t duet_router_http_start(duet_router_t *rt, const char *addr, int threads,
                                     int keepalive_ms, duet_router_http_t **http_p);
int duet_router_http_bound_port(const duet_router_http_t *http);
/* Stop accepting new connections (in-flight requests go on). */
void duet_router_http_quiesce(duet_router_http_t *http);
/* Ticker: keepalives and disconnect detection on suspended connections. */
void duet_router_http_tick(duet_router_http_t *http);
/* Requests whose connection is still open. */
size_t duet_router_http_active(duet_router_http_t *http);
/* Resume every suspended connection and stop the daemon; requests still
 * referenced by jobs stay allocated.  Accepts NULL. */
void duet_router_http_stop(duet_router_http_t *http);
/* Free (after the rpc client is gone: no sink runs any more).  Accepts NULL. */
void duet_router_http_destroy(duet_router_http_t *http);

/* ---- gRPC (grpc_api.c) ---- */
duet_status_t duet_router_grpc_start(duet_router_t *rt, const char *addr, int threads);
/* Generate's validation of a client's request: the token ids, the request
 * id and, on failure, the status and message (exposed for fuzz/). */
bool duet_router_grpc_prepare(duet_router_t *rt, Duet__V1__GenerateRequest *in, char *id_buf,
                              size_t id_cap, int32_t **ids_p, size_t *n_p, grpc_status_code *code_p,
                              char *msg, size_t msg_cap);
/* The most choices (GenerateRequest.n) one gRPC call may ask for (as HTTP). */
#define DUET_ROUTER_GRPC_N_MAX 16
/* grpc_choices.c: run a validated request (token ids, request id, clamped
 * max_tokens; `n` 0..DUET_ROUTER_GRPC_N_MAX) as its n choices' jobs; ends
 * the call, at once on failure or when the last choice ended.  in is
 * borrowed for the call only. */
void duet_router_grpc_run(duet_router_t *rt, duet_rpc_call_t *call, Duet__V1__GenerateRequest *in,
                          int64_t deadline_ns);
/* Map a job failure to an HTTP error. */
void duet_router_error_from_grpc(grpc_status_code code, const char *msg, bool started,
                                 duet_router_oai_error_t *err);
/* Set the router's own grpc.health.v1 status from the workers' state. */
void duet_router_update_health(duet_router_t *rt);

#endif
