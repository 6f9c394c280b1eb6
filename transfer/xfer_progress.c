/* The progress thread of a rank and the command queue that feeds it.
 *
 * Progress model: one thread per rank owns the rank's transport worker
 * (single-threaded) and its tables.  A loop turn runs queued commands,
 * drives the worker's progress, handles received messages, issues a bounded
 * batch of puts, checks deadlines and peers, and then delivers outcomes
 * (user callbacks run here, at a point where no table is being iterated).
 * With nothing left to do it arms the worker and sleeps in epoll on the
 * worker's event fd and an eventfd that other threads write when they queue
 * a command; the sleep is bounded by the nearest deadline, and by 1 ms while
 * transport operations are in flight (a safety net should a completion not
 * raise an event).  Exception: a device pool with puts in flight polls
 * without sleeping (see duet__rank_sleep: arming would stall UCX's CUDA
 * streams), so a prefill rank spins one core while its puts run.
 *
 * Peers do not call up into sends and expectations: this file tells both
 * when a peer fails or is closed. */
#include "transfer/xfer_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/sync.h"

/* The rank whose progress thread this is (NULL on other threads). */
static _Thread_local duet_xfer_rank_t *duet__self_rank;

static int duet__on_thread(const duet_xfer_rank_t *r)
{
    return duet__self_rank == r;
}

/* A callback of one rank waiting on another rank's thread could deadlock
 * against that rank's callbacks doing the same: refuse it. */
static duet_status_t duet__foreign_rank_check(const duet_xfer_rank_t *r)
{
    if (duet__self_rank != NULL && duet__self_rank != r)
        return duet_error(DUET_ERR_INVALID,
                          "xfer: a callback of rank %d may not wait on rank %d (queue the work "
                          "to another thread)",
                          duet__self_rank->index, r->index);
    return DUET_OK;
}

/* ---- commands ---------------------------------------------------------------- */

static void duet__rank_wake(duet_xfer_rank_t *r)
{
    uint64_t one = 1;
    ssize_t n = write(r->evfd, &one, sizeof(one));
    (void)n; /* EAGAIN means the counter is already non-zero: awake anyway */
}

static void duet__cmd_exec(duet_xfer_rank_t *r, duet__cmd_t *c);

/* Queue c; 0 when the rank no longer takes commands. */
static int duet__cmd_enqueue(duet_xfer_rank_t *r, duet__cmd_t *c)
{
    pthread_mutex_lock(&r->mu);
    if (!r->thread_started || r->closed > 1 || (r->closed && c->kind != DUET__CMD_UNWAIT)) {
        pthread_mutex_unlock(&r->mu);
        return 0;
    }
    c->next = NULL;
    if (r->cmd_tail != NULL)
        r->cmd_tail->next = c;
    else
        r->cmd_head = c;
    r->cmd_tail = c;
    if (c->kind == DUET__CMD_STOP)
        r->closed = 1;
    pthread_mutex_unlock(&r->mu);
    duet__rank_wake(r);
    return 1;
}

duet_status_t duet__cmd_result(const duet__cmd_t *c)
{
    if (c->status != DUET_OK)
        return duet_error(c->status, "%s", c->msg[0] ? c->msg : duet_status_str(c->status));
    return DUET_OK;
}

duet_status_t duet__call(duet_xfer_rank_t *r, duet__cmd_t *c, int callback_safe)
{
    c->heap = 0;
    c->done = 0;
    c->status = DUET_OK;
    c->msg[0] = '\0';
    if (duet__on_thread(r)) {
        if (!callback_safe)
            return duet_error(DUET_ERR_INVALID,
                              "xfer rank %d: this call must not be made from a transfer callback",
                              r->index);
        duet__cmd_exec(r, c);
        return duet__cmd_result(c);
    }
    if (duet__foreign_rank_check(r) != DUET_OK)
        return DUET_ERR_INVALID;
    if (!duet__cmd_enqueue(r, c))
        return duet_error(DUET_ERR_SHUTDOWN, "xfer rank %d: shutting down", r->index);
    pthread_mutex_lock(&r->mu);
    while (!c->done)
        pthread_cond_wait(&r->cond, &r->mu);
    pthread_mutex_unlock(&r->mu);
    return duet__cmd_result(c);
}

