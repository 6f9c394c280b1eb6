/* Peers: connecting to a remote rank from its descriptor, failure handling,
 * disconnecting, and the benchmark's raw put.
 *
 * Endpoints.  UCX 1.13 refuses peer error handling on its shared-memory
 * transports ("no peer failure handler"): an endpoint asking for it avoids
 * sysv/posix, and its puts go through AM emulation that needs the target to
 * progress.  So:
 *   - the control endpoint (notifications, acks) has error mode "peer" when
 *     some transport supports it (tcp here): its error callback tells us the
 *     remote process is gone;
 *   - when the remote pool is mapped here through shared memory (same host,
 *     ucp_rkey_ptr works), puts use a second, error-mode-"none" data
 *     endpoint: one-sided sysv/posix puts;
 *   - otherwise (tcp, RDMA, registered memory) puts share the control
 *     endpoint.  Never put over an error-mode-"none" endpoint on tcp: when
 *     the sender dies mid-put, UCX aborts the *receiving* process (seen:
 *     "ucp_request.inl:346 Fatal: unexpected error" in ucp_put_handler);
 *   - with no peer-capable transport (UCX_TLS=sm,self) everything shares one
 *     error-mode-"none" endpoint and failures surface through deadlines and
 *     missing acknowledgements.
 *
 * Close order: flush the data endpoint, destroy the rkey, then close the
 * endpoints (UCX wants rkeys destroyed before their endpoint).  A peer's
 * memory is freed once every UCX request that points at it completed. */
#include "transfer/xfer_internal.h"

#include <inttypes.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"

enum { CLOSE_NONE, CLOSE_FLUSH, CLOSE_EPS, CLOSE_DONE };

struct duet__put_op {
    duet_xfer_rank_t *r;
    duet__cmd_t *cmd; /* NULL once the caller gave up */
    int pending;      /* UCX requests */
    ucs_status_t failed;
    int64_t deadline_ns;
    duet__put_op_t *next, **prevp;
};

int duet__peer_known(const duet_xfer_rank_t *r, const duet_xfer_peer_t *p)
{
    for (const duet_xfer_peer_t *q = r->peers; q != NULL; q = q->next)
        if (q == p)
            return !q->user_released;
    return 0;
}

duet_xfer_peer_t *duet__peer_find(duet_xfer_rank_t *r, uint64_t instance, int rank)
{
    for (duet_xfer_peer_t *p = r->peers; p != NULL; p = p->next)
        if (!p->closing && p->info.instance == instance && p->info.rank == rank)
            return p;
    return NULL;
}

static void peer_unlink(duet_xfer_rank_t *r, duet_xfer_peer_t *p)
{
    if (p->prev != NULL)
        p->prev->next = p->next;
    else
        r->peers = p->next;
    if (p->next != NULL)
        p->next->prev = p->prev;
    p->next = p->prev = NULL;
}

static void peer_free(duet_xfer_peer_t *p)
{
    if (p->rkey != NULL)
        ucp_rkey_destroy(p->rkey);
    duet_free(p);
}

/* ---- failure ------------------------------------------------------------------- */

static void ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    duet_xfer_peer_t *p = arg;
    (void)ep;
    /* Inside ucp_worker_progress: only record; duet__peer_scan acts on it. */
    if (p->failed == DUET_OK) {
        p->failed = DUET_ERR_PEER;
        snprintf(p->why, sizeof(p->why), "%s", ucs_status_string(status));
    }
}

static void peer_fail(duet_xfer_rank_t *r, duet_xfer_peer_t *p, duet_status_t st, const char *why)
{
    (void)r;
    if (p->failed == DUET_OK) {
        p->failed = st;
        snprintf(p->why, sizeof(p->why), "%s", why);
    }
}

/* ---- requests that point at a peer ---------------------------------------------- */

static void close_advance(duet_xfer_rank_t *r, duet_xfer_peer_t *p);

static void peer_req_cb(void *req, ucs_status_t status, void *user_data)
{
    duet_xfer_peer_t *p = user_data;
    duet_xfer_rank_t *r = p->r;
    duet__req_done(r, req);
    p->ops--;
    if (status != UCS_OK && status != UCS_ERR_CANCELED && !p->closing)
        peer_fail(r, p, DUET_ERR_PEER, ucs_status_string(status));
    if (p->closing)
        close_advance(r, p);
}

