/* The router's view of the cluster's prefill and decode workers.
 *
 * Two kinds of config instance entries, freely mixed in prefill[] and
 * decode[]:
 *   address: "host:port"   one static worker, named as the entry;
 *   discover: "name:port"  a group (a Kubernetes headless Service): every
 *                          health_interval_ms the name is resolved and the
 *                          group keeps one worker per address, named
 *                          "<entry name>/<ip>" (discovery.h).
 *
 * One checker thread per worker calls grpc.health.v1 Health/Check every
 * health_interval_ms, then the role's Info (TP size, pages, queue depth,
 * running, draining, instance_id).  A worker is in rotation while its last
 * Check said SERVING and its Info does not say draining (a discovered one
 * also needs its Info to answer, so a stale address that now belongs to
 * something else never gets traffic); it leaves on the first failed check
 * and comes back on the first good one.  A new worker is checked before it
 * gets traffic.  duet_router_workers_suspect() makes a checker run now.
 *
 * One discovery thread (when there are groups) resolves each group's name,
 * the lookups themselves on detached threads with a timeout so a stuck
 * resolver holds nothing up.  Reconciliation per group
 * (duet_router_disc_reconcile):
 *   - a new address joins: a fresh worker, out of rotation until checked;
 *   - an address no longer resolved leaves rotation at once; its worker is
 *     removed once this router's requests on it have finished (streams are
 *     never cut); if the address resolves again before that, the worker
 *     comes back (checked again first);
 *   - a failed lookup (NXDOMAIN, SERVFAIL, timeout) keeps the last known
 *     set for the grace period, then drops it; logged once per change.
 * A daemon whose Info reports a new instance_id restarted: the worker
 * becomes a new instance in place (logged, counters start over; the same
 * probe found the new one SERVING, so it stays in rotation; requests still
 * on the old one fail, and are retried when no token had reached the
 * client).  In place keeps names unique: at most one worker per group and
 * address, so each metric series {role,name} is one worker.  Static
 * workers never leave.
 *
 * Indices: a worker keeps its slot index while it is in the table; a
 * removed worker's slot may later hold another one.  Indices handed out by
 * pick stay valid (same worker, name and address) until released.  count()
 * bounds the slots to iterate; snapshot() says which hold a worker (a free
 * slot reads as "<last name> (removed, slot N)", never a live name).
 *
 * Thread-safe: every function may be called from any thread. */
#ifndef DUET_ROUTER_FLEET_WORKERS_H
#define DUET_ROUTER_FLEET_WORKERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/cluster.h"
#include "common/rpc.h"
#include "common/status.h"
#include "router/base/buf.h"
#include "router/fleet/discovery.h"
#include "router/base/metrics.h"
#include "router/fleet/policy.h"
#include "router/fleet/policy_cache.h"

typedef struct duet_router_workers duet_router_workers_t;

/* Called on a checker or the discovery thread when a worker enters or
 * leaves rotation.  No workers lock is held. */
typedef void (*duet_router_workers_change_cb)(void *arg);

typedef struct {
    duet_router_policy_t policy;
    int interval_ms;                         /* health checks and DNS lookups */
    int64_t grace_ms;                        /* failed lookups keep the last set this long;
                                                0: 3 intervals */
    duet_rpc_client_t *cli;                  /* borrowed, outlives the workers */
    duet_router_metrics_t *metrics;          /* optional: join/leave/lookup counters */
    duet_router_workers_change_cb on_change; /* optional */
    void *change_arg;
} duet_router_workers_config_t;

typedef enum {
    DUET_ROUTER_WORKER_ACTIVE = 0,  /* in the table (in rotation when healthy) */
    DUET_ROUTER_WORKER_LEAVING = 1, /* out of rotation, requests finishing */
    DUET_ROUTER_WORKER_REMOVED = 2, /* gone: the slot's last worker */
} duet_router_worker_state_t;

