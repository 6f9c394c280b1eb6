/* Server call state machine: request bytes, the send queue (one send batch in
 * flight at a time), the deferred status, cancellation and the reference
 * count shared by the application and the CQ thread.
 *
 * Lock order: the call lock is innermost.  No callback runs with it held, and
 * grpc_call_start_batch never calls back (completions go to the CQ), so it is
 * started under the lock, which also serialises batches as gRPC requires. */
#include <string.h>

#include <grpc/slice.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/rpc_internal.h"
#include "common/sync.h"

static void duet__call_free(duet_rpc_call_t *call)
{
    duet_rpc_server_t *srv = call->srv;

    if (call->sending)
        grpc_byte_buffer_destroy(call->sending);
    for (size_t i = 0; i < call->queue_len; i++)
        grpc_byte_buffer_destroy(call->queue[(call->queue_head + i) % call->queue_cap]);
    duet_free(call->queue);
    if (call->has_details)
        grpc_slice_unref(call->finish_details);
    /* Metadata slices belong to the grpc_call: destroy the array first. */
    grpc_metadata_array_destroy(&call->md);
    if (call->gcall)
        grpc_call_unref(call->gcall);
    pthread_cond_destroy(&call->cond);
    pthread_mutex_destroy(&call->lock);
    if (call->recv_bb)
        grpc_byte_buffer_destroy(call->recv_bb);
    duet_free(call->req);
    duet_free(call->path);
    duet_free(call);
    duet__rpc_server_call_removed(srv);
}

static void duet__call_unref(duet_rpc_call_t *call)
{
    if (atomic_fetch_sub_explicit(&call->refs, 1, memory_order_acq_rel) == 1)
        duet__call_free(call);
}

static void duet__call_ref(duet_rpc_call_t *call)
{
    atomic_fetch_add_explicit(&call->refs, 1, memory_order_relaxed);
}

static void duet__call_drop_queue_locked(duet_rpc_call_t *call)
{
    while (call->queue_len > 0) {
        grpc_byte_buffer_destroy(call->queue[call->queue_head]);
        call->queue_head = (call->queue_head + 1) % call->queue_cap;
        call->queue_len--;
    }
    call->finish_pending = false;
}

/* Ring buffer push; grows up to `limit` entries (0 = no limit). */
static duet_status_t duet__call_push_locked(duet_rpc_call_t *call, grpc_byte_buffer *bb,
                                            size_t limit)
{
    if (limit > 0 && call->queue_len >= limit)
        return DUET_ERR_EXHAUSTED;
    if (call->queue_len == call->queue_cap) {
        size_t ncap = call->queue_cap ? call->queue_cap * 2 : 8;
        grpc_byte_buffer **nq = DUET_NEW_ARRAY(grpc_byte_buffer *, ncap);
        if (!nq)
            return duet_error(DUET_ERR_NO_MEMORY, "rpc: stream queue of %zu", ncap);
        for (size_t i = 0; i < call->queue_len; i++)
            nq[i] = call->queue[(call->queue_head + i) % call->queue_cap];
        duet_free(call->queue);
        call->queue = nq;
        call->queue_cap = ncap;
        call->queue_head = 0;
    }
    call->queue[(call->queue_head + call->queue_len) % call->queue_cap] = bb;
    call->queue_len++;
    return DUET_OK;
}

/* Start the next send batch: initial metadata if not sent yet, the next queued
 * message, and the status once the queue is empty.  Requires no send batch in
 * flight. */
