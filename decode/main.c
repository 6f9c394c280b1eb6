/* duet-decode: admits requests, has a prefill daemon fill their KV pages,
 * and runs continuous-batching decode (DESIGN §1).
 *
 *   duet-decode --config cluster.json --name decode-0 [--tp 4 ...]
 *
 * SIGINT/SIGTERM: health NOT_SERVING, new requests refused (UNAVAILABLE),
 * in-flight ones finish within drain_timeout_ms and the rest are aborted,
 * then UCX, gRPC and the engine are released and the process exits 0. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/sync.h"
#include "engine/backend.h"
#include "decode/decode.h"

static int duet__check_config(duet_decode_t *dc)
{
    duet_model_config_t cfg;
    duet_status_t st = duet_model_config_load(dc->args.cluster->model, &cfg);
    if (st == DUET_OK)
        st = duet_tp_check(&cfg, dc->args.self->tp);
    if (st != DUET_OK) {
        fprintf(stderr, "duet-decode: %s: %s\n", dc->args.self->name, duet_error_msg());
        return 1;
    }
    printf("duet-decode: config ok: %s tp %d listen %s model %s\n", dc->args.self->name,
           dc->args.self->tp, dc->args.self->listen, dc->args.cluster->model);
    /* valid config, but can this binary run it?  (a CPU-only build has no
     * cuda backend): exit 3 says so */
    fflush(stdout);
    if (duet_backend_find(dc->args.self->backend) == NULL) {
        fprintf(stderr, "duet-decode: %s: %s\n", dc->args.self->name, duet_error_msg());
        return 3;
    }
    return 0;
}

static duet_status_t duet__start(duet_decode_t *dc)
{
    duet_rpc_server_config_t sc;
    duet_rpc_client_config_t cc;
    duet_status_t st;

    char host[64] = "localhost";
    gethostname(host, sizeof(host) - 1);
    snprintf(dc->host_name, sizeof(dc->host_name), "%s@%s", dc->args.self->name, host);
    duet_rpc_server_config_init(&sc);
    sc.bind_addr = dc->args.self->listen;
    sc.n_threads = dc->args.self->grpc_threads;
    sc.max_message_bytes = 64u << 20;
    sc.stream_queue_limit = 4096;
    sc.shutdown_grace_ms = 2000;
    duet_rpc_client_config_init(&cc);
    cc.max_message_bytes = 64u << 20;
    if ((st = duet_workq_create("dc-work", &dc->workq)) != DUET_OK ||
        (st = duet_rpc_client_create(&cc, &dc->cli)) != DUET_OK ||
        (st = duet_rpc_server_create(&sc, &dc->srv)) != DUET_OK ||
        (st = duet_rpc_health_create(dc->srv, DUET_RPC_HEALTH_NOT_SERVING, &dc->health)) !=
            DUET_OK ||
        (st = duet_dc_service_register(dc)) != DUET_OK ||
        (st = duet_rpc_server_start(dc->srv)) != DUET_OK)
        return st;

    if ((st = duet_tokenizer_load(dc->args.cluster->model, &dc->tok)) != DUET_OK)
        return st;
    dc->piece_cap = duet_detok_max_chunk(dc->tok) + 64;
    dc->piece = duet_malloc(dc->piece_cap);
    if (dc->piece == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "no memory");
    duet_kv_engine_opts_t ko = {
        .role = DUET_XFER_DECODE,
        .cluster = dc->args.cluster,
        .self = dc->args.self,
        .on_peer_error = duet_dc_on_peer_error,
        .cb_arg = dc,
    };
    if ((st = duet_kv_engine_create(&ko, &dc->ke)) != DUET_OK)
        return st;
    dc->max_ctx = dc->ke.model_cfg.max_pos;
    if ((st = duet_kv_pool_create(dc->args.self->n_pages, &dc->pages)) != DUET_OK)
        return st;
    dc->descs = DUET_NEW_ARRAY(void *, (size_t)dc->ke.tp);
    dc->desc_lens = DUET_NEW_ARRAY(size_t, (size_t)dc->ke.tp);
    if (dc->descs == NULL || dc->desc_lens == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "no memory");
    if ((st = duet_kv_engine_descriptors(&dc->ke, dc->descs, dc->desc_lens)) != DUET_OK)
        return st;
    atomic_store(&dc->next_transfer_id, (duet_random_u64() & 0xffffffff00000000ull) | 1);
    /* fault injection for tests: every decode step takes at least this long */
    const char *delay = getenv("DUET_FAULT_DECODE_STEP_DELAY_MS");
    dc->fault_step_delay_ms = delay != NULL ? strtol(delay, NULL, 10) : 0;
    if ((st = duet_dc_sched_start(dc)) != DUET_OK)
        return st;
    atomic_store(&dc->ready, true);
    return DUET_OK;
}

