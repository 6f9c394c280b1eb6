/* gRPC client: channel cache, blocking unary calls (one pluck queue per call)
 * and server-streaming calls driven by the client's CQ threads.
 *
 * Calls never set GRPC_INITIAL_METADATA_WAIT_FOR_READY: against a peer that
 * is down they fail at once with UNAVAILABLE instead of waiting for the
 * deadline, and after such a failure the channel's reconnect backoff is reset
 * so a restarted peer is found by the next call. */
#include <limits.h>
#include <stddef.h>
#include <string.h>

#include <grpc/grpc_security.h>
#include <grpc/slice.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/rpc_auth.h"
#include "common/rpc_internal.h"
#include "common/sync.h"

typedef struct duet__channel_entry {
    struct duet__channel_entry *next;
    char *target;
    grpc_channel *channel;
    int refs; /* the cache's own + borrowers; under cli->lock */
} duet__channel_entry_t;

typedef struct {
    duet_rpc_client_t *cli;
    int index;
} duet__client_worker_t;

struct duet_rpc_client {
    duet_rpc_client_config_t cfg;
    grpc_channel_credentials *creds;
    grpc_metadata secret_md; /* sent on every call when has_secret */
    bool has_secret;
    grpc_arg args[12];
    grpc_channel_args chargs;

    pthread_mutex_t lock;
    pthread_cond_t cond; /* a stream left the live list */
    duet__channel_entry_t *channels;
    duet_rpc_stream_t *streams; /* live: batches outstanding */
    size_t n_streams;
    bool closing;
    unsigned next_cq;

    int n_threads;
    grpc_completion_queue *cqs[DUET__RPC_MAX_THREADS];
    pthread_t threads[DUET__RPC_MAX_THREADS];
    duet__client_worker_t workers[DUET__RPC_MAX_THREADS];
};

/* refs: the caller's handle (if any) + 1 while batches are outstanding.
 * pending counts outstanding batches; when it reaches 0 the grpc_call is
 * released and the stream leaves the client's live list. */
struct duet_rpc_stream {
    duet__rpc_tag_t start_tag;
    duet__rpc_tag_t msg_tag;
    duet__rpc_tag_t status_tag;
    duet_rpc_client_t *cli;
    duet_rpc_stream_t *prev, *next; /* live list, under cli->lock */
    grpc_call *gcall;
    atomic_int refs;
    pthread_mutex_t lock;
    int pending;
    bool recv_pending;
    bool status_received;
    bool done; /* on_done decided */
    bool cancelled;
    bool first_recv;
    grpc_metadata_array init_md;
    grpc_metadata_array trail_md;
    grpc_byte_buffer *recv_bb;
    grpc_status_code code;
    grpc_slice details;
    duet_rpc_stream_message_cb on_message;
    duet_rpc_stream_done_cb on_done;
    void *arg;
};

void duet_rpc_client_config_init(duet_rpc_client_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->max_message_bytes = 4u << 20;
    cfg->keepalive_ms = 30000;
    cfg->keepalive_timeout_ms = 10000;
    cfg->reconnect_backoff_ms = 1000;
    cfg->n_threads = 1;
}

static int duet__clamp_ms(int64_t ms)
{
    return ms > INT_MAX ? INT_MAX : (int)ms;
}

/* ---- channel cache ---- */

static duet__channel_entry_t *duet__channel_get(duet_rpc_client_t *cli, const char *target)
{
    duet__channel_entry_t *e;

    pthread_mutex_lock(&cli->lock);
    for (e = cli->channels; e; e = e->next)
        if (strcmp(e->target, target) == 0)
            break;
    if (!e) {
        e = DUET_NEW(duet__channel_entry_t);
        if (e)
            e->target = duet_strdup(target);
        if (!e || !e->target) {
            duet_free(e);
            pthread_mutex_unlock(&cli->lock);
            duet_error(DUET_ERR_NO_MEMORY, "rpc: channel to %s", target);
            return NULL;
        }
        e->channel = grpc_channel_create(target, cli->creds, &cli->chargs);
        e->refs = 1;
        e->next = cli->channels;
        cli->channels = e;
    }
    e->refs++;
    pthread_mutex_unlock(&cli->lock);
    return e;
}

