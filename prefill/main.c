/* duet-prefill: computes prompts' KV caches and writes them into decode
 * daemons' pages (DESIGN §1).
 *
 *   duet-prefill --config cluster.json --name prefill-0 [--tp 2 ...]
 *
 * Start-up, SIGINT/SIGTERM drain and the exit after an engine failure are
 * the node's (node/node.h); this file adds the prefill's services and
 * scheduler to it. */
#include <string.h>

#include "common/log.h"
#include "prefill/prefill.h"

static duet_status_t duet__prefill_register(void *arg)
{
    return duet_pf_service_register(arg);
}

static duet_status_t duet__prefill_start(void *arg)
{
    duet_prefill_t *pf = arg;
    duet_status_t st = duet_pf_sched_start(pf);
    if (st == DUET_OK)
        pf->sched_started = true;
    return st;
}

static void duet__prefill_stop(void *arg)
{
    duet_prefill_t *pf = arg;
    if (pf->sched_started)
        duet_pf_sched_stop(pf);
}

/* A connection to a decode rank failed: its link goes (requests using it
 * have been failed by the transfer layer); the decode bootstraps again. */
static void duet__prefill_on_peer_error(void *arg, duet_xfer_peer_t *peer, duet_status_t st,
                                        const char *detail)
{
    duet_prefill_t *pf = arg;
    const duet_xfer_desc_info_t *in = duet_xfer_peer_info(peer);
    char id[128] = "?";

    duet_node_link_retire_peer(&pf->node, peer, in->instance, in->rank, id, sizeof(id));
    DUET_LOG_WARN("prefill: transfer peer failed (%s): %s; decode %s must bootstrap again",
                  duet_status_str(st), detail, id);
}

static const duet_node_ops_t duet__prefill_ops = {
    .role = DUET_ROLE_PREFILL,
    .register_services = duet__prefill_register,
    .start = duet__prefill_start,
    .pending = duet_pf_pending,
    .drain_abort = duet_pf_drain_abort,
    .stop = duet__prefill_stop,
    .quiesce = duet_pf_quiesce,
    .on_peer_error = duet__prefill_on_peer_error,
    .on_layer = duet_pf_on_layer,
};

int main(int argc, char **argv)
{
    static duet_prefill_t pf;
    int rc;

    pthread_mutex_init(&pf.lock, NULL);
    pthread_cond_init(&pf.cv, NULL);
    /* grants served once (node/replay.h): room for 196,608 live ones */
    pf.grants_seen = duet_node_replay_create(DUET_PF_GRANTS_SEEN);
    if (pf.grants_seen == NULL) {
        DUET_LOG_ERROR("prefill: no memory for the grant table");
        return 1;
    }
    rc = duet_node_main(&pf.node, &duet__prefill_ops, &pf, argc, argv);
    duet_node_replay_destroy(pf.grants_seen);
    pthread_cond_destroy(&pf.cv);
    pthread_mutex_destroy(&pf.lock);
    return rc;
}