static void duet__drain(duet_decode_t *dc)
{
    int64_t deadline = duet_now_ns() + (int64_t)dc->args.self->drain_timeout_ms * DUET_NS_PER_MS;
    int queued = 0, running = 0;

    duet_rpc_health_set(dc->health, "", DUET_RPC_HEALTH_NOT_SERVING);
    atomic_store(&dc->draining, true);
    for (;;) {
        duet_dc_counts(dc, &queued, &running);
        if (queued + running == 0 || duet_now_ns() >= deadline)
            break;
        nanosleep(&(struct timespec){0, 20 * 1000000L}, NULL);
    }
    if (queued + running > 0)
        DUET_LOG_WARN("decode: drain timeout: aborting %d request(s)", queued + running);
}

static void duet__stop(duet_decode_t *dc)
{
    /* the scheduler ends what is left (UNAVAILABLE) and waits for the
     * prefill calls and transfers those requests still have */
    duet_dc_sched_stop(dc);
    if (dc->srv != NULL)
        duet_rpc_server_shutdown(dc->srv, 2000);
    /* the worker first: a bootstrap still queued or running calls through
     * the client (its call ends at its deadline) */
    duet_workq_destroy(dc->workq);
    dc->workq = NULL;
    duet_rpc_client_destroy(dc->cli);
    dc->cli = NULL;
    duet_dc_links_destroy(dc);
    duet_rpc_server_destroy(dc->srv);
    duet_rpc_health_destroy(dc->health);
    for (int r = 0; dc->descs != NULL && r < dc->ke.tp; r++)
        duet_free(dc->descs[r]);
    duet_free(dc->descs);
    duet_free(dc->desc_lens);
    duet_kv_engine_destroy(&dc->ke);
    duet_kv_pool_destroy(dc->pages);
    duet_tokenizer_destroy(dc->tok);
    duet_free(dc->piece);
    /* events posted after the scheduler left (late callbacks) */
    while (dc->ev_head != NULL) {
        duet_dc_ev_t *ev = dc->ev_head;
        dc->ev_head = ev->next;
        duet_free(ev);
    }
}

int main(int argc, char **argv)
{
    static duet_decode_t dc;
    duet_status_t st;
    int rc = 1;

    duet_log_init_from_env();
    duet_log_set_component("decode");
    duet_daemon_signals_block();
    st = duet_daemon_args_parse(argc, argv, DUET_ROLE_DECODE, &dc.args);
    if (st == DUET_ERR_CANCELLED)
        return 0;
    if (st != DUET_OK) {
        fprintf(stderr, "duet-decode: %s\n", duet_error_msg());
        return 2;
    }
    if (dc.args.check_config) {
        rc = duet__check_config(&dc);
        duet_daemon_args_cleanup(&dc.args);
        return rc;
    }
    pthread_mutex_init(&dc.evlock, NULL);
    /* the scheduler's timed wait takes a CLOCK_MONOTONIC deadline */
    duet_cond_init_monotonic(&dc.evcv);
    st = duet__start(&dc);
    if (st != DUET_OK) {
        DUET_LOG_ERROR("start-up failed: %s", duet_error_msg());
        fprintf(stderr, "duet-decode: %s: %s\n", dc.args.self->name, duet_error_msg());
        goto out;
    }
    duet_rpc_health_set(dc.health, "", DUET_RPC_HEALTH_SERVING);
    DUET_LOG_INFO("decode %s (%s) serving on port %d: tp %d, %d pages of %d tokens",
                  dc.args.self->name, dc.args.instance_id, duet_rpc_server_port(dc.srv),
                  dc.ke.tp, dc.args.self->n_pages, dc.args.cluster->page_size);
    int sig = duet_daemon_signal_wait(-1);
    DUET_LOG_INFO("decode: signal %d: draining", sig);
    duet__drain(&dc);
    rc = 0;
out:
    duet__stop(&dc);
    pthread_cond_destroy(&dc.evcv);
    pthread_mutex_destroy(&dc.evlock);
    duet_daemon_args_cleanup(&dc.args);
    DUET_LOG_INFO("decode: exit %d", rc);
    return rc;
}
