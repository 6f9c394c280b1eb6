/* Peers: connecting to a remote rank from its descriptor, failure handling,
 * disconnecting, and the benchmark's raw put.
 *
 * Endpoints.  UCX 1.13 refuses peer error handling on its shared-memory
 * transports ("no peer failure handler"): an endpoint asking for it avoids
 * sysv/posix, and its puts go through AM emulation that needs the target to
 * progress.  So:
 *   - the control endpoint (notifications, acks) detects peer failure when
 *     some transport supports it (tcp here): its error callback tells us the
 *     remote process is gone;
 *   - when the remote pool is mapped here through shared memory (same host,
 *     the transport's rkey_mapped), puts use a second data endpoint without
 *     failure detection: one-sided sysv/posix puts;
 *   - otherwise (tcp, RDMA, registered memory) puts share the control
 *     endpoint.  Never put over an endpoint without failure detection on
 *     tcp: when the sender dies mid-put, UCX aborts the *receiving* process
 *     (seen with 1.13: a fatal "unexpected error" in its put handler);
 *   - with no peer-capable transport (UCX_TLS=sm,self) everything shares one
 *     endpoint without detection and failures surface through deadlines and
 *     missing acknowledgements.
 *
 * Close order: flush the data endpoint, destroy the rkey, then close the
 * endpoints (UCX wants rkeys destroyed before their endpoint).  A peer's
 * memory is freed once every transport operation that points at it
 * completed.
 *
 * This file calls no sends or expectations: the progress loop tells them
 * when a peer fails (duet__peer_next_failure) or is closed. */
#include "transfer/xfer_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"

enum { DUET__CLOSE_NONE, DUET__CLOSE_FLUSH, DUET__CLOSE_EPS, DUET__CLOSE_DONE };

