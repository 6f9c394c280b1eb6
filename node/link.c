/* Links between prefill and decode daemons: the table, connecting a link's
 * ranks, and both sides of Bootstrap (node/link.h). */
#include "node/link.h"

#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/random.h"
#include "common/rpc_pb.h"
#include "duet/v1/prefill.pb-c.h"
#include "engine/tp.h"
#include "node/deadline.h"

/* ---- the table ------------------------------------------------------------ */

static void duet__link_disconnect(duet_node_link_t *link)
{
    if (link->peers != NULL) {
        for (int i = 0; i < link->node->ke.tp * link->remote_tp; i++)
            duet_xfer_peer_disconnect(link->peers[i]);
    }
    duet_free(link->peers);
    link->peers = NULL;
    duet_slice_plan_destroy(link->plan);
    link->plan = NULL;
}

static void duet__link_free(void *arg)
{
    duet_node_link_t *link = arg;
    duet__link_disconnect(link);
    duet_free(link);
}

duet_node_link_t *duet_node_link_add(duet_node_t *node, const char *key, size_t size)
{
    duet_node_link_t *link = duet_calloc(1, size);
    if (link == NULL)
        return NULL;
    snprintf(link->key, sizeof(link->key), "%s", key);
    link->state = DUET_NODE_LINK_CONNECTING;
    link->refs = 1;
    link->node = node;
    pthread_mutex_lock(&node->links_lock);
    link->next = node->links;
    node->links = link;
    pthread_mutex_unlock(&node->links_lock);
    return link;
}

duet_node_link_t *duet_node_link_find(duet_node_t *node, const char *key, bool hold)
{
    duet_node_link_t *link;
    pthread_mutex_lock(&node->links_lock);
    for (link = node->links; link != NULL; link = link->next) {
        if (strcmp(link->key, key) != 0)
            continue;
        if (hold && link->state != DUET_NODE_LINK_READY)
            continue;
        if (hold)
            link->refs++;
        break;
    }
    pthread_mutex_unlock(&node->links_lock);
    return link;
}

void duet_node_link_hold(duet_node_link_t *link)
{
    pthread_mutex_lock(&link->node->links_lock);
    link->refs++;
    pthread_mutex_unlock(&link->node->links_lock);
}

void duet_node_link_put(duet_node_link_t *link)
{
    duet_node_t *node;

    if (link == NULL)
        return;
    node = link->node;
    pthread_mutex_lock(&node->links_lock);
    if (--link->refs == 0) {
        if (node->links_closed) {
            /* the worker is going: duet_node_links_destroy frees it */
            link->next = node->links_dropped;
            node->links_dropped = link;
        } else if (duet_workq_post(node->workq, duet__link_free, link) != DUET_OK) {
            /* disconnecting blocks and is not allowed on progress threads:
             * the worker does it (posted under the lock, so before
             * duet_node_links_close lets the worker go) */
            DUET_LOG_ERROR("%s: cannot release the link to %s: %s", node->role, link->key,
                           duet_error_msg());
        }
    }
    pthread_mutex_unlock(&node->links_lock);
}

void duet_node_link_ready(duet_node_link_t *link)
{
    pthread_mutex_lock(&link->node->links_lock);
    if (link->state == DUET_NODE_LINK_CONNECTING)
        link->state = DUET_NODE_LINK_READY;
    pthread_mutex_unlock(&link->node->links_lock);
}

/* links_lock held: unlink it; the caller drops the table's reference */
static bool duet__unlink(duet_node_t *node, duet_node_link_t *link)
{
    for (duet_node_link_t **pp = &node->links; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == link) {
            *pp = link->next;
            link->next = NULL;
            link->state = DUET_NODE_LINK_DEAD;
            return true;
        }
    }
    return false;
}

void duet_node_link_retire(duet_node_link_t *link)
{
    duet_node_t *node = link->node;
    pthread_mutex_lock(&node->links_lock);
    bool was_in = duet__unlink(node, link);
    pthread_mutex_unlock(&node->links_lock);
    if (was_in)
        duet_node_link_put(link);
}