/* duet__call (callback-safe) of cmds[i] on ranks[i] for every i with
 * skip[i] clear, the ranks' threads running them at once: every command is
 * queued (each thread woken) before the first wait, so n ranks cost one
 * wake-up round trip, not n in turn.  st[i] is each call's result; the
 * caller turns a failure into duet_error itself (from cmds[i].msg). */
void duet__call_all(duet_xfer_rank_t *const *ranks, duet__cmd_t *cmds, const bool *skip, int n,
                    duet_status_t *st)
{
    for (int i = 0; i < n; i++) {
        duet__cmd_t *c = &cmds[i];
        if (skip[i])
            continue;
        c->heap = 0;
        c->done = 0;
        c->status = DUET_OK;
        c->msg[0] = '\0';
        st[i] = DUET_OK;
        if (duet__on_thread(ranks[i])) {
            duet__cmd_exec(ranks[i], c);
            c->done = 1;
        } else if (duet__foreign_rank_check(ranks[i]) != DUET_OK) {
            c->status = DUET_ERR_INVALID;
            snprintf(c->msg, sizeof(c->msg), "%s", duet_error_msg());
            c->done = 1;
        } else if (!duet__cmd_enqueue(ranks[i], c)) {
            c->status = DUET_ERR_SHUTDOWN;
            snprintf(c->msg, sizeof(c->msg), "xfer rank %d: shutting down", ranks[i]->index);
            c->done = 1;
        }
    }
    for (int i = 0; i < n; i++) {
        if (skip[i])
            continue;
        pthread_mutex_lock(&ranks[i]->mu);
        while (!cmds[i].done)
            pthread_cond_wait(&ranks[i]->cond, &ranks[i]->mu);
        pthread_mutex_unlock(&ranks[i]->mu);
        st[i] = cmds[i].status;
    }
}

duet_status_t duet__post_async(duet_xfer_rank_t *r, duet__cmd_t *c)
{
    c->heap = 1;
    c->status = DUET_OK;
    c->msg[0] = '\0';
    if (duet__on_thread(r)) {
        duet__cmd_exec(r, c);
        return DUET_OK;
    }
    if (!duet__cmd_enqueue(r, c)) {
        duet_free(c);
        return duet_error(DUET_ERR_SHUTDOWN, "xfer rank %d: shutting down", r->index);
    }
    return DUET_OK;
}

/* ---- outcomes: wait, cancel, delivery ------------------------------------- */

static duet__outcome_t *duet__outcome_get(duet_xfer_rank_t *r, int side, uint64_t id)
{
    return side == DUET__SIDE_SEND ? duet__send_outcome(r, id) : duet__recv_outcome(r, id);
}

static void duet__outcome_release(duet_xfer_rank_t *r, duet__outcome_t *o)
{
    if (o->side == DUET__SIDE_SEND)
        duet__send_release(r, o);
    else
        duet__recv_release(r, o);
}

static void duet__exec_wait(duet_xfer_rank_t *r, duet__cmd_t *c)
{
    duet__outcome_t *o = duet__outcome_get(r, c->u.wait.side, c->u.wait.transfer_id);
    if (o == NULL) {
        duet__cmd_done(r, c, DUET_ERR_NOT_FOUND, "xfer rank %d: request %" PRIu64 " not found",
                       r->index, c->u.wait.transfer_id);
    } else if (o->cb != NULL || o->waiter != NULL) {
        duet__cmd_done(r, c, DUET_ERR_INVALID,
                       "xfer rank %d: request %" PRIu64 " has a callback or another waiter",
                       r->index, c->u.wait.transfer_id);
    } else if (o->terminal) {
        *c->u.wait.res = o->res;
        duet__outcome_release(r, o);
        duet__cmd_done(r, c, DUET_OK, NULL);
    } else {
        o->waiter = c;
    }
}

static void duet__exec_unwait(duet_xfer_rank_t *r, duet__cmd_t *c)
{
    duet__cmd_t *w = c->u.unwait;
    if (!w->done) {
        duet__outcome_t *o = duet__outcome_get(r, w->u.wait.side, w->u.wait.transfer_id);
        if (o != NULL && o->waiter == w)
            o->waiter = NULL;
        duet__cmd_done(r, w, DUET_ERR_TIMEOUT, "xfer rank %d: request %" PRIu64 " still running",
                       r->index, w->u.wait.transfer_id);
    }
    duet__cmd_done(r, c, DUET_OK, NULL);
}

