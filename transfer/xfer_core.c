/* Context, ranks, the command queue and the progress loop of the transfer
 * engine.
 *
 * Progress model: one thread per rank owns the rank's UCP worker (thread mode
 * single) and its tables.  A loop turn runs queued commands, drives
 * ucp_worker_progress, handles received messages, issues a bounded batch of
 * puts, checks deadlines and then delivers outcomes (user callbacks run
 * here, at a point where no table is being iterated).  With nothing left to
 * do it arms the worker and sleeps in epoll on the worker's event fd and an
 * eventfd that other threads write when they queue a command; the sleep is
 * bounded by the nearest deadline, and by 1 ms while UCX requests are in
 * flight (a safety net should a completion not raise an event). */
#include "transfer/xfer_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/sync.h"
#include "transfer/xfer_crc32c.h"

/* ---- small shared helpers -------------------------------------------------- */

/* The rank whose progress thread this is (NULL on other threads). */
static _Thread_local duet_xfer_rank_t *duet__self_rank;

static int on_thread(const duet_xfer_rank_t *r)
{
    return duet__self_rank == r;
}

/* A callback of one rank waiting on another rank's thread could deadlock
 * against that rank's callbacks doing the same: refuse it. */
static duet_status_t foreign_rank_check(const duet_xfer_rank_t *r)
{
    if (duet__self_rank != NULL && duet__self_rank != r)
        return duet_error(DUET_ERR_INVALID,
                          "xfer: a callback of rank %d may not wait on rank %d (queue the work "
                          "to another thread)",
                          duet__self_rank->index, r->index);
    return DUET_OK;
}

void duet__deadline_hint(duet_xfer_rank_t *r, int64_t deadline_ns)
{
    if (deadline_ns < r->next_deadline_ns)
        r->next_deadline_ns = deadline_ns;
}

void duet__outcome_fail(duet__outcome_t *o, duet_status_t st, const char *fmt, ...)
{
    va_list ap;
    if (o->res.status != DUET_OK)
        return; /* the first failure is the one reported */
    o->res.status = st;
    va_start(ap, fmt);
    vsnprintf(o->res.detail, sizeof(o->res.detail), fmt, ap);
    va_end(ap);
}

void duet__due(duet_xfer_rank_t *r, duet__outcome_t *o)
{
    if (o->is_due)
        return;
    o->is_due = 1;
    o->due_next = NULL;
    o->due_prev = r->due_tail;
    if (r->due_tail != NULL)
        r->due_tail->due_next = o;
    else
        r->due_head = o;
    r->due_tail = o;
}

void duet__undue(duet_xfer_rank_t *r, duet__outcome_t *o)
{
    if (!o->is_due)
        return;
    if (o->due_prev != NULL)
        o->due_prev->due_next = o->due_next;
    else
        r->due_head = o->due_next;
    if (o->due_next != NULL)
        o->due_next->due_prev = o->due_prev;
    else
        r->due_tail = o->due_prev;
    o->is_due = 0;
    o->due_prev = o->due_next = NULL;
}

void duet__req_done(duet_xfer_rank_t *r, void *req)
{
    ucp_request_free(req);
    r->ucx_reqs--;
}

/* ---- commands ---------------------------------------------------------------- */

void duet__cmd_done(duet_xfer_rank_t *r, duet__cmd_t *c, duet_status_t st, const char *fmt, ...)
{
    c->status = st;
    if (fmt != NULL) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->msg, sizeof(c->msg), fmt, ap);
        va_end(ap);
    }
    if (c->heap) {
        if (st != DUET_OK)
            DUET_LOG_DEBUG("xfer rank %d: queued command %d: %s", r->index, c->kind, c->msg);
        duet_free(c);
        return;
    }
    pthread_mutex_lock(&r->mu);
    c->done = 1;
    pthread_cond_broadcast(&r->cond);
    pthread_mutex_unlock(&r->mu);
}

static void rank_wake(duet_xfer_rank_t *r)
{
    uint64_t one = 1;
    ssize_t n = write(r->evfd, &one, sizeof(one));
    (void)n; /* EAGAIN means the counter is already non-zero: awake anyway */
}

static void cmd_exec(duet_xfer_rank_t *r, duet__cmd_t *c);