bool duet_node_link_retire_peer(duet_node_t *node, const duet_xfer_peer_t *peer, uint64_t instance,
                                int rank, char *key_out, size_t key_len)
{
    duet_node_link_t *found = NULL;

    pthread_mutex_lock(&node->links_lock);
    for (duet_node_link_t *l = node->links; l != NULL && found == NULL; l = l->next) {
        /* a connecting link's peers are its bootstrap's until it is READY */
        if (l->state != DUET_NODE_LINK_READY || l->peers == NULL)
            continue;
        for (int i = 0; i < node->ke.tp * l->remote_tp; i++) {
            /* The pointer alone could be stale: a peer is freed only after
             * its error callback ran, and a link connected since becomes
             * READY only after; comparing the remote identity as well keeps
             * that an invariant checked here rather than an ordering
             * assumed. */
            if (l->peers[i] != peer)
                continue;
            const duet_xfer_desc_info_t *in = duet_xfer_peer_info(l->peers[i]);
            if (in->instance == instance && in->rank == rank) {
                found = l;
                break;
            }
        }
    }
    if (found != NULL) {
        snprintf(key_out, key_len, "%s", found->key);
        duet__unlink(node, found);
    }
    pthread_mutex_unlock(&node->links_lock);
    if (found == NULL)
        return false;
    duet_node_link_put(found);
    return true;
}

/* Prefill: retire the links of a decode instance id or name other than keep
 * (the new link of a restarted decode replaces its old one). */
static void duet__retire_identity(duet_node_t *node, const char *id, const char *name,
                                  const duet_node_link_t *keep)
{
    duet_node_link_t **pp, *gone = NULL;

    pthread_mutex_lock(&node->links_lock);
    pp = &node->links;
    while (*pp != NULL) {
        duet_node_link_t *l = *pp;
        if (l != keep && (strcmp(l->remote_id, id) == 0 || strcmp(l->remote_name, name) == 0)) {
            duet__unlink(node, l);
            l->next = gone;
            gone = l;
        } else {
            pp = &l->next;
        }
    }
    pthread_mutex_unlock(&node->links_lock);
    while (gone != NULL) {
        duet_node_link_t *l = gone;
        gone = l->next;
        l->next = NULL;
        DUET_LOG_INFO("prefill: dropping link to decode %s (%s)", l->remote_name, l->remote_id);
        duet_node_link_put(l);
    }
}

void duet_node_links_close(duet_node_t *node)
{
    pthread_mutex_lock(&node->links_lock);
    node->links_closed = true;
    pthread_mutex_unlock(&node->links_lock);
}

void duet_node_links_destroy(duet_node_t *node)
{
    duet_node_link_t *lists[2];

    pthread_mutex_lock(&node->links_lock);
    lists[0] = node->links;
    lists[1] = node->links_dropped;
    node->links = node->links_dropped = NULL;
    pthread_mutex_unlock(&node->links_lock);
    for (int i = 0; i < 2; i++) {
        while (lists[i] != NULL) {
            duet_node_link_t *next = lists[i]->next;
            duet__link_free(lists[i]);
            lists[i] = next;
        }
    }
}

/* ---- connecting ----------------------------------------------------------- */

#define DUET__PROBE_MAX_MS 5000

/* Before UCX sees the remote's descriptors: try them in a child process
 * (transfer/xfer_probe.c), so that a malformed worker address or rkey
 * fails this bootstrap alone, never the daemon.  Only the ranks some local
 * rank connects to; prefill unpacks rkeys, decode does not. */
