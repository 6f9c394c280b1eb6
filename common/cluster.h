/* The cluster config (DESIGN §8): one JSON file describing a deployment --
 * the model, the router, and lists of prefill and decode instances, each
 * with its own TP size, backend, devices and addresses.  A heterogeneous-TP
 * cluster is just entries with different `tp`.
 *
 *   {
 *     "model": "models/stories260K",
 *     "kv": {"page_size": 16},
 *     "transfer": {"timeout_ms": 10000, "checksum": false},
 *     "router": {"http": "127.0.0.1:8000", "grpc": "127.0.0.1:8001",
 *                "policy": "least_load"},
 *     "auth": {"ca": "ca.pem", "cert": "node.pem", "key": "node.key",
 *              "secret_file": "secret"},
 *     "prefill": [{"name": "prefill-0", "address": "127.0.0.1:9100", "tp": 2}],
 *     "decode":  [{"name": "decode-0",  "address": "127.0.0.1:9200", "tp": 4}]
 *   }
 *
 * Every key is validated once at load against declarative tables: an
 * unknown key, a wrong type or an out-of-range value is DUET_ERR_CONFIG
 * naming the key path ("decode[0].tp: 0 is out of range 1..64").
 * duet_cluster_describe() prints the tables (name, type, default, range,
 * doc) for --help-config. */
#ifndef DUET_COMMON_CLUSTER_H
#define DUET_COMMON_CLUSTER_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common/status.h"

#define DUET_CLUSTER_MAX_DEVICES 64

typedef enum {
    DUET_ROLE_PREFILL = 0,
    DUET_ROLE_DECODE = 1,
} duet_role_t;

typedef struct {
    char *name;     /* unique within the cluster */
    char *address;  /* host:port others use to reach its gRPC server */
    char *listen;   /* host:port to bind; default: address */
    char *discover; /* DNS name:port whose A records are instances (k8s) */
    int tp;
    char *backend; /* "cpu" or "cuda" */
    int threads;   /* cpu threads per rank, 0 = auto */
    int devices[DUET_CLUSTER_MAX_DEVICES];
    int n_devices;
    int n_pages; /* KV pages (each page_size tokens) */
    int max_batch_tokens;
    int max_seqs;           /* decode: running sequences; prefill: prompts per batch */
    int max_queue;          /* requests waiting for admission before RESOURCE_EXHAUSTED */
    int grpc_threads;       /* completion-queue threads */
    int drain_timeout_ms;   /* SIGTERM grace before in-flight requests are aborted */
    int max_tokens_default; /* decode: when a request gives no max_tokens */
    /* decode: colocated mode and conditional disaggregation (docs/design-notes.md
     * "Colocated mode and conditional disaggregation"): "off" (every prompt on
     * a prefill instance), "always" (every prompt on this decode's own
     * engine), "auto" (per request: local when the prompt has at most
     * prefill_local_max_tokens tokens and fewer than prefill_local_max_running
     * sequences are decoding here, or when no prefill instance is known) */
    char *prefill_local;
    int prefill_local_max_tokens;
    int prefill_local_max_running;
    /* decode, local prefills: prompt tokens per decode step, computed in the
     * step's forward beside the running sequences (chunked prefill; the
     * effective budget is capped to max_batch_tokens); 0 = each admitted
     * prompt whole, in its own forward before the step */
    int prefill_chunk_tokens;
    /* packed KV transfers: staging units after each rank's pool, each as
     * large as one KV page in every layer; -1 = auto (n_pages / 4 where
     * packing can run, else 0) */
    int stage_pages;
    /* the prefix cache of the KV pool (docs/prefix-cache.md) */
    bool prefix_cache;
} duet_instance_config_t;

/* router.cache_aware: the cache_aware policy's thresholds
 * (docs/kv-aware-routing.md). */
typedef struct {
    double balance_abs_threshold; /* load-score spread ... */
    double balance_rel_threshold; /* ... and ratio above which the least loaded wins */
    double min_match_ratio;       /* matched/prompt tokens needed to follow a prefix */
    int64_t max_tree_tokens;      /* prompt tokens remembered per instance (LRU) */
} duet_router_cache_aware_config_t;

typedef struct {
    char *name;
    char *http;         /* host:port, "" = off */
    char *grpc;         /* host:port, "" = off */
    char *policy;       /* a router policy name (router/fleet/policy.h checks it) */
    int max_concurrent; /* requests in flight before queueing */
    int queue_limit;    /* queued before 429 */
    char *api_key;      /* "" = no auth */
    char *api_key_env;  /* environment variable holding the key */
    int max_body_bytes;
    int max_prompt_tokens; /* 0 = the model context */
    int max_tokens_limit;  /* largest max_tokens accepted */
    int health_interval_ms;
    int request_timeout_ms;
    char *served_model_name; /* "" = the model directory's name */
    char *https_cert;        /* PEM certificate chain for HTTPS ("" = plain HTTP) */
    char *https_key;         /* its private key (PEM) */
    /* connection limits of router.http (docs/security.md "Connection
     * limits"): 0 = auto */
    int http_max_connections;
    int http_max_connections_per_client;
    int http_header_timeout_s; /* idle before a complete request header */
    duet_router_cache_aware_config_t cache_aware;
    int migrate_max;      /* migrations of a started stream (docs/migration.md) */
    int stall_timeout_ms; /* no token for this long: the stream migrates (0 = off) */
    bool migrate_on_drain; /* a draining decode's streams move, make-before-break (docs/migration.md) */
    int prefill_wait_max_ms; /* admission: hold requests while every prefill's queue is
                                longer than this (0 = off; docs/migration.md "Overload") */
} duet_router_config_t;