/* Start a flush or close on ep; 1 when it is still in flight. */
static int peer_req(duet_xfer_rank_t *r, duet_xfer_peer_t *p, ucs_status_ptr_t req)
{
    if (req == NULL)
        return 0;
    if (UCS_PTR_IS_ERR(req)) {
        if (!p->closing)
            peer_fail(r, p, DUET_ERR_PEER, ucs_status_string(UCS_PTR_STATUS(req)));
        return 0;
    }
    p->ops++;
    r->ucx_reqs++;
    return 1;
}

static ucs_status_ptr_t ep_flush(duet_xfer_peer_t *p, ucp_ep_h ep)
{
    ucp_request_param_t rp;
    memset(&rp, 0, sizeof(rp));
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    rp.cb.send = peer_req_cb;
    rp.user_data = p;
    return ucp_ep_flush_nbx(ep, &rp);
}

static ucs_status_ptr_t ep_close(duet_xfer_peer_t *p, ucp_ep_h ep, int force)
{
    ucp_request_param_t rp;
    memset(&rp, 0, sizeof(rp));
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    rp.cb.send = peer_req_cb;
    rp.user_data = p;
    if (force) {
        rp.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
        rp.flags = UCP_EP_CLOSE_FLAG_FORCE; /* allowed only on error-mode-peer endpoints */
    }
    return ucp_ep_close_nbx(ep, &rp);
}

/* ---- closing ---------------------------------------------------------------------- */

static void peer_reap(duet_xfer_rank_t *r, duet_xfer_peer_t *p)
{
    duet__cmd_t *c = p->cmd;
    peer_unlink(r, p);
    peer_free(p);
    if (c != NULL)
        duet__cmd_done(r, c, DUET_OK, NULL);
}

static void close_advance(duet_xfer_rank_t *r, duet_xfer_peer_t *p)
{
    if (p->ops > 0)
        return;
    if (p->close_stage == CLOSE_FLUSH) {
        /* The data endpoint is flushed: nothing uses the rkey any more. */
        if (p->rkey != NULL) {
            ucp_rkey_destroy(p->rkey);
            p->rkey = NULL;
        }
        p->close_stage = CLOSE_EPS;
        if (p->data_ep != NULL && !p->ctl_shared)
            peer_req(r, p, ep_close(p, p->data_ep, 0));
        if (p->ctl_ep != NULL)
            peer_req(r, p, ep_close(p, p->ctl_ep, p->ctl_peer_mode));
        p->data_ep = p->ctl_ep = NULL;
        if (p->ops > 0)
            return;
    }
    if (p->close_stage == CLOSE_EPS) {
        p->close_stage = CLOSE_DONE;
        peer_reap(r, p);
    }
}

void duet__peer_close_start(duet_xfer_rank_t *r, duet_xfer_peer_t *p)
{
    if (p->closing)
        return;
    p->closing = 1;
    p->ready = 0;
    p->close_deadline_ns = duet_now_ns() + DUET__CLOSE_MS * DUET_NS_PER_MS;
    duet__send_peer_gone(r, p);
    duet__recv_peer_gone(r, p, 1);
    p->close_stage = CLOSE_FLUSH;
    if (p->data_ep != NULL && p->rkey != NULL)
        peer_req(r, p, ep_flush(p, p->data_ep));
    close_advance(r, p);
}

int duet__peers_idle(const duet_xfer_rank_t *r)
{
    return r->peers == NULL;
}

void duet__peer_drop_rkeys(duet_xfer_rank_t *r)
{
    for (duet_xfer_peer_t *p = r->peers; p != NULL; p = p->next) {
        if (p->rkey != NULL) {
            ucp_rkey_destroy(p->rkey);
            p->rkey = NULL;
        }
    }
}

void duet__peer_reap_all(duet_xfer_rank_t *r)
{
    while (r->peers != NULL) {
        duet_xfer_peer_t *p = r->peers;
        duet__cmd_t *c = p->cmd;
        peer_unlink(r, p);
        peer_free(p); /* its endpoints went with the worker */
        if (c != NULL) {
            c->status = DUET_ERR_SHUTDOWN;
            c->done = 1;
        }
    }
    while (r->put_ops != NULL) {
        duet__put_op_t *op = r->put_ops;
        r->put_ops = op->next;
        duet_free(op);
    }
}