static duet_status_t duet__probe(duet_node_t *node, duet_node_link_t *link,
                                 const ProtobufCBinaryData *descs, int64_t deadline)
{
    bool prefill = node->args.role == DUET_ROLE_PREFILL;
    bool used[DUET_TP_MAX] = {false};
    const void *blobs[DUET_TP_MAX];
    size_t lens[DUET_TP_MAX];
    int remote[DUET_TP_MAX], n = 0, qs[DUET_TP_MAX];
    duet_status_t st;

    for (int r = 0; r < node->ke.tp; r++) {
        int k = prefill ? duet_slice_plan_receivers(link->plan, r, remote)
                        : duet_slice_plan_senders(link->plan, r, remote);
        for (int i = 0; i < k; i++)
            used[remote[i]] = true;
    }
    for (int q = 0; q < link->remote_tp; q++) {
        if (!used[q])
            continue;
        qs[n] = q;
        blobs[n] = descs[q].data;
        lens[n++] = descs[q].len;
    }
    if (n == 0)
        return DUET_OK;
    /* a few ms when healthy (docs/security.md); a hung one holds the
     * node's worker thread for no more than this */
    int64_t cap = duet_now_ns() + DUET__PROBE_MAX_MS * DUET_NS_PER_MS;
    st = duet_xfer_probe_descs(node->ke.xfer, blobs, lens, n, prefill,
                               deadline < cap ? deadline : cap);
    if (st == DUET_OK)
        return DUET_OK;
    if (prefill)
        return duet_error_wrap(st, "bootstrap: decode %s ranks %d..%d: ", link->remote_name, qs[0],
                               qs[n - 1]);
    return duet_error_wrap(st, "bootstrap with prefill %s: prefill ranks %d..%d: ", link->key,
                           qs[0], qs[n - 1]);
}

/* Make the plan and connect every local rank to the remote ranks it shares
 * heads with (a prefill rank to its receivers, a decode rank to its
 * senders), from the remote's descriptors.  Worker thread. */
static duet_status_t duet__connect(duet_node_t *node, duet_node_link_t *link,
                                   const ProtobufCBinaryData *descs, int64_t deadline)
{
    bool prefill = node->args.role == DUET_ROLE_PREFILL;
    int L = node->ke.tp, R = link->remote_tp;
    int P = prefill ? L : R, D = prefill ? R : L;
    int remote[DUET_TP_MAX];
    duet_status_t st;

    if ((st = duet_slice_plan_create(P, D, node->ke.kv_heads, &link->plan)) != DUET_OK)
        goto err;
    link->peers = DUET_NEW_ARRAY(duet_xfer_peer_t *, (size_t)(L * R));
    if (link->peers == NULL) {
        st = duet_error(DUET_ERR_NO_MEMORY, "bootstrap: no memory");
        goto err;
    }
    if ((st = duet__probe(node, link, descs, deadline)) != DUET_OK)
        goto err;
    for (int r = 0; r < L; r++) {
        int n = prefill ? duet_slice_plan_receivers(link->plan, r, remote)
                        : duet_slice_plan_senders(link->plan, r, remote);
        for (int i = 0; i < n; i++) {
            int q = remote[i];
            st = duet_xfer_peer_connect(duet_xfer_rank(node->ke.xfer, r), descs[q].data,
                                        descs[q].len, deadline, &link->peers[r * R + q]);
            if (st == DUET_OK)
                continue;
            if (prefill)
                st = duet_error_wrap(st, "bootstrap: prefill rank %d -> decode %s rank %d: ", r,
                                     link->remote_name, q);
            else
                st = duet_error_wrap(st,
                                     "bootstrap with prefill %s: decode rank %d -> prefill "
                                     "rank %d: ",
                                     link->key, r, q);
            goto err;
        }
    }
    return DUET_OK;
err:
    duet__link_disconnect(link);
    return st;
}

/* ---- Bootstrap: the decode side ------------------------------------------ */

static duet_status_t duet__check_reply(duet_node_t *node, const char *target,
                                       const Duet__V1__BootstrapResponse *m)
{
    if (m->tp < 1 || m->tp > DUET_TP_MAX || m->n_rank_descriptors != m->tp)
        return duet_error(DUET_ERR_FORMAT, "bootstrap with prefill %s: tp %u, %zu descriptors",
                          target, m->tp, m->n_rank_descriptors);
    if (m->model_fingerprint != node->ke.fingerprint || m->kv_heads != (uint32_t)node->ke.kv_heads)
        return duet_error(DUET_ERR_MISMATCH,
                          "bootstrap with prefill %s: it serves model fingerprint %016llx (%u kv "
                          "heads), this decode %016llx (%d kv heads)",
                          target, (unsigned long long)m->model_fingerprint, m->kv_heads,
                          (unsigned long long)node->ke.fingerprint, node->ke.kv_heads);
    return DUET_OK;
}

