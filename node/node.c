/* The life of a daemon process (node/node.h): start-up, serving, drain,
 * engine failure, release. */
#include "node/node.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/fault.h"
#include "common/limits.h"
#include "common/log.h"
#include "common/rpc_auth.h"
#include "engine/backend.h"
#include "engine/tp.h"
#include "node/link.h"

/* The auth material against this daemon: no plaintext listen on a
 * non-loopback address unless auth.insecure; a certificate naming an
 * identity must name this role and instance (docs/security.md "Identities
 * and roles"). */
static duet_status_t duet__check_auth(duet_node_t *node, const duet_rpc_auth_t *auth)
{
    const duet_daemon_args_t *a = &node->args;
    const duet_auth_config_t *ac = &a->cluster->auth;
    bool tls = ac->ca != NULL && ac->ca[0] != '\0';
    char key[192];
    duet_status_t st;

    snprintf(key, sizeof(key), "listen (%s %s)", node->role, a->self->name);
    if ((st = duet_rpc_auth_listen_check(tls, ac->insecure, key, a->self->listen)) != DUET_OK)
        return st;
    const char *id = duet_rpc_auth_identity(auth);
    if (!tls)
        return DUET_OK;
    if (id[0] == '\0') {
        DUET_LOG_WARN("duet-%s: auth.cert %s names no identity (URI SAN spiffe://duet/%s/%s): "
                      "peers refuse its calls that need a role",
                      node->role, ac->cert, node->role, a->self->name);
        return DUET_OK;
    }
    char want[192];
    snprintf(want, sizeof(want), "%s/%s", node->role, a->self->name);
    if (strcmp(id, want) != 0)
        return duet_error(DUET_ERR_CONFIG,
                          "auth.cert: %s names spiffe://duet/%s, but this is %s (want "
                          "spiffe://duet/%s)",
                          ac->cert, id, want, want);
    return DUET_OK;
}

/* --check-config: 0 valid, 1 invalid, 3 valid but not runnable by this
 * binary */
static int duet__check_config(duet_node_t *node)
{
    const duet_daemon_args_t *a = &node->args;
    duet_model_config_t cfg;
    duet_status_t st = duet_model_config_load(a->cluster->model, &cfg);

    if (st == DUET_OK)
        st = duet_tp_check(&cfg, a->self->tp);
    if (st == DUET_OK) {
        duet_rpc_auth_t *auth = NULL;
        st = duet_rpc_auth_load(&a->cluster->auth, &auth);
        if (st == DUET_OK)
            st = duet__check_auth(node, auth);
        duet_rpc_auth_destroy(auth);
    }
    if (st != DUET_OK) {
        fprintf(stderr, "duet-%s: %s: %s\n", node->role, a->self->name, duet_error_msg());
        return 1;
    }
    printf("duet-%s: config ok: %s tp %d listen %s model %s\n", node->role, a->self->name,
           a->self->tp, a->self->listen, a->cluster->model);
    /* valid config, but can this binary run it?  (a CPU-only build has no
     * cuda backend): exit 3 says so */
    fflush(stdout);
    if (duet_backend_find(a->self->backend) == NULL) {
        fprintf(stderr, "duet-%s: %s: %s\n", node->role, a->self->name, duet_error_msg());
        return 3;
    }
    return 0;
}

