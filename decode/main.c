/* duet-decode: admits requests, has a prefill daemon fill their KV pages,
 * and runs continuous-batching decode (DESIGN §1).
 *
 *   duet-decode --config cluster.json --name decode-0 [--tp 4 ...]
 *
 * Start-up, SIGINT/SIGTERM drain and the exit after an engine failure are
 * the node's (node/node.h); this file adds the decode's services, tokenizer
 * and scheduler to it. */
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/fault.h"
#include "common/log.h"
#include "common/sync.h"
#include "decode/events.h"
#include "decode/prefill_path.h"
#include "decode/sched.h"
#include "decode/service.h"

static duet_status_t duet__decode_register(void *arg)
{
    return duet_dc_service_register(arg);
}

static duet_status_t duet__decode_start(void *arg)
{
    duet_decode_t *dc = arg;
    duet_status_t st;

    if ((st = duet_tokenizer_load(dc->node.args.cluster->model, &dc->tok)) != DUET_OK)
        return st;
    dc->piece_cap = duet_detok_max_chunk(dc->tok) + 64;
    dc->piece = duet_malloc(dc->piece_cap);
    if (dc->piece == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "no memory");
    dc->max_ctx = dc->node.ke.model_cfg.max_pos;
    const duet_instance_config_t *self = dc->node.args.self;
    dc->local_mode = duet_cluster_prefill_local(self);
    /* chunked prefill (local_prefill.c): a step's prompt tokens fit its
     * forward's chunk */
    dc->chunk_tokens = self->prefill_chunk_tokens < self->max_batch_tokens
                           ? self->prefill_chunk_tokens
                           : self->max_batch_tokens;
    if (dc->local_mode != DUET_PREFILL_LOCAL_OFF)
        DUET_LOG_INFO("decode: prefill_local %s (auto: prompts up to %d tokens while fewer than "
                      "%d sequences decode); prefill_chunk_tokens %d (0: whole prompts)",
                      self->prefill_local, self->prefill_local_max_tokens,
                      self->prefill_local_max_running, dc->chunk_tokens);
    /* fault injection for tests (common/fault.h): every decode step takes
     * at least this long; a remote prefill's KV copy (unpack or import)
     * fails once the first token went out */
    dc->fault_step_delay_ms = duet_fault_value("decode.step_delay_ms", 0);
    dc->fault_kv_copy = duet_fault("decode.kv_copy_fail");
    return duet_dc_sched_start(dc);
}

/* The scheduler ends what is left (UNAVAILABLE) and waits for the prefill
 * calls and transfers those requests still have. */
static void duet__decode_stop(void *arg)
{
    duet_dc_drain_report(arg);
    duet_dc_sched_stop(arg);
}

static void duet__decode_cleanup(void *arg)
{
    duet_decode_t *dc = arg;
    duet_tokenizer_destroy(dc->tok);
    dc->tok = NULL;
    duet_free(dc->piece);
    dc->piece = NULL;
    /* events posted after the scheduler left (late callbacks) */
    while (dc->ev_head != NULL) {
        duet_dc_ev_t *ev = dc->ev_head;
        dc->ev_head = ev->next;
        duet_free(ev);
    }
}

static const duet_node_ops_t duet__decode_ops = {
    .role = DUET_ROLE_DECODE,
    .rpc_client = true,
    .register_services = duet__decode_register,
    .start = duet__decode_start,
    .pending = duet_dc_pending,
    .drain_begin = duet_dc_drain_begin,
    .stop = duet__decode_stop,
    .cleanup = duet__decode_cleanup,
    .on_peer_error = duet_dc_on_peer_error,
};

int main(int argc, char **argv)
{
    static duet_decode_t dc;
    int rc;

    pthread_mutex_init(&dc.evlock, NULL);
    /* the scheduler's timed wait takes a CLOCK_MONOTONIC deadline */
    duet_cond_init_monotonic(&dc.evcv);
    rc = duet_node_main(&dc.node, &duet__decode_ops, &dc, argc, argv);
    pthread_cond_destroy(&dc.evcv);
    pthread_mutex_destroy(&dc.evlock);
    return rc;
}