/* Queue c; 0 when the rank no longer takes commands. */
static int cmd_enqueue(duet_xfer_rank_t *r, duet__cmd_t *c)
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
    rank_wake(r);
    return 1;
}

static duet_status_t cmd_result(duet__cmd_t *c)
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
    if (on_thread(r)) {
        if (!callback_safe)
            return duet_error(DUET_ERR_INVALID,
                              "xfer rank %d: this call must not be made from a transfer callback",
                              r->index);
        cmd_exec(r, c);
        return cmd_result(c);
    }
    if (foreign_rank_check(r) != DUET_OK)
        return DUET_ERR_INVALID;
    if (!cmd_enqueue(r, c))
        return duet_error(DUET_ERR_SHUTDOWN, "xfer rank %d: shutting down", r->index);
    pthread_mutex_lock(&r->mu);
    while (!c->done)
        pthread_cond_wait(&r->cond, &r->mu);
    pthread_mutex_unlock(&r->mu);
    return cmd_result(c);
}

duet_status_t duet__post_async(duet_xfer_rank_t *r, duet__cmd_t *c)
{
    c->heap = 1;
    c->status = DUET_OK;
    c->msg[0] = '\0';
    if (on_thread(r)) {
        cmd_exec(r, c);
        return DUET_OK;
    }
    if (!cmd_enqueue(r, c)) {
        duet_free(c);
        return duet_error(DUET_ERR_SHUTDOWN, "xfer rank %d: shutting down", r->index);
    }
    return DUET_OK;
}

/* ---- outcomes: wait, cancel, delivery ------------------------------------- */

static duet__outcome_t *outcome_get(duet_xfer_rank_t *r, int side, uint64_t id)
{
    return side == DUET__SIDE_SEND ? duet__send_outcome(r, id) : duet__recv_outcome(r, id);
}

static void outcome_release(duet_xfer_rank_t *r, duet__outcome_t *o)
{
    if (o->side == DUET__SIDE_SEND)
        duet__send_release(r, o);
    else
        duet__recv_release(r, o);
}

static void exec_wait(duet_xfer_rank_t *r, duet__cmd_t *c)
{
    duet__outcome_t *o = outcome_get(r, c->u.wait.side, c->u.wait.transfer_id);
    if (o == NULL) {
        duet__cmd_done(r, c, DUET_ERR_NOT_FOUND, "xfer rank %d: request %" PRIu64 " not found",
                       r->index, c->u.wait.transfer_id);
    } else if (o->cb != NULL || o->waiter != NULL) {
        duet__cmd_done(r, c, DUET_ERR_INVALID,
                       "xfer rank %d: request %" PRIu64 " has a callback or another waiter",
                       r->index, c->u.wait.transfer_id);
    } else if (o->terminal) {
        *c->u.wait.res = o->res;
        outcome_release(r, o);
        duet__cmd_done(r, c, DUET_OK, NULL);
    } else {
        o->waiter = c;
    }
}

static void exec_unwait(duet_xfer_rank_t *r, duet__cmd_t *c)
{
    duet__cmd_t *w = c->u.unwait;
    if (!w->done) {
        duet__outcome_t *o = outcome_get(r, w->u.wait.side, w->u.wait.transfer_id);
        if (o != NULL && o->waiter == w)
            o->waiter = NULL;
        duet__cmd_done(r, w, DUET_ERR_TIMEOUT, "xfer rank %d: request %" PRIu64 " still running",
                       r->index, w->u.wait.transfer_id);
    }
    duet__cmd_done(r, c, DUET_OK, NULL);
}

/* Run the callbacks / wake the waiters of outcomes that became final.  The
 * list may grow while callbacks call back in. */
static int deliver(duet_xfer_rank_t *r)
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
            outcome_release(r, o);
        } else if (o->waiter != NULL) {
            duet__cmd_t *w = o->waiter;
            *w->u.wait.res = o->res;
            o->waiter = NULL;
            outcome_release(r, o);
            duet__cmd_done(r, w, DUET_OK, NULL);
        }
    }
    return any;
}