/* Run the callbacks / wake the waiters of outcomes that became final.  The
 * list may grow while callbacks call back in. */
static int duet__deliver(duet_xfer_rank_t *r)
{
    int any = 0;
    duet__outcome_t *o;
    while ((o = r->due_head) != NULL) {
        duet__undue(r, o);
        any = 1;
        if (!o->terminal)
            continue;
        if (o->cb != NULL) {
            o->in_callback = 1;
            o->cb(o->arg, o->transfer_id, &o->res);
            o->in_callback = 0;
            duet__outcome_release(r, o);
        } else if (o->waiter != NULL) {
            duet__cmd_t *w = o->waiter;
            *w->u.wait.res = o->res;
            o->waiter = NULL;
            duet__outcome_release(r, o);
            duet__cmd_done(r, w, DUET_OK, NULL);
        }
    }
    return any;
}

duet_status_t duet__wait(duet_xfer_rank_t *r, int side, uint64_t id, int64_t deadline_ns,
                         duet_xfer_result_t *res_p)
{
    duet__cmd_t c, u;
    duet_xfer_result_t res;
    memset(&c, 0, sizeof(c));
    c.kind = DUET__CMD_WAIT;
    c.u.wait.side = side;
    c.u.wait.transfer_id = id;
    c.u.wait.res = &res;
    if (duet__on_thread(r))
        return duet_error(DUET_ERR_INVALID,
                          "xfer rank %d: waiting is not allowed in a transfer callback", r->index);
    if (duet__foreign_rank_check(r) != DUET_OK)
        return DUET_ERR_INVALID;
    if (!duet__cmd_enqueue(r, &c))
        return duet_error(DUET_ERR_SHUTDOWN, "xfer rank %d: shutting down", r->index);
    pthread_mutex_lock(&r->mu);
    while (!c.done) {
        struct timespec ts = duet_deadline_timespec(deadline_ns);
        if (pthread_cond_timedwait(&r->cond, &r->mu, &ts) == ETIMEDOUT && !c.done) {
            pthread_mutex_unlock(&r->mu);
            memset(&u, 0, sizeof(u));
            u.kind = DUET__CMD_UNWAIT;
            u.u.unwait = &c;
            duet__call(r, &u, 0); /* completes c, one way or the other */
            pthread_mutex_lock(&r->mu);
            while (!c.done)
                pthread_cond_wait(&r->cond, &r->mu);
        }
    }
    pthread_mutex_unlock(&r->mu);
    if (c.status == DUET_OK)
        *res_p = res;
    return duet__cmd_result(&c);
}

duet_status_t duet__cancel(duet_xfer_rank_t *r, int side, uint64_t id)
{
    duet__cmd_t c;
    memset(&c, 0, sizeof(c));
    c.kind = DUET__CMD_CANCEL;
    c.u.cancel.side = side;
    c.u.cancel.transfer_id = id;
    return duet__call(r, &c, 1);
}

/* ---- peers ------------------------------------------------------------------------ */

/* Fail the work that uses p, then close it. */
static void duet__close_peer(duet_xfer_rank_t *r, duet_xfer_peer_t *p)
{
    if (p->closing)
        return;
    duet__send_peer_gone(r, p);
    duet__recv_peer_gone(r, p, 1);
    duet__peer_close_start(r, p);
}

/* Connects, closes and raw puts past their deadlines; then every peer
 * failure not reported yet: fail the work that depends on it, tell the
 * user. */
static void duet__check_peers(duet_xfer_rank_t *r, int64_t now)
{
    duet_xfer_peer_t *p;
    duet__peer_scan(r, now);
    while ((p = duet__peer_next_failure(r)) != NULL) {
        duet__send_peer_gone(r, p);
        duet__recv_peer_gone(r, p, 0);
        if (r->x->cfg.on_peer_error != NULL && !p->user_released)
            r->x->cfg.on_peer_error(r->x->cfg.cb_arg, p, p->failed, p->why);
    }
}

/* ---- the progress thread ------------------------------------------------------ */

static void duet__exec_stop(duet_xfer_rank_t *r, duet__cmd_t *c)
{
    r->stopping = 1;
    r->stop_cmd = c;
    r->stop_deadline_ns = duet_now_ns() + DUET__CLOSE_MS * DUET_NS_PER_MS;
    duet__send_fail_all(r, DUET_ERR_SHUTDOWN, "transfer engine shutting down");
    duet__recv_fail_all(r, DUET_ERR_SHUTDOWN, "transfer engine shutting down");
    for (duet_xfer_peer_t *p = r->peers, *next; p != NULL; p = next) {
        next = p->next; /* closing may free p at once */
        p->user_released = 1;
        duet__close_peer(r, p);
    }
}