/* A worker's prefix cache, from its Info (docs/prefix-cache.md). */
typedef struct {
    bool on;
    uint32_t cached_pages, shared_pages, in_use_pages;
    uint64_t lookups, lookup_tokens, hit_tokens, hit_pages, inserted_pages, evictions;
} duet_router_cache_stats_t;

typedef struct {
    duet_role_t role;
    char name[128];
    char address[128];
    char group[DUET_ROUTER_DISC_HOST_MAX + 8]; /* discovered: its discover spec; static: "" */
    duet_router_worker_state_t state;
    bool healthy;
    bool have_info;
    uint32_t tp; /* from Info, else the config's */
    uint32_t free_pages, total_pages, queue_depth, running, max_context;
    bool draining;
    /* decode: prefill_local (its Info's, else the config's) and its counts
     * of local and remote prefills (Info) */
    duet_prefill_local_t prefill_local;
    uint64_t prefills_local, prefills_remote;
    /* decode step timing from its Info (decode_steps .. decode_cycle_ns) */
    uint64_t steps, forward_ns, cycles, cycle_ns;
    duet_router_cache_stats_t cache;
    int64_t inflight; /* this router's requests on it */
    double load;      /* duet_router_load_score */
    uint64_t checks, failures;
    int64_t last_ok_ms_ago; /* -1: never */
    char instance_id[64];
    char last_error[160];
} duet_router_worker_info_t;

/* Check the instance lists the way the router reads them (used by
 * --check-config through duet_router_create): each role has an entry, each
 * entry has `address` or `discover` (not both), discover parses as
 * "name:port" / "[v6]:port", and no static name looks like a discovered
 * worker's ("<group>/...").  DUET_ERR_CONFIG naming the key.  Resolves
 * nothing. */
duet_status_t duet_router_workers_validate(const duet_cluster_config_t *cfg);

/* Build the table: static workers in config order (indices 0..), groups
 * empty until the first lookup.  Fails as duet_router_workers_validate. */
duet_status_t duet_router_workers_create(const duet_cluster_config_t *cfg,
                                         const duet_router_workers_config_t *wc,
                                         duet_router_workers_t **w_p);
/* Start the checker threads and the discovery thread (the first checks
 * and lookups run at once). */
duet_status_t duet_router_workers_start(duet_router_workers_t *w);
/* Stop and join the threads (idempotent; pick/release still work; running
 * lookups are abandoned).  Accepts NULL. */
void duet_router_workers_stop(duet_router_workers_t *w);
/* Stop, free everything.  Accepts NULL. */
void duet_router_workers_destroy(duet_router_workers_t *w);

/* Slots to iterate with snapshot (0..count-1); some may hold no worker. */
size_t duet_router_workers_count(const duet_router_workers_t *w, duet_role_t role);
/* Workers in the table (active, not leaving). */
size_t duet_router_workers_active(duet_router_workers_t *w, duet_role_t role);
size_t duet_router_workers_healthy(duet_router_workers_t *w, duet_role_t role);
/* The shortest wait a new prompt would have in a healthy prefill's queue,
 * in ms: (its Info's queue_tokens + the requests picked for it since, at
 * its mean prompt length; or, when more, this router's requests on it
 * without a first token at that mean: some may not have reached its queue
 * yet) / its measured prefill_tokens_per_s.  0 when no
 * prefill is healthy or none has measured a rate yet (docs/migration.md
 * "Overload"). */
int64_t duet_router_workers_prefill_wait_ms(duet_router_workers_t *w);
/* At least one healthy decode worker, and a healthy prefill worker or a
 * healthy decode that prefills locally. */
bool duet_router_workers_ready(duet_router_workers_t *w);

/* Choose a worker of role by the policy, avoiding index `avoid` (-1: none)
 * when another healthy worker exists.  Counts a request in flight on it
 * (undo with duet_router_workers_release).  -1 when none is healthy. */
int duet_router_workers_pick(duet_router_workers_t *w, duet_role_t role, int avoid);
void duet_router_workers_release(duet_router_workers_t *w, duet_role_t role, int idx);