static void duet__call_send_next_locked(duet_rpc_call_t *call)
{
    grpc_op ops[3];
    size_t n = 0;
    bool md = false, status = false;
    grpc_byte_buffer *bb = NULL;

    memset(ops, 0, sizeof(ops));
    if (call->queue_len == 0 && !call->finish_pending)
        return;
    if (!call->initial_md_sent) {
        ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
        n++;
        md = true;
    }
    if (call->queue_len > 0) {
        bb = call->queue[call->queue_head];
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n].data.send_message.send_message = bb;
        /* More is already queued behind it: let gRPC coalesce the writes
         * (the last queued message goes without the hint and flushes).
         * Not with the initial metadata: gRPC 1.51 holds a first batch
         * sent with the hint, and its completion, until a later write
         * flushes it -- which waits for that completion (a deferred
         * first send finds the queue full). */
        if (call->queue_len > 1 && !md)
            ops[n].flags = GRPC_WRITE_BUFFER_HINT;
        n++;
    }
    if (call->finish_pending && call->queue_len <= 1) {
        ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
        ops[n].data.send_status_from_server.status = call->finish_code;
        ops[n].data.send_status_from_server.status_details =
            call->has_details ? &call->finish_details : NULL;
        n++;
        status = true;
    }
    duet__call_ref(call);
    grpc_call_error rc = grpc_call_start_batch(call->gcall, ops, n, &call->send_tag, NULL);
    if (rc != GRPC_CALL_OK) {
        /* Only a bug in this file can get here; fail the call rather than
         * leave the client waiting for its deadline. */
        DUET_LOG_ERROR("rpc: start_batch method %s error %s", duet_rpc_call_method(call),
                       grpc_call_error_to_string(rc));
        atomic_fetch_sub_explicit(&call->refs, 1, memory_order_relaxed);
        call->cancelled = true;
        duet__call_drop_queue_locked(call);
        grpc_call_cancel_with_status(call->gcall, GRPC_STATUS_INTERNAL, "server send failed", NULL);
        return;
    }
    call->send_in_flight = true;
    if (md)
        call->initial_md_sent = true;
    if (bb) {
        call->sending = bb;
        call->queue_head = (call->queue_head + 1) % call->queue_cap;
        call->queue_len--;
    }
    if (status) {
        call->finish_pending = false;
        call->status_sent = true;
    }
}

duet_status_t duet__rpc_call_create(duet_rpc_server_t *srv, const duet__rpc_method_t *method,
                                    const char *path, grpc_call *gcall, gpr_timespec deadline,
                                    grpc_metadata_array *md, duet_rpc_call_t **call_p)
{
    duet_status_t st = DUET_ERR_NO_MEMORY;
    duet_rpc_call_t *call = DUET_NEW(duet_rpc_call_t);
    grpc_op op;

    if (!call)
        goto err_cancel;
    call->close_tag.kind = DUET__RPC_TAG_CALL_CLOSE;
    call->send_tag.kind = DUET__RPC_TAG_CALL_SEND;
    call->recv_tag.kind = DUET__RPC_TAG_CALL_RECV;
    call->srv = srv;
    call->method = method;
    call->deadline_ns = duet__rpc_deadline_from_gpr(deadline);
    call->md = *md;
    grpc_metadata_array_init(md);
    call->gcall = gcall;
    atomic_init(&call->refs, 1);
    if (pthread_mutex_init(&call->lock, NULL) != 0)
        goto err_free;
    if (duet_cond_init_monotonic(&call->cond) != 0)
        goto err_mutex;
    if (method) {
        call->path = NULL;
    } else {
        call->path = duet_strdup(path);
        if (!call->path)
            goto err_cond;
    }
    /* Posted first: it is how cancellation and deadlines are noticed. */
    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    op.data.recv_close_on_server.cancelled = &call->close_cancelled;
    duet__call_ref(call);
    grpc_call_error rc = grpc_call_start_batch(gcall, &op, 1, &call->close_tag, NULL);
    if (rc != GRPC_CALL_OK) {
        /* The call is freed with the only reference left. */
        atomic_fetch_sub_explicit(&call->refs, 1, memory_order_relaxed);
        grpc_call_cancel_with_status(gcall, GRPC_STATUS_INTERNAL, "server error", NULL);
        duet__call_unref(call);
        return duet_error(DUET_ERR_INTERNAL, "rpc: recv_close batch: %s",
                          grpc_call_error_to_string(rc));
    }
    *call_p = call;
    return DUET_OK;

err_cond:
    pthread_cond_destroy(&call->cond);
err_mutex:
    pthread_mutex_destroy(&call->lock);
err_free:
    grpc_metadata_array_destroy(&call->md);
    duet_free(call);
err_cancel:
    /* The client gets an answer instead of waiting for its deadline. */
    grpc_call_cancel_with_status(
        gcall, st == DUET_ERR_NO_MEMORY ? GRPC_STATUS_RESOURCE_EXHAUSTED : GRPC_STATUS_INTERNAL,
        "server could not accept the call", NULL);
    grpc_call_unref(gcall);
    duet__rpc_server_call_removed(srv);
    return duet_error(st, "rpc: accepting a call failed");
}