static void duet__channel_put(duet_rpc_client_t *cli, duet__channel_entry_t *e)
{
    pthread_mutex_lock(&cli->lock);
    bool last = --e->refs == 0;
    pthread_mutex_unlock(&cli->lock);
    if (last) {
        grpc_channel_destroy(e->channel);
        duet_free(e->target);
        duet_free(e);
    }
}

void duet_rpc_client_forget(duet_rpc_client_t *cli, const char *target)
{
    duet__channel_entry_t *e, **pp;

    pthread_mutex_lock(&cli->lock);
    for (pp = &cli->channels; (e = *pp) != NULL; pp = &e->next)
        if (strcmp(e->target, target) == 0)
            break;
    if (e)
        *pp = e->next;
    pthread_mutex_unlock(&cli->lock);
    if (e)
        duet__channel_put(cli, e);
}

/* The cluster secret (rpc_auth.h) in a SEND_INITIAL_METADATA op. */
static void duet__secret_op(duet_rpc_client_t *cli, grpc_op *op)
{
    if (cli->has_secret) {
        op->data.send_initial_metadata.count = 1;
        op->data.send_initial_metadata.metadata = &cli->secret_md;
    }
}

static grpc_call *duet__channel_call(duet__channel_entry_t *e, grpc_completion_queue *cq,
                                     const char *method, int64_t deadline_ns)
{
    return grpc_channel_create_call(e->channel, NULL, GRPC_PROPAGATE_DEFAULTS, cq,
                                    grpc_slice_from_static_string(method), NULL,
                                    duet__rpc_deadline_to_gpr(deadline_ns), NULL);
}

/* ---- unary ---- */

void duet_rpc_result_cleanup(duet_rpc_result_t *res)
{
    if (!res)
        return;
    duet_free(res->message);
    duet_free(res->data);
    memset(res, 0, sizeof(*res));
}

static char *duet__slice_strdup(grpc_slice s)
{
    return duet_strndup((const char *)GRPC_SLICE_START_PTR(s), GRPC_SLICE_LENGTH(s));
}

static bool duet__method_ok(const char *method)
{
    return method && method[0] == '/' && strchr(method + 1, '/');
}

duet_status_t duet_rpc_client_unary(duet_rpc_client_t *cli, const char *target, const char *method,
                                    const void *req, size_t req_len, int64_t deadline_ns,
                                    duet_rpc_result_t *res)
{
    duet_status_t st;
    duet__channel_entry_t *e;
    grpc_completion_queue *cq;
    grpc_call *call;
    grpc_byte_buffer *send_bb, *recv_bb = NULL;
    grpc_metadata_array init_md, trail_md;
    grpc_status_code code = GRPC_STATUS_UNKNOWN;
    grpc_slice details = grpc_empty_slice();
    grpc_op ops[6];

    memset(res, 0, sizeof(*res));
    res->code = GRPC_STATUS_INTERNAL;
    if (!target || !*target || !duet__method_ok(method)) {
        res->message = duet_strdup("bad target or method");
        return duet_error(DUET_ERR_INVALID, "rpc: bad target or method path");
    }
    e = duet__channel_get(cli, target);
    if (!e) {
        res->message = duet_strdup("out of memory");
        return DUET_ERR_NO_MEMORY;
    }
    send_bb = duet__rpc_bb_from(req, req_len);
    cq = grpc_completion_queue_create_for_pluck(NULL);
    call = duet__channel_call(e, cq, method, deadline_ns);
    grpc_metadata_array_init(&init_md);
    grpc_metadata_array_init(&trail_md);

    memset(ops, 0, sizeof(ops));
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    duet__secret_op(cli, &ops[0]);
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = send_bb;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &init_md;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &recv_bb;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &trail_md;
    ops[5].data.recv_status_on_client.status = &code;
    ops[5].data.recv_status_on_client.status_details = &details;
    grpc_call_error rc = grpc_call_start_batch(call, ops, 6, ops, NULL);
    if (rc == GRPC_CALL_OK) {
        /* The call's own deadline bounds this wait. */
        grpc_completion_queue_pluck(cq, ops, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        res->code = code;
        res->message = duet__slice_strdup(details);
        if (code == GRPC_STATUS_OK && recv_bb)
            st = duet__rpc_bb_flatten(recv_bb, &res->data, &res->len);
        else
            st = duet_rpc_status_from_grpc(code);
        if (code == GRPC_STATUS_OK && !recv_bb && st == DUET_OK) {
            res->code = GRPC_STATUS_INTERNAL;
            st = DUET_ERR_PEER;
        }
        if (st != DUET_OK)
            duet_error(st, "rpc: %s %s: %s %s", target, method, duet_rpc_code_name(res->code),
                       res->message ? res->message : "");
        if (code == GRPC_STATUS_UNAVAILABLE)
            grpc_channel_reset_connect_backoff(e->channel);
    } else {
        res->message = duet_strdup(grpc_call_error_to_string(rc));
        st = duet_error(DUET_ERR_INTERNAL, "rpc: %s %s: start_batch %s", target, method,
                        grpc_call_error_to_string(rc));
    }
    if (!res->message) {
        res->code = GRPC_STATUS_RESOURCE_EXHAUSTED;
        st = DUET_ERR_NO_MEMORY;
    }

    grpc_slice_unref(details);
    grpc_metadata_array_destroy(&init_md);
    grpc_metadata_array_destroy(&trail_md);
    if (recv_bb)
        grpc_byte_buffer_destroy(recv_bb);
    grpc_byte_buffer_destroy(send_bb);
    grpc_call_unref(call);
    grpc_completion_queue_shutdown(cq);
    grpc_completion_queue_destroy(cq);
    duet__channel_put(cli, e);
    return st;
}

/* ---- streams ---- */

static void duet__stream_unref(duet_rpc_stream_t *s)
{
    if (atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) != 1)
        return;
    grpc_metadata_array_destroy(&s->init_md);
    grpc_metadata_array_destroy(&s->trail_md);
    grpc_slice_unref(s->details);
    pthread_mutex_destroy(&s->lock);
    duet_free(s);
}

