/* The router daemon's context, shared by the front ends (http/, grpc/) and
 * the job layer: configuration, model facts (tokenizer, context length,
 * chat template), the fleet, admission state and the listeners.  It is
 * defined here, at the seam, so that everything above the fleet sees one
 * struct; the fleet (fleet/) and the pure rooms below never do.
 *
 * Lock order (never the reverse): an HTTP request's lock is never held
 * while calling a job function; a job's lock is never held while calling
 * a sink; rt->adm_lock may be taken under neither and is never held while
 * calling a sink or the rpc client. */
#ifndef DUET_ROUTER_JOB_CTX_H
#define DUET_ROUTER_JOB_CTX_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/cluster.h"
#include "common/rpc.h"
#include "tokenizer/tokenizer.h"
#include "router/base/metrics.h"
#include "router/base/options.h"
#include "router/chat/chat_template.h"
#include "router/fleet/policy.h"
#include "router/fleet/workers.h"

typedef struct duet_router duet_router_t;
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

#endif
