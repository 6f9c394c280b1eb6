/* The runtime both daemons share (DESIGN §1, §9): a duet_node_t owns what
 * every duet-prefill and duet-decode process has -- the command line, the
 * gRPC server with its health service, the engine with its KV pools and
 * transfer ranks (node/kv_engine.h), the page allocator, this daemon's
 * transfer descriptors, the worker thread for blocking work, the links to
 * the other role's daemons (node/link.h) -- and runs the life of the
 * process: start-up, serving, the drain on SIGINT/SIGTERM, the exit on an
 * engine failure, and the release of everything.  A daemon brings what is
 * its own through duet_node_ops_t: its gRPC services and its scheduler.
 *
 * Life of a node (duet_node_main):
 *   parse the command line (exit 2 on a bad one; --help exits 0) and, with
 *   --check-config, validate and exit (0 ok, 1 invalid, 3 this binary lacks
 *   the backend); otherwise the gRPC server and its health service come up
 *   first (health NOT_SERVING, methods answer UNAVAILABLE until ready),
 *   then the engine and transfer ranks, the page pool and the descriptors,
 *   then ops->start (the scheduler), then health SERVING.
 *   SIGINT/SIGTERM: health NOT_SERVING, new requests refused (the daemons
 *   check `draining`), in-flight ones finish within drain_timeout_ms and the
 *   rest are aborted, then everything is released and the process exits 0.
 *   Engine failure (duet_node_fail: a collective deadline, a rank error, a
 *   device error): the engine cannot run again, so the daemon fails what it
 *   holds, does not drain, and exits DUET_NODE_EXIT_ENGINE_FAILED so that
 *   the orchestrator restarts the instance.
 *
 * Threads: duet_node_main runs on the process's main thread; the ops run
 * there too except where they say otherwise.  `ready`, `draining` and the
 * failure are safe to read from any thread. */
#ifndef DUET_NODE_NODE_H
#define DUET_NODE_NODE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "common/daemon.h"
#include "common/rpc.h"
#include "common/workq.h"
#include "kv/pool.h"
#include "kv/prefix_cache.h"
#include "node/kv_engine.h"

/* Exit status after an engine failure (EX_SOFTWARE of sysexits.h). */
#define DUET_NODE_EXIT_ENGINE_FAILED 70

typedef struct duet_node duet_node_t;
typedef struct duet_node_link duet_node_link_t;

/* What a daemon adds to the node.  ud is the daemon's context. */
typedef struct {
    duet_role_t role;
    bool rpc_client; /* create node->cli: the daemon calls other daemons */
    /* Add the daemon's gRPC methods (the server is not started yet). */
    duet_status_t (*register_services)(void *ud);
    /* Everything is up (engine, pool, descriptors): start the scheduler.
     * The handlers may touch the engine once this returned DUET_OK. */
    duet_status_t (*start)(void *ud);
    /* Requests not finished yet (drain; any thread may call it). */
    int (*pending)(void *ud);
    /* The drain began (new requests are refused from now on): hand back
     * what others can continue (optional; any thread). */
    void (*drain_begin)(void *ud);
    /* The drain deadline passed: abort what is left (optional). */
    void (*drain_abort)(void *ud);
    /* Stop the scheduler: it ends what is left (also after a failed
     * start-up, where start may not have run or not have succeeded). */
    void (*stop)(void *ud);
    /* After the gRPC server shut down, before the worker, the client and
     * the links go: wait for what can still call back (optional). */
    void (*quiesce)(void *ud);
    /* Last: release the daemon's own resources (optional). */
    void (*cleanup)(void *ud);
    /* Transfer callbacks (node/kv_engine.h): run on progress / rank threads. */
    duet_xfer_peer_error_cb_t on_peer_error;
    void (*on_layer)(void *ud, int rank, int layer, bool last_chunk);
} duet_node_ops_t;

struct duet_node {
    duet_daemon_args_t args;
    const duet_node_ops_t *ops;
    void *ud;
    const char *role; /* "prefill" or "decode": logs */
    duet_kv_engine_t ke;
    duet_kv_pool_t *pages; /* page ids, the same on every rank */
    duet_kv_pool_t *stage; /* staging units of packed transfers (NULL: no arena) */
    duet_rpc_server_t *srv;
    duet_rpc_health_t *health;
    duet_rpc_client_t *cli; /* ops->rpc_client only */
    duet_rpc_auth_t *auth;  /* the config's auth section, NULL = off */
    duet_workq_t *workq;    /* blocking work: connects, disconnects, bootstrap calls */
    void **descs;           /* our transfer descriptors, one per rank */
    size_t *desc_lens;
    /* "<name>@<host>": how the other side tells a restarted instance of us
     * from a sibling that shares our config entry (a StatefulSet's pods) */
    char host_name[160];
    atomic_bool ready;    /* handlers may touch the engine */
    atomic_bool draining; /* handlers refuse new requests (UNAVAILABLE) */

    /* the links to the other role's daemons (node/link.h) */
    pthread_mutex_t links_lock;
    duet_node_link_t *links;
    duet_node_link_t *links_dropped; /* released after links_closed */
    bool links_closed;               /* the worker is going */

    /* engine failure: the first one is kept, main is woken */
    pthread_t main_thread;
    atomic_bool failed;
    pthread_mutex_t fail_lock;
    char fail_msg[512];
};

/* The whole life of a daemon process (see the file comment); returns the
 * process's exit status.  node is the daemon's (zeroed) storage, ud is
 * handed to every op. */
int duet_node_main(duet_node_t *node, const duet_node_ops_t *ops, void *ud, int argc, char **argv);

/* The engine failed (any thread, any number of times; the first detail is
 * kept): log it, health NOT_SERVING, refuse new requests, and wake the main
 * thread, which stops the daemon and exits DUET_NODE_EXIT_ENGINE_FAILED.
 * The caller has already failed the requests the failed step carried. */
void duet_node_fail(duet_node_t *node, const char *detail);

/* True once duet_node_fail was called. */
bool duet_node_failed(duet_node_t *node);

#endif