/* CQ thread, under the lock: the call is dead.  Whichever notices first (a
 * failed send or RECV_CLOSE) runs on_cancel, once, unless the application
 * has already ended the call. */
static void duet__call_cancelled_locked(duet_rpc_call_t *call)
{
    call->cancelled = true;
    duet__call_drop_queue_locked(call);
    if (call->app_done || call->cancel_notified)
        return;
    call->cancel_notified = true;
    if (call->on_cancel) {
        duet_rpc_cancel_cb cb = call->on_cancel;
        void *arg = call->on_cancel_arg;
        call->cancel_cb_running = true;
        call->cancel_cb_thread = pthread_self();
        pthread_mutex_unlock(&call->lock);
        cb(call, arg);
        pthread_mutex_lock(&call->lock);
        call->cancel_cb_running = false;
    }
}

void duet__rpc_call_on_close(duet_rpc_call_t *call)
{
    pthread_mutex_lock(&call->lock);
    call->closed = true;
    if (call->close_cancelled)
        duet__call_cancelled_locked(call);
    pthread_cond_broadcast(&call->cond);
    pthread_mutex_unlock(&call->lock);
    duet__call_unref(call);
}

duet_status_t duet__rpc_call_recv(duet_rpc_call_t *call)
{
    grpc_op op;
    grpc_call_error rc;

    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &call->recv_bb;
    duet__call_ref(call);
    pthread_mutex_lock(&call->lock);
    rc = grpc_call_start_batch(call->gcall, &op, 1, &call->recv_tag, NULL);
    pthread_mutex_unlock(&call->lock);
    if (rc != GRPC_CALL_OK) {
        atomic_fetch_sub_explicit(&call->refs, 1, memory_order_relaxed);
        DUET_LOG_ERROR("rpc: recv_message batch method %s error %s", duet_rpc_call_method(call),
                       grpc_call_error_to_string(rc));
        duet_rpc_call_fail(call, GRPC_STATUS_INTERNAL, "server error");
        return duet_error(DUET_ERR_INTERNAL, "rpc: recv_message batch: %s",
                          grpc_call_error_to_string(rc));
    }
    return DUET_OK;
}

bool duet__rpc_call_on_recv(duet_rpc_call_t *call, bool success)
{
    grpc_byte_buffer *bb = call->recv_bb;
    bool ok = false;

    call->recv_bb = NULL;
    if (!success) /* cancelled, or over the message size (gRPC said so) */
        duet_rpc_call_fail(call, GRPC_STATUS_CANCELLED, "call ended before its message");
    else if (bb == NULL)
        duet_rpc_call_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "request message missing");
    else if (duet__rpc_bb_flatten(bb, &call->req, &call->req_len) != DUET_OK)
        duet_rpc_call_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "server out of memory");
    else
        ok = true;
    if (bb)
        grpc_byte_buffer_destroy(bb);
    duet__call_unref(call);
    return ok;
}

/* Start the next send batch (no send in flight): here, or on the server's
 * sender thread when the server defers the sends of application threads
 * (duet_rpc_server_config_t.defer_sends). */
static void duet__call_start_locked(duet_rpc_call_t *call)
{
    if (duet__rpc_server_defers(call->srv) && !duet__rpc_on_cq_thread()) {
        if (!call->kick_pending) {
            call->kick_pending = true;
            duet__call_ref(call);
            duet__rpc_server_kick(call->srv, call);
        }
        return;
    }
    duet__call_send_next_locked(call);
}

