/* gRPC server over the C core completion-queue API.
 *
 * One completion queue per thread.  Each queue keeps DUET__RPC_SLOTS request
 * slots posted per registered method plus as many for unregistered methods
 * (answered UNIMPLEMENTED); a call is bound to the queue it arrived on, so
 * all of one call's completions are handled by one thread.  The call state
 * machine lives in rpc_call.c. */
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <grpc/grpc_security.h>
#include <grpc/slice.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/rpc_auth.h"
#include "common/rpc_internal.h"
#include "common/sync.h"

#define DUET__RPC_SLOTS           4
#define DUET__RPC_MAX_PATH        256
#define DUET__RPC_SHUTDOWN_WARN_S 5

typedef struct {
    duet__rpc_tag_t tag;
    duet_rpc_server_t *srv;
    const duet__rpc_method_t *method; /* NULL: the unregistered-method slot */
    grpc_completion_queue *cq;
    grpc_call *gcall;
    gpr_timespec deadline;
    grpc_metadata_array md;
    grpc_call_details details;
} duet__request_slot_t;

typedef struct {
    duet_rpc_server_t *srv;
    int index;
} duet__cq_worker_t;

struct duet_rpc_server {
    duet__rpc_tag_t shutdown_tag;
    duet_rpc_server_config_t cfg;
    char *bind_addr;
    grpc_server *server;
    int port;

    grpc_completion_queue *cqs[DUET__RPC_MAX_THREADS];
    pthread_t threads[DUET__RPC_MAX_THREADS];
    duet__cq_worker_t workers[DUET__RPC_MAX_THREADS];
    int n_threads_started;

    duet__rpc_method_t *methods;
    size_t n_methods;
    duet__request_slot_t *slots;
    size_t n_slots;

    struct {
        duet_rpc_shutdown_cb cb;
        void *arg;
    } hooks[DUET__RPC_MAX_HOOKS];
    int n_hooks;

    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool started;
    bool shutting_down;
    bool shutdown_notified; /* the shutdown tag came back */
    bool finished;          /* grpc server destroyed, threads joined */
    size_t active_calls;

    /* the sender thread (cfg.defer_sends): calls whose next send it starts */
    pthread_t sender;
    bool sender_started, sender_stop;
    duet_rpc_call_t *kick_head, *kick_tail;
    pthread_mutex_t kick_lock;
    pthread_cond_t kick_cv;
};

void duet_rpc_server_config_init(duet_rpc_server_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->bind_addr = "0.0.0.0:0";
    cfg->n_threads = 2;
    cfg->max_message_bytes = 4u << 20;
    cfg->stream_queue_limit = 1024;
    cfg->shutdown_grace_ms = 5000;
    cfg->handshake_timeout_ms = 10000;
    cfg->max_connection_idle_ms = 300000;
    cfg->max_streams = 4096;
}

void duet__rpc_server_call_added(duet_rpc_server_t *srv)
{
    pthread_mutex_lock(&srv->lock);
    srv->active_calls++;
    pthread_mutex_unlock(&srv->lock);
}

void duet__rpc_server_call_removed(duet_rpc_server_t *srv)
{
    pthread_mutex_lock(&srv->lock);
    if (--srv->active_calls == 0)
        pthread_cond_broadcast(&srv->cond);
    pthread_mutex_unlock(&srv->lock);
}

size_t duet__rpc_server_queue_limit(const duet_rpc_server_t *srv)
{
    return srv->cfg.stream_queue_limit;
}

bool duet__rpc_server_defers(const duet_rpc_server_t *srv)
{
    return srv->sender_started;
}

void duet__rpc_server_kick(duet_rpc_server_t *srv, duet_rpc_call_t *call)
{
    pthread_mutex_lock(&srv->kick_lock);
    call->kick_next = NULL;
    if (srv->kick_tail)
        srv->kick_tail->kick_next = call;
    else
        srv->kick_head = call;
    srv->kick_tail = call;
    pthread_cond_signal(&srv->kick_cv);
    pthread_mutex_unlock(&srv->kick_lock);
}

