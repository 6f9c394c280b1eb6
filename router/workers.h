/* The router's view of the cluster's prefill and decode workers, from the
 * cluster config.  One checker thread per worker calls grpc.health.v1
 * Health/Check every health_interval_ms, then the role's Info (load: queue
 * depth, running, free pages).  A worker is in rotation while its last Check
 * said SERVING and its Info does not say draining; it leaves on the first
 * failed check and comes back on the first good one.  duet_router_workers_
 * suspect() makes a worker's checker run now (after a failed request).
 *
 * Thread-safe: every function may be called from any thread.  Worker
 * indices are stable for the life of the object; name/address strings
 * stay valid until destroy. */
#ifndef DUET_ROUTER_WORKERS_H
#define DUET_ROUTER_WORKERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/cluster.h"
#include "common/rpc.h"
#include "common/status.h"
#include "router/policy.h"

typedef struct duet_router_workers duet_router_workers_t;

/* Called on a checker thread when a worker enters or leaves rotation. */
typedef void (*duet_router_workers_change_cb)(void *arg);

typedef struct {
    duet_role_t role;
    const char *name;
    const char *address;
    bool healthy;
    bool have_info;
    uint32_t tp; /* from Info, else the config's */
    uint32_t free_pages, total_pages, queue_depth, running, max_context;
    bool draining;
    int64_t inflight; /* this router's requests on it */
    double load;      /* duet_router_load_score */
    uint64_t checks, failures;
    int64_t last_ok_ms_ago; /* -1: never */
    char instance_id[64];
    char last_error[160];
} duet_router_worker_info_t;

/* cli is borrowed (outlives the workers object).  Fails with
 * DUET_ERR_CONFIG when a role has no instance or an instance has no
 * static address (`discover` entries are not supported by the router). */
duet_status_t duet_router_workers_create(const duet_cluster_config_t *cfg,
                                         duet_router_policy_t policy, int interval_ms,
                                         duet_rpc_client_t *cli,
                                         duet_router_workers_change_cb on_change, void *arg,
                                         duet_router_workers_t **w_p);
/* Start the checker threads (the first check runs at once). */
duet_status_t duet_router_workers_start(duet_router_workers_t *w);
/* Stop and join the checkers (idempotent; pick/release still work).
 * Accepts NULL. */
void duet_router_workers_stop(duet_router_workers_t *w);
/* Stop the checkers, free everything.  Accepts NULL. */
void duet_router_workers_destroy(duet_router_workers_t *w);

size_t duet_router_workers_count(const duet_router_workers_t *w, duet_role_t role);
size_t duet_router_workers_healthy(duet_router_workers_t *w, duet_role_t role);
/* At least one healthy prefill and one healthy decode worker. */
bool duet_router_workers_ready(duet_router_workers_t *w);

/* Choose a worker of role by the policy, avoiding index `avoid` (-1: none)
 * when another healthy worker exists.  Counts a request in flight on it
 * (undo with duet_router_workers_release).  -1 when none is healthy. */
int duet_router_workers_pick(duet_router_workers_t *w, duet_role_t role, int avoid);
void duet_router_workers_release(duet_router_workers_t *w, duet_role_t role, int idx);
const char *duet_router_workers_address(const duet_router_workers_t *w, duet_role_t role, int idx);
const char *duet_router_workers_name(const duet_router_workers_t *w, duet_role_t role, int idx);
/* A request to this worker failed: check it now instead of at the next tick. */
void duet_router_workers_suspect(duet_router_workers_t *w, duet_role_t role, int idx);

void duet_router_workers_snapshot(duet_router_workers_t *w, duet_role_t role, int idx,
                                  duet_router_worker_info_t *info);

#endif