static duet_status_t wait_outcome(duet_xfer_rank_t *r, int side, uint64_t id, int64_t deadline_ns,
                                  duet_xfer_result_t *res_p)
{
    duet__cmd_t c, u;
    duet_xfer_result_t res;
    memset(&c, 0, sizeof(c));
    c.kind = DUET__CMD_WAIT;
    c.u.wait.side = side;
    c.u.wait.transfer_id = id;
    c.u.wait.res = &res;
    if (on_thread(r))
        return duet_error(DUET_ERR_INVALID,
                          "xfer rank %d: waiting is not allowed in a transfer callback", r->index);
    if (foreign_rank_check(r) != DUET_OK)
        return DUET_ERR_INVALID;
    if (!cmd_enqueue(r, &c))
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
    return cmd_result(&c);
}

duet_status_t duet_xfer_recv_wait(duet_xfer_rank_t *r, uint64_t transfer_id, int64_t deadline_ns,
                                  duet_xfer_result_t *res_p)
{
    return wait_outcome(r, DUET__SIDE_RECV, transfer_id, deadline_ns, res_p);
}

duet_status_t duet_xfer_send_wait(duet_xfer_rank_t *r, uint64_t transfer_id, int64_t deadline_ns,
                                  duet_xfer_result_t *res_p)
{
    return wait_outcome(r, DUET__SIDE_SEND, transfer_id, deadline_ns, res_p);
}

static duet_status_t cancel(duet_xfer_rank_t *r, int side, uint64_t id)
{
    duet__cmd_t c;
    memset(&c, 0, sizeof(c));
    c.kind = DUET__CMD_CANCEL;
    c.u.cancel.side = side;
    c.u.cancel.transfer_id = id;
    return duet__call(r, &c, 1);
}

duet_status_t duet_xfer_recv_cancel(duet_xfer_rank_t *r, uint64_t transfer_id)
{
    return cancel(r, DUET__SIDE_RECV, transfer_id);
}

duet_status_t duet_xfer_send_cancel(duet_xfer_rank_t *r, uint64_t transfer_id)
{
    return cancel(r, DUET__SIDE_SEND, transfer_id);
}

/* ---- the progress thread ------------------------------------------------------ */

static void exec_stop(duet_xfer_rank_t *r, duet__cmd_t *c)
{
    r->stopping = 1;
    r->stop_cmd = c;
    r->stop_deadline_ns = duet_now_ns() + DUET__CLOSE_MS * DUET_NS_PER_MS;
    duet__send_fail_all(r, DUET_ERR_SHUTDOWN, "transfer engine shutting down");
    duet__recv_fail_all(r, DUET_ERR_SHUTDOWN, "transfer engine shutting down");
    for (duet_xfer_peer_t *p = r->peers, *next; p != NULL; p = next) {
        next = p->next; /* closing may free p at once */
        p->user_released = 1;
        duet__peer_close_start(r, p);
    }
}

static void cmd_exec(duet_xfer_rank_t *r, duet__cmd_t *c)
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
        duet__peer_exec_disconnect(r, c);
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
        exec_wait(r, c);
        break;
    case DUET__CMD_UNWAIT:
        exec_unwait(r, c);
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
        exec_stop(r, c);
        break;
    default:
        duet__cmd_done(r, c, DUET_ERR_INTERNAL, "xfer: command %d unknown", c->kind);
    }
}

static int run_cmds(duet_xfer_rank_t *r)
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
        cmd_exec(r, c);
        c = next;
    }
    return 1;
}

static ucs_status_t am_cb(void *arg, const void *header, size_t header_length, void *data,
                          size_t length, const ucp_am_recv_param_t *param)
{
    duet_xfer_rank_t *r = arg;
    duet__msg_t m;
    (void)data;
    (void)param;
    if (length != 0 || duet__msg_decode(header, header_length, &m) != DUET_OK) {
        DUET__STAT_ADD(r, dropped_invalid, 1);
        DUET_LOG_DEBUG("xfer rank %d: dropped a message: %s", r->index, duet_error_msg());
        return UCS_OK;
    }
    if (r->n_inbox == r->cap_inbox) {
        int cap = r->cap_inbox ? r->cap_inbox * 2 : 64;
        duet__msg_t *inbox = duet_realloc(r->inbox, (size_t)cap * sizeof(*inbox));
        if (inbox == NULL) {
            DUET__STAT_ADD(r, dropped_invalid, 1);
            DUET_LOG_ERROR("xfer rank %d: out of memory, message dropped", r->index);
            return UCS_OK;
        }
        r->inbox = inbox;
        r->cap_inbox = cap;
    }
    r->inbox[r->n_inbox++] = m;
    return UCS_OK;
}