/* Whether a decode rank is on the GPU of a prefill rank it hears from. */
static bool duet__shares_gpu(const duet_node_t *node, const duet_node_link_t *link,
                             const Duet__V1__BootstrapResponse *m)
{
    if (m->n_rank_gpus != (size_t)link->remote_tp)
        return false; /* an older prefill: none sent */
    for (int d = 0; d < node->ke.tp; d++)
        for (int s = 0; s < link->remote_tp; s++)
            if (duet_node_link_peers(link, d)[s] != NULL && node->ke.gpu[d][0] != '\0' &&
                m->rank_gpus[s] != NULL && strcmp(node->ke.gpu[d], m->rank_gpus[s]) == 0)
                return true;
    return false;
}

duet_status_t duet_node_link_bootstrap(duet_node_t *node, duet_node_link_t *link)
{
    int D = node->ke.tp;
    int64_t deadline = duet_node_deadline_rpc(node->args.cluster, duet_now_ns());
    Duet__V1__BootstrapRequest req = DUET__V1__BOOTSTRAP_REQUEST__INIT;
    Duet__V1__BootstrapResponse *resp = NULL;
    ProtobufCBinaryData descs[DUET_TP_MAX];
    duet_rpc_result_t res = {0};
    uint8_t *buf = NULL;
    size_t len = 0;
    duet_status_t st;

    for (int d = 0; d < D; d++)
        descs[d] = (ProtobufCBinaryData){node->desc_lens[d], node->descs[d]};
    req.decode_id = node->args.instance_id;
    req.decode_name = node->host_name;
    req.tp = (uint32_t)D;
    req.model_fingerprint = node->ke.fingerprint;
    req.kv_heads = (uint32_t)node->ke.kv_heads;
    req.n_rank_descriptors = (size_t)D;
    req.rank_descriptors = descs;
    /* a new key for every link: grants made for an older one do not hold */
    if ((st = duet_random_bytes(link->grant_key, sizeof(link->grant_key))) != DUET_OK)
        goto out;
    req.grant_key = (ProtobufCBinaryData){sizeof(link->grant_key), link->grant_key};
    if ((st = duet_pb_pack(&req.base, &buf, &len)) != DUET_OK)
        goto out;
    st = duet_rpc_client_unary(node->cli, link->key, "/duet.v1.Prefill/Bootstrap", buf, len,
                               deadline, &res);
    if (st != DUET_OK) {
        st = duet_error_wrap(st, "bootstrap with prefill %s: ", link->key);
        goto out;
    }
    resp = duet__v1__bootstrap_response__unpack(NULL, res.len, res.data);
    if (resp == NULL) {
        st = duet_error(DUET_ERR_FORMAT, "bootstrap with prefill %s: malformed reply", link->key);
        goto out;
    }
    if ((st = duet__check_reply(node, link->key, resp)) != DUET_OK)
        goto out;
    link->remote_tp = (int)resp->tp;
    snprintf(link->remote_id, sizeof(link->remote_id), "%s",
             resp->prefill_id ? resp->prefill_id : "");
    snprintf(link->remote_name, sizeof(link->remote_name), "%s",
             resp->prefill_name ? resp->prefill_name : "");
    if ((st = duet__connect(node, link, resp->rank_descriptors, deadline)) != DUET_OK)
        goto out;
    link->shares_gpu = duet__shares_gpu(node, link, resp);
    DUET_LOG_INFO("decode: bootstrapped with prefill %s (%s, tp %d)%s", link->key, link->remote_id,
                  link->remote_tp,
                  link->shares_gpu
                      ? "; a decode rank shares its GPU with a prefill rank sending to "
                        "it: early unpacks only for large requests"
                      : "");
out:
    if (st != DUET_OK) {
        snprintf(link->error, sizeof(link->error), "%s", duet_error_msg());
        DUET_LOG_WARN("decode: %s", link->error);
    }
    if (resp != NULL)
        duet__v1__bootstrap_response__free_unpacked(resp, NULL);
    duet_rpc_result_cleanup(&res);
    duet_free(buf);
    return st;
}

/* ---- Bootstrap: the prefill side ------------------------------------------ */

typedef struct {
    duet_node_t *node;
    duet_rpc_call_t *call;
    Duet__V1__BootstrapRequest *msg;
    const char *peer; /* the caller's decode identity name; NULL: TLS off */
} duet__serve_task_t;

