/* duet-prefill: computes prompts' KV caches and writes them into decode
 * daemons' pages (DESIGN §1).
 *
 *   duet-prefill --config cluster.json --name prefill-0 [--tp 2 ...]
 *
 * Start-up: the gRPC server and its health service come up first (health
 * NOT_SERVING while the model loads), then the engine and transfer ranks,
 * then health SERVING.  SIGINT/SIGTERM: health NOT_SERVING, new requests
 * refused (UNAVAILABLE), in-flight ones finish within drain_timeout_ms,
 * then everything is released and the process exits 0. */
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "engine/backend.h"
#include "common/sync.h"
#include "prefill/prefill.h"

static int duet__check_config(duet_prefill_t *pf)
{
    duet_model_config_t cfg;
    duet_status_t st = duet_model_config_load(pf->args.cluster->model, &cfg);
    if (st == DUET_OK)
        st = duet_tp_check(&cfg, pf->args.self->tp);
    if (st != DUET_OK) {
        fprintf(stderr, "duet-prefill: %s: %s\n", pf->args.self->name, duet_error_msg());
        return 1;
    }
    printf("duet-prefill: config ok: %s tp %d listen %s model %s\n", pf->args.self->name,
           pf->args.self->tp, pf->args.self->listen, pf->args.cluster->model);
    /* valid config, but can this binary run it?  (a CPU-only build has no
     * cuda backend): exit 3 says so */
    fflush(stdout);
    if (duet_backend_find(pf->args.self->backend) == NULL) {
        fprintf(stderr, "duet-prefill: %s: %s\n", pf->args.self->name, duet_error_msg());
        return 3;
    }
    return 0;
}

static duet_status_t duet__start(duet_prefill_t *pf)
{
    duet_rpc_server_config_t sc;
    duet_status_t st;

    duet_rpc_server_config_init(&sc);
    sc.bind_addr = pf->args.self->listen;
    sc.n_threads = pf->args.self->grpc_threads;
    sc.max_message_bytes = 64u << 20;
    sc.shutdown_grace_ms = 2000;
    if ((st = duet_workq_create("pf-work", &pf->workq)) != DUET_OK ||
        (st = duet_rpc_server_create(&sc, &pf->srv)) != DUET_OK ||
        (st = duet_rpc_health_create(pf->srv, DUET_RPC_HEALTH_NOT_SERVING, &pf->health)) !=
            DUET_OK ||
        (st = duet_pf_service_register(pf)) != DUET_OK ||
        (st = duet_rpc_server_start(pf->srv)) != DUET_OK)
        return st;

    duet_kv_engine_opts_t ko = {
        .role = DUET_XFER_PREFILL,
        .cluster = pf->args.cluster,
        .self = pf->args.self,
        .on_peer_error = duet_pf_on_peer_error,
        .cb_arg = pf,
        .on_layer = duet_pf_on_layer,
        .layer_ud = pf,
    };
    if ((st = duet_kv_engine_create(&ko, &pf->ke)) != DUET_OK)
        return st;
    if ((st = duet_kv_pool_create(pf->args.self->n_pages, &pf->pages)) != DUET_OK)
        return st;
    pf->descs = DUET_NEW_ARRAY(void *, (size_t)pf->ke.tp);
    pf->desc_lens = DUET_NEW_ARRAY(size_t, (size_t)pf->ke.tp);
    if (pf->descs == NULL || pf->desc_lens == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "no memory");
    if ((st = duet_kv_engine_descriptors(&pf->ke, pf->descs, pf->desc_lens)) != DUET_OK)
        return st;
    if ((st = duet_pf_sched_start(pf)) != DUET_OK)
        return st;
    pf->sched_started = true;
    /* the handlers answered UNAVAILABLE until now */
    atomic_store(&pf->ready, true);
    return DUET_OK;
}