void duet__rpc_call_kicked(duet_rpc_call_t *call)
{
    pthread_mutex_lock(&call->lock);
    call->kick_pending = false;
    if (!call->send_in_flight && !call->cancelled)
        duet__call_send_next_locked(call);
    pthread_mutex_unlock(&call->lock);
    duet__call_unref(call);
}

void duet__rpc_call_on_send(duet_rpc_call_t *call, bool success)
{
    pthread_mutex_lock(&call->lock);
    call->send_in_flight = false;
    if (call->sending) {
        grpc_byte_buffer_destroy(call->sending);
        call->sending = NULL;
    }
    if (!success) {
        duet__call_cancelled_locked(call);
    } else if (!call->cancelled) {
        duet__call_send_next_locked(call);
    }
    pthread_cond_broadcast(&call->cond);
    pthread_mutex_unlock(&call->lock);
    duet__call_unref(call);
}

const char *duet_rpc_call_method(const duet_rpc_call_t *call)
{
    return call->method ? call->method->path : call->path;
}

duet_rpc_kind_t duet_rpc_call_kind(const duet_rpc_call_t *call)
{
    return call->method ? call->method->kind : DUET_RPC_UNARY;
}

int64_t duet_rpc_call_deadline_ns(const duet_rpc_call_t *call)
{
    return call->deadline_ns;
}

const char *duet_rpc_call_metadata(const duet_rpc_call_t *call, const char *key, size_t *len_p)
{
    for (size_t i = 0; i < call->md.count; i++) {
        const grpc_metadata *m = &call->md.metadata[i];
        if (grpc_slice_str_cmp(m->key, key) == 0) {
            if (len_p)
                *len_p = GRPC_SLICE_LENGTH(m->value);
            return (const char *)GRPC_SLICE_START_PTR(m->value);
        }
    }
    return NULL;
}

duet_status_t duet_rpc_call_on_cancel(duet_rpc_call_t *call, duet_rpc_cancel_cb cb, void *arg)
{
    duet_status_t st = DUET_OK;
    pthread_mutex_lock(&call->lock);
    if (call->cancelled) {
        st =
            duet_error(DUET_ERR_CANCELLED, "rpc: %s already cancelled", duet_rpc_call_method(call));
    } else {
        call->on_cancel = cb;
        call->on_cancel_arg = arg;
    }
    pthread_mutex_unlock(&call->lock);
    return st;
}

duet_status_t duet_rpc_call_write(duet_rpc_call_t *call, const void *data, size_t len)
{
    duet_status_t st;
    grpc_byte_buffer *bb;

    if (duet_rpc_call_kind(call) != DUET_RPC_SERVER_STREAMING)
        return duet_error(DUET_ERR_INVALID, "rpc: write on unary call %s",
                          duet_rpc_call_method(call));
    bb = duet__rpc_bb_from(data, len);
    if (!bb)
        return duet_error(DUET_ERR_NO_MEMORY, "rpc: message of %zu bytes", len);
    pthread_mutex_lock(&call->lock);
    if (call->cancelled) {
        st = duet_error(DUET_ERR_CANCELLED, "rpc: %s cancelled", duet_rpc_call_method(call));
    } else if (call->app_done) {
        st = duet_error(DUET_ERR_INVALID, "rpc: write after finish on %s",
                        duet_rpc_call_method(call));
    } else {
        st = duet__call_push_locked(call, bb, duet__rpc_server_queue_limit(call->srv));
        if (st == DUET_OK) {
            bb = NULL;
            if (!call->send_in_flight)
                duet__call_start_locked(call);
        } else if (st == DUET_ERR_EXHAUSTED) {
            duet_error(st, "rpc: %s stream queue full (%zu)", duet_rpc_call_method(call),
                       call->queue_len);
        }
    }
    pthread_mutex_unlock(&call->lock);
    if (bb)
        grpc_byte_buffer_destroy(bb);
    return st;
}