/* ---- connect ------------------------------------------------------------------------ */

static ucs_status_t ep_create(duet_xfer_rank_t *r, duet_xfer_peer_t *p, const void *addr,
                              int peer_mode, ucp_ep_h *ep_p)
{
    ucp_ep_params_t ep;
    memset(&ep, 0, sizeof(ep));
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.address = addr;
    ep.err_mode = peer_mode ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
    if (peer_mode) {
        ep.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
        ep.err_handler.cb = ep_err_cb;
        ep.err_handler.arg = p;
    }
    return ucp_ep_create(r->worker, &ep, ep_p);
}

static void connect_fail(duet_xfer_rank_t *r, duet_xfer_peer_t *p, duet_status_t st,
                         const char *why)
{
    duet__cmd_t *c = p->cmd;
    p->cmd = NULL;
    p->user_released = 1;
    duet__cmd_done(r, c, st, "peer %s rank %d: %s", duet__role_name(p->info.role), p->info.rank,
                   why);
    duet__peer_close_start(r, p);
}

static void connect_check(duet_xfer_rank_t *r, duet_xfer_peer_t *p)
{
    duet__cmd_t *c = p->cmd;
    if (c == NULL || c->kind != DUET__CMD_CONNECT || p->ops > 0)
        return;
    if (p->failed != DUET_OK) {
        char why[160];
        snprintf(why, sizeof(why), "connecting failed: %s", p->why);
        connect_fail(r, p, DUET_ERR_PEER, why);
        return;
    }
    p->ready = 1;
    p->cmd = NULL;
    c->u.connect.peer = p;
    DUET_LOG_INFO("xfer rank %d: connected to %s rank %d (instance %016" PRIx64 "): %s, %s",
                  r->index, duet__role_name(p->info.role), p->info.rank, p->info.instance,
                  p->data_ep == NULL ? "no puts"
                  : p->one_sided     ? "puts one-sided into shared memory"
                                     : "puts through the control endpoint",
                  p->ctl_peer_mode ? "peer failure detection on" : "deadlines only");
    duet__cmd_done(r, c, DUET_OK, NULL);
}

static void connect_flush_cb(void *req, ucs_status_t status, void *user_data)
{
    duet_xfer_peer_t *p = user_data;
    duet_xfer_rank_t *r = p->r;
    duet__req_done(r, req);
    p->ops--;
    if (status != UCS_OK)
        peer_fail(r, p, DUET_ERR_PEER, ucs_status_string(status));
    if (p->closing)
        close_advance(r, p);
    else
        connect_check(r, p);
}

/* Is the remote pool mapped here through shared memory (same host, and a
 * UCX memory domain that maps it: sysv/posix for pools from
 * duet_xfer_pool_alloc)? */
static int shm_mapped(duet_xfer_rank_t *r, duet_xfer_peer_t *p)
{
    void *ptr;
    return !p->info.pool_device && p->info.host_id == r->info.host_id && p->rkey != NULL &&
           ucp_rkey_ptr(p->rkey, p->remote_base, &ptr) == UCS_OK;
}

