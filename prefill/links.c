/* Decode daemons that bootstrapped with this prefill daemon (DESIGN §1):
 * their transfer descriptors, our connections to their ranks, and the slice
 * plan for their TP size.  A decode daemon that restarts bootstraps again
 * under a new decode_id and replaces its old link. */
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/rpc_pb.h"
#include "duet/v1/prefill.pb-c.h"
#include "prefill/prefill.h"

typedef struct {
    duet_prefill_t *pf;
    duet_rpc_call_t *call;
    Duet__V1__BootstrapRequest *msg;
} duet__boot_task_t;

static void duet__link_free(duet_prefill_t *pf, duet_pf_link_t *link)
{
    int P = pf->ke.tp;
    if (link->peers != NULL) {
        for (int i = 0; i < P * link->D; i++)
            duet_xfer_peer_disconnect(link->peers[i]);
    }
    duet_free(link->peers);
    duet_slice_plan_destroy(link->plan);
    duet_free(link);
}

static void duet__link_free_task(void *arg)
{
    duet_pf_link_t *link = arg;
    duet__link_free(link->owner, link);
}

void duet_pf_link_put(duet_prefill_t *pf, duet_pf_link_t *link)
{
    bool last;
    if (link == NULL)
        return;
    pthread_mutex_lock(&pf->links_lock);
    last = --link->refs == 0;
    pthread_mutex_unlock(&pf->links_lock);
    if (!last)
        return;
    /* disconnecting blocks and is not allowed on progress threads: the
     * worker does it */
    if (duet_workq_post(pf->workq, duet__link_free_task, link) != DUET_OK)
        DUET_LOG_ERROR("prefill: cannot release link %s: %s", link->decode_id,
                       duet_error_msg());
}

duet_pf_link_t *duet_pf_link_get(duet_prefill_t *pf, const char *decode_id)
{
    duet_pf_link_t *link;
    pthread_mutex_lock(&pf->links_lock);
    for (link = pf->links; link != NULL; link = link->next) {
        if (!link->dead && strcmp(link->decode_id, decode_id) == 0) {
            link->refs++;
            break;
        }
    }
    pthread_mutex_unlock(&pf->links_lock);
    return link;
}

/* Take links matching (decode_id or name) out of the table; the table's
 * reference goes with them. */
static void duet__links_retire(duet_prefill_t *pf, const char *decode_id, const char *name)
{
    duet_pf_link_t **pp, *gone = NULL;
    pthread_mutex_lock(&pf->links_lock);
    pp = &pf->links;
    while (*pp != NULL) {
        duet_pf_link_t *l = *pp;
        if ((decode_id && strcmp(l->decode_id, decode_id) == 0) ||
            (name && strcmp(l->name, name) == 0)) {
            *pp = l->next;
            l->dead = true;
            l->next = gone;
            gone = l;
        } else {
            pp = &l->next;
        }
    }
    pthread_mutex_unlock(&pf->links_lock);
    while (gone != NULL) {
        duet_pf_link_t *l = gone;
        gone = l->next;
        DUET_LOG_INFO("prefill: dropping link to decode %s (%s)", l->name, l->decode_id);
        duet_pf_link_put(pf, l);
    }
}

void duet_pf_on_peer_error(void *arg, duet_xfer_peer_t *peer, duet_status_t st,
                           const char *detail)
{
    duet_prefill_t *pf = arg;
    int P = pf->ke.tp;
    char id[64] = "";

    pthread_mutex_lock(&pf->links_lock);
    for (duet_pf_link_t *l = pf->links; l != NULL && id[0] == '\0'; l = l->next) {
        for (int i = 0; i < P * l->D; i++) {
            if (l->peers[i] == peer) {
                l->dead = true;
                snprintf(id, sizeof(id), "%s", l->decode_id);
                break;
            }
        }
    }
    pthread_mutex_unlock(&pf->links_lock);
    DUET_LOG_WARN("prefill: transfer peer failed (%s): %s; decode %s must bootstrap again",
                  duet_status_str(st), detail, id[0] ? id : "?");
}

static duet_status_t duet__boot_check(duet_prefill_t *pf, const Duet__V1__BootstrapRequest *m)
{
    if (m->decode_id == NULL || m->decode_id[0] == '\0' || strlen(m->decode_id) >= 64)
        return duet_error(DUET_ERR_INVALID, "bootstrap: decode_id must be 1..63 bytes");
    if (m->decode_name == NULL || strlen(m->decode_name) >= 160)
        return duet_error(DUET_ERR_INVALID, "bootstrap: decode_name must be at most 159 bytes");
    if (m->tp < 1 || m->tp > DUET_TP_MAX || m->n_rank_descriptors != m->tp)
        return duet_error(DUET_ERR_INVALID, "bootstrap: tp %u with %zu rank descriptors",
                          m->tp, m->n_rank_descriptors);
    if (m->model_fingerprint != pf->ke.fingerprint)
        return duet_error(DUET_ERR_MISMATCH,
                          "bootstrap: decode %s serves model fingerprint %016llx, this prefill "
                          "serves %016llx (%s): different model or weights",
                          m->decode_name, (unsigned long long)m->model_fingerprint,
                          (unsigned long long)pf->ke.fingerprint, pf->args.cluster->model);
    if (m->kv_heads != (uint32_t)pf->ke.kv_heads)
        return duet_error(DUET_ERR_MISMATCH, "bootstrap: decode has %u kv heads, prefill %d",
                          m->kv_heads, pf->ke.kv_heads);
    return DUET_OK;
}