/* A batch completed (called with s->lock held, which it releases).  When it
 * was the last one, the call is released and the stream leaves the list. */
static void duet__stream_batch_done_unlock(duet_rpc_stream_t *s)
{
    bool last = --s->pending == 0;
    grpc_call *gcall = NULL;
    if (last) {
        gcall = s->gcall;
        s->gcall = NULL;
    }
    pthread_mutex_unlock(&s->lock);
    if (!last)
        return;
    /* Metadata slices belong to the call: drop the arrays' contents first. */
    grpc_metadata_array_destroy(&s->init_md);
    grpc_metadata_array_init(&s->init_md);
    grpc_metadata_array_destroy(&s->trail_md);
    grpc_metadata_array_init(&s->trail_md);
    grpc_call_unref(gcall);
    duet_rpc_client_t *cli = s->cli;
    pthread_mutex_lock(&cli->lock);
    if (s->prev)
        s->prev->next = s->next;
    else
        cli->streams = s->next;
    if (s->next)
        s->next->prev = s->prev;
    cli->n_streams--;
    pthread_cond_broadcast(&cli->cond);
    pthread_mutex_unlock(&cli->lock);
    duet__stream_unref(s);
}

/* Under s->lock: report the end once the status is in and no receive is
 * outstanding, so on_done is last.  Releases the lock. */
static void duet__stream_maybe_done_unlock(duet_rpc_stream_t *s)
{
    if (s->done || !s->status_received || s->recv_pending) {
        duet__stream_batch_done_unlock(s);
        return;
    }
    s->done = true;
    grpc_status_code code = s->cancelled ? GRPC_STATUS_CANCELLED : s->code;
    char *msg = s->cancelled ? NULL : duet__slice_strdup(s->details);
    pthread_mutex_unlock(&s->lock);
    s->on_done(s, code, msg ? msg : (s->cancelled ? "cancelled by client" : ""), s->arg);
    duet_free(msg);
    pthread_mutex_lock(&s->lock);
    duet__stream_batch_done_unlock(s);
}

static bool duet__stream_post_recv_locked(duet_rpc_stream_t *s)
{
    grpc_op ops[2];
    size_t n = 0;

    memset(ops, 0, sizeof(ops));
    if (s->first_recv) {
        ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
        ops[n].data.recv_initial_metadata.recv_initial_metadata = &s->init_md;
        n++;
    }
    ops[n].op = GRPC_OP_RECV_MESSAGE;
    ops[n].data.recv_message.recv_message = &s->recv_bb;
    n++;
    if (grpc_call_start_batch(s->gcall, ops, n, &s->msg_tag, NULL) != GRPC_CALL_OK)
        return false;
    s->first_recv = false;
    s->recv_pending = true;
    s->pending++;
    return true;
}