static void duet__drain(duet_prefill_t *pf)
{
    int64_t deadline = duet_now_ns() + (int64_t)pf->args.self->drain_timeout_ms * DUET_NS_PER_MS;
    duet_rpc_health_set(pf->health, "", DUET_RPC_HEALTH_NOT_SERVING);
    pthread_mutex_lock(&pf->lock);
    pf->draining = true;
    while ((pf->n_queued > 0 || pf->n_inflight > 0) && duet_now_ns() < deadline) {
        pthread_mutex_unlock(&pf->lock);
        nanosleep(&(struct timespec){0, 20 * 1000000L}, NULL);
        pthread_mutex_lock(&pf->lock);
    }
    int left = pf->n_queued + pf->n_inflight;
    /* what is left is aborted: queued requests fail, sends end cancelled */
    for (duet_pf_req_t *r = pf->queue_head; r != NULL; r = r->next)
        r->aborted = true;
    for (duet_pf_req_t *r = pf->inflight; r != NULL; r = r->next)
        r->aborted = true;
    pthread_cond_broadcast(&pf->cv);
    pthread_mutex_unlock(&pf->lock);
    if (left > 0)
        DUET_LOG_WARN("prefill: drain timeout: aborting %d request(s)", left);
}

static void duet__stop(duet_prefill_t *pf)
{
    if (pf->sched_started)
        duet_pf_sched_stop(pf);
    /* the scheduler is gone; sends still in flight end on their own
     * (acknowledged, failed or at their deadline) */
    if (pf->srv != NULL)
        duet_rpc_server_shutdown(pf->srv, 2000);
    if (pf->ke.xfer != NULL) {
        for (;;) {
            pthread_mutex_lock(&pf->lock);
            int n = pf->n_inflight;
            pthread_mutex_unlock(&pf->lock);
            if (n == 0)
                break;
            nanosleep(&(struct timespec){0, 10 * 1000000L}, NULL);
        }
    }
    duet_workq_destroy(pf->workq);
    pf->workq = NULL;
    duet_pf_links_destroy(pf);
    duet_rpc_server_destroy(pf->srv);
    duet_rpc_health_destroy(pf->health);
    for (int r = 0; pf->descs != NULL && r < pf->ke.tp; r++)
        duet_free(pf->descs[r]);
    duet_free(pf->descs);
    duet_free(pf->desc_lens);
    duet_kv_engine_destroy(&pf->ke);
    duet_kv_pool_destroy(pf->pages);
}

int main(int argc, char **argv)
{
    duet_prefill_t pf;
    duet_status_t st;
    int rc = 1;

    memset(&pf, 0, sizeof(pf));
    duet_log_init_from_env();
    duet_log_set_component("prefill");
    duet_daemon_signals_block();
    st = duet_daemon_args_parse(argc, argv, DUET_ROLE_PREFILL, &pf.args);
    if (st == DUET_ERR_CANCELLED)
        return 0;
    if (st != DUET_OK) {
        fprintf(stderr, "duet-prefill: %s\n", duet_error_msg());
        return 2;
    }
    if (pf.args.check_config) {
        rc = duet__check_config(&pf);
        duet_daemon_args_cleanup(&pf.args);
        return rc;
    }
    pthread_mutex_init(&pf.lock, NULL);
    pthread_cond_init(&pf.cv, NULL);
    pthread_mutex_init(&pf.links_lock, NULL);

    st = duet__start(&pf);
    if (st != DUET_OK) {
        DUET_LOG_ERROR("start-up failed: %s", duet_error_msg());
        fprintf(stderr, "duet-prefill: %s: %s\n", pf.args.self->name, duet_error_msg());
        goto out;
    }
    duet_rpc_health_set(pf.health, "", DUET_RPC_HEALTH_SERVING);
    DUET_LOG_INFO("prefill %s (%s) serving on port %d: tp %d, %d pages", pf.args.self->name,
                  pf.args.instance_id, duet_rpc_server_port(pf.srv), pf.ke.tp,
                  pf.args.self->n_pages);
    int sig = duet_daemon_signal_wait(-1);
    DUET_LOG_INFO("prefill: signal %d: draining", sig);
    duet__drain(&pf);
    rc = 0;
out:
    duet__stop(&pf);
    pthread_mutex_destroy(&pf.links_lock);
    pthread_cond_destroy(&pf.cv);
    pthread_mutex_destroy(&pf.lock);
    duet_daemon_args_cleanup(&pf.args);
    DUET_LOG_INFO("prefill: exit %d", rc);
    return rc;
}