void duet__peer_exec_connect(duet_xfer_rank_t *r, duet__cmd_t *c)
{
    const duet__desc_t *d = c->u.connect.desc;
    ucp_request_param_t rp;
    duet_xfer_peer_t *p;
    ucs_status_t us;
    char why[160];

    p = DUET_NEW(duet_xfer_peer_t);
    if (p == NULL) {
        duet__cmd_done(r, c, DUET_ERR_NO_MEMORY, "peer %s rank %d: out of memory",
                       duet__role_name(d->info.role), d->info.rank);
        return;
    }
    p->r = r;
    p->info = d->info;
    p->remote_base = d->pool_base;
    p->cmd = c;
    p->connect_deadline_ns = c->u.connect.deadline_ns;
    p->next = r->peers;
    if (r->peers != NULL)
        r->peers->prev = p;
    r->peers = p;

    /* The control endpoint first, on both sides: over wire-up transports
     * (tcp) UCX pairs each side's n-th endpoint to the other worker with the
     * remote's n-th and refuses pairs whose error modes differ ("asymmetric
     * endpoint configuration"); both sides' first endpoints are the control
     * ones, both in the same mode. */
    if (!atomic_load(&r->x->no_peer_mode)) {
        us = ep_create(r, p, d->addr, 1, &p->ctl_ep);
        if (us == UCS_OK)
            p->ctl_peer_mode = 1;
        else
            p->ctl_ep = NULL;
    }
    if (r->info.role == DUET_XFER_PREFILL) {
        /* Puts go over a separate error-mode-none endpoint only when the
         * remote pool is mapped through shared memory (one-sided there).
         * Otherwise they share the control endpoint: emulated or RDMA puts on
         * an error-mode-none endpoint make UCX abort the *target* process
         * when the sender dies mid-put (seen with tcp). */
        if (p->ctl_peer_mode) {
            us = ucp_ep_rkey_unpack(p->ctl_ep, d->rkey, &p->rkey);
            if (us != UCS_OK) {
                p->rkey = NULL;
                snprintf(why, sizeof(why), "rkey unpack: %s", ucs_status_string(us));
                connect_fail(r, p, DUET_ERR_PEER, why);
                return;
            }
            if (!shm_mapped(r, p)) {
                p->data_ep = p->ctl_ep;
                p->ctl_shared = 1;
            } else {
                ucp_rkey_destroy(p->rkey);
                p->rkey = NULL;
            }
        }
        if (p->data_ep == NULL) {
            us = ep_create(r, p, d->addr, 0, &p->data_ep);
            if (us != UCS_OK) {
                p->data_ep = NULL;
                snprintf(why, sizeof(why), "unreachable: %s", ucs_status_string(us));
                connect_fail(r, p, DUET_ERR_PEER, why);
                return;
            }
            us = ucp_ep_rkey_unpack(p->data_ep, d->rkey, &p->rkey);
            if (us != UCS_OK) {
                p->rkey = NULL;
                snprintf(why, sizeof(why), "rkey unpack: %s", ucs_status_string(us));
                connect_fail(r, p, DUET_ERR_PEER, why);
                return;
            }
        }
        p->one_sided = shm_mapped(r, p);
    }
    if (p->ctl_ep == NULL && p->data_ep != NULL) {
        p->ctl_ep = p->data_ep;
        p->ctl_shared = 1;
    } else if (p->ctl_ep == NULL) {
        us = ep_create(r, p, d->addr, 0, &p->ctl_ep);
        if (us != UCS_OK) {
            p->ctl_ep = NULL;
            snprintf(why, sizeof(why), "unreachable: %s", ucs_status_string(us));
            connect_fail(r, p, DUET_ERR_PEER, why);
            return;
        }
    }
    if (!p->ctl_peer_mode && !atomic_exchange(&r->x->no_peer_mode, 1))
        DUET_LOG_WARN("xfer: no UCX transport here detects peer failure (UCX_TLS?); a dead peer "
                      "is found by deadlines and missing acknowledgements");

    /* Flushing wires the endpoints up now, so the first request does not pay
     * for it, and shows an unreachable peer before any request depends on it. */
    memset(&rp, 0, sizeof(rp));
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    rp.cb.send = connect_flush_cb;
    rp.user_data = p;
    peer_req(r, p, ucp_ep_flush_nbx(p->ctl_ep, &rp));
    if (p->data_ep != NULL && !p->ctl_shared)
        peer_req(r, p, ucp_ep_flush_nbx(p->data_ep, &rp));
    connect_check(r, p);
}

/* ---- disconnect, scan --------------------------------------------------------------- */

void duet__peer_exec_disconnect(duet_xfer_rank_t *r, duet__cmd_t *c)
{
    duet_xfer_peer_t *p = c->u.peer;
    if (!duet__peer_known(r, p)) {
        duet__cmd_done(r, c, DUET_ERR_INVALID, "xfer rank %d: peer not connected here", r->index);
        return;
    }
    p->user_released = 1;
    p->cmd = c; /* completed when the peer is reaped */
    if (p->closing)
        return;
    duet__peer_close_start(r, p);
}