/* Start the sends the application threads queued, in the order they came;
 * runs until shutdown has no call left. */
static void *duet__sender_main(void *arg)
{
    duet_rpc_server_t *srv = arg;
    duet_thread_set_name("rpc-send");
    pthread_mutex_lock(&srv->kick_lock);
    for (;;) {
        while (srv->kick_head == NULL && !srv->sender_stop)
            pthread_cond_wait(&srv->kick_cv, &srv->kick_lock);
        duet_rpc_call_t *c = srv->kick_head;
        if (c == NULL)
            break; /* stopping, nothing left */
        srv->kick_head = srv->kick_tail = NULL;
        pthread_mutex_unlock(&srv->kick_lock);
        while (c != NULL) {
            duet_rpc_call_t *next = c->kick_next;
            duet__rpc_call_kicked(c);
            c = next;
        }
        pthread_mutex_lock(&srv->kick_lock);
    }
    pthread_mutex_unlock(&srv->kick_lock);
    return NULL;
}

static void duet__sender_stop(duet_rpc_server_t *srv)
{
    if (!srv->sender_started)
        return;
    pthread_mutex_lock(&srv->kick_lock);
    srv->sender_stop = true;
    pthread_cond_signal(&srv->kick_cv);
    pthread_mutex_unlock(&srv->kick_lock);
    pthread_join(srv->sender, NULL);
}

size_t duet_rpc_server_active_calls(duet_rpc_server_t *srv)
{
    pthread_mutex_lock(&srv->lock);
    size_t n = srv->active_calls;
    pthread_mutex_unlock(&srv->lock);
    return n;
}

int duet_rpc_server_port(const duet_rpc_server_t *srv)
{
    return srv->port;
}

/* Post (or re-post) a request slot; false when the server refused. */
static bool duet__slot_post(duet__request_slot_t *slot)
{
    duet_rpc_server_t *srv = slot->srv;
    grpc_call_error rc;

    if (slot->method)
        rc = grpc_server_request_registered_call(srv->server, slot->method->handle, &slot->gcall,
                                                 &slot->deadline, &slot->md, NULL, slot->cq,
                                                 slot->cq, &slot->tag);
    else
        rc = grpc_server_request_call(srv->server, &slot->gcall, &slot->details, &slot->md,
                                      slot->cq, slot->cq, &slot->tag);
    if (rc != GRPC_CALL_OK) {
        DUET_LOG_ERROR("rpc: request_call error %s", grpc_call_error_to_string(rc));
        return false;
    }
    return true;
}

