/* grpc.health.v1.Health: Check and Watch over duet_rpc, per the public
 * health-checking spec.  Unknown service: Check answers NOT_FOUND, Watch
 * sends SERVICE_UNKNOWN and keeps the stream open for later changes.
 *
 * Locking: the health lock is taken before a call's lock (writes happen
 * under it).  A watcher is finished by whoever unlinks it from the list — the
 * on_cancel callback, a failed write, or shutdown — and never under the
 * health lock, because a terminal function waits for a running on_cancel,
 * which itself takes the health lock. */
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"
#include "common/rpc_internal.h"
#include "grpc/health/v1/health.pb-c.h"

#define DUET__HEALTH_MAX_SERVICE 256
#define HEALTH_CHECK_PATH        "/grpc.health.v1.Health/Check"
#define HEALTH_WATCH_PATH        "/grpc.health.v1.Health/Watch"

typedef struct duet__health_entry {
    struct duet__health_entry *next;
    char *service;
    duet_rpc_health_status_t status;
} duet__health_entry_t;

typedef struct duet__watcher {
    struct duet__watcher *next;
    duet_rpc_health_t *health;
    duet_rpc_call_t *call;
    char *service;
    duet_rpc_health_status_t last; /* last status written */
} duet__watcher_t;

struct duet_rpc_health {
    pthread_mutex_t lock;
    duet__health_entry_t *entries;
    duet__watcher_t *watchers;
    size_t n_watchers;
    bool shut;
};

static void *duet__pb_alloc(void *data, size_t size)
{
    (void)data;
    return duet_malloc(size);
}

static void duet__pb_free(void *data, void *ptr)
{
    (void)data;
    duet_free(ptr);
}

static ProtobufCAllocator duet__pb_allocator = {duet__pb_alloc, duet__pb_free, NULL};

static size_t duet__pack_status(duet_rpc_health_status_t status, uint8_t *buf)
{
    Grpc__Health__V1__HealthCheckResponse resp = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    resp.status = (Grpc__Health__V1__HealthCheckResponse__ServingStatus)status;
    return grpc__health__v1__health_check_response__pack(&resp, buf);
}

/* The requested service name, or NULL after failing the call. */
static char *duet__parse_request(duet_rpc_call_t *call, const uint8_t *req, size_t len)
{
    Grpc__Health__V1__HealthCheckRequest *msg =
        grpc__health__v1__health_check_request__unpack(&duet__pb_allocator, len, req);
    if (!msg) {
        duet_rpc_call_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "malformed HealthCheckRequest");
        return NULL;
    }
    char *service = NULL;
    if (strlen(msg->service) > DUET__HEALTH_MAX_SERVICE)
        duet_rpc_call_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "service name too long");
    else if (!(service = duet_strdup(msg->service)))
        duet_rpc_call_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    grpc__health__v1__health_check_request__free_unpacked(msg, &duet__pb_allocator);
    return service;
}

static duet__health_entry_t *duet__find_locked(duet_rpc_health_t *h, const char *service)
{
    for (duet__health_entry_t *e = h->entries; e; e = e->next)
        if (strcmp(e->service, service) == 0)
            return e;
    return NULL;
}

static duet_rpc_health_status_t duet__status_locked(duet_rpc_health_t *h, const char *service)
{
    duet__health_entry_t *e = duet__find_locked(h, service);
    return e ? e->status : DUET_RPC_HEALTH_SERVICE_UNKNOWN;
}

static bool duet__unlink_locked(duet_rpc_health_t *h, duet__watcher_t *w)
{
    for (duet__watcher_t **pp = &h->watchers; *pp; pp = &(*pp)->next) {
        if (*pp == w) {
            *pp = w->next;
            h->n_watchers--;
            return true;
        }
    }
    return false;
}

static void duet__watcher_finish(duet__watcher_t *w, grpc_status_code code, const char *msg)
{
    duet_rpc_call_finish(w->call, code, msg);
    duet_free(w->service);
    duet_free(w);
}

/* Under the lock: send `status` to w unless it already has it.  Returns
 * false when w has been unlinked because it does not keep up (the caller
 * finishes it after unlocking). */
static bool duet__notify_locked(duet_rpc_health_t *h, duet__watcher_t *w,
                                duet_rpc_health_status_t status)
{
    uint8_t buf[16];
    if (w->last == status)
        return true;
    duet_status_t st = duet_rpc_call_write(w->call, buf, duet__pack_status(status, buf));
    if (st == DUET_OK) {
        w->last = status;
        return true;
    }
    if (st == DUET_ERR_EXHAUSTED) {
        duet__unlink_locked(h, w);
        return false;
    }
    return true; /* cancelled: on_cancel unlinks it */
}