duet_status_t duet_rpc_call_wait_writable(duet_rpc_call_t *call, int64_t deadline_ns)
{
    duet_status_t st = DUET_OK;
    size_t limit = duet__rpc_server_queue_limit(call->srv);

    if (duet__rpc_on_cq_thread())
        return duet_error(DUET_ERR_INVALID, "rpc: wait_writable on a completion-queue thread");
    struct timespec ts = duet_deadline_timespec(deadline_ns);
    pthread_mutex_lock(&call->lock);
    while (!call->cancelled && !call->app_done && call->queue_len >= limit) {
        if (pthread_cond_timedwait(&call->cond, &call->lock, &ts) != 0) {
            if (duet_now_ns() >= deadline_ns) {
                st = duet_error(DUET_ERR_TIMEOUT, "rpc: %s stream stayed full",
                                duet_rpc_call_method(call));
                break;
            }
            ts = duet_deadline_timespec(deadline_ns);
        }
    }
    if (st == DUET_OK && call->cancelled)
        st = duet_error(DUET_ERR_CANCELLED, "rpc: %s cancelled", duet_rpc_call_method(call));
    pthread_mutex_unlock(&call->lock);
    return st;
}

/* The common tail of every terminal function: an optional last message, the
 * status, and the release of the application's reference. */
static duet_status_t duet__call_terminate(duet_rpc_call_t *call, grpc_byte_buffer *last,
                                          grpc_status_code code, const char *msg)
{
    duet_status_t st = DUET_OK;
    pthread_t self = pthread_self();

    pthread_mutex_lock(&call->lock);
    /* After we return, on_cancel must be neither running nor pending. */
    while (call->cancel_cb_running && !pthread_equal(call->cancel_cb_thread, self))
        pthread_cond_wait(&call->cond, &call->lock);
    call->app_done = true;
    if (call->cancelled) {
        st = duet_error(DUET_ERR_CANCELLED, "rpc: %s cancelled", duet_rpc_call_method(call));
    } else {
        if (last) {
            st = duet__call_push_locked(call, last, 0);
            if (st == DUET_OK) {
                last = NULL;
            } else {
                code = GRPC_STATUS_RESOURCE_EXHAUSTED;
                msg = "server out of memory";
            }
        }
        call->finish_code = code;
        if (msg && *msg) {
            call->finish_details = grpc_slice_from_copied_string(msg);
            call->has_details = true;
        }
        call->finish_pending = true;
        if (!call->send_in_flight)
            duet__call_start_locked(call);
    }
    pthread_cond_broadcast(&call->cond);
    pthread_mutex_unlock(&call->lock);
    if (last)
        grpc_byte_buffer_destroy(last);
    duet__call_unref(call);
    return st;
}

duet_status_t duet_rpc_call_reply(duet_rpc_call_t *call, const void *data, size_t len)
{
    grpc_byte_buffer *bb = duet__rpc_bb_from(data, len);
    if (!bb)
        return duet__call_terminate(call, NULL, GRPC_STATUS_RESOURCE_EXHAUSTED,
                                    "server out of memory");
    return duet__call_terminate(call, bb, GRPC_STATUS_OK, NULL);
}

duet_status_t duet_rpc_call_fail(duet_rpc_call_t *call, grpc_status_code code, const char *msg)
{
    if (code == GRPC_STATUS_OK) {
        DUET_LOG_ERROR("rpc: %s failed with status OK; sending INTERNAL",
                       duet_rpc_call_method(call));
        code = GRPC_STATUS_INTERNAL;
    }
    return duet__call_terminate(call, NULL, code, msg);
}

duet_status_t duet_rpc_call_fail_status(duet_rpc_call_t *call, duet_status_t st, const char *msg)
{
    return duet_rpc_call_fail(call, duet_rpc_status_to_grpc(st), msg ? msg : duet_status_str(st));
}

duet_status_t duet_rpc_call_finish(duet_rpc_call_t *call, grpc_status_code code, const char *msg)
{
    if (code == GRPC_STATUS_OK && duet_rpc_call_kind(call) == DUET_RPC_UNARY) {
        DUET_LOG_ERROR("rpc: unary %s finished without a reply; sending INTERNAL",
                       duet_rpc_call_method(call));
        return duet__call_terminate(call, NULL, GRPC_STATUS_INTERNAL, "no reply");
    }
    return duet__call_terminate(call, NULL, code, msg);
}