static void duet__on_request(duet__request_slot_t *slot, bool success)
{
    duet_rpc_server_t *srv = slot->srv;
    const duet__rpc_method_t *method = slot->method;
    grpc_call *gcall = slot->gcall;
    grpc_metadata_array md = slot->md;
    gpr_timespec deadline = method ? slot->deadline : slot->details.deadline;
    char path[DUET__RPC_MAX_PATH + 1] = "";
    duet_rpc_call_t *call;

    if (!success)
        return; /* shutting down: the slot stays idle */
    /* Counted before the re-post so that shutdown, which waits for the count
     * to reach zero, cannot destroy the server under duet__slot_post. */
    duet__rpc_server_call_added(srv);
    if (!method) {
        size_t n = GRPC_SLICE_LENGTH(slot->details.method);
        if (n > DUET__RPC_MAX_PATH)
            n = DUET__RPC_MAX_PATH;
        memcpy(path, GRPC_SLICE_START_PTR(slot->details.method), n);
        path[n] = '\0';
        grpc_call_details_destroy(&slot->details);
        grpc_call_details_init(&slot->details);
    }
    slot->gcall = NULL;
    grpc_metadata_array_init(&slot->md);
    /* Re-post before the handler runs.  The call just received holds the
     * server open, so shutdown cannot complete underneath this. */
    duet__slot_post(slot);

    duet_status_t st = duet__rpc_call_create(srv, method, path, gcall, deadline, &md, &call);
    grpc_metadata_array_destroy(&md);
    if (st != DUET_OK) {
        DUET_LOG_ERROR("rpc: dropping call: %s", duet_error_msg());
        return;
    }
    if (srv->cfg.auth) {
        const char *msg = NULL;
        grpc_status_code code = duet__rpc_auth_check(srv->cfg.auth, call, &msg);
        if (code != GRPC_STATUS_OK) {
            duet_rpc_call_fail(call, code, msg);
            return;
        }
    }
    if (!method) {
        DUET_LOG_DEBUG("rpc: unimplemented method %s", path);
        char msg[DUET__RPC_MAX_PATH + 32];
        snprintf(msg, sizeof(msg), "unknown method %s", path);
        duet_rpc_call_fail(call, GRPC_STATUS_UNIMPLEMENTED, msg);
        return;
    }
    if (srv->cfg.check) {
        const char *msg = NULL;
        grpc_status_code code = srv->cfg.check(call, srv->cfg.check_arg, &msg);
        if (code != GRPC_STATUS_OK) {
            duet_rpc_call_fail(call, code, msg ? msg : "rejected");
            return;
        }
    }
    /* Only now is the message read (methods are registered without a
     * payload): a caller that fails the checks above makes this server read
     * at most what HTTP/2 flow control lets it send, not a whole message
     * of up to max_message_bytes.  The handler runs in duet__on_recv. */
    duet__rpc_call_recv(call);
}

static void duet__on_recv(duet_rpc_call_t *call, bool success)
{
    const duet__rpc_method_t *method = call->method;

    if (duet__rpc_call_on_recv(call, success))
        method->handler(call, call->req, call->req_len, method->arg);
}

static void *duet__cq_thread_main(void *p)
{
    duet__cq_worker_t *w = p;
    duet_rpc_server_t *srv = w->srv;
    grpc_completion_queue *cq = srv->cqs[w->index];

    duet_thread_set_name("rpc-srv-%d", w->index);
    duet__rpc_cq_thread_set(srv);
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
        if (ev.type != GRPC_OP_COMPLETE)
            continue;
        duet__rpc_tag_t *tag = ev.tag;
        switch (tag->kind) {
        case DUET__RPC_TAG_REQUEST:
            duet__on_request((duet__request_slot_t *)tag, ev.success != 0);
            break;
        case DUET__RPC_TAG_CALL_CLOSE:
            duet__rpc_call_on_close(
                (duet_rpc_call_t *)((char *)tag - offsetof(duet_rpc_call_t, close_tag)));
            break;
        case DUET__RPC_TAG_CALL_RECV:
            duet__on_recv((duet_rpc_call_t *)((char *)tag - offsetof(duet_rpc_call_t, recv_tag)),
                          ev.success != 0);
            break;
        case DUET__RPC_TAG_CALL_SEND:
            duet__rpc_call_on_send(
                (duet_rpc_call_t *)((char *)tag - offsetof(duet_rpc_call_t, send_tag)),
                ev.success != 0);
            break;
        case DUET__RPC_TAG_SHUTDOWN:
            pthread_mutex_lock(&srv->lock);
            srv->shutdown_notified = true;
            pthread_cond_broadcast(&srv->cond);
            pthread_mutex_unlock(&srv->lock);
            break;
        default:
            DUET_LOG_ERROR("rpc: server got a foreign tag kind %d", (int)tag->kind);
            break;
        }
    }
    duet__rpc_cq_thread_set(NULL);
    return NULL;
}

/* A server that never started still needs shutdown before destroy; nobody
 * polls its queues, so poll here. */
static void duet__server_shutdown_unstarted(duet_rpc_server_t *srv)
{
    grpc_server_shutdown_and_notify(srv->server, srv->cqs[0], &srv->shutdown_tag);
    for (;;) {
        grpc_event ev =
            grpc_completion_queue_next(srv->cqs[0], gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_OP_COMPLETE && ev.tag == &srv->shutdown_tag)
            break;
    }
    /* no call is left to send for (a pending send holds its call) */
    duet__sender_stop(srv);
    grpc_server_destroy(srv->server);
    srv->server = NULL;
}