static duet_status_t duet__start(duet_node_t *node)
{
    const duet_node_ops_t *ops = node->ops;
    duet_rpc_server_config_t sc;
    duet_rpc_client_config_t cc;
    duet_status_t st;

    char host[64] = "localhost";
    gethostname(host, sizeof(host) - 1);
    snprintf(node->host_name, sizeof(node->host_name), "%s@%s", node->args.self->name, host);
    duet_model_config_t mc;
    if ((st = duet_model_config_load(node->args.cluster->model, &mc)) != DUET_OK)
        return st;
    if ((st = duet_rpc_auth_load(&node->args.cluster->auth, &node->auth)) != DUET_OK ||
        (st = duet__check_auth(node, node->auth)) != DUET_OK)
        return st;
    duet_rpc_server_config_init(&sc);
    sc.auth = node->auth;
    sc.bind_addr = node->args.self->listen;
    sc.n_threads = node->args.self->grpc_threads;
    /* the router's caps: a bigger request is RESOURCE_EXHAUSTED */
    sc.max_message_bytes = duet_limit_daemon_message_bytes(node->args.cluster, mc.max_pos);
    sc.stream_queue_limit = 4096;
    sc.shutdown_grace_ms = 2000;
    /* decode: the scheduler queues each step's tokens and runs the next
     * step while a sender thread writes them (DUET_DECODE_DEFER_SENDS=0:
     * the scheduler writes them itself, for comparison) */
    const char *defer = getenv("DUET_DECODE_DEFER_SENDS");
    sc.defer_sends = ops->role == DUET_ROLE_DECODE && !(defer != NULL && strcmp(defer, "0") == 0);
    duet_rpc_client_config_init(&cc);
    cc.auth = node->auth;
    cc.max_message_bytes = 64u << 20;
    if ((st = duet_workq_create(ops->role == DUET_ROLE_PREFILL ? "pf-work" : "dc-work",
                                &node->workq)) != DUET_OK ||
        (ops->rpc_client && (st = duet_rpc_client_create(&cc, &node->cli)) != DUET_OK) ||
        (st = duet_rpc_server_create(&sc, &node->srv)) != DUET_OK ||
        (st = duet_rpc_health_create(node->srv, DUET_RPC_HEALTH_NOT_SERVING, &node->health)) !=
            DUET_OK ||
        (st = ops->register_services(node->ud)) != DUET_OK ||
        (st = duet_rpc_server_start(node->srv)) != DUET_OK)
        return st;

    duet_kv_engine_opts_t ko = {
        .role = ops->role == DUET_ROLE_PREFILL ? DUET_XFER_PREFILL : DUET_XFER_DECODE,
        .cluster = node->args.cluster,
        .self = node->args.self,
        .on_peer_error = ops->on_peer_error,
        .cb_arg = node->ud,
        .on_layer = ops->on_layer,
        .layer_ud = node->ud,
    };
    if ((st = duet_kv_engine_create(&ko, &node->ke)) != DUET_OK)
        return st;
    if ((st = duet_kv_pool_create(node->args.self->n_pages, &node->pages)) != DUET_OK)
        return st;
    if (node->ke.stage_units > 0 &&
        (st = duet_kv_pool_create(node->ke.stage_units, &node->stage)) != DUET_OK)
        return st;
    if (node->args.self->prefix_cache && (st = duet_kv_pool_cache_enable(node->pages)) != DUET_OK)
        return st;
    node->descs = DUET_NEW_ARRAY(void *, (size_t)node->ke.tp);
    node->desc_lens = DUET_NEW_ARRAY(size_t, (size_t)node->ke.tp);
    if (node->descs == NULL || node->desc_lens == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "no memory");
    if ((st = duet_kv_engine_descriptors(&node->ke, node->descs, node->desc_lens)) != DUET_OK)
        return st;
    if ((st = ops->start(node->ud)) != DUET_OK)
        return st;
    /* the handlers answered UNAVAILABLE until now */
    atomic_store(&node->ready, true);
    return DUET_OK;
}

static void duet__drain(duet_node_t *node)
{
    int64_t deadline = duet_now_ns() + (int64_t)node->args.self->drain_timeout_ms * DUET_NS_PER_MS;
    int left;

    duet_rpc_health_set(node->health, "", DUET_RPC_HEALTH_NOT_SERVING);
    atomic_store(&node->draining, true);
    if (node->ops->drain_begin != NULL)
        node->ops->drain_begin(node->ud);
    /* an engine failure during the drain ends it: what is left cannot run */
    while ((left = node->ops->pending(node->ud)) > 0 && duet_now_ns() < deadline &&
           !duet_node_failed(node))
        nanosleep(&(struct timespec){0, 20 * 1000000L}, NULL);
    if (left == 0)
        return;
    if (!duet_node_failed(node))
        DUET_LOG_WARN("%s: drain timeout: aborting %d request(s)", node->role, left);
    if (node->ops->drain_abort != NULL)
        node->ops->drain_abort(node->ud);
}

static void duet__stop(duet_node_t *node)
{
    const duet_node_ops_t *ops = node->ops;

    /* the scheduler ends what is left; transfers still in flight end on
     * their own (acknowledged, failed or at their deadline) */
    ops->stop(node->ud);
    if (node->srv != NULL)
        duet_rpc_server_shutdown(node->srv, 2000);
    if (ops->quiesce != NULL)
        ops->quiesce(node->ud);
    /* the worker before the client: a bootstrap still queued or running
     * calls through it (its call ends at its deadline) */
    duet_node_links_close(node);
    duet_workq_destroy(node->workq);
    node->workq = NULL;
    duet_rpc_client_destroy(node->cli);
    node->cli = NULL;
    duet_node_links_destroy(node);
    duet_rpc_server_destroy(node->srv);
    node->srv = NULL;
    duet_rpc_health_destroy(node->health);
    node->health = NULL;
    duet_rpc_auth_destroy(node->auth);
    node->auth = NULL;
    for (int r = 0; node->descs != NULL && r < node->ke.tp; r++)
        duet_free(node->descs[r]);
    duet_free(node->descs);
    node->descs = NULL;
    duet_free(node->desc_lens);
    node->desc_lens = NULL;
    duet_kv_engine_destroy(&node->ke);
    duet_kv_pool_destroy(node->pages);
    node->pages = NULL;
    duet_kv_pool_destroy(node->stage);
    node->stage = NULL;
    if (ops->cleanup != NULL)
        ops->cleanup(node->ud);
}