static int process_inbox(duet_xfer_rank_t *r)
{
    int n = r->n_inbox;
    for (int i = 0; i < r->n_inbox; i++) {
        const duet__msg_t *m = &r->inbox[i];
        if (m->kind == DUET__MSG_NOTIFY && r->info.role == DUET_XFER_DECODE) {
            duet__recv_on_notify(r, m);
        } else if (m->kind == DUET__MSG_ACK && r->info.role == DUET_XFER_PREFILL) {
            duet__send_on_ack(r, m);
        } else {
            DUET__STAT_ADD(r, dropped_invalid, 1);
        }
    }
    r->n_inbox = 0;
    return n > 0;
}

static void rank_sleep(duet_xfer_rank_t *r, int64_t now)
{
    struct epoll_event ev[4];
    int timeout = -1, n;
    ucs_status_t st = ucp_worker_arm(r->worker);
    if (st == UCS_ERR_BUSY)
        return;
    if (r->next_deadline_ns != INT64_MAX) {
        int64_t ms = (r->next_deadline_ns - now + DUET_NS_PER_MS - 1) / DUET_NS_PER_MS;
        timeout = ms < 0 ? 0 : ms > 60000 ? 60000 : (int)ms;
    }
    if (st != UCS_OK || r->ucx_reqs > 0 || r->stopping)
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

static void *rank_main(void *arg)
{
    duet_xfer_rank_t *r = arg;
    duet__self_rank = r;
    duet_thread_set_name("xfer-%c%d", r->info.role == DUET_XFER_PREFILL ? 'p' : 'd', r->index);
    for (;;) {
        int busy = run_cmds(r);
        int64_t now;
        for (int i = 0; i < 32 && ucp_worker_progress(r->worker); i++)
            busy = 1;
        busy |= process_inbox(r);
        busy |= duet__send_post_some(r);
        now = duet_now_ns();
        if (now >= r->next_deadline_ns) {
            r->next_deadline_ns = INT64_MAX;
            duet__send_scan(r, now, &r->next_deadline_ns);
            duet__recv_scan(r, now, &r->next_deadline_ns);
        }
        duet__peer_scan(r, now);
        busy |= deliver(r);
        if (r->stopping &&
            ((duet__peers_idle(r) && duet__sends_idle(r)) || now > r->stop_deadline_ns))
            break;
        if (busy)
            continue;
        rank_sleep(r, now);
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

/* ---- ranks -------------------------------------------------------------------- */

static void rank_destroy(duet_xfer_rank_t *r)
{
    if (r == NULL)
        return;
    if (r->thread_started) {
        duet__cmd_t c;
        memset(&c, 0, sizeof(c));
        c.kind = DUET__CMD_STOP;
        duet__call(r, &c, 0);
        pthread_join(r->thread, NULL);
        r->thread_started = 0;
    }
    duet__peer_drop_rkeys(r); /* rkeys go before the worker (and its endpoints) */
    if (r->worker != NULL) {
        if (r->addr != NULL)
            ucp_worker_release_address(r->worker, r->addr);
        ucp_worker_destroy(r->worker);
    }
    duet__peer_reap_all(r);
    while (r->send_list != NULL) {
        duet__send_t *s = r->send_list;
        duet__send_free(s); /* unlinks itself */
    }
    duet__recv_cleanup(r);
    duet__map_cleanup(&r->sends);
    if (r->rkey_buf != NULL)
        ucp_rkey_buffer_release(r->rkey_buf);
    if (r->memh != NULL)
        ucp_mem_unmap(r->x->ucp, r->memh);
    if (r->epfd >= 0)
        close(r->epfd);
    if (r->evfd >= 0)
        close(r->evfd);
    pthread_cond_destroy(&r->cond);
    pthread_mutex_destroy(&r->mu);
    duet_free(r->inbox);
    duet_free(r);
}

static duet_status_t rank_create(duet_xfer_t *x, int index, duet_xfer_rank_t **rank_p)
{
    ucp_worker_params_t wp;
    ucp_worker_attr_t wa;
    ucp_am_handler_param_t hp;
    struct epoll_event ev;
    duet_xfer_rank_t *r;
    duet_status_t st;
    ucs_status_t us;
    int rc;

    r = DUET_NEW(duet_xfer_rank_t);
    if (r == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "xfer rank %d", index);
    r->x = x;
    r->index = index;
    r->efd = r->evfd = r->epfd = -1;
    r->next_deadline_ns = INT64_MAX;
    atomic_store(&r->corrupt_at, -1);
    r->info.role = x->cfg.role;
    r->info.rank = index;
    r->info.tp = x->cfg.tp;
    r->info.kv_heads = x->cfg.kv_heads;
    r->info.dtype = x->cfg.dtype;
    r->info.layout = x->cfg.layout;
    r->info.model_fingerprint = x->cfg.model_fingerprint;
    r->info.instance = x->instance;
    r->info.host_id = x->host_id;
    duet__map_init(&r->sends);
    duet__map_init(&r->expects);
    duet__map_init(&r->tombs);
    pthread_mutex_init(&r->mu, NULL);
    rc = duet_cond_init_monotonic(&r->cond);
    if (rc != 0) {
        pthread_mutex_destroy(&r->mu);
        duet_free(r);
        return duet_error(DUET_ERR_INTERNAL, "xfer rank %d: condition variable: %s", index,
                          strerror(rc));
    }
    r->tomb_ring = DUET_NEW_ARRAY(uint64_t, DUET__TOMB_CAP);
    r->early = DUET_NEW_ARRAY(duet__early_t, (size_t)x->cfg.early_max);
    if (r->tomb_ring == NULL || r->early == NULL) {
        st = duet_error(DUET_ERR_NO_MEMORY, "xfer rank %d: tables", index);
        goto err_destroy;
    }

    memset(&wp, 0, sizeof(wp));
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    us = ucp_worker_create(x->ucp, &wp, &r->worker);
    if (us != UCS_OK) {
        r->worker = NULL;
        st = duet_error(DUET_ERR_IO, "xfer rank %d: ucp_worker_create: %s", index,
                        ucs_status_string(us));
        goto err_destroy;
    }
    memset(&hp, 0, sizeof(hp));
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    hp.id = DUET__AM_ID;
    hp.cb = am_cb;
    hp.arg = r;
    hp.flags = UCP_AM_FLAG_WHOLE_MSG;
    us = ucp_worker_set_am_recv_handler(r->worker, &hp);
    if (us == UCS_OK) {
        memset(&wa, 0, sizeof(wa));
        wa.field_mask = UCP_WORKER_ATTR_FIELD_ADDRESS;
        us = ucp_worker_query(r->worker, &wa);
        r->addr = us == UCS_OK ? wa.address : NULL;
        r->addr_len = us == UCS_OK ? wa.address_length : 0;
    }
    if (us == UCS_OK)
        us = ucp_worker_get_efd(r->worker, &r->efd);
    if (us != UCS_OK) {
        st =
            duet_error(DUET_ERR_IO, "xfer rank %d: worker setup: %s", index, ucs_status_string(us));
        goto err_destroy;
    }
    r->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    r->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (r->evfd < 0 || r->epfd < 0) {
        st = duet_error(DUET_ERR_IO, "xfer rank %d: eventfd/epoll: %s", index, strerror(errno));
        goto err_destroy;
    }
    memset(&ev, 0, sizeof(ev));
    ev.events = EPOLLIN;
    ev.data.fd = r->efd;
    if (epoll_ctl(r->epfd, EPOLL_CTL_ADD, r->efd, &ev) != 0)
        goto err_epoll;
    ev.data.fd = r->evfd;
    if (epoll_ctl(r->epfd, EPOLL_CTL_ADD, r->evfd, &ev) != 0)
        goto err_epoll;
    rc = pthread_create(&r->thread, NULL, rank_main, r);
    if (rc != 0) {
        st = duet_error(DUET_ERR_INTERNAL, "xfer rank %d: pthread_create: %s", index, strerror(rc));
        goto err_destroy;
    }
    r->thread_started = 1;
    *rank_p = r;
    return DUET_OK;

err_epoll:
    st = duet_error(DUET_ERR_IO, "xfer rank %d: epoll_ctl: %s", index, strerror(errno));
err_destroy:
    rank_destroy(r);
    return st;
}

/* ---- context ------------------------------------------------------------------ */

/* Same host <=> same hostname and boot: only then can shared memory work. */
static uint64_t host_id_get(void)
{
    char buf[320] = "";
    size_t n = 0;
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f != NULL) {
        n = fread(buf, 1, 64, f);
        fclose(f);
    }
    if (gethostname(buf + n, sizeof(buf) - n - 1) != 0)
        buf[n] = '\0';
    n = strlen(buf);
    return ((uint64_t)duet__crc32c(0, buf, n) << 32) | duet__crc32c(0x9e3779b9u, buf, n);
}

/* Can any transport in this UCX_TLS value report peer failures (UCX 1.13:
 * tcp and the InfiniBand ones; not self or shared memory)?  An explicit list
 * without one would only earn a UCX error line per connection attempt. */
static int tls_may_detect_failure(const char *tls)
{
    static const char *const capable[] = {"all", "tcp", "rc", "dc", "ud", "ib", "mlx5"};
    char buf[256], *save = NULL;
    if (tls == NULL || tls[0] == '\0' || tls[0] == '^')
        return 1;
    snprintf(buf, sizeof(buf), "%s", tls);
    for (char *t = strtok_r(buf, ",", &save); t != NULL; t = strtok_r(NULL, ",", &save))
        for (size_t k = 0; k < sizeof(capable) / sizeof(capable[0]); k++)
            if (strncmp(t, capable[k], strlen(capable[k])) == 0)
                return 1;
    return 0;
}

static uint64_t instance_new(void)
{
    uint64_t v = 0;
    if (getrandom(&v, sizeof(v), 0) != (ssize_t)sizeof(v))
        v = (uint64_t)duet_now_ns() ^ ((uint64_t)getpid() << 32);
    return v ? v : 1;
}

duet_status_t duet_xfer_create(const duet_xfer_config_t *cfg, duet_xfer_t **xfer_p)
{
    duet_xfer_desc_info_t info;
    ucp_config_t *config;
    ucp_params_t params;
    duet_xfer_t *x;
    ucs_status_t us;
    duet_status_t st;

    memset(&info, 0, sizeof(info));
    info.role = cfg->role;
    info.tp = cfg->tp;
    info.kv_heads = cfg->kv_heads;
    info.dtype = cfg->dtype;
    info.layout = cfg->layout;
    info.pool_bytes = UINT64_MAX;
    if (duet__desc_check_info(&info, "xfer config") != DUET_OK)
        return duet_error(DUET_ERR_CONFIG, "%s", duet_error_msg());

    x = DUET_NEW(duet_xfer_t);
    if (x == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "xfer context");
    x->cfg = *cfg;
    if (x->cfg.early_ttl_ms <= 0)
        x->cfg.early_ttl_ms = 5000;
    if (x->cfg.early_max <= 0)
        x->cfg.early_max = 1024;
    if (cfg->tls != NULL) {
        x->tls = duet_strdup(cfg->tls);
        if (x->tls == NULL) {
            duet_free(x);
            return duet_error(DUET_ERR_NO_MEMORY, "xfer context");
        }
    }
    x->cfg.tls = x->tls;
    x->instance = instance_new();
    x->host_id = host_id_get();
    if (!tls_may_detect_failure(x->tls != NULL ? x->tls : getenv("UCX_TLS"))) {
        atomic_store(&x->no_peer_mode, 1);
        DUET_LOG_WARN("xfer: no transport in UCX_TLS %s detects peer failure; a dead peer is "
                      "found by deadlines and missing acknowledgements",
                      x->tls != NULL ? x->tls : getenv("UCX_TLS"));
    }

    us = ucp_config_read(NULL, NULL, &config);
    if (us != UCS_OK) {
        st = duet_error(DUET_ERR_CONFIG, "ucx config: %s", ucs_status_string(us));
        goto err_free;
    }
    if (x->tls != NULL && (us = ucp_config_modify(config, "TLS", x->tls)) != UCS_OK) {
        ucp_config_release(config);
        st = duet_error(DUET_ERR_CONFIG, "ucx TLS '%s': %s", x->tls, ucs_status_string(us));
        goto err_free;
    }
    memset(&params, 0, sizeof(params));
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    params.mt_workers_shared = 1; /* ranks map pools and run workers on their own threads */
    us = ucp_init(&params, config, &x->ucp);
    ucp_config_release(config);
    if (us != UCS_OK) {
        x->ucp = NULL;
        st = duet_error(DUET_ERR_IO, "ucp_init: %s", ucs_status_string(us));
        goto err_free;
    }
    x->ranks = DUET_NEW_ARRAY(duet_xfer_rank_t *, (size_t)cfg->tp);
    if (x->ranks == NULL) {
        st = duet_error(DUET_ERR_NO_MEMORY, "xfer ranks");
        goto err_destroy;
    }
    for (int i = 0; i < cfg->tp; i++) {
        st = rank_create(x, i, &x->ranks[i]);
        if (st != DUET_OK)
            goto err_destroy;
        x->n_ranks++;
    }
    DUET_LOG_INFO("xfer: %s daemon, tp %d, instance %016" PRIx64 ", tls %s",
                  duet__role_name(cfg->role), cfg->tp, x->instance,
                  x->tls ? x->tls : "(ucx default)");
    *xfer_p = x;
    return DUET_OK;

err_destroy:
    duet_xfer_destroy(x);
    return st;
err_free:
    duet_free(x->tls);
    duet_free(x);
    return st;
}

void duet_xfer_destroy(duet_xfer_t *x)
{
    if (x == NULL)
        return;
    for (int i = 0; i < x->n_ranks; i++)
        rank_destroy(x->ranks[i]);
    duet_free(x->ranks);
    if (x->ucp != NULL)
        ucp_cleanup(x->ucp);
    duet_free(x->tls);
    duet_free(x);
}

duet_xfer_rank_t *duet_xfer_rank(duet_xfer_t *x, int i)
{
    return (x != NULL && i >= 0 && i < x->n_ranks) ? x->ranks[i] : NULL;
}

int duet_xfer_rank_index(const duet_xfer_rank_t *r)
{
    return r->index;
}

duet_status_t duet_xfer_rank_run(duet_xfer_rank_t *r, duet_status_t (*fn)(void *arg), void *arg)
{
    duet__cmd_t c;
    memset(&c, 0, sizeof(c));
    c.kind = DUET__CMD_RUN;
    c.u.run.fn = fn;
    c.u.run.arg = arg;
    return duet__call(r, &c, 0);
}

bool duet_xfer_supports_cuda_memory(const duet_xfer_t *xfer)
{
    ucp_context_attr_t attr = {.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES};
    if (ucp_context_query(xfer->ucp, &attr) != UCS_OK)
        return false;
    return (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
}

/* Whether UCX_PROTO_ENABLE in the environment says yes (1) or no (0);
 * -1 when unset. */
static int duet__proto_env(void)
{
    const char *v = getenv("UCX_PROTO_ENABLE");
    if (v == NULL || *v == '\0')
        return -1;
    return strcasecmp(v, "y") == 0 || strcasecmp(v, "yes") == 0 || strcasecmp(v, "on") == 0 ||
           strcmp(v, "1") == 0;
}

int duet_xfer_ucx_version(void)
{
    unsigned major, minor, release;
    ucp_get_version(&major, &minor, &release);
    return (int)(major * 100 + minor);
}

bool duet_xfer_device_puts(const duet_xfer_t *xfer, const char **why)
{
    unsigned major, minor, release;
    int env = duet__proto_env();

    if (!duet_xfer_supports_cuda_memory(xfer)) {
        *why = "this UCX build has no CUDA transports";
        return false;
    }
    /* UCX's original protocols emulate a put whose rkey no lane serves by
     * reading the source on the CPU: a put from device memory then faults
     * (seen with 1.13 and cuda_ipc).  Its new protocols (the default since
     * 1.16, UCX_PROTO_ENABLE=y before) move device memory with cuda_ipc /
     * cuda_copy. */
    ucp_get_version(&major, &minor, &release);
    if (env == 0) {
        *why = "UCX_PROTO_ENABLE=n (UCX's original protocols cannot put from device memory)";
        return false;
    }
    if (env < 0 && (major < 1 || (major == 1 && minor < 16))) {
        *why = "this UCX (< 1.16) needs UCX_PROTO_ENABLE=y to put from device memory";
        return false;
    }
    *why = "UCX moves CUDA memory";
    return true;
}