static void duet__server_free(duet_rpc_server_t *srv)
{
    for (int i = 0; i < srv->cfg.n_threads; i++) {
        if (!srv->cqs[i])
            continue;
        if (srv->n_threads_started == 0) {
            grpc_completion_queue_shutdown(srv->cqs[i]);
            while (grpc_completion_queue_next(srv->cqs[i], gpr_inf_future(GPR_CLOCK_REALTIME), NULL)
                       .type != GRPC_QUEUE_SHUTDOWN)
                ;
        }
        grpc_completion_queue_destroy(srv->cqs[i]);
    }
    for (size_t i = 0; i < srv->n_slots; i++) {
        duet__request_slot_t *slot = &srv->slots[i];
        grpc_metadata_array_destroy(&slot->md);
        grpc_call_details_destroy(&slot->details);
    }
    duet_free(srv->slots);
    for (size_t i = 0; i < srv->n_methods; i++)
        duet_free(srv->methods[i].path);
    duet_free(srv->methods);
    pthread_cond_destroy(&srv->cond);
    pthread_mutex_destroy(&srv->lock);
    pthread_cond_destroy(&srv->kick_cv);
    pthread_mutex_destroy(&srv->kick_lock);
    duet_free(srv->bind_addr);
    duet_free(srv);
    duet__rpc_grpc_release();
}