static void duet__stream_on_message(duet_rpc_stream_t *s, bool success)
{
    pthread_mutex_lock(&s->lock);
    grpc_byte_buffer *bb = s->recv_bb;
    s->recv_bb = NULL;
    s->recv_pending = false;
    if (success && bb && !s->cancelled) {
        uint8_t *data = NULL;
        size_t len = 0;
        pthread_mutex_unlock(&s->lock);
        duet_status_t st = duet__rpc_bb_flatten(bb, &data, &len);
        if (st == DUET_OK)
            s->on_message(s, data, len, s->arg);
        duet_free(data);
        pthread_mutex_lock(&s->lock);
        if (st != DUET_OK) {
            s->cancelled = true;
            grpc_call_cancel_with_status(s->gcall, GRPC_STATUS_RESOURCE_EXHAUSTED,
                                         "client out of memory", NULL);
        } else if (!s->cancelled && !duet__stream_post_recv_locked(s)) {
            s->cancelled = true;
            grpc_call_cancel(s->gcall, NULL);
        }
    }
    if (bb)
        grpc_byte_buffer_destroy(bb);
    duet__stream_maybe_done_unlock(s);
}

static void duet__stream_on_status(duet_rpc_stream_t *s)
{
    pthread_mutex_lock(&s->lock);
    s->status_received = true;
    duet__stream_maybe_done_unlock(s);
}

static void *duet__client_cq_main(void *p)
{
    duet__client_worker_t *w = p;
    grpc_completion_queue *cq = w->cli->cqs[w->index];

    duet_thread_set_name("rpc-cli-%d", w->index);
    duet__rpc_cq_thread_set(w->cli);
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
        if (ev.type != GRPC_OP_COMPLETE)
            continue;
        duet__rpc_tag_t *tag = ev.tag;
        duet_rpc_stream_t *s;
        switch (tag->kind) {
        case DUET__RPC_TAG_STREAM_START:
            s = (duet_rpc_stream_t *)((char *)tag - offsetof(duet_rpc_stream_t, start_tag));
            pthread_mutex_lock(&s->lock);
            duet__stream_maybe_done_unlock(s);
            break;
        case DUET__RPC_TAG_STREAM_MSG:
            s = (duet_rpc_stream_t *)((char *)tag - offsetof(duet_rpc_stream_t, msg_tag));
            duet__stream_on_message(s, ev.success != 0);
            break;
        case DUET__RPC_TAG_STREAM_STATUS:
            s = (duet_rpc_stream_t *)((char *)tag - offsetof(duet_rpc_stream_t, status_tag));
            duet__stream_on_status(s);
            break;
        default:
            DUET_LOG_ERROR("rpc: client got a foreign tag kind %d", (int)tag->kind);
            break;
        }
    }
    duet__rpc_cq_thread_set(NULL);
    return NULL;
}