static void duet__exec_disconnect(duet_xfer_rank_t *r, duet__cmd_t *c)
{
    duet_xfer_peer_t *p = c->u.peer; /* c may be gone once p is closed */
    if (duet__peer_exec_disconnect(r, c))
        duet__close_peer(r, p);
}

static void duet__cmd_exec(duet_xfer_rank_t *r, duet__cmd_t *c)
{
    if (r->stopping && c->kind != DUET__CMD_UNWAIT) {
        duet__cmd_done(r, c, DUET_ERR_SHUTDOWN, "xfer rank %d: shutting down", r->index);
        return;
    }
    switch (c->kind) {
    case DUET__CMD_CONNECT:
        duet__peer_exec_connect(r, c);
        break;
    case DUET__CMD_DISCONNECT:
        duet__exec_disconnect(r, c);
        break;
    case DUET__CMD_EXPECT:
        duet__recv_exec_expect(r, c);
        break;
    case DUET__CMD_SEND_BEGIN:
        duet__send_exec_begin(r, c);
        break;
    case DUET__CMD_SEND_LAYERS:
        duet__send_exec_layers(r, c);
        break;
    case DUET__CMD_SEND_END:
        duet__send_exec_end(r, c);
        break;
    case DUET__CMD_WAIT:
        duet__exec_wait(r, c);
        break;
    case DUET__CMD_UNWAIT:
        duet__exec_unwait(r, c);
        break;
    case DUET__CMD_CANCEL: {
        char msg[DUET_XFER_DETAIL_MAX] = "";
        duet_status_t st = c->u.cancel.side == DUET__SIDE_SEND
                               ? duet__send_cancel(r, c->u.cancel.transfer_id, msg, sizeof(msg))
                               : duet__recv_cancel(r, c->u.cancel.transfer_id, msg, sizeof(msg));
        duet__cmd_done(r, c, st, "%s", msg);
        break;
    }
    case DUET__CMD_PUT:
        duet__peer_exec_put(r, c);
        break;
    case DUET__CMD_RUN: {
        duet_status_t st = c->u.run.fn(c->u.run.arg);
        duet__cmd_done(r, c, st, "%s", st != DUET_OK ? duet_error_msg() : "");
        break;
    }
    case DUET__CMD_STOP:
        duet__exec_stop(r, c);
        break;
    default:
        duet__cmd_done(r, c, DUET_ERR_INTERNAL, "xfer: command %d unknown", c->kind);
    }
}

static int duet__run_cmds(duet_xfer_rank_t *r)
{
    duet__cmd_t *c;
    pthread_mutex_lock(&r->mu);
    c = r->cmd_head;
    r->cmd_head = r->cmd_tail = NULL;
    pthread_mutex_unlock(&r->mu);
    if (c == NULL)
        return 0;
    while (c != NULL) {
        duet__cmd_t *next = c->next;
        duet__cmd_exec(r, c);
        c = next;
    }
    return 1;
}

/* The worker's message callback (inside progress): decode and keep the
 * message for duet__process_inbox. */
void duet__rank_on_msg(void *arg, const void *msg, size_t len)
{
    duet_xfer_rank_t *r = arg;
    duet__msg_t m;
    if (duet__msg_decode(msg, len, &m) != DUET_OK) {
        DUET__STAT_ADD(r, dropped_invalid, 1);
        DUET_LOG_DEBUG("xfer rank %d: dropped a message: %s", r->index, duet_error_msg());
        return;
    }
    if (r->n_inbox == r->cap_inbox) {
        int cap = r->cap_inbox ? r->cap_inbox * 2 : 64;
        duet__msg_t *inbox = duet_realloc(r->inbox, (size_t)cap * sizeof(*inbox));
        if (inbox == NULL) {
            DUET__STAT_ADD(r, dropped_invalid, 1);
            DUET_LOG_ERROR("xfer rank %d: out of memory, message dropped", r->index);
            return;
        }
        r->inbox = inbox;
        r->cap_inbox = cap;
    }
    r->inbox[r->n_inbox++] = m;
}