duet_status_t duet_rpc_server_create(const duet_rpc_server_config_t *cfg, duet_rpc_server_t **srv_p)
{
    duet_rpc_server_t *srv;
    grpc_arg args[10];
    grpc_channel_args chargs;

    if (!cfg->bind_addr || !*cfg->bind_addr)
        return duet_error(DUET_ERR_INVALID, "rpc: server bind address missing");
    if (cfg->n_threads < 1 || cfg->n_threads > DUET__RPC_MAX_THREADS)
        return duet_error(DUET_ERR_INVALID, "rpc: server threads %d not in 1..%d", cfg->n_threads,
                          DUET__RPC_MAX_THREADS);
    if (cfg->max_message_bytes < 1024 || cfg->max_message_bytes > INT_MAX)
        return duet_error(DUET_ERR_INVALID, "rpc: max message %zu not in 1 KiB..2 GiB",
                          cfg->max_message_bytes);
    if (cfg->stream_queue_limit < 1)
        return duet_error(DUET_ERR_INVALID, "rpc: stream queue limit must be at least 1");
    if (cfg->handshake_timeout_ms < 1 || cfg->max_connection_idle_ms < 1 || cfg->max_streams < 1)
        return duet_error(DUET_ERR_INVALID, "rpc: handshake timeout, idle time and streams per "
                                            "connection must be at least 1");

    srv = DUET_NEW(duet_rpc_server_t);
    if (!srv)
        return duet_error(DUET_ERR_NO_MEMORY, "rpc: server");
    srv->shutdown_tag.kind = DUET__RPC_TAG_SHUTDOWN;
    srv->cfg = *cfg;
    srv->bind_addr = duet_strdup(cfg->bind_addr);
    if (!srv->bind_addr) {
        duet_free(srv);
        return duet_error(DUET_ERR_NO_MEMORY, "rpc: server");
    }
    srv->cfg.bind_addr = srv->bind_addr;
    pthread_mutex_init(&srv->lock, NULL);
    duet_cond_init_monotonic(&srv->cond);
    pthread_mutex_init(&srv->kick_lock, NULL);
    pthread_cond_init(&srv->kick_cv, NULL);
    duet__rpc_grpc_acquire();

    args[0] = duet__rpc_int_arg(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, (int)cfg->max_message_bytes);
    args[1] = duet__rpc_int_arg(GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, (int)cfg->max_message_bytes);
    /* Two daemons configured with one port must not silently share it. */
    args[2] = duet__rpc_int_arg(GRPC_ARG_ALLOW_REUSEPORT, 0);
    /* Notice clients that vanished without closing (node loss) so that their
     * streams get cancelled, and accept client keepalives down to 5 s. */
    args[3] = duet__rpc_int_arg(GRPC_ARG_KEEPALIVE_TIME_MS, 60000);
    args[4] = duet__rpc_int_arg(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20000);
    args[5] = duet__rpc_int_arg(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
    args[6] = duet__rpc_int_arg(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
    /* Connections that hold a descriptor and do nothing: one that has not
     * finished its TLS and HTTP/2 handshakes by then (default 120 s), one
     * without a call for max_connection_idle_ms (default: forever).  A
     * client with calls or the health checks of router and decode (every
     * health_interval_ms) never idles that long. */
    args[7] = duet__rpc_int_arg(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, cfg->handshake_timeout_ms);
    args[8] = duet__rpc_int_arg(GRPC_ARG_MAX_CONNECTION_IDLE_MS, cfg->max_connection_idle_ms);
    args[9] = duet__rpc_int_arg(GRPC_ARG_MAX_CONCURRENT_STREAMS, cfg->max_streams);
    chargs.num_args = sizeof(args) / sizeof(args[0]);
    chargs.args = args;
    srv->server = grpc_server_create(&chargs, NULL);
    for (int i = 0; i < cfg->n_threads; i++) {
        srv->cqs[i] = grpc_completion_queue_create_for_next(NULL);
        grpc_server_register_completion_queue(srv->server, srv->cqs[i], NULL);
    }
    grpc_server_credentials *creds = duet__rpc_auth_server_creds(cfg->auth);
    srv->port = grpc_server_add_http2_port(srv->server, srv->bind_addr, creds);
    grpc_server_credentials_release(creds);
    if (srv->port == 0) {
        duet_status_t st = duet_error(
            DUET_ERR_IO, "rpc: cannot listen on %s (in use or bad address)", srv->bind_addr);
        duet__server_shutdown_unstarted(srv);
        duet__server_free(srv);
        return st;
    }
    *srv_p = srv;
    return DUET_OK;
}

duet_status_t duet_rpc_server_add_method(duet_rpc_server_t *srv, const char *path,
                                         duet_rpc_kind_t kind, duet_rpc_handler_cb handler,
                                         void *arg)
{
    if (srv->started)
        return duet_error(DUET_ERR_SHUTDOWN, "rpc: add_method %s after start", path);
    if (!path || path[0] != '/' || !strchr(path + 1, '/') || strlen(path) > DUET__RPC_MAX_PATH)
        return duet_error(DUET_ERR_INVALID, "rpc: bad method path \"%s\"", path ? path : "");
    if (!handler || (kind != DUET_RPC_UNARY && kind != DUET_RPC_SERVER_STREAMING))
        return duet_error(DUET_ERR_INVALID, "rpc: method %s needs a handler and a kind", path);
    for (size_t i = 0; i < srv->n_methods; i++)
        if (strcmp(srv->methods[i].path, path) == 0)
            return duet_error(DUET_ERR_INVALID, "rpc: method %s registered twice", path);

    duet__rpc_method_t *nm =
        duet_realloc(srv->methods, (srv->n_methods + 1) * sizeof(duet__rpc_method_t));
    if (!nm)
        return duet_error(DUET_ERR_NO_MEMORY, "rpc: method %s", path);
    srv->methods = nm;
    duet__rpc_method_t *m = &srv->methods[srv->n_methods];
    memset(m, 0, sizeof(*m));
    m->path = duet_strdup(path);
    if (!m->path)
        return duet_error(DUET_ERR_NO_MEMORY, "rpc: method %s", path);
    m->kind = kind;
    m->handler = handler;
    m->arg = arg;
    /* the message is asked for after the call's checks (duet__on_request) */
    m->handle = grpc_server_register_method(srv->server, m->path, NULL, GRPC_SRM_PAYLOAD_NONE, 0);
    if (!m->handle) {
        duet_free(m->path);
        return duet_error(DUET_ERR_INVALID, "rpc: gRPC refused method %s", path);
    }
    srv->n_methods++;
    return DUET_OK;
}

duet_status_t duet_rpc_server_on_shutdown(duet_rpc_server_t *srv, duet_rpc_shutdown_cb cb,
                                          void *arg)
{
    if (srv->started)
        return duet_error(DUET_ERR_SHUTDOWN, "rpc: shutdown hook after start");
    if (srv->n_hooks == DUET__RPC_MAX_HOOKS)
        return duet_error(DUET_ERR_EXHAUSTED, "rpc: more than %d shutdown hooks",
                          DUET__RPC_MAX_HOOKS);
    srv->hooks[srv->n_hooks].cb = cb;
    srv->hooks[srv->n_hooks].arg = arg;
    srv->n_hooks++;
    return DUET_OK;
}

duet_status_t duet_rpc_server_start(duet_rpc_server_t *srv)
{
    int n = srv->cfg.n_threads;
    size_t per_cq = (srv->n_methods + 1) * DUET__RPC_SLOTS;

    if (srv->started)
        return duet_error(DUET_ERR_INVALID, "rpc: server started twice");
    srv->slots = DUET_NEW_ARRAY(duet__request_slot_t, per_cq * (size_t)n);
    if (!srv->slots)
        return duet_error(DUET_ERR_NO_MEMORY, "rpc: request slots");
    srv->n_slots = per_cq * (size_t)n;
    for (size_t i = 0; i < srv->n_slots; i++) {
        duet__request_slot_t *slot = &srv->slots[i];
        size_t m = (i % per_cq) / DUET__RPC_SLOTS;
        slot->tag.kind = DUET__RPC_TAG_REQUEST;
        slot->srv = srv;
        slot->method = m < srv->n_methods ? &srv->methods[m] : NULL;
        slot->cq = srv->cqs[i / per_cq];
        grpc_metadata_array_init(&slot->md);
        grpc_call_details_init(&slot->details);
    }
    if (srv->cfg.defer_sends) {
        int rc = pthread_create(&srv->sender, NULL, duet__sender_main, srv);
        if (rc != 0)
            return duet_error(DUET_ERR_NO_MEMORY, "rpc: sender thread: %s", strerror(rc));
        srv->sender_started = true;
    }
    grpc_server_start(srv->server);
    srv->started = true;
    for (size_t i = 0; i < srv->n_slots; i++)
        duet__slot_post(&srv->slots[i]);
    for (int i = 0; i < n; i++) {
        srv->workers[i].srv = srv;
        srv->workers[i].index = i;
        int rc = pthread_create(&srv->threads[i], NULL, duet__cq_thread_main, &srv->workers[i]);
        if (rc != 0) {
            /* Threads already running are joined by shutdown. */
            DUET_LOG_ERROR("rpc: pthread_create: %s", strerror(rc));
            return duet_error(DUET_ERR_NO_MEMORY, "rpc: server thread %d: %s", i, strerror(rc));
        }
        srv->n_threads_started++;
    }
    const char *id = duet_rpc_auth_identity(srv->cfg.auth);
    DUET_LOG_INFO("rpc: serving addr %s port %d methods %zu threads %d auth %s%s%s", srv->bind_addr,
                  srv->port, srv->n_methods, n, duet_rpc_auth_mode(srv->cfg.auth),
                  id[0] ? " identity " : "", id);
    return DUET_OK;
}

/* Wait until every call handle is gone (and, with need_notify, the shutdown
 * tag is back), or until deadline_ns; true when done. */
static bool duet__server_wait_drained(duet_rpc_server_t *srv, int64_t deadline_ns, bool need_notify)
{
    pthread_mutex_lock(&srv->lock);
    while (!((srv->shutdown_notified || !need_notify) && srv->active_calls == 0) &&
           duet_now_ns() < deadline_ns) {
        struct timespec ts = duet_deadline_timespec(deadline_ns);
        pthread_cond_timedwait(&srv->cond, &srv->lock, &ts);
    }
    bool done = (srv->shutdown_notified || !need_notify) && srv->active_calls == 0;
    pthread_mutex_unlock(&srv->lock);
    return done;
}

duet_status_t duet_rpc_server_shutdown(duet_rpc_server_t *srv, int64_t grace_ms)
{
    duet_status_t st = DUET_OK;

    if (duet__rpc_on_cq_thread())
        return duet_error(DUET_ERR_INVALID, "rpc: server shutdown from a completion-queue thread");
    pthread_mutex_lock(&srv->lock);
    if (!srv->started || srv->shutting_down) {
        pthread_mutex_unlock(&srv->lock);
        return duet_error(DUET_ERR_INVALID, "rpc: server not running");
    }
    srv->shutting_down = true;
    pthread_mutex_unlock(&srv->lock);

    int64_t t0 = duet_now_ns();
    grpc_server_shutdown_and_notify(srv->server, srv->cqs[0], &srv->shutdown_tag);
    for (int i = 0; i < srv->n_hooks; i++)
        srv->hooks[i].cb(srv, srv->hooks[i].arg);
    /* The grace is for calls.  Open client connections also hold the
     * shutdown tag back (gRPC waits for them to close), so once no call is
     * left, cancelling closes them at once. */
    if (!duet__server_wait_drained(srv, duet_deadline_in_ms(grace_ms < 0 ? 0 : grace_ms), false)) {
        DUET_LOG_INFO("rpc: shutdown grace over port %d calls %zu: cancelling", srv->port,
                      duet_rpc_server_active_calls(srv));
        st = duet_error(DUET_ERR_TIMEOUT, "rpc: calls still running after %lld ms grace",
                        (long long)grace_ms);
    }
    grpc_server_cancel_all_calls(srv->server);
    while (!duet__server_wait_drained(srv, duet_deadline_in_ms(DUET__RPC_SHUTDOWN_WARN_S * 1000),
                                      true))
        DUET_LOG_WARN("rpc: shutdown waiting port %d calls %zu not finished by their owners",
                      srv->port, duet_rpc_server_active_calls(srv));
    /* no call is left to send for (a pending send holds its call) */
    duet__sender_stop(srv);
    grpc_server_destroy(srv->server);
    srv->server = NULL;
    for (int i = 0; i < srv->cfg.n_threads; i++)
        grpc_completion_queue_shutdown(srv->cqs[i]);
    for (int i = 0; i < srv->n_threads_started; i++)
        pthread_join(srv->threads[i], NULL);
    /* Queues whose thread failed to start (see start) drain here. */
    for (int i = srv->n_threads_started; i < srv->cfg.n_threads; i++)
        while (grpc_completion_queue_next(srv->cqs[i], gpr_inf_future(GPR_CLOCK_REALTIME), NULL)
                   .type != GRPC_QUEUE_SHUTDOWN)
            ;
    srv->finished = true;
    DUET_LOG_INFO("rpc: server port %d stopped after %.1f ms", srv->port,
                  (double)(duet_now_ns() - t0) / 1e6);
    return st;
}

void duet_rpc_server_destroy(duet_rpc_server_t *srv)
{
    if (!srv)
        return;
    if (duet__rpc_on_cq_thread()) {
        DUET_LOG_ERROR("rpc: server destroy from a completion-queue thread ignored");
        return;
    }
    if (!srv->started || srv->n_threads_started == 0)
        duet__server_shutdown_unstarted(srv);
    else if (!srv->shutting_down)
        duet_rpc_server_shutdown(srv, srv->cfg.shutdown_grace_ms);
    /* Both paths above leave every queue idle (no thread or joined). */
    if (srv->started && srv->n_threads_started > 0 && !srv->finished) {
        DUET_LOG_ERROR("rpc: server destroy while another thread shuts it down");
        return;
    }
    duet__server_free(srv);
}