duet_status_t duet_rpc_client_stream(duet_rpc_client_t *cli, const char *target, const char *method,
                                     const void *req, size_t req_len, int64_t deadline_ns,
                                     duet_rpc_stream_message_cb on_message,
                                     duet_rpc_stream_done_cb on_done, void *arg,
                                     duet_rpc_stream_t **stream_p)
{
    duet_status_t st;
    duet_rpc_stream_t *s;
    duet__channel_entry_t *e;
    grpc_byte_buffer *bb;
    grpc_op ops[3];

    if (!target || !*target || !duet__method_ok(method) || !on_message || !on_done)
        return duet_error(DUET_ERR_INVALID, "rpc: stream needs a target, method and callbacks");
    s = DUET_NEW(duet_rpc_stream_t);
    if (!s)
        return duet_error(DUET_ERR_NO_MEMORY, "rpc: stream");
    s->start_tag.kind = DUET__RPC_TAG_STREAM_START;
    s->msg_tag.kind = DUET__RPC_TAG_STREAM_MSG;
    s->status_tag.kind = DUET__RPC_TAG_STREAM_STATUS;
    s->cli = cli;
    s->on_message = on_message;
    s->on_done = on_done;
    s->arg = arg;
    s->first_recv = true;
    s->details = grpc_empty_slice();
    grpc_metadata_array_init(&s->init_md);
    grpc_metadata_array_init(&s->trail_md);
    pthread_mutex_init(&s->lock, NULL);
    atomic_init(&s->refs, stream_p ? 2 : 1);

    e = duet__channel_get(cli, target);
    if (!e) {
        st = DUET_ERR_NO_MEMORY;
        goto err_free;
    }
    bb = duet__rpc_bb_from(req, req_len);
    pthread_mutex_lock(&cli->lock);
    if (cli->closing) {
        pthread_mutex_unlock(&cli->lock);
        grpc_byte_buffer_destroy(bb);
        duet__channel_put(cli, e);
        st = duet_error(DUET_ERR_SHUTDOWN, "rpc: client is closing");
        goto err_free;
    }
    grpc_completion_queue *cq = cli->cqs[cli->next_cq++ % (unsigned)cli->n_threads];
    /* Live before any batch can complete. */
    s->next = cli->streams;
    if (cli->streams)
        cli->streams->prev = s;
    cli->streams = s;
    cli->n_streams++;
    pthread_mutex_unlock(&cli->lock);
    s->gcall = duet__channel_call(e, cq, method, deadline_ns);
    duet__channel_put(cli, e);

    pthread_mutex_lock(&s->lock);
    memset(ops, 0, sizeof(ops));
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    duet__secret_op(cli, &ops[0]);
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = bb;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    bool ok = grpc_call_start_batch(s->gcall, ops, 3, &s->start_tag, NULL) == GRPC_CALL_OK;
    /* The send batch took its own reference on the slices. */
    grpc_byte_buffer_destroy(bb);
    if (ok) {
        s->pending++;
        memset(ops, 0, sizeof(ops));
        ops[0].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
        ops[0].data.recv_status_on_client.trailing_metadata = &s->trail_md;
        ops[0].data.recv_status_on_client.status = &s->code;
        ops[0].data.recv_status_on_client.status_details = &s->details;
        ok = grpc_call_start_batch(s->gcall, ops, 1, &s->status_tag, NULL) == GRPC_CALL_OK;
        if (ok)
            s->pending++;
    }
    if (ok)
        ok = duet__stream_post_recv_locked(s);
    if (!ok) {
        /* Cannot happen with a fresh call; keep the contract anyway: on_done
         * (CANCELLED) fires when the batches already started come back, or
         * here when there are none. */
        DUET_LOG_ERROR("rpc: stream %s %s: start_batch refused", target, method);
        s->cancelled = true;
        s->status_received = true;
        grpc_call_cancel(s->gcall, NULL);
        if (s->pending == 0) {
            s->pending = 1;
            duet__stream_maybe_done_unlock(s);
        } else {
            pthread_mutex_unlock(&s->lock);
        }
    } else {
        pthread_mutex_unlock(&s->lock);
    }
    if (stream_p)
        *stream_p = s;
    return DUET_OK;

err_free:
    grpc_metadata_array_destroy(&s->init_md);
    grpc_metadata_array_destroy(&s->trail_md);
    pthread_mutex_destroy(&s->lock);
    duet_free(s);
    return st;
}

void duet_rpc_stream_cancel(duet_rpc_stream_t *s)
{
    pthread_mutex_lock(&s->lock);
    if (!s->done && !s->cancelled && s->gcall) {
        s->cancelled = true;
        grpc_call_cancel(s->gcall, NULL);
    }
    pthread_mutex_unlock(&s->lock);
}

void duet_rpc_stream_release(duet_rpc_stream_t *s)
{
    if (s)
        duet__stream_unref(s);
}

/* ---- blocking stream helper ---- */

typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    duet_rpc_messages_t *out;
    size_t cap, max;
    bool done, overflow, oom;
} duet__collect_t;

static void duet__collect_on_message(duet_rpc_stream_t *s, const uint8_t *data, size_t len,
                                     void *arg)
{
    duet__collect_t *c = arg;
    duet_rpc_messages_t *out = c->out;
    uint8_t *copy = NULL;

    if (out->count == c->max) {
        c->overflow = true;
        duet_rpc_stream_cancel(s);
        return;
    }
    if (out->count == c->cap) {
        size_t ncap = c->cap ? c->cap * 2 : 16;
        uint8_t **nd = duet_realloc(out->data, ncap * sizeof(*nd));
        if (nd)
            out->data = nd;
        size_t *nl = nd ? duet_realloc(out->len, ncap * sizeof(*nl)) : NULL;
        if (nl)
            out->len = nl;
        if (!nd || !nl) {
            c->oom = true;
            duet_rpc_stream_cancel(s);
            return;
        }
        c->cap = ncap;
    }
    if (len > 0) {
        copy = duet_malloc(len);
        if (!copy) {
            c->oom = true;
            duet_rpc_stream_cancel(s);
            return;
        }
        memcpy(copy, data, len);
    }
    out->data[out->count] = copy;
    out->len[out->count] = len;
    out->count++;
}

