#include "router/workers.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/sync.h"
#include "duet/v1/common.pb-c.h"
#include "grpc/health/v1/health.pb-c.h"

typedef struct {
    duet_router_workers_t *owner;
    duet_role_t role;
    int index;
    char *name;
    char *address;
    uint32_t tp_config;
    pthread_t thread;
    bool started;

    atomic_bool healthy;
    _Atomic int64_t inflight;

    pthread_mutex_t lock; /* the fields below */
    bool poke;
    bool have_info;
    uint32_t tp, free_pages, total_pages, queue_depth, running, max_context;
    bool draining;
    uint64_t checks, failures;
    int64_t last_ok_ns;
    char instance_id[64];
    char last_error[160];
} duet__worker_t;

struct duet_router_workers {
    duet_rpc_client_t *cli;
    duet_router_policy_t policy;
    int64_t interval_ns;
    duet_router_workers_change_cb on_change;
    void *change_arg;
    duet__worker_t *list[2]; /* by role */
    size_t n[2];

    pthread_mutex_t lock; /* stop flag, cond, pick state */
    pthread_cond_t cond;
    bool stop;
    uint64_t cursor[2];
    uint64_t rnd;
};

static duet_status_t duet__workers_fill(duet_router_workers_t *w, duet_role_t role,
                                        const duet_instance_config_t *inst, int n)
{
    const char *what = duet_role_name(role);

    if (n == 0)
        return duet_error(DUET_ERR_CONFIG, "%s: the router needs at least one %s instance", what,
                          what);
    w->list[role] = DUET_NEW_ARRAY(duet__worker_t, (size_t)n);
    if (w->list[role] == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "router: no memory for workers");
    w->n[role] = (size_t)n;
    for (int i = 0; i < n; i++) {
        duet__worker_t *wk = &w->list[role][i];
        if (inst[i].address == NULL || inst[i].address[0] == '\0')
            return duet_error(DUET_ERR_CONFIG,
                              "%s[%d].address: required by the router (discover is not "
                              "supported)",
                              what, i);
        wk->owner = w;
        wk->role = role;
        wk->index = i;
        wk->tp_config = (uint32_t)inst[i].tp;
        wk->tp = wk->tp_config;
        wk->name = duet_strdup(inst[i].name);
        wk->address = duet_strdup(inst[i].address);
        pthread_mutex_init(&wk->lock, NULL);
        atomic_init(&wk->healthy, false);
        atomic_init(&wk->inflight, 0);
        snprintf(wk->last_error, sizeof(wk->last_error), "not checked yet");
        if (wk->name == NULL || wk->address == NULL)
            return duet_error(DUET_ERR_NO_MEMORY, "router: no memory for workers");
    }
    return DUET_OK;
}

duet_status_t duet_router_workers_create(const duet_cluster_config_t *cfg,
                                         duet_router_policy_t policy, int interval_ms,
                                         duet_rpc_client_t *cli,
                                         duet_router_workers_change_cb on_change, void *arg,
                                         duet_router_workers_t **w_p)
{
    duet_router_workers_t *w = DUET_NEW(duet_router_workers_t);
    duet_status_t st;

    if (w == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "router: no memory for workers");
    w->cli = cli;
    w->policy = policy;
    w->interval_ns = (int64_t)interval_ms * DUET_NS_PER_MS;
    w->on_change = on_change;
    w->change_arg = arg;
    w->rnd = (uint64_t)duet_now_ns() ^ (uint64_t)(uintptr_t)w;
    pthread_mutex_init(&w->lock, NULL);
    duet_cond_init_monotonic(&w->cond);
    if ((st = duet__workers_fill(w, DUET_ROLE_PREFILL, cfg->prefill, cfg->n_prefill)) != DUET_OK ||
        (st = duet__workers_fill(w, DUET_ROLE_DECODE, cfg->decode, cfg->n_decode)) != DUET_OK) {
        duet_router_workers_destroy(w);
        return st;
    }
    *w_p = w;
    return DUET_OK;
}

/* One Health/Check and, when serving, one Info.  Returns whether the worker
 * is usable, with the reason in err when not. */