/* Notify the watchers of `service` (all when NULL); the slow ones are moved
 * to *slow_p. */
static void duet__notify_all_locked(duet_rpc_health_t *h, const char *service,
                                    duet__watcher_t **slow_p)
{
    duet__watcher_t *w = h->watchers;
    while (w) {
        duet__watcher_t *next = w->next;
        if (!service || strcmp(service, w->service) == 0) {
            if (!duet__notify_locked(h, w, duet__status_locked(h, w->service))) {
                w->next = *slow_p;
                *slow_p = w;
            }
        }
        w = next;
    }
}

static void duet__finish_slow(duet__watcher_t *slow)
{
    while (slow) {
        duet__watcher_t *next = slow->next;
        duet__watcher_finish(slow, GRPC_STATUS_RESOURCE_EXHAUSTED, "health watcher not reading");
        slow = next;
    }
}

static void duet__health_check(duet_rpc_call_t *call, const uint8_t *req, size_t len, void *arg)
{
    duet_rpc_health_t *h = arg;
    uint8_t buf[16];
    char *service = duet__parse_request(call, req, len);
    if (!service)
        return;
    pthread_mutex_lock(&h->lock);
    duet_rpc_health_status_t status = duet__status_locked(h, service);
    pthread_mutex_unlock(&h->lock);
    if (status == DUET_RPC_HEALTH_SERVICE_UNKNOWN)
        duet_rpc_call_fail(call, GRPC_STATUS_NOT_FOUND, "unknown service");
    else
        duet_rpc_call_reply(call, buf, duet__pack_status(status, buf));
    duet_free(service);
}

static void duet__watch_cancelled(duet_rpc_call_t *call, void *arg)
{
    duet__watcher_t *w = arg;
    duet_rpc_health_t *h = w->health;

    pthread_mutex_lock(&h->lock);
    bool mine = duet__unlink_locked(h, w);
    pthread_mutex_unlock(&h->lock);
    if (mine)
        duet__watcher_finish(w, GRPC_STATUS_CANCELLED, "cancelled");
}