void duet__peer_scan(duet_xfer_rank_t *r, int64_t now)
{
    duet_xfer_peer_t *p, *next;
    for (p = r->peers; p != NULL; p = next) {
        next = p->next;
        if (p->cmd != NULL && p->cmd->kind == DUET__CMD_CONNECT) {
            if (p->failed == DUET_OK && now > p->connect_deadline_ns)
                peer_fail(r, p, DUET_ERR_TIMEOUT, "no answer before the deadline");
            if (p->failed != DUET_OK) {
                char why[160];
                snprintf(why, sizeof(why), "connecting failed: %s", p->why);
                connect_fail(r, p, p->failed, why);
            }
            continue;
        }
        if (p->closing) {
            if (now > p->close_deadline_ns && p->close_stage != CLOSE_DONE) {
                duet__cmd_t *c = p->cmd;
                /* Stuck: leave the rest to the worker's destruction. */
                DUET_LOG_WARN("xfer rank %d: closing %s rank %d takes too long, leaving it",
                              r->index, duet__role_name(p->info.role), p->info.rank);
                p->close_stage = CLOSE_DONE;
                p->cmd = NULL;
                if (c != NULL)
                    duet__cmd_done(r, c, DUET_OK, NULL);
            }
            continue;
        }
        if (p->failed != DUET_OK && !p->error_reported) {
            p->error_reported = 1;
            DUET__STAT_ADD(r, peer_failures, 1);
            DUET_LOG_WARN("xfer rank %d: %s rank %d failed: %s", r->index,
                          duet__role_name(p->info.role), p->info.rank, p->why);
            duet__send_peer_gone(r, p);
            duet__recv_peer_gone(r, p, 0);
            if (r->x->cfg.on_peer_error != NULL && !p->user_released)
                r->x->cfg.on_peer_error(r->x->cfg.cb_arg, p, p->failed, p->why);
        }
    }
    for (duet__put_op_t *op = r->put_ops; op != NULL; op = op->next) {
        if (op->cmd != NULL && now > op->deadline_ns) {
            duet__cmd_done(r, op->cmd, DUET_ERR_TIMEOUT,
                           "xfer rank %d: put not done by the deadline", r->index);
            op->cmd = NULL;
        }
    }
}

/* ---- the benchmark's raw put ----------------------------------------------------------- */

static void put_op_check(duet_xfer_rank_t *r, duet__put_op_t *op)
{
    if (op->pending > 0)
        return;
    if (op->cmd != NULL) {
        if (op->failed != UCS_OK)
            duet__cmd_done(r, op->cmd, DUET_ERR_PEER, "xfer rank %d: put: %s", r->index,
                           ucs_status_string(op->failed));
        else
            duet__cmd_done(r, op->cmd, DUET_OK, NULL);
    }
    if (op->prevp != NULL) {
        *op->prevp = op->next;
        if (op->next != NULL)
            op->next->prevp = op->prevp;
    }
    duet_free(op);
}

static void put_op_cb(void *req, ucs_status_t status, void *user_data)
{
    duet__put_op_t *op = user_data;
    duet__req_done(op->r, req);
    op->pending--;
    if (status != UCS_OK && op->failed == UCS_OK)
        op->failed = status;
    put_op_check(op->r, op);
}

static void put_op_req(duet_xfer_rank_t *r, duet__put_op_t *op, ucs_status_ptr_t req)
{
    if (req == NULL)
        return;
    if (UCS_PTR_IS_ERR(req)) {
        if (op->failed == UCS_OK)
            op->failed = UCS_PTR_STATUS(req);
        return;
    }
    op->pending++;
    r->ucx_reqs++;
}