static bool duet__worker_probe(duet__worker_t *wk, char *err, size_t err_len)
{
    duet_router_workers_t *w = wk->owner;
    Grpc__Health__V1__HealthCheckRequest hreq = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    uint8_t buf[64];
    size_t len = grpc__health__v1__health_check_request__pack(&hreq, buf);
    int64_t timeout_ms = w->interval_ns / DUET_NS_PER_MS;
    duet_rpc_result_t res;
    bool ok = false;

    if (timeout_ms < 500)
        timeout_ms = 500;
    if (timeout_ms > 2000)
        timeout_ms = 2000;
    duet_rpc_client_unary(w->cli, wk->address, "/grpc.health.v1.Health/Check", buf, len,
                          duet_deadline_in_ms(timeout_ms), &res);
    if (res.code != GRPC_STATUS_OK) {
        snprintf(err, err_len, "health check: %s %s", duet_rpc_code_name(res.code),
                 res.message ? res.message : "");
        duet_rpc_result_cleanup(&res);
        return false;
    }
    Grpc__Health__V1__HealthCheckResponse *hr =
        grpc__health__v1__health_check_response__unpack(NULL, res.len, res.data);
    duet_rpc_result_cleanup(&res);
    if (hr == NULL) {
        snprintf(err, err_len, "health check: malformed reply");
        return false;
    }
    ok = hr->status == GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
    if (!ok)
        snprintf(err, err_len, "health check: status %d (not SERVING)", (int)hr->status);
    grpc__health__v1__health_check_response__free_unpacked(hr, NULL);
    if (!ok)
        return false;

    duet_rpc_client_unary(w->cli, wk->address,
                          wk->role == DUET_ROLE_PREFILL ? "/duet.v1.Prefill/Info"
                                                        : "/duet.v1.Decode/Info",
                          NULL, 0, duet_deadline_in_ms(timeout_ms), &res);
    Duet__V1__InfoResponse *info = res.code == GRPC_STATUS_OK
                                       ? duet__v1__info_response__unpack(NULL, res.len, res.data)
                                       : NULL;
    pthread_mutex_lock(&wk->lock);
    if (info != NULL) {
        wk->have_info = true;
        wk->tp = info->tp ? info->tp : wk->tp_config;
        wk->free_pages = info->free_pages;
        wk->total_pages = info->total_pages;
        wk->queue_depth = info->queue_depth;
        wk->running = info->running;
        wk->max_context = info->max_context;
        wk->draining = info->draining;
        snprintf(wk->instance_id, sizeof(wk->instance_id), "%s", info->instance_id);
    } else {
        wk->have_info = false;
    }
    bool draining = wk->draining && info != NULL;
    pthread_mutex_unlock(&wk->lock);
    if (info == NULL)
        DUET_LOG_DEBUG("worker %s info: %s %s", wk->name, duet_rpc_code_name(res.code),
                       res.message ? res.message : "");
    else
        duet__v1__info_response__free_unpacked(info, NULL);
    duet_rpc_result_cleanup(&res);
    if (draining) {
        snprintf(err, err_len, "draining");
        return false;
    }
    return true;
}