static void duet__collect_on_done(duet_rpc_stream_t *s, grpc_status_code code, const char *msg,
                                  void *arg)
{
    duet__collect_t *c = arg;
    pthread_mutex_lock(&c->lock);
    c->out->code = code;
    c->out->message = duet_strdup(msg);
    c->done = true;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->lock);
}

void duet_rpc_messages_cleanup(duet_rpc_messages_t *msgs)
{
    if (!msgs)
        return;
    for (size_t i = 0; i < msgs->count; i++)
        duet_free(msgs->data[i]);
    duet_free(msgs->data);
    duet_free(msgs->len);
    duet_free(msgs->message);
    memset(msgs, 0, sizeof(*msgs));
}

duet_status_t duet_rpc_client_stream_collect(duet_rpc_client_t *cli, const char *target,
                                             const char *method, const void *req, size_t req_len,
                                             int64_t deadline_ns, size_t max_messages,
                                             duet_rpc_messages_t *out)
{
    duet__collect_t c;
    duet_status_t st;

    memset(out, 0, sizeof(*out));
    out->code = GRPC_STATUS_INTERNAL;
    if (duet__rpc_on_cq_thread())
        return duet_error(DUET_ERR_INVALID, "rpc: blocking stream on a completion-queue thread");
    memset(&c, 0, sizeof(c));
    pthread_mutex_init(&c.lock, NULL);
    pthread_cond_init(&c.cond, NULL);
    c.out = out;
    c.max = max_messages;
    st = duet_rpc_client_stream(cli, target, method, req, req_len, deadline_ns,
                                duet__collect_on_message, duet__collect_on_done, &c, NULL);
    if (st == DUET_OK) {
        pthread_mutex_lock(&c.lock);
        while (!c.done)
            pthread_cond_wait(&c.cond, &c.lock);
        pthread_mutex_unlock(&c.lock);
        if (c.overflow)
            st = duet_error(DUET_ERR_EXHAUSTED, "rpc: %s %s: more than %zu messages", target,
                            method, max_messages);
        else if (c.oom)
            st = duet_error(DUET_ERR_NO_MEMORY, "rpc: %s %s: collecting messages", target, method);
        else if (out->code != GRPC_STATUS_OK)
            st =
                duet_error(duet_rpc_status_from_grpc(out->code), "rpc: %s %s: %s %s", target,
                           method, duet_rpc_code_name(out->code), out->message ? out->message : "");
    }
    pthread_cond_destroy(&c.cond);
    pthread_mutex_destroy(&c.lock);
    return st;
}

/* ---- lifecycle ---- */