static duet_status_t duet__boot_connect(duet_prefill_t *pf, const Duet__V1__BootstrapRequest *m,
                                        duet_pf_link_t **link_p)
{
    int P = pf->ke.tp, D = (int)m->tp;
    int64_t deadline = duet_now_ns() + (int64_t)pf->args.cluster->rpc_timeout_ms * DUET_NS_PER_MS;
    duet_pf_link_t *link = DUET_NEW(duet_pf_link_t);
    duet_status_t st;
    int recv[DUET_TP_MAX];

    if (link == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "bootstrap: no memory");
    snprintf(link->decode_id, sizeof(link->decode_id), "%s", m->decode_id);
    snprintf(link->name, sizeof(link->name), "%s", m->decode_name);
    link->D = D;
    link->refs = 1;
    link->owner = pf;
    if ((st = duet_slice_plan_create(P, D, pf->ke.kv_heads, &link->plan)) != DUET_OK)
        goto err;
    link->peers = DUET_NEW_ARRAY(duet_xfer_peer_t *, (size_t)(P * D));
    if (link->peers == NULL) {
        st = duet_error(DUET_ERR_NO_MEMORY, "bootstrap: no memory");
        goto err;
    }
    for (int s = 0; s < P; s++) {
        int n = duet_slice_plan_receivers(link->plan, s, recv);
        for (int i = 0; i < n; i++) {
            int d = recv[i];
            st = duet_xfer_peer_connect(duet_xfer_rank(pf->ke.xfer, s),
                                        m->rank_descriptors[d].data, m->rank_descriptors[d].len,
                                        deadline, &link->peers[s * D + d]);
            if (st != DUET_OK) {
                st = duet_error_wrap(st, "bootstrap: prefill rank %d -> decode %s rank %d: ", s,
                                     m->decode_name, d);
                goto err;
            }
        }
    }
    *link_p = link;
    return DUET_OK;
err:
    duet__link_free(pf, link);
    return st;
}

static void duet__boot_task(void *arg)
{
    duet__boot_task_t *t = arg;
    duet_prefill_t *pf = t->pf;
    const Duet__V1__BootstrapRequest *m = t->msg;
    duet_pf_link_t *link = NULL;
    duet_status_t st;

    if ((st = duet__boot_check(pf, m)) == DUET_OK) {
        /* a restarted decode daemon replaces its old link */
        duet__links_retire(pf, m->decode_id, m->decode_name);
        st = duet__boot_connect(pf, m, &link);
    }
    if (st != DUET_OK) {
        DUET_LOG_WARN("prefill: bootstrap from %s refused: %s", m->decode_name,
                      duet_error_msg());
        duet_rpc_call_fail_status(t->call, st, duet_error_msg());
        goto out;
    }
    pthread_mutex_lock(&pf->links_lock);
    link->next = pf->links;
    pf->links = link;
    pthread_mutex_unlock(&pf->links_lock);
    DUET_LOG_INFO("prefill: decode %s (%s, tp %d) bootstrapped", link->name, link->decode_id,
                  link->D);

    Duet__V1__BootstrapResponse resp = DUET__V1__BOOTSTRAP_RESPONSE__INIT;
    ProtobufCBinaryData descs[DUET_TP_MAX];
    for (int r = 0; r < pf->ke.tp; r++)
        descs[r] = (ProtobufCBinaryData){pf->desc_lens[r], pf->descs[r]};
    resp.prefill_id = pf->args.instance_id;
    resp.prefill_name = pf->args.self->name;
    resp.tp = (uint32_t)pf->ke.tp;
    resp.model_fingerprint = pf->ke.fingerprint;
    resp.kv_heads = (uint32_t)pf->ke.kv_heads;
    resp.n_rank_descriptors = (size_t)pf->ke.tp;
    resp.rank_descriptors = descs;
    duet_pb_reply(t->call, &resp.base);
out:
    duet__v1__bootstrap_request__free_unpacked(t->msg, NULL);
    duet_free(t);
}

void duet_pf_bootstrap(duet_prefill_t *pf, duet_rpc_call_t *call, const uint8_t *req, size_t len)
{
    duet__boot_task_t *t = DUET_NEW(duet__boot_task_t);
    Duet__V1__BootstrapRequest *m = duet__v1__bootstrap_request__unpack(NULL, len, req);

    if (m == NULL || t == NULL) {
        duet_rpc_call_fail(call, m == NULL ? GRPC_STATUS_INVALID_ARGUMENT
                                           : GRPC_STATUS_RESOURCE_EXHAUSTED,
                           m == NULL ? "bootstrap: malformed BootstrapRequest" : "no memory");
        if (m != NULL)
            duet__v1__bootstrap_request__free_unpacked(m, NULL);
        duet_free(t);
        return;
    }
    *t = (duet__boot_task_t){pf, call, m};
    /* connecting blocks: not on a completion-queue thread */
    if (duet_workq_post(pf->workq, duet__boot_task, t) != DUET_OK) {
        duet_rpc_call_fail_status(call, DUET_ERR_SHUTDOWN, "prefill is shutting down");
        duet__v1__bootstrap_request__free_unpacked(m, NULL);
        duet_free(t);
    }
}

void duet_pf_links_destroy(duet_prefill_t *pf)
{
    duet_pf_link_t *l = pf->links;
    pf->links = NULL;
    while (l != NULL) {
        duet_pf_link_t *next = l->next;
        duet__link_free(pf, l);
        l = next;
    }
}