static int duet__process_inbox(duet_xfer_rank_t *r)
{
    int n = r->n_inbox;
    for (int i = 0; i < r->n_inbox; i++) {
        const duet__msg_t *m = &r->inbox[i];
        if (m->kind == DUET__MSG_NOTIFY && r->info.role == DUET_XFER_DECODE) {
            duet__recv_on_notify(r, m);
        } else if (m->kind == DUET__MSG_PROGRESS && r->info.role == DUET_XFER_DECODE) {
            duet__recv_on_progress(r, m);
        } else if (m->kind == DUET__MSG_ACK && r->info.role == DUET_XFER_PREFILL) {
            duet__send_on_ack(r, m);
        } else {
            DUET__STAT_ADD(r, dropped_invalid, 1);
        }
    }
    r->n_inbox = 0;
    return n > 0;
}

static void duet__rank_sleep(duet_xfer_rank_t *r, int64_t now)
{
    struct epoll_event ev[4];
    int timeout = -1, n, armed;
    /* A device pool's puts are copies on UCX's CUDA streams, and arming the
     * worker there queues a host callback on each stream with copies in
     * flight (UCX's cuda_ipc/cuda_copy event arm): the stream then holds
     * every later put until the host ran that callback, a GPU -> host ->
     * GPU round trip between the puts of one layer and the next.  So while
     * such puts are in flight the thread polls instead of sleeping. */
    if (r->info.pool_device && !r->arm_device && r->ops->inflight(r->worker) > 0 && !r->stopping)
        return;
    armed = r->ops->arm(r->worker);
    if (armed == 0)
        return; /* events pending */
    if (r->next_deadline_ns != INT64_MAX) {
        int64_t ms = (r->next_deadline_ns - now + DUET_NS_PER_MS - 1) / DUET_NS_PER_MS;
        timeout = ms < 0 ? 0 : ms > 60000 ? 60000 : (int)ms;
    }
    if (armed < 0 || r->ops->inflight(r->worker) > 0 || r->stopping)
        timeout = timeout < 0 || timeout > 1 ? 1 : timeout;
    n = epoll_wait(r->epfd, ev, 4, timeout);
    for (int i = 0; i < n; i++) {
        if (ev[i].data.fd == r->evfd) {
            uint64_t v;
            ssize_t k = read(r->evfd, &v, sizeof(v));
            (void)k;
        }
    }
}

void *duet__rank_main(void *arg)
{
    duet_xfer_rank_t *r = arg;
    duet__self_rank = r;
    duet_thread_set_name("xfer-%c%d", r->info.role == DUET_XFER_PREFILL ? 'p' : 'd', r->index);
    for (;;) {
        int busy = duet__run_cmds(r);
        int64_t now;
        for (int i = 0; i < 32 && r->ops->progress(r->worker); i++)
            busy = 1;
        busy |= duet__process_inbox(r);
        busy |= duet__send_post_some(r);
        now = duet_now_ns();
        if (now >= r->next_deadline_ns) {
            r->next_deadline_ns = INT64_MAX;
            duet__send_scan(r, now, &r->next_deadline_ns);
            duet__recv_scan(r, now, &r->next_deadline_ns);
        }
        duet__check_peers(r, now);
        busy |= duet__deliver(r);
        if (r->stopping &&
            ((duet__peers_idle(r) && duet__sends_idle(r)) || now > r->stop_deadline_ns))
            break;
        if (busy)
            continue;
        duet__rank_sleep(r, now);
    }
    if (!duet__peers_idle(r) || !duet__sends_idle(r))
        DUET_LOG_WARN("xfer rank %d: stopped with endpoints or requests still closing", r->index);
    pthread_mutex_lock(&r->mu);
    r->closed = 2;
    for (duet__cmd_t *c = r->cmd_head; c != NULL;) {
        duet__cmd_t *next = c->next;
        c->status = DUET_ERR_SHUTDOWN;
        snprintf(c->msg, sizeof(c->msg), "xfer rank %d: shutting down", r->index);
        if (c->heap)
            duet_free(c);
        else
            c->done = 1;
        c = next;
    }
    r->cmd_head = r->cmd_tail = NULL;
    r->stop_cmd->status = DUET_OK;
    r->stop_cmd->done = 1;
    pthread_cond_broadcast(&r->cond);
    pthread_mutex_unlock(&r->mu);
    return NULL;
}