void duet__peer_exec_put(duet_xfer_rank_t *r, duet__cmd_t *c)
{
    duet_xfer_peer_t *p = c->u.put.peer;
    size_t src = c->u.put.src_off, dst = c->u.put.dst_off, len = c->u.put.len;
    ucp_request_param_t rp;
    duet__put_op_t *op;

    if (!duet__peer_known(r, p) || p->closing || !p->ready || p->data_ep == NULL) {
        duet__cmd_done(r, c, DUET_ERR_INVALID, "xfer rank %d: not a prefill peer connected here",
                       r->index);
        return;
    }
    if (p->failed != DUET_OK) {
        duet__cmd_done(r, c, DUET_ERR_PEER, "xfer rank %d: peer failed: %s", r->index, p->why);
        return;
    }
    if (len == 0 || src > r->bytes || len > r->bytes - src || dst > p->info.pool_bytes ||
        len > p->info.pool_bytes - dst) {
        duet__cmd_done(r, c, DUET_ERR_INVALID, "xfer rank %d: put outside the pools", r->index);
        return;
    }
    op = DUET_NEW(duet__put_op_t);
    if (op == NULL) {
        duet__cmd_done(r, c, DUET_ERR_NO_MEMORY, "xfer rank %d: put", r->index);
        return;
    }
    op->r = r;
    op->cmd = c;
    op->deadline_ns = c->u.put.deadline_ns;
    memset(&rp, 0, sizeof(rp));
    rp.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMH;
    rp.cb.send = put_op_cb;
    rp.user_data = op;
    rp.memh = r->memh;
    if (r->info.pool_device) {
        rp.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMORY_TYPE;
        rp.memory_type = UCS_MEMORY_TYPE_CUDA;
    }
    put_op_req(r, op,
               ucp_put_nbx(p->data_ep, r->base + src, len, p->remote_base + dst, p->rkey, &rp));
    rp.op_attr_mask &= ~(uint32_t)(UCP_OP_ATTR_FIELD_MEMH | UCP_OP_ATTR_FIELD_MEMORY_TYPE);
    put_op_req(r, op, ucp_ep_flush_nbx(p->data_ep, &rp));
    if (op->pending > 0) {
        op->next = r->put_ops;
        if (op->next != NULL)
            op->next->prevp = &op->next;
        op->prevp = &r->put_ops;
        r->put_ops = op;
    }
    put_op_check(r, op);
}

duet_status_t duet_xfer_debug_put(duet_xfer_peer_t *peer, size_t src_off, size_t dst_off,
                                  size_t bytes, int64_t deadline_ns)
{
    duet__cmd_t c;
    memset(&c, 0, sizeof(c));
    c.kind = DUET__CMD_PUT;
    c.u.put.peer = peer;
    c.u.put.src_off = src_off;
    c.u.put.dst_off = dst_off;
    c.u.put.len = bytes;
    c.u.put.deadline_ns = deadline_ns;
    return duet__call(peer->r, &c, 0);
}

/* ---- public ------------------------------------------------------------------------- */

duet_status_t duet_xfer_peer_connect(duet_xfer_rank_t *r, const void *blob, size_t len,
                                     int64_t deadline_ns, duet_xfer_peer_t **peer_p)
{
    duet__desc_t d;
    duet__cmd_t c;
    duet_status_t st;
    void *copy;

    if (r->pool_kind == 0)
        return duet_error(DUET_ERR_INVALID, "xfer rank %d: connect needs the pool first", r->index);
    /* UCX gets a private copy: its cuda_ipc rkey unpack (1.13) writes into
     * the packed rkey it is given, and the caller's blob may be shared by
     * several ranks connecting to the same peer (seen: the second rank's
     * checksum check failed). */
    copy = duet_malloc(len ? len : 1);
    if (copy == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "xfer rank %d: connect: no memory", r->index);
    if (blob != NULL)
        memcpy(copy, blob, len);
    st = duet__desc_decode(blob != NULL ? copy : NULL, len, &d);
    if (st == DUET_OK)
        st = duet__desc_check_peer(&r->info, &d.info);
    if (st == DUET_OK) {
        memset(&c, 0, sizeof(c));
        c.kind = DUET__CMD_CONNECT;
        c.u.connect.desc = &d;
        c.u.connect.deadline_ns = deadline_ns;
        st = duet__call(r, &c, 0);
        if (st == DUET_OK)
            *peer_p = c.u.connect.peer;
    }
    duet_free(copy);
    return st;
}

void duet_xfer_peer_disconnect(duet_xfer_peer_t *peer)
{
    duet__cmd_t c;
    if (peer == NULL)
        return;
    memset(&c, 0, sizeof(c));
    c.kind = DUET__CMD_DISCONNECT;
    c.u.peer = peer;
    if (duet__call(peer->r, &c, 0) != DUET_OK)
        DUET_LOG_WARN("xfer: disconnect: %s", duet_error_msg());
}

const duet_xfer_desc_info_t *duet_xfer_peer_info(const duet_xfer_peer_t *peer)
{
    return &peer->info;
}