/* ---- colocated decodes (workers_coloc.c) ---- */
/* Pick a decode as duet_router_workers_pick does; with colocated, only
 * among decodes that prefill locally (prefill_local not "off"). */
int duet_router_workers_pick_decode(duet_router_workers_t *w, int avoid, bool colocated);
/* A picked decode's prefill_local mode. */
duet_prefill_local_t duet_router_workers_prefill_local(duet_router_workers_t *w, int idx);
/* Name and address of a picked worker, valid until it is released. */
const char *duet_router_workers_address(const duet_router_workers_t *w, duet_role_t role, int idx);
const char *duet_router_workers_name(const duet_router_workers_t *w, duet_role_t role, int idx);
/* A request to this worker failed: check it now instead of at the next tick. */
void duet_router_workers_suspect(duet_router_workers_t *w, duet_role_t role, int idx);

/* ---- the cache_aware policy (workers_cache.c) ---- */
/* Pick as duet_router_workers_pick (colocated false) or _pick_decode, with
 * the prompt's page keys for the cache_aware policy (the others ignore
 * key; NULL: none).  *matched_p (optional): the prompt prefix, in tokens,
 * this router had already sent to the chosen worker (0 under the other
 * policies). */
int duet_router_workers_pick_keyed(duet_router_workers_t *w, duet_role_t role, int avoid,
                                   bool colocated, const duet_router_ca_key_t *key,
                                   size_t *matched_p);
/* A request that ran on slot idx of role (still held) ended with output:
 * record its prompt + output pages for the cache_aware policy (nothing
 * under the others; policy_cache.h duet_router_cache_aware_record_output). */
void duet_router_workers_cache_record_output(duet_router_workers_t *w, duet_role_t role, int idx,
                                             const duet_router_ca_tokens_t *t);
/* Append the duet_router_cache_aware_* metrics (nothing under the other
 * policies). */
void duet_router_workers_cache_render(duet_router_workers_t *w, duet_router_buf_t *b);
/* The duet_prefix_cache_* metrics (Prometheus text) of every worker, per
 * instance, and their sums per role (router/fleet/cache_metrics.c). */
void duet_router_cache_metrics_render(duet_router_workers_t *w, duet_router_buf_t *b);

/* ---- pinned picks: the choices of an n > 1 request (workers_pin.c) ---- */
/* A worker as a request held it: its slot and the instance the slot held. */
typedef struct {
    int idx; /* -1: none */
    uint64_t instance;
} duet_router_pin_t;
/* The instance slot idx holds now (another value once the slot holds a
 * restarted daemon or another worker); idx must be held (picked). */
uint64_t duet_router_workers_instance(duet_router_workers_t *w, duet_role_t role, int idx);
/* Take the pinned worker when it is still the same instance, in rotation
 * (healthy: not draining), a decode that prefills locally when colocated,
 * and not overloaded: its load score is within balance_abs of the least
 * loaded eligible worker's, or within balance_rel times it (the
 * cache_aware policy's imbalance rule, router.cache_aware thresholds).
 * Counts a request in flight on it as pick does (and, under cache_aware,
 * records the key there; *matched_p as pick_keyed).  -1 when the pin does
 * not hold: the caller picks as usual. */
int duet_router_workers_pick_pinned(duet_router_workers_t *w, duet_role_t role, bool colocated,
                                    const duet_router_pin_t *pin, double balance_abs,
                                    double balance_rel, const duet_router_ca_key_t *key,
                                    size_t *matched_p);

/* The largest KV pool (Info total_pages) among the role's active workers
 * whose Info came; 0 when none has reported yet.  Thread-safe. */
uint32_t duet_router_workers_max_pages(const duet_router_workers_t *w, duet_role_t role);

/* Copy slot idx's worker into info.  Returns false when the slot holds
 * none (info then describes its last worker, state REMOVED, or is zeroed
 * when it never held one). */
bool duet_router_workers_snapshot(duet_router_workers_t *w, duet_role_t role, int idx,
                                  duet_router_worker_info_t *info);

#endif