static void duet__health_watch(duet_rpc_call_t *call, const uint8_t *req, size_t len, void *arg)
{
    duet_rpc_health_t *h = arg;
    char *service = duet__parse_request(call, req, len);
    if (!service)
        return;
    duet__watcher_t *w = DUET_NEW(duet__watcher_t);
    if (!w) {
        duet_free(service);
        duet_rpc_call_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    w->health = h;
    w->call = call;
    w->service = service;
    w->last = (duet_rpc_health_status_t)-1;

    pthread_mutex_lock(&h->lock);
    duet_rpc_health_status_t status = duet__status_locked(h, service);
    if (h->shut) {
        duet__notify_locked(h, w, status);
        pthread_mutex_unlock(&h->lock);
        duet__watcher_finish(w, GRPC_STATUS_UNAVAILABLE, "server shutting down");
        return;
    }
    if (duet_rpc_call_on_cancel(call, duet__watch_cancelled, w) != DUET_OK) {
        pthread_mutex_unlock(&h->lock);
        duet__watcher_finish(w, GRPC_STATUS_CANCELLED, "cancelled");
        return;
    }
    w->next = h->watchers;
    h->watchers = w;
    h->n_watchers++;
    duet__watcher_t *slow = NULL;
    if (!duet__notify_locked(h, w, status))
        slow = w;
    pthread_mutex_unlock(&h->lock);
    duet__finish_slow(slow);
}

static void duet__health_on_server_shutdown(duet_rpc_server_t *srv, void *arg)
{
    (void)srv;
    duet_rpc_health_shutdown(arg);
}

duet_status_t duet_rpc_health_create(duet_rpc_server_t *srv, duet_rpc_health_status_t overall,
                                     duet_rpc_health_t **health_p)
{
    duet_status_t st;
    duet_rpc_health_t *h = DUET_NEW(duet_rpc_health_t);

    if (!h)
        return duet_error(DUET_ERR_NO_MEMORY, "rpc: health service");
    pthread_mutex_init(&h->lock, NULL);
    st = duet_rpc_health_set(h, "", overall);
    if (st != DUET_OK)
        goto err_free;
    st = duet_rpc_server_add_method(srv, HEALTH_CHECK_PATH, DUET_RPC_UNARY, duet__health_check, h);
    if (st != DUET_OK)
        goto err_free;
    st = duet_rpc_server_add_method(srv, HEALTH_WATCH_PATH, DUET_RPC_SERVER_STREAMING,
                                    duet__health_watch, h);
    if (st != DUET_OK)
        goto err_free;
    st = duet_rpc_server_on_shutdown(srv, duet__health_on_server_shutdown, h);
    if (st != DUET_OK)
        goto err_free;
    *health_p = h;
    return DUET_OK;

err_free:
    /* Methods already registered cannot be removed: the server must not be
     * started after this failure (its creator destroys it). */
    duet_rpc_health_destroy(h);
    return st;
}

duet_status_t duet_rpc_health_set(duet_rpc_health_t *h, const char *service,
                                  duet_rpc_health_status_t status)
{
    duet__watcher_t *slow = NULL;

    if (strlen(service) > DUET__HEALTH_MAX_SERVICE)
        return duet_error(DUET_ERR_INVALID, "rpc: health service name longer than %d",
                          DUET__HEALTH_MAX_SERVICE);
    if (status != DUET_RPC_HEALTH_SERVING && status != DUET_RPC_HEALTH_NOT_SERVING &&
        status != DUET_RPC_HEALTH_UNKNOWN)
        return duet_error(DUET_ERR_INVALID, "rpc: health status %d cannot be set", (int)status);
    pthread_mutex_lock(&h->lock);
    if (h->shut) {
        pthread_mutex_unlock(&h->lock);
        return duet_error(DUET_ERR_SHUTDOWN, "rpc: health service shut down");
    }
    duet__health_entry_t *e = duet__find_locked(h, service);
    if (!e) {
        e = DUET_NEW(duet__health_entry_t);
        if (e)
            e->service = duet_strdup(service);
        if (!e || !e->service) {
            duet_free(e);
            pthread_mutex_unlock(&h->lock);
            return duet_error(DUET_ERR_NO_MEMORY, "rpc: health service %s", service);
        }
        e->next = h->entries;
        h->entries = e;
    }
    e->status = status;
    duet__notify_all_locked(h, service, &slow); /* each watcher skips what it has */
    pthread_mutex_unlock(&h->lock);
    duet__finish_slow(slow);
    return DUET_OK;
}

duet_status_t duet_rpc_health_clear(duet_rpc_health_t *h, const char *service)
{
    duet__watcher_t *slow = NULL;

    pthread_mutex_lock(&h->lock);
    if (h->shut) {
        pthread_mutex_unlock(&h->lock);
        return duet_error(DUET_ERR_SHUTDOWN, "rpc: health service shut down");
    }
    for (duet__health_entry_t **pp = &h->entries; *pp; pp = &(*pp)->next) {
        duet__health_entry_t *e = *pp;
        if (strcmp(e->service, service) == 0) {
            *pp = e->next;
            duet_free(e->service);
            duet_free(e);
            break;
        }
    }
    duet__notify_all_locked(h, service, &slow);
    pthread_mutex_unlock(&h->lock);
    duet__finish_slow(slow);
    return DUET_OK;
}

duet_rpc_health_status_t duet_rpc_health_get(duet_rpc_health_t *h, const char *service)
{
    pthread_mutex_lock(&h->lock);
    duet_rpc_health_status_t status = duet__status_locked(h, service);
    pthread_mutex_unlock(&h->lock);
    return status;
}

size_t duet_rpc_health_watchers(duet_rpc_health_t *h)
{
    pthread_mutex_lock(&h->lock);
    size_t n = h->n_watchers;
    pthread_mutex_unlock(&h->lock);
    return n;
}

void duet_rpc_health_shutdown(duet_rpc_health_t *h)
{
    duet__watcher_t *slow = NULL, *all;

    pthread_mutex_lock(&h->lock);
    if (h->shut) {
        pthread_mutex_unlock(&h->lock);
        return;
    }
    h->shut = true;
    for (duet__health_entry_t *e = h->entries; e; e = e->next)
        e->status = DUET_RPC_HEALTH_NOT_SERVING;
    duet__notify_all_locked(h, NULL, &slow);
    all = h->watchers;
    h->watchers = NULL;
    h->n_watchers = 0;
    pthread_mutex_unlock(&h->lock);
    duet__finish_slow(slow);
    /* NOT_SERVING is queued ahead of the status, so watchers see the drain. */
    while (all) {
        duet__watcher_t *next = all->next;
        duet__watcher_finish(all, GRPC_STATUS_UNAVAILABLE, "server shutting down");
        all = next;
    }
}

void duet_rpc_health_destroy(duet_rpc_health_t *h)
{
    if (!h)
        return;
    if (h->watchers)
        DUET_LOG_ERROR("rpc: health destroyed with %zu watchers (server still running?)",
                       h->n_watchers);
    while (h->entries) {
        duet__health_entry_t *next = h->entries->next;
        duet_free(h->entries->service);
        duet_free(h->entries);
        h->entries = next;
    }
    pthread_mutex_destroy(&h->lock);
    duet_free(h);
}