/* The instance part of a decode_name ("<name>@<host>") equals name. */
static bool duet__name_is(const char *decode_name, const char *name)
{
    if (decode_name == NULL)
        return false;
    size_t n = strcspn(decode_name, "@");
    return strlen(name) == n && memcmp(decode_name, name, n) == 0;
}

/* With identities (TLS on): a decode bootstraps only as the instance its
 * certificate names, and never under the id of a link another instance
 * made (docs/security.md "Identities and roles"). */
static duet_status_t duet__check_identity(duet_node_t *node, const Duet__V1__BootstrapRequest *m,
                                          const char *peer)
{
    duet_status_t st = DUET_OK;

    if (peer == NULL)
        return DUET_OK;
    if (!duet__name_is(m->decode_name, peer))
        return duet_error(DUET_ERR_PEER,
                          "bootstrap: decode_name %s is not the instance the caller's "
                          "certificate names (decode/%s)",
                          m->decode_name ? m->decode_name : "", peer);
    pthread_mutex_lock(&node->links_lock);
    for (const duet_node_link_t *l = node->links; l != NULL; l = l->next)
        if (m->decode_id != NULL && strcmp(l->remote_id, m->decode_id) == 0 &&
            !duet__name_is(l->remote_name, peer)) {
            st = duet_error(DUET_ERR_PEER,
                            "bootstrap: decode_id %s belongs to decode %s, not to the caller "
                            "(decode/%s)",
                            m->decode_id, l->remote_name, peer);
            break;
        }
    pthread_mutex_unlock(&node->links_lock);
    return st;
}

static duet_status_t duet__check_request(duet_node_t *node, const Duet__V1__BootstrapRequest *m)
{
    if (m->decode_id == NULL || m->decode_id[0] == '\0' || strlen(m->decode_id) >= 64)
        return duet_error(DUET_ERR_INVALID, "bootstrap: decode_id must be 1..63 bytes");
    if (m->decode_name == NULL || strlen(m->decode_name) >= 160)
        return duet_error(DUET_ERR_INVALID, "bootstrap: decode_name must be at most 159 bytes");
    if (m->tp < 1 || m->tp > DUET_TP_MAX || m->n_rank_descriptors != m->tp)
        return duet_error(DUET_ERR_INVALID, "bootstrap: tp %u with %zu rank descriptors", m->tp,
                          m->n_rank_descriptors);
    if (m->model_fingerprint != node->ke.fingerprint)
        return duet_error(DUET_ERR_MISMATCH,
                          "bootstrap: decode %s serves model fingerprint %016llx, this prefill "
                          "serves %016llx (%s): different model or weights",
                          m->decode_name, (unsigned long long)m->model_fingerprint,
                          (unsigned long long)node->ke.fingerprint, node->args.cluster->model);
    if (m->kv_heads != (uint32_t)node->ke.kv_heads)
        return duet_error(DUET_ERR_MISMATCH, "bootstrap: decode has %u kv heads, prefill %d",
                          m->kv_heads, node->ke.kv_heads);
    if (m->grant_key.len != DUET_NODE_GRANT_KEY_LEN)
        return duet_error(DUET_ERR_INVALID,
                          "bootstrap: grant_key of %zu bytes, expected %d (a decode that grants "
                          "its pages: docs/security.md)",
                          m->grant_key.len, DUET_NODE_GRANT_KEY_LEN);
    return DUET_OK;
}

static void duet__reply(duet_node_t *node, duet_rpc_call_t *call)
{
    Duet__V1__BootstrapResponse resp = DUET__V1__BOOTSTRAP_RESPONSE__INIT;
    ProtobufCBinaryData descs[DUET_TP_MAX];
    char *gpus[DUET_TP_MAX];

    for (int r = 0; r < node->ke.tp; r++)
        descs[r] = (ProtobufCBinaryData){node->desc_lens[r], node->descs[r]};
    resp.prefill_id = node->args.instance_id;
    resp.prefill_name = node->args.self->name;
    resp.tp = (uint32_t)node->ke.tp;
    resp.model_fingerprint = node->ke.fingerprint;
    resp.kv_heads = (uint32_t)node->ke.kv_heads;
    resp.n_rank_descriptors = (size_t)node->ke.tp;
    resp.rank_descriptors = descs;
    for (int r = 0; r < node->ke.tp; r++)
        gpus[r] = node->ke.gpu[r];
    resp.n_rank_gpus = (size_t)node->ke.tp;
    resp.rank_gpus = gpus;
    duet_pb_reply(call, &resp.base);
}