duet_status_t duet_rpc_client_create(const duet_rpc_client_config_t *cfg, duet_rpc_client_t **cli_p)
{
    duet_rpc_client_t *cli;
    int n = 0;

    if (cfg->n_threads < 1 || cfg->n_threads > DUET__RPC_MAX_THREADS)
        return duet_error(DUET_ERR_INVALID, "rpc: client threads %d not in 1..%d", cfg->n_threads,
                          DUET__RPC_MAX_THREADS);
    if (cfg->max_message_bytes < 1024 || cfg->max_message_bytes > INT_MAX)
        return duet_error(DUET_ERR_INVALID, "rpc: max message %zu not in 1 KiB..2 GiB",
                          cfg->max_message_bytes);
    if (cfg->reconnect_backoff_ms < 100)
        return duet_error(DUET_ERR_INVALID, "rpc: reconnect backoff %lld ms below 100",
                          (long long)cfg->reconnect_backoff_ms);
    cli = DUET_NEW(duet_rpc_client_t);
    if (!cli)
        return duet_error(DUET_ERR_NO_MEMORY, "rpc: client");
    cli->cfg = *cfg;
    pthread_mutex_init(&cli->lock, NULL);
    pthread_cond_init(&cli->cond, NULL);
    duet__rpc_grpc_acquire();
    cli->creds = duet__rpc_auth_channel_creds(cfg->auth);
    const char *secret, *server_name = duet__rpc_auth_server_name(cfg->auth);
    size_t secret_len;
    if (duet__rpc_auth_secret(cfg->auth, &secret, &secret_len)) {
        cli->secret_md.key = grpc_slice_from_static_string(DUET_RPC_AUTH_SECRET_KEY);
        cli->secret_md.value = grpc_slice_from_copied_buffer(secret, secret_len);
        cli->has_secret = true;
    }

    cli->args[n++] =
        duet__rpc_int_arg(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, (int)cfg->max_message_bytes);
    cli->args[n++] =
        duet__rpc_int_arg(GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, (int)cfg->max_message_bytes);
    /* Own subchannels per client: forget() really reconnects, and clients in
     * one process (tests, router) do not share connections. */
    cli->args[n++] = duet__rpc_int_arg(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    cli->args[n++] = duet__rpc_int_arg(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    cli->args[n++] = duet__rpc_int_arg(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
    cli->args[n++] = duet__rpc_int_arg(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
                                       duet__clamp_ms(cfg->reconnect_backoff_ms));
    if (cfg->keepalive_ms > 0) {
        cli->args[n++] =
            duet__rpc_int_arg(GRPC_ARG_KEEPALIVE_TIME_MS, duet__clamp_ms(cfg->keepalive_ms));
        cli->args[n++] = duet__rpc_int_arg(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                                           duet__clamp_ms(cfg->keepalive_timeout_ms));
        cli->args[n++] = duet__rpc_int_arg(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
        /* Otherwise core stops pinging after 2 pings without data, and a
         * quiet stream (health Watch) to a vanished peer is never noticed. */
        cli->args[n++] = duet__rpc_int_arg(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
    }
    if (server_name) {
        /* certificates name the cluster, not each pod's address */
        memset(&cli->args[n], 0, sizeof(cli->args[n]));
        cli->args[n].type = GRPC_ARG_STRING;
        cli->args[n].key = (char *)GRPC_SSL_TARGET_NAME_OVERRIDE_ARG;
        cli->args[n++].value.string = (char *)server_name;
    }
    cli->chargs.num_args = (size_t)n;
    cli->chargs.args = cli->args;

    cli->n_threads = cfg->n_threads;
    for (int i = 0; i < cfg->n_threads; i++) {
        cli->cqs[i] = grpc_completion_queue_create_for_next(NULL);
        cli->workers[i].cli = cli;
        cli->workers[i].index = i;
        int rc = pthread_create(&cli->threads[i], NULL, duet__client_cq_main, &cli->workers[i]);
        if (rc != 0) {
            grpc_completion_queue_shutdown(cli->cqs[i]);
            grpc_completion_queue_destroy(cli->cqs[i]);
            cli->n_threads = i;
            duet_status_t st =
                duet_error(DUET_ERR_NO_MEMORY, "rpc: client thread: %s", strerror(rc));
            duet_rpc_client_destroy(cli);
            return st;
        }
    }
    *cli_p = cli;
    return DUET_OK;
}

void duet_rpc_client_destroy(duet_rpc_client_t *cli)
{
    if (!cli)
        return;
    if (duet__rpc_on_cq_thread()) {
        DUET_LOG_ERROR("rpc: client destroy from a completion-queue thread ignored");
        return;
    }
    pthread_mutex_lock(&cli->lock);
    cli->closing = true;
    for (duet_rpc_stream_t *s = cli->streams; s; s = s->next)
        duet_rpc_stream_cancel(s);
    while (cli->n_streams > 0)
        pthread_cond_wait(&cli->cond, &cli->lock);
    duet__channel_entry_t *channels = cli->channels;
    cli->channels = NULL;
    pthread_mutex_unlock(&cli->lock);

    for (int i = 0; i < cli->n_threads; i++)
        grpc_completion_queue_shutdown(cli->cqs[i]);
    for (int i = 0; i < cli->n_threads; i++) {
        pthread_join(cli->threads[i], NULL);
        grpc_completion_queue_destroy(cli->cqs[i]);
    }
    while (channels) {
        duet__channel_entry_t *next = channels->next;
        duet__channel_put(cli, channels);
        channels = next;
    }
    grpc_channel_credentials_release(cli->creds);
    if (cli->has_secret)
        grpc_slice_unref(cli->secret_md.value);
    pthread_cond_destroy(&cli->cond);
    pthread_mutex_destroy(&cli->lock);
    duet_free(cli);
    duet__rpc_grpc_release();
}