struct duet__put_op {
    duet_xfer_rank_t *r;
    duet__cmd_t *cmd;   /* NULL once the caller gave up */
    int pending;        /* transport operations */
    const char *failed; /* the first failure, NULL: none */
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

static void duet__peer_unlink(duet_xfer_rank_t *r, duet_xfer_peer_t *p)
{
    if (p->prev != NULL)
        p->prev->next = p->next;
    else
        r->peers = p->next;
    if (p->next != NULL)
        p->next->prev = p->prev;
    p->next = p->prev = NULL;
}

static void duet__peer_free(duet_xfer_rank_t *r, duet_xfer_peer_t *p)
{
    r->ops->rkey_destroy(p->rkey);
    duet_free(p);
}

/* ---- failure ------------------------------------------------------------------- */

static void duet__peer_fail(duet_xfer_peer_t *p, duet_status_t st, const char *why)
{
    if (p->failed == DUET_OK) {
        p->failed = st;
        snprintf(p->why, sizeof(p->why), "%s", why);
    }
}

/* The control endpoint's error callback, inside progress: only record;
 * duet__peer_next_failure reports it. */
static void duet__peer_ep_error(void *arg, const char *why)
{
    duet__peer_fail(arg, DUET_ERR_PEER, why);
}

duet_xfer_peer_t *duet__peer_next_failure(duet_xfer_rank_t *r)
{
    for (duet_xfer_peer_t *p = r->peers; p != NULL; p = p->next) {
        if (p->closing || p->error_reported || p->failed == DUET_OK ||
            (p->cmd != NULL && p->cmd->kind == DUET__CMD_CONNECT))
            continue;
        p->error_reported = 1;
        DUET__STAT_ADD(r, peer_failures, 1);
        DUET_LOG_WARN("xfer rank %d: %s rank %d failed: %s", r->index,
                      duet__role_name(p->info.role), p->info.rank, p->why);
        return p;
    }
    return NULL;
}

/* ---- operations that point at a peer ---------------------------------------------- */

static void duet__peer_close_advance(duet_xfer_rank_t *r, duet_xfer_peer_t *p);

static void duet__peer_op_done(void *arg, duet_status_t st, const char *why)
{
    duet_xfer_peer_t *p = arg;
    p->ops--;
    if (st != DUET_OK && st != DUET_ERR_CANCELLED && !p->closing)
        duet__peer_fail(p, DUET_ERR_PEER, why);
    if (p->closing)
        duet__peer_close_advance(p->r, p);
}

/* Count an operation on p that is in flight; record one that failed at once. */
static void duet__peer_started(duet_xfer_peer_t *p, duet_xfer_op_t op, const char *why)
{
    if (op == DUET_XFER_OP_PENDING)
        p->ops++;
    else if (op == DUET_XFER_OP_FAILED && !p->closing)
        duet__peer_fail(p, DUET_ERR_PEER, why);
}

static void duet__peer_flush(duet_xfer_rank_t *r, duet_xfer_peer_t *p, duet_xfer_ep_t *ep,
                             duet_xfer_op_cb_t cb)
{
    const char *why = NULL;
    duet_xfer_op_t op = r->ops->flush(ep, cb, p, &why);
    duet__peer_started(p, op, why);
}

static void duet__peer_ep_close(duet_xfer_rank_t *r, duet_xfer_peer_t *p, duet_xfer_ep_t *ep,
                                int force)
{
    const char *why = NULL;
    duet_xfer_op_t op = r->ops->ep_close(ep, force != 0, duet__peer_op_done, p, &why);
    duet__peer_started(p, op, why);
}

/* ---- closing ---------------------------------------------------------------------- */

static void duet__peer_reap(duet_xfer_rank_t *r, duet_xfer_peer_t *p)
{
    duet__cmd_t *c = p->cmd;
    duet__peer_unlink(r, p);
    duet__peer_free(r, p);
    if (c != NULL)
        duet__cmd_done(r, c, DUET_OK, NULL);
}

static void duet__peer_close_advance(duet_xfer_rank_t *r, duet_xfer_peer_t *p)
{
    if (p->ops > 0)
        return;
    if (p->close_stage == DUET__CLOSE_FLUSH) {
        /* The data endpoint is flushed: nothing uses the rkey any more. */
        r->ops->rkey_destroy(p->rkey);
        p->rkey = NULL;
        p->close_stage = DUET__CLOSE_EPS;
        if (p->data_ep != NULL && !p->ctl_shared)
            duet__peer_ep_close(r, p, p->data_ep, 0);
        if (p->ctl_ep != NULL)
            duet__peer_ep_close(r, p, p->ctl_ep, p->ctl_peer_mode);
        p->data_ep = p->ctl_ep = NULL;
        if (p->ops > 0)
            return;
    }
    if (p->close_stage == DUET__CLOSE_EPS) {
        p->close_stage = DUET__CLOSE_DONE;
        duet__peer_reap(r, p);
    }
}

void duet__peer_close_start(duet_xfer_rank_t *r, duet_xfer_peer_t *p)
{
    if (p->closing)
        return;
    p->closing = 1;
    p->ready = 0;
    p->close_deadline_ns = duet_now_ns() + DUET__CLOSE_MS * DUET_NS_PER_MS;
    p->close_stage = DUET__CLOSE_FLUSH;
    if (p->data_ep != NULL && p->rkey != NULL)
        duet__peer_flush(r, p, p->data_ep, duet__peer_op_done);
    duet__peer_close_advance(r, p);
}

/* A transfer from p timed out here while its KV may still be on the way
 * (a partition that heals later delivers it, seconds late): its pages go
 * back to the pool once the outcome is out and are given to other
 * requests, so p's late puts must not land.  Force-closing the endpoints
 * makes UCX drop whatever still arrives on them (their id is released at
 * once), before the outcome is delivered.  The failure is then reported
 * like any other (the node retires the link; the next request bootstraps
 * a new one).  Endpoints without failure detection cannot be forced. */
int duet__peer_reset(duet_xfer_rank_t *r, duet_xfer_peer_t *p, const char *why)
{
    if (p->closing || !p->ctl_peer_mode)
        return 0;
    duet__peer_fail(p, DUET_ERR_PEER, why);
    if (p->ctl_ep == NULL)
        return 1; /* already cut */
    DUET_LOG_WARN("xfer rank %d: cutting the link to %s rank %d: %s", r->index,
                  duet__role_name(p->info.role), p->info.rank, why);
    r->ops->rkey_destroy(p->rkey);
    p->rkey = NULL;
    if (p->data_ep != NULL && !p->ctl_shared)
        duet__peer_ep_close(r, p, p->data_ep, 0);
    duet__peer_ep_close(r, p, p->ctl_ep, 1);
    p->data_ep = p->ctl_ep = NULL;
    p->ready = 0;
    return 1;
}

typedef struct {
    duet_xfer_rank_t *r;
    duet_xfer_peer_t *p;
    const char *why;
} duet__cut_t;

/* (rank thread) */
static duet_status_t duet__peer_cut_run(void *arg)
{
    duet__cut_t *a = arg;
    if (duet__peer_known(a->r, a->p))
        duet__peer_reset(a->r, a->p, a->why);
    return DUET_OK;
}

duet_status_t duet_xfer_peer_cut(duet_xfer_rank_t *r, duet_xfer_peer_t *peer, const char *why)
{
    duet__cut_t a = {r, peer, why};
    return duet_xfer_rank_run(r, duet__peer_cut_run, &a);
}

int duet__peers_idle(const duet_xfer_rank_t *r)
{
    return r->peers == NULL;
}

void duet__peer_drop_rkeys(duet_xfer_rank_t *r)
{
    for (duet_xfer_peer_t *p = r->peers; p != NULL; p = p->next) {
        r->ops->rkey_destroy(p->rkey);
        p->rkey = NULL;
    }
}

void duet__peer_reap_all(duet_xfer_rank_t *r)
{
    while (r->peers != NULL) {
        duet_xfer_peer_t *p = r->peers;
        duet__cmd_t *c = p->cmd;
        duet__peer_unlink(r, p);
        duet__peer_free(r, p); /* its endpoints went with the worker */
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

/* Complete the connect command with "peer decode rank 1: <what>: <why>". */
static void duet__peer_connect_fail(duet_xfer_rank_t *r, duet_xfer_peer_t *p, duet_status_t st,
                                    const char *what, const char *why)
{
    duet__cmd_t *c = p->cmd;
    p->cmd = NULL;
    p->user_released = 1;
    duet__cmd_done(r, c, st, "peer %s rank %d: %s: %s", duet__role_name(p->info.role), p->info.rank,
                   what, why);
    duet__peer_close_start(r, p); /* nothing uses a peer still connecting */
}

static void duet__peer_connect_check(duet_xfer_rank_t *r, duet_xfer_peer_t *p)
{
    duet__cmd_t *c = p->cmd;
    if (c == NULL || c->kind != DUET__CMD_CONNECT || p->ops > 0)
        return;
    if (p->failed != DUET_OK) {
        duet__peer_connect_fail(r, p, DUET_ERR_PEER, "connecting failed", p->why);
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

static void duet__peer_connect_flushed(void *arg, duet_status_t st, const char *why)
{
    duet_xfer_peer_t *p = arg;
    duet_xfer_rank_t *r = p->r;
    p->ops--;
    if (st != DUET_OK)
        duet__peer_fail(p, DUET_ERR_PEER, why);
    if (p->closing)
        duet__peer_close_advance(r, p);
    else
        duet__peer_connect_check(r, p);
}

/* Is the remote pool mapped here through shared memory (same host, and a
 * transport that maps it: sysv/posix for pools from duet_xfer_pool_alloc)? */
static int duet__peer_shm_mapped(duet_xfer_rank_t *r, duet_xfer_peer_t *p)
{
    return !p->info.pool_device && p->info.host_id == r->info.host_id && p->rkey != NULL &&
           r->ops->rkey_mapped(p->rkey, p->remote_base);
}

/* The prefill side's puts: over a separate endpoint without failure
 * detection only when the remote pool is mapped through shared memory
 * (one-sided there).  Otherwise they share the control endpoint: emulated or
 * RDMA puts on an endpoint without detection make UCX abort the *target*
 * process when the sender dies mid-put (seen with tcp).  0 when connecting
 * failed (the command is completed). */
static int duet__peer_connect_data(duet_xfer_rank_t *r, duet_xfer_peer_t *p, const duet__desc_t *d)
{
    const char *why = NULL;
    if (p->ctl_peer_mode) {
        if (r->ops->rkey_unpack(p->ctl_ep, d->rkey, d->rkey_len, &p->rkey, &why) != DUET_OK) {
            p->rkey = NULL;
            duet__peer_connect_fail(r, p, DUET_ERR_PEER, "rkey unpack", why);
            return 0;
        }
        if (!duet__peer_shm_mapped(r, p)) {
            p->data_ep = p->ctl_ep;
            p->ctl_shared = 1;
        } else {
            r->ops->rkey_destroy(p->rkey);
            p->rkey = NULL;
        }
    }
    if (p->data_ep == NULL) {
        if (r->ops->ep_create(r->worker, d->addr, d->addr_len, NULL, NULL, &p->data_ep, &why) !=
            DUET_OK) {
            p->data_ep = NULL;
            duet__peer_connect_fail(r, p, DUET_ERR_PEER, "unreachable", why);
            return 0;
        }
        if (r->ops->rkey_unpack(p->data_ep, d->rkey, d->rkey_len, &p->rkey, &why) != DUET_OK) {
            p->rkey = NULL;
            duet__peer_connect_fail(r, p, DUET_ERR_PEER, "rkey unpack", why);
            return 0;
        }
    }
    p->one_sided = duet__peer_shm_mapped(r, p);
    return 1;
}

void duet__peer_exec_connect(duet_xfer_rank_t *r, duet__cmd_t *c)
{
    const duet__desc_t *d = c->u.connect.desc;
    const char *why = NULL;
    duet_xfer_peer_t *p;

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
        if (r->ops->ep_create(r->worker, d->addr, d->addr_len, duet__peer_ep_error, p, &p->ctl_ep,
                              &why) == DUET_OK)
            p->ctl_peer_mode = 1;
        else
            p->ctl_ep = NULL;
    }
    if (r->info.role == DUET_XFER_PREFILL && !duet__peer_connect_data(r, p, d))
        return;
    if (p->ctl_ep == NULL && p->data_ep != NULL) {
        p->ctl_ep = p->data_ep;
        p->ctl_shared = 1;
    } else if (p->ctl_ep == NULL) {
        if (r->ops->ep_create(r->worker, d->addr, d->addr_len, NULL, NULL, &p->ctl_ep, &why) !=
            DUET_OK) {
            p->ctl_ep = NULL;
            duet__peer_connect_fail(r, p, DUET_ERR_PEER, "unreachable", why);
            return;
        }
    }
    /* Only this peer: one whose address a detecting endpoint cannot reach
     * (a garbage or hostile descriptor, issue 25) must not turn detection
     * off for every later peer.  A transport list without detection at
     * all is known at create (no_peer_mode) and logged there. */
    if (!p->ctl_peer_mode && !atomic_load(&r->x->no_peer_mode))
        DUET_LOG_WARN("xfer rank %d: %s rank %d: no transport to it detects peer failure; a "
                      "dead peer is found by deadlines and missing acknowledgements",
                      r->index, duet__role_name(p->info.role), p->info.rank);

    /* Flushing wires the endpoints up now, so the first request does not pay
     * for it, and shows an unreachable peer before any request depends on it. */
    duet__peer_flush(r, p, p->ctl_ep, duet__peer_connect_flushed);
    if (p->data_ep != NULL && !p->ctl_shared)
        duet__peer_flush(r, p, p->data_ep, duet__peer_connect_flushed);
    duet__peer_connect_check(r, p);
}

/* ---- disconnect, scan --------------------------------------------------------------- */

int duet__peer_exec_disconnect(duet_xfer_rank_t *r, duet__cmd_t *c)
{
    duet_xfer_peer_t *p = c->u.peer;
    if (!duet__peer_known(r, p)) {
        duet__cmd_done(r, c, DUET_ERR_INVALID, "xfer rank %d: peer not connected here", r->index);
        return 0;
    }
    p->user_released = 1;
    p->cmd = c; /* completed when the peer is reaped */
    return !p->closing;
}

void duet__peer_scan(duet_xfer_rank_t *r, int64_t now)
{
    duet_xfer_peer_t *p, *next;
    for (p = r->peers; p != NULL; p = next) {
        next = p->next;
        if (p->cmd != NULL && p->cmd->kind == DUET__CMD_CONNECT) {
            if (p->failed == DUET_OK && now > p->connect_deadline_ns)
                duet__peer_fail(p, DUET_ERR_TIMEOUT, "no answer before the deadline");
            if (p->failed != DUET_OK)
                duet__peer_connect_fail(r, p, p->failed, "connecting failed", p->why);
            continue;
        }
        if (p->closing && now > p->close_deadline_ns && p->close_stage != DUET__CLOSE_DONE) {
            duet__cmd_t *c = p->cmd;
            /* Stuck: leave the rest to the worker's destruction. */
            DUET_LOG_WARN("xfer rank %d: closing %s rank %d takes too long, leaving it", r->index,
                          duet__role_name(p->info.role), p->info.rank);
            p->close_stage = DUET__CLOSE_DONE;
            p->cmd = NULL;
            if (c != NULL)
                duet__cmd_done(r, c, DUET_OK, NULL);
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

static void duet__put_op_check(duet_xfer_rank_t *r, duet__put_op_t *op)
{
    if (op->pending > 0)
        return;
    if (op->cmd != NULL) {
        if (op->failed != NULL)
            duet__cmd_done(r, op->cmd, DUET_ERR_PEER, "xfer rank %d: put: %s", r->index,
                           op->failed);
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

static void duet__put_op_done(void *arg, duet_status_t st, const char *why)
{
    duet__put_op_t *op = arg;
    op->pending--;
    if (st != DUET_OK && op->failed == NULL)
        op->failed = why;
    duet__put_op_check(op->r, op);
}

static void duet__put_op_started(duet__put_op_t *op, duet_xfer_op_t started, const char *why)
{
    if (started == DUET_XFER_OP_PENDING)
        op->pending++;
    else if (started == DUET_XFER_OP_FAILED && op->failed == NULL)
        op->failed = why;
}

void duet__peer_exec_put(duet_xfer_rank_t *r, duet__cmd_t *c)
{
    duet_xfer_peer_t *p = c->u.put.peer;
    size_t src = c->u.put.src_off, dst = c->u.put.dst_off, len = c->u.put.len;
    const char *why = NULL;
    duet_xfer_op_t started;
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
    started = r->ops->put(p->data_ep, r->mem, r->base + src, len, p->remote_base + dst, p->rkey,
                          duet__put_op_done, op, &why);
    duet__put_op_started(op, started, why);
    started = r->ops->flush(p->data_ep, duet__put_op_done, op, &why);
    duet__put_op_started(op, started, why);
    if (op->pending > 0) {
        op->next = r->put_ops;
        if (op->next != NULL)
            op->next->prevp = &op->next;
        op->prevp = &r->put_ops;
        r->put_ops = op;
    }
    duet__put_op_check(r, op);
}

const duet_xfer_desc_info_t *duet_xfer_peer_info(const duet_xfer_peer_t *peer)
{
    return &peer->info;
}