/* auth: how the cluster's gRPC servers authenticate their callers and how
 * its clients authenticate themselves (docs/security.md "Authentication").
 * Every string is a file path ("" = off); relative paths in the file are
 * resolved against its directory.  TLS is on when ca is set (then cert and
 * key are required): servers ask for a client certificate signed by ca and
 * clients check the server's.  secret_file holds a shared secret sent as
 * metadata x-duet-secret and checked by every server. */
typedef struct {
    char *ca;          /* PEM bundle of the cluster CA */
    char *cert;        /* this process's certificate chain (server and client) */
    char *key;         /* its private key */
    char *secret_file; /* the shared secret (first line, >= 16 bytes) */
    char *server_name; /* name clients expect in server certificates ("" = host) */
    char *clients;     /* comma-separated client identities (spiffe://duet/client/<name>)
                          that may call Decode.Generate / Decode.Abort besides routers */
    bool insecure;     /* listen on a non-loopback address without TLS */
} duet_auth_config_t;

/* transfer.on_failure: what decode does when a request's KV transfer fails
 * after it admitted the request (docs/migration.md). */
typedef enum {
    DUET_XFER_ON_FAILURE_FAIL = 0,      /* the request fails (the router may retry it) */
    DUET_XFER_ON_FAILURE_RETRY = 1,     /* fail it retryably: the router retries another pair */
    DUET_XFER_ON_FAILURE_RECOMPUTE = 2, /* decode prefills the prompt itself */
    DUET_XFER_ON_FAILURE_COUNT
} duet_xfer_on_failure_t;

typedef struct {
    char *model;   /* model directory */
    int page_size; /* kv.page_size: the same on every instance */
    int max_context; /* kv.max_context: 0 = the model's max_position_embeddings */
    int transfer_timeout_ms;
    bool transfer_checksum;
    int rpc_timeout_ms; /* control-plane calls between daemons */
    int transfer_queue_timeout_ms; /* a request's wait in prefill's queue, before its start */
    duet_xfer_on_failure_t transfer_on_failure;
    duet_router_config_t router;
    duet_auth_config_t auth;
    duet_instance_config_t *prefill;
    int n_prefill;
    duet_instance_config_t *decode;
    int n_decode;
    char *path; /* the file it came from */
} duet_cluster_config_t;

/* The context length the cluster serves: kv.max_context, or model_max_pos
 * (the model's max_position_embeddings) when 0.  DUET_ERR_CONFIG naming the
 * key when kv.max_context is above model_max_pos (positions past it were
 * never trained: RoPE scaling is what extends a model, in its config). */
duet_status_t duet_cluster_context(const duet_cluster_config_t *cfg, int model_max_pos, int *ctx_p);

/* Load and validate a cluster config file.  Cross-checks: unique instance
 * names, every instance has address or discover, CUDA device lists match tp.
 * Relative model paths are resolved against the file's directory. */
duet_status_t duet_cluster_load(const char *path, duet_cluster_config_t **cfg_p);
/* Parse from text (what = name for messages, base_dir for relative paths). */
duet_status_t duet_cluster_parse(const char *text, size_t len, const char *what,
                                 const char *base_dir, duet_cluster_config_t **cfg_p);
void duet_cluster_free(duet_cluster_config_t *cfg);

/* The instance called name, or NULL (then *role_p is untouched). */
duet_instance_config_t *duet_cluster_find(duet_cluster_config_t *cfg, const char *name,
                                          duet_role_t *role_p);

/* Apply a command-line override to an instance ("tp", "4") by the same
 * table; DUET_ERR_NOT_FOUND for a key the table does not have. */
duet_status_t duet_cluster_instance_set(duet_instance_config_t *inst, const char *key,
                                        const char *value);

/* Override an auth key ("ca", "secret_file", ...) from a command-line flag
 * (the value is used as given, not resolved against the config file). */
duet_status_t duet_cluster_auth_set(duet_cluster_config_t *cfg, const char *key, const char *value);

/* The checks across an instance's keys (prefill_local is a mode, and only
 * on decode instances), for role ("prefill" | "decode"); DUET_ERR_CONFIG
 * naming path.key.  Load runs it; a daemon runs it again after overrides. */
duet_status_t duet_cluster_instance_check(const duet_instance_config_t *inst, const char *role,
                                          const char *path);

/* Print every key with its type, default, range and doc. */
void duet_cluster_describe(FILE *out);

const char *duet_role_name(duet_role_t role);

typedef enum {
    DUET_PREFILL_LOCAL_OFF = 0,
    DUET_PREFILL_LOCAL_ALWAYS = 1,
    DUET_PREFILL_LOCAL_AUTO = 2,
} duet_prefill_local_t;

/* An instance's prefill_local mode (validated at load). */
duet_prefill_local_t duet_cluster_prefill_local(const duet_instance_config_t *inst);

#endif