static void *duet__worker_main(void *p)
{
    duet__worker_t *wk = p;
    duet_router_workers_t *w = wk->owner;
    char err[160];

    duet_thread_set_name("rt-chk-%c%d", wk->role == DUET_ROLE_PREFILL ? 'p' : 'd', wk->index);
    pthread_mutex_lock(&w->lock);
    while (!w->stop) {
        pthread_mutex_unlock(&w->lock);
        int64_t t0 = duet_now_ns();
        err[0] = '\0';
        bool ok = duet__worker_probe(wk, err, sizeof(err));
        bool was = atomic_exchange(&wk->healthy, ok);
        pthread_mutex_lock(&wk->lock);
        wk->checks++;
        if (ok) {
            wk->last_ok_ns = duet_now_ns();
            wk->last_error[0] = '\0';
        } else {
            wk->failures++;
            snprintf(wk->last_error, sizeof(wk->last_error), "%s", err);
        }
        pthread_mutex_unlock(&wk->lock);
        if (ok != was) {
            if (ok)
                DUET_LOG_INFO("worker %s %s (%s) is healthy", duet_role_name(wk->role), wk->name,
                              wk->address);
            else
                DUET_LOG_WARN("worker %s %s (%s) left rotation: %s", duet_role_name(wk->role),
                              wk->name, wk->address, err);
            if (w->on_change)
                w->on_change(w->change_arg);
        }
        int64_t deadline = t0 + w->interval_ns;
        struct timespec ts = duet_deadline_timespec(deadline);
        pthread_mutex_lock(&w->lock);
        for (;;) {
            pthread_mutex_lock(&wk->lock);
            bool poked = wk->poke;
            wk->poke = false;
            pthread_mutex_unlock(&wk->lock);
            if (w->stop || poked || duet_now_ns() >= deadline)
                break;
            pthread_cond_timedwait(&w->cond, &w->lock, &ts);
        }
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

duet_status_t duet_router_workers_start(duet_router_workers_t *w)
{
    for (int r = 0; r < 2; r++) {
        for (size_t i = 0; i < w->n[r]; i++) {
            duet__worker_t *wk = &w->list[r][i];
            int rc = pthread_create(&wk->thread, NULL, duet__worker_main, wk);
            if (rc != 0)
                return duet_error(DUET_ERR_INTERNAL, "router: pthread_create: %s", strerror(rc));
            wk->started = true;
        }
    }
    return DUET_OK;
}

void duet_router_workers_stop(duet_router_workers_t *w)
{
    if (w == NULL)
        return;
    pthread_mutex_lock(&w->lock);
    w->stop = true;
    pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->lock);
    for (int r = 0; r < 2; r++) {
        for (size_t i = 0; w->list[r] && i < w->n[r]; i++) {
            duet__worker_t *wk = &w->list[r][i];
            if (wk->started)
                pthread_join(wk->thread, NULL);
            wk->started = false;
        }
    }
}

void duet_router_workers_destroy(duet_router_workers_t *w)
{
    if (w == NULL)
        return;
    duet_router_workers_stop(w);
    for (int r = 0; r < 2; r++) {
        for (size_t i = 0; w->list[r] && i < w->n[r]; i++) {
            duet__worker_t *wk = &w->list[r][i];
            if (wk->owner)
                pthread_mutex_destroy(&wk->lock);
            duet_free(wk->name);
            duet_free(wk->address);
        }
        duet_free(w->list[r]);
    }
    pthread_cond_destroy(&w->cond);
    pthread_mutex_destroy(&w->lock);
    duet_free(w);
}

size_t duet_router_workers_count(const duet_router_workers_t *w, duet_role_t role)
{
    return w->n[role];
}

size_t duet_router_workers_healthy(duet_router_workers_t *w, duet_role_t role)
{
    size_t n = 0;
    for (size_t i = 0; i < w->n[role]; i++)
        n += atomic_load(&w->list[role][i].healthy);
    return n;
}

bool duet_router_workers_ready(duet_router_workers_t *w)
{
    return duet_router_workers_healthy(w, DUET_ROLE_PREFILL) > 0 &&
           duet_router_workers_healthy(w, DUET_ROLE_DECODE) > 0;
}

static double duet__worker_load(duet__worker_t *wk)
{
    int64_t inflight = atomic_load(&wk->inflight);
    pthread_mutex_lock(&wk->lock);
    double load = wk->have_info ? duet_router_load_score(wk->queue_depth, wk->running,
                                                         wk->free_pages, wk->total_pages, inflight)
                                : duet_router_load_score(0, 0, 0, 0, inflight);
    pthread_mutex_unlock(&wk->lock);
    return load;
}

int duet_router_workers_pick(duet_router_workers_t *w, duet_role_t role, int avoid)
{
    size_t n = w->n[role], eligible = 0;
    duet_router_cand_t stack[64], *c = n <= 64 ? stack : duet_malloc(n * sizeof(*c));
    int idx;

    if (c == NULL)
        return -1;
    for (size_t i = 0; i < n; i++) {
        c[i].eligible = atomic_load(&w->list[role][i].healthy);
        c[i].load = w->policy == DUET_ROUTER_POLICY_ROUND_ROBIN
                        ? 0.0
                        : duet__worker_load(&w->list[role][i]);
        eligible += c[i].eligible;
    }
    if (avoid >= 0 && (size_t)avoid < n && c[avoid].eligible && eligible > 1)
        c[avoid].eligible = false;
    pthread_mutex_lock(&w->lock);
    idx = duet_router_policy_pick(w->policy, c, n, &w->cursor[role], &w->rnd);
    pthread_mutex_unlock(&w->lock);
    if (idx >= 0)
        atomic_fetch_add(&w->list[role][idx].inflight, 1);
    if (c != stack)
        duet_free(c);
    return idx;
}

void duet_router_workers_release(duet_router_workers_t *w, duet_role_t role, int idx)
{
    if (idx >= 0 && (size_t)idx < w->n[role])
        atomic_fetch_sub(&w->list[role][idx].inflight, 1);
}

const char *duet_router_workers_address(const duet_router_workers_t *w, duet_role_t role, int idx)
{
    return w->list[role][idx].address;
}

const char *duet_router_workers_name(const duet_router_workers_t *w, duet_role_t role, int idx)
{
    return w->list[role][idx].name;
}

void duet_router_workers_suspect(duet_router_workers_t *w, duet_role_t role, int idx)
{
    duet__worker_t *wk;
    if (idx < 0 || (size_t)idx >= w->n[role])
        return;
    wk = &w->list[role][idx];
    pthread_mutex_lock(&wk->lock);
    wk->poke = true;
    pthread_mutex_unlock(&wk->lock);
    pthread_mutex_lock(&w->lock);
    pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->lock);
}

void duet_router_workers_snapshot(duet_router_workers_t *w, duet_role_t role, int idx,
                                  duet_router_worker_info_t *info)
{
    duet__worker_t *wk = &w->list[role][idx];

    memset(info, 0, sizeof(*info));
    info->role = role;
    info->name = wk->name;
    info->address = wk->address;
    info->healthy = atomic_load(&wk->healthy);
    info->inflight = atomic_load(&wk->inflight);
    info->load = duet__worker_load(wk);
    pthread_mutex_lock(&wk->lock);
    info->have_info = wk->have_info;
    info->tp = wk->tp;
    info->free_pages = wk->free_pages;
    info->total_pages = wk->total_pages;
    info->queue_depth = wk->queue_depth;
    info->running = wk->running;
    info->max_context = wk->max_context;
    info->draining = wk->draining;
    info->checks = wk->checks;
    info->failures = wk->failures;
    info->last_ok_ms_ago = wk->last_ok_ns ? (duet_now_ns() - wk->last_ok_ns) / DUET_NS_PER_MS : -1;
    snprintf(info->instance_id, sizeof(info->instance_id), "%s", wk->instance_id);
    snprintf(info->last_error, sizeof(info->last_error), "%s", wk->last_error);
    pthread_mutex_unlock(&wk->lock);
}