int duet_node_main(duet_node_t *node, const duet_node_ops_t *ops, void *ud, int argc, char **argv)
{
    duet_status_t st;
    int rc = 1;

    /* the child that tries a peer's UCX descriptors (transfer/xfer_probe.c) */
    if (argc >= 2 && strcmp(argv[1], DUET_XFER_PROBE_FLAG) == 0)
        return duet_xfer_probe_main(argc >= 3 ? argv[2] : "");
    node->ops = ops;
    node->ud = ud;
    node->role = duet_role_name(ops->role);
    duet_log_init_from_env();
    duet_log_set_component(node->role);
    /* a malformed DUET_FAULTS (tests) stops the daemon: a test arming a
     * misspelt fault point would otherwise test nothing */
    if (duet_fault_init_from_env() != DUET_OK) {
        fprintf(stderr, "duet-%s: %s\n", node->role, duet_error_msg());
        return 2;
    }
    duet_daemon_signals_block();
    st = duet_daemon_args_parse(argc, argv, ops->role, &node->args);
    if (st == DUET_ERR_CANCELLED)
        return 0;
    if (st != DUET_OK) {
        fprintf(stderr, "duet-%s: %s\n", node->role, duet_error_msg());
        return 2;
    }
    if (node->args.check_config) {
        rc = duet__check_config(node);
        duet_daemon_args_cleanup(&node->args);
        return rc;
    }
    pthread_mutex_init(&node->links_lock, NULL);
    pthread_mutex_init(&node->fail_lock, NULL);
    node->main_thread = pthread_self();

    st = duet__start(node);
    if (st != DUET_OK) {
        DUET_LOG_ERROR("start-up failed: %s", duet_error_msg());
        fprintf(stderr, "duet-%s: %s: %s\n", node->role, node->args.self->name, duet_error_msg());
        goto out;
    }
    duet_rpc_health_set(node->health, "", DUET_RPC_HEALTH_SERVING);
    DUET_LOG_INFO("%s %s (%s) serving on port %d: tp %d, %d pages of %d tokens, prefix cache %s",
                  node->role, node->args.self->name, node->args.instance_id,
                  duet_rpc_server_port(node->srv), node->ke.tp, node->args.self->n_pages,
                  node->args.cluster->page_size, node->args.self->prefix_cache ? "on" : "off");
    /* a request the pool can never hold is refused (docs: README "Long
     * contexts"): say so once when the pool is shorter than the context */
    int64_t pool_tokens = (int64_t)node->args.self->n_pages * node->args.cluster->page_size;
    if (pool_tokens < node->ke.model_cfg.max_pos)
        DUET_LOG_WARN("kv: the pool holds %lld tokens, less than the context of %d: a request "
                      "needing more KV is refused (raise n_pages or lower kv.max_context)",
                      (long long)pool_tokens, node->ke.model_cfg.max_pos);
    /* duet_node_fail wakes this wait too */
    int sig = duet_daemon_signal_wait(-1);
    if (duet_node_failed(node)) {
        DUET_LOG_ERROR("%s: stopping after the engine failure (no drain)", node->role);
    } else {
        DUET_LOG_INFO("%s: signal %d: draining", node->role, sig);
        duet__drain(node);
    }
    rc = 0;
out:
    duet__stop(node);
    if (duet_node_failed(node))
        rc = DUET_NODE_EXIT_ENGINE_FAILED;
    pthread_mutex_destroy(&node->fail_lock);
    pthread_mutex_destroy(&node->links_lock);
    duet_daemon_args_cleanup(&node->args);
    DUET_LOG_INFO("%s: exit %d", node->role, rc);
    return rc;
}

void duet_node_fail(duet_node_t *node, const char *detail)
{
    bool first;

    pthread_mutex_lock(&node->fail_lock);
    first = !atomic_load(&node->failed);
    if (first) {
        snprintf(node->fail_msg, sizeof(node->fail_msg), "%s", detail);
        atomic_store(&node->draining, true);
        atomic_store(&node->failed, true);
    }
    pthread_mutex_unlock(&node->fail_lock);
    if (!first)
        return;
    DUET_LOG_ERROR("engine failed: %s; exiting so the orchestrator restarts this instance", detail);
    duet_rpc_health_set(node->health, "", DUET_RPC_HEALTH_NOT_SERVING);
    /* main waits in sigwaitinfo for SIGINT/SIGTERM, blocked in every
     * thread: a SIGTERM directed at it ends the wait (and stays pending,
     * harmlessly, when main has already moved on) */
    pthread_kill(node->main_thread, SIGTERM);
}

bool duet_node_failed(duet_node_t *node)
{
    return atomic_load(&node->failed);
}