static void duet__serve_task(void *arg)
{
    duet__serve_task_t *t = arg;
    duet_node_t *node = t->node;
    const Duet__V1__BootstrapRequest *m = t->msg;
    int64_t deadline = duet_node_deadline_rpc(node->args.cluster, duet_now_ns());
    duet_node_link_t *link = NULL;
    duet_status_t st;

    if ((st = duet__check_identity(node, m, t->peer)) != DUET_OK) {
        DUET_LOG_WARN("prefill: bootstrap from decode/%s refused: %s", t->peer, duet_error_msg());
        duet_rpc_call_fail(t->call, GRPC_STATUS_PERMISSION_DENIED, duet_error_msg());
        goto out;
    }
    if ((st = duet__check_request(node, m)) != DUET_OK)
        goto refuse;
    /* CONNECTING beside any READY link of the same decode, which keeps
     * serving (lookups take READY links only) until this one works */
    link = duet_node_link_add(node, m->decode_id, sizeof(*link));
    if (link == NULL) {
        st = duet_error(DUET_ERR_NO_MEMORY, "bootstrap: no memory");
        goto refuse;
    }
    snprintf(link->remote_id, sizeof(link->remote_id), "%s", m->decode_id);
    snprintf(link->remote_name, sizeof(link->remote_name), "%s", m->decode_name);
    link->remote_tp = (int)m->tp;
    memcpy(link->grant_key, m->grant_key.data, sizeof(link->grant_key));
    if ((st = duet__connect(node, link, m->rank_descriptors, deadline)) != DUET_OK) {
        duet_node_link_retire(link);
        goto refuse;
    }
    /* connected: it replaces the older links of this decode (a restarted
     * one); READY first, so lookups never find none between the two */
    duet_node_link_ready(link);
    duet__retire_identity(node, m->decode_id, m->decode_name, link);
    DUET_LOG_INFO("prefill: decode %s (%s, tp %d) bootstrapped", link->remote_name, link->remote_id,
                  link->remote_tp);
    duet__reply(node, t->call);
    goto out;
refuse:
    DUET_LOG_WARN("prefill: bootstrap from %s refused: %s", m->decode_name, duet_error_msg());
    duet_rpc_call_fail_status(t->call, st, duet_error_msg());
out:
    duet__v1__bootstrap_request__free_unpacked(t->msg, NULL);
    duet_free(t);
}

void duet_node_link_serve_bootstrap(duet_node_t *node, duet_rpc_call_t *call, const uint8_t *req,
                                    size_t len)
{
    duet__serve_task_t *t = DUET_NEW(duet__serve_task_t);
    Duet__V1__BootstrapRequest *m = duet__v1__bootstrap_request__unpack(NULL, len, req);

    if (m == NULL || t == NULL) {
        duet_rpc_call_fail(
            call, m == NULL ? GRPC_STATUS_INVALID_ARGUMENT : GRPC_STATUS_RESOURCE_EXHAUSTED,
            m == NULL ? "bootstrap: malformed BootstrapRequest" : "no memory");
        if (m != NULL)
            duet__v1__bootstrap_request__free_unpacked(m, NULL);
        duet_free(t);
        return;
    }
    const char *peer = NULL;
    duet_rpc_role_t role = duet_rpc_call_identity(call, &peer);
    *t = (duet__serve_task_t){node, call, m, role == DUET_RPC_ROLE_DECODE ? peer : NULL};
    /* connecting blocks: not on a completion-queue thread */
    if (duet_workq_post(node->workq, duet__serve_task, t) != DUET_OK) {
        duet_rpc_call_fail_status(call, DUET_ERR_SHUTDOWN, "prefill is shutting down");
        duet__v1__bootstrap_request__free_unpacked(m, NULL);
        duet_free(t);
    }
}
