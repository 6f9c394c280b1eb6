/* Worker table, health checkers, lifecycle and queries (see workers.h;
 * the slot and locking model is in workers_internal.h, the discovery
 * thread in workers_disc.c). */
#include "router/fleet/workers.h"

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
#include "router/fleet/workers_internal.h"

/* The slot behind an index handed out by pick, or NULL. */
static duet__worker_t *duet__slot_checked(const duet_router_workers_t *w, duet_role_t role, int idx)
{
    if (idx < 0 || idx >= DUET__CHUNK * DUET__MAX_CHUNKS ||
        w->chunks[role][idx / DUET__CHUNK] == NULL)
        return NULL;
    return duet__slot(w, role, (size_t)idx);
}

/* ---- config ---- */

duet_status_t duet_router_workers_validate(const duet_cluster_config_t *cfg)
{
    for (int r = 0; r < 2; r++) {
        const duet_instance_config_t *list = r ? cfg->decode : cfg->prefill;
        int n = r ? cfg->n_decode : cfg->n_prefill;
        const char *what = duet_role_name((duet_role_t)r);

        if (n == 0 && !(r == DUET_ROLE_PREFILL && duet__workers_any_colocated(cfg)))
            return duet_error(DUET_ERR_CONFIG,
                              r == DUET_ROLE_PREFILL
                                  ? "%s: the router needs at least one %s instance (or decode "
                                    "instances with prefill_local)"
                                  : "%s: the router needs at least one %s instance",
                              what, what);
        for (int i = 0; i < n; i++) {
            bool addr = list[i].address && list[i].address[0];
            bool disc = list[i].discover && list[i].discover[0];
            duet_router_disc_spec_t spec;
            if (addr && disc)
                return duet_error(DUET_ERR_CONFIG,
                                  "%s[%d]: give address or discover, not both (discover makes "
                                  "the entry a group of instances found through DNS)",
                                  what, i);
            if (!addr && !disc)
                return duet_error(DUET_ERR_CONFIG, "%s[%d]: needs address or discover", what, i);
            if (disc && duet_router_disc_parse(list[i].discover, &spec) != DUET_OK)
                return duet_error_wrap(DUET_ERR_CONFIG, "%s[%d].discover: ", what, i);
        }
    }
    /* discovered workers are "<group>/<ip>": no static name may look like one */
    for (int r = 0; r < 2; r++) {
        const duet_instance_config_t *list = r ? cfg->decode : cfg->prefill;
        for (int i = 0; i < (r ? cfg->n_decode : cfg->n_prefill); i++) {
            const char *slash = strchr(list[i].name, '/');
            if (slash == NULL || (list[i].discover && list[i].discover[0]))
                continue;
            for (int r2 = 0; r2 < 2; r2++) {
                const duet_instance_config_t *l2 = r2 ? cfg->decode : cfg->prefill;
                for (int k = 0; k < (r2 ? cfg->n_decode : cfg->n_prefill); k++) {
                    size_t len = strlen(l2[k].name);
                    if (l2[k].discover && l2[k].discover[0] &&
                        len == (size_t)(slash - list[i].name) &&
                        strncmp(l2[k].name, list[i].name, len) == 0)
                        return duet_error(DUET_ERR_CONFIG,
                                          "%s[%d].name: '%s' could be the name of a worker of "
                                          "discover group '%s' (\"<group>/<ip>\")",
                                          duet_role_name((duet_role_t)r), i, list[i].name,
                                          l2[k].name);
                }
            }
        }
    }
    return DUET_OK;
}

/* ---- slots ---- */

duet__worker_t *duet__workers_slot_alloc(duet_router_workers_t *w, duet_role_t role)
{
    size_t n = atomic_load(&w->n_slots[role]);
    duet__worker_t **chunk;

    for (size_t i = 0; i < n; i++) {
        duet__worker_t *wk = duet__slot(w, role, i);
        if (wk->state == DUET__FREE && !wk->started)
            return wk;
    }
    if (n == (size_t)DUET__CHUNK * DUET__MAX_CHUNKS)
        return NULL;
    chunk = &w->chunks[role][n / DUET__CHUNK];
    if (*chunk == NULL) {
        duet__worker_t *c = DUET_NEW_ARRAY(duet__worker_t, DUET__CHUNK);
        if (c == NULL)
            return NULL;
        for (int k = 0; k < DUET__CHUNK; k++) {
            c[k].owner = w;
            c[k].role = role;
            c[k].index = (int)(n / DUET__CHUNK) * DUET__CHUNK + k;
            pthread_mutex_init(&c[k].lock, NULL);
            atomic_init(&c[k].healthy, false);
            atomic_init(&c[k].inflight, 0);
            atomic_init(&c[k].instance, 0);
            atomic_init(&c[k].exited, false);
            atomic_init(&c[k].state, DUET__FREE);
        }
        *chunk = c;
    }
    /* the chunk pointer is written before readers may see n + 1 */
    atomic_store(&w->n_slots[role], n + 1);
    return duet__slot(w, role, n);
}

duet_status_t duet__workers_slot_fill(duet__worker_t *wk, duet__group_t *g, const char *name,
                                      const char *address, uint32_t tp, duet_prefill_local_t local)
{
    char *n = duet_strdup(name), *a = duet_strdup(address);

    if (n == NULL || a == NULL) {
        duet_free(n);
        duet_free(a);
        return duet_error(DUET_ERR_NO_MEMORY, "router: no memory for a worker");
    }
    pthread_mutex_lock(&wk->lock);
    duet_free(wk->name);
    duet_free(wk->address);
    wk->name = n;
    wk->address = a;
    wk->group = g;
    wk->tp_config = wk->tp = tp;
    wk->local_config = wk->local = local;
    wk->prefills_local = wk->prefills_remote = 0;
    wk->steps = wk->forward_ns = wk->cycles = wk->cycle_ns = 0;
    wk->poke = wk->have_info = wk->draining = false;
    wk->free_pages = wk->total_pages = wk->queue_depth = wk->running = wk->max_context = 0;
    wk->queue_tokens = 0;
    wk->tokens_per_s = 0;
    wk->prompt_mean = 0;
    atomic_store(&wk->routed, 0);
    wk->checks = wk->failures = 0;
    wk->last_ok_ns = 0;
    wk->instance_id[0] = '\0';
    snprintf(wk->last_error, sizeof(wk->last_error), "not checked yet");
    atomic_store(&wk->healthy, false);
    atomic_store(&wk->exited, false);
    atomic_fetch_add(&wk->instance, 1);
    wk->state = DUET__ACTIVE;
    pthread_mutex_unlock(&wk->lock);
    return DUET_OK;
}

bool duet__workers_leave_locked(duet_router_workers_t *w, duet__worker_t *wk, const char *why)
{
    bool was;

    pthread_mutex_lock(&wk->lock);
    was = atomic_exchange(&wk->healthy, false);
    wk->state = DUET__LEAVING;
    snprintf(wk->last_error, sizeof(wk->last_error), "leaving: %.150s", why);
    pthread_mutex_unlock(&wk->lock);
    pthread_cond_broadcast(&w->cond); /* its checker ends */
    DUET_LOG_INFO("worker %s %s (%s) leaves rotation: %s; %lld requests in flight",
                  duet_role_name(wk->role), wk->name, wk->address, why,
                  (long long)atomic_load(&wk->inflight));
    duet__count(w->cfg.metrics ? &w->cfg.metrics->workers_left : NULL);
    return was;
}

/* ---- health checks ---- */

/* One Health/Check and, when serving, one Info.  Returns whether the worker
 * is usable, with the reason in err when not. */
static bool duet__worker_probe(duet__worker_t *wk, char *err, size_t err_len)
{
    duet_router_workers_t *w = wk->owner;
    Grpc__Health__V1__HealthCheckRequest hreq = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    uint8_t buf[64];
    size_t len = grpc__health__v1__health_check_request__pack(&hreq, buf);
    int64_t timeout_ms = w->interval_ns / DUET_NS_PER_MS;
    const char *role = duet_role_name(wk->role);
    duet_router_disc_id_t id = DUET_ROUTER_DISC_ID_SAME;
    char old_id[64] = "";
    duet_rpc_result_t res;
    bool ok = false;

    if (timeout_ms < 500)
        timeout_ms = 500;
    if (timeout_ms > 2000)
        timeout_ms = 2000;
    duet_rpc_client_unary(w->cfg.cli, wk->address, "/grpc.health.v1.Health/Check", buf, len,
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
    if (!ok) {
        /* a started daemon says NOT_SERVING once it drains (or stops after
         * an engine failure): its streams move (router/job/job_handoff.c) */
        pthread_mutex_lock(&wk->lock);
        wk->draining = true;
        pthread_mutex_unlock(&wk->lock);
        return false;
    }

    duet_rpc_client_unary(w->cfg.cli, wk->address,
                          wk->role == DUET_ROLE_PREFILL ? "/duet.v1.Prefill/Info"
                                                        : "/duet.v1.Decode/Info",
                          NULL, 0, duet_deadline_in_ms(timeout_ms), &res);
    Duet__V1__InfoResponse *info = res.code == GRPC_STATUS_OK
                                       ? duet__v1__info_response__unpack(NULL, res.len, res.data)
                                       : NULL;
    /* a discovered address may by now belong to something else */
    bool foreign = info != NULL && info->role != NULL && info->role[0] != '\0' &&
                   strcmp(info->role, role) != 0;
    pthread_mutex_lock(&wk->lock);
    if (info != NULL && !foreign) {
        id = duet_router_disc_identity(wk->instance_id, info->instance_id);
        snprintf(old_id, sizeof(old_id), "%s", wk->instance_id);
        if (id == DUET_ROUTER_DISC_ID_RESTARTED) { /* a new instance: its own counts */
            wk->checks = wk->failures = 0;
            wk->last_ok_ns = 0;
            atomic_fetch_add(&wk->instance, 1); /* and an empty cache */
        }
        wk->have_info = true;
        wk->tp = info->tp ? info->tp : wk->tp_config;
        wk->free_pages = info->free_pages;
        wk->total_pages = info->total_pages;
        wk->queue_depth = info->queue_depth;
        wk->running = info->running;
        wk->max_context = info->max_context;
        wk->draining = info->draining;
        wk->queue_tokens = info->queue_tokens;
        wk->tokens_per_s = info->prefill_tokens_per_s;
        wk->prompt_mean = info->prompt_tokens_mean;
        atomic_store(&wk->routed, 0); /* counted in queue_tokens from now */
        duet__workers_info_local(wk, info);
        duet__workers_info_cache(wk, info);
        snprintf(wk->instance_id, sizeof(wk->instance_id), "%s", info->instance_id);
    } else {
        wk->have_info = false;
    }
    bool draining = wk->draining && wk->have_info;
    pthread_mutex_unlock(&wk->lock);

    ok = true;
    if (foreign) {
        snprintf(err, err_len, "info: the daemon there is a %.16s, not a %s", info->role, role);
        ok = false;
    } else if (info == NULL) {
        DUET_LOG_DEBUG("worker %s info: %s %s", wk->name, duet_rpc_code_name(res.code),
                       res.message ? res.message : "");
        if (wk->group != NULL) {
            snprintf(err, err_len, "info: %s %s", duet_rpc_code_name(res.code),
                     res.message ? res.message : "malformed reply");
            ok = false;
        }
    } else {
        /* a new instance at the same address, checked by this very probe;
         * requests still on the old one fail (and are retried before their
         * first token) */
        if (id == DUET_ROUTER_DISC_ID_RESTARTED)
            DUET_LOG_INFO("worker %s %s (%s) restarted: instance_id %s, was %s; a new instance",
                          role, wk->name, wk->address, info->instance_id, old_id);
        if (draining) {
            snprintf(err, err_len, "draining");
            ok = false;
        }
    }
    if (info != NULL)
        duet__v1__info_response__free_unpacked(info, NULL);
    duet_rpc_result_cleanup(&res);
    return ok;
}

static void *duet__worker_main(void *p)
{
    duet__worker_t *wk = p;
    duet_router_workers_t *w = wk->owner;
    char err[160];

    duet_thread_set_name("rt-chk-%c%d", wk->role == DUET_ROLE_PREFILL ? 'p' : 'd', wk->index);
    pthread_mutex_lock(&w->lock);
    while (!w->stop && wk->state == DUET__ACTIVE) {
        pthread_mutex_unlock(&w->lock);
        int64_t t0 = duet_now_ns();
        err[0] = '\0';
        bool ok = duet__worker_probe(wk, err, sizeof(err)), was, now_ok;
        pthread_mutex_lock(&wk->lock);
        now_ok = ok && wk->state == DUET__ACTIVE;
        if (wk->state == DUET__ACTIVE) { /* else last_error says why it left */
            wk->checks++;
            if (ok) {
                wk->last_ok_ns = duet_now_ns();
                wk->last_error[0] = '\0';
            } else {
                wk->failures++;
                snprintf(wk->last_error, sizeof(wk->last_error), "%s", err);
            }
        }
        was = atomic_exchange(&wk->healthy, now_ok);
        uint32_t tp = wk->tp;
        pthread_mutex_unlock(&wk->lock);
        if (now_ok != was) {
            if (now_ok)
                DUET_LOG_INFO("worker %s %s (%s) is healthy: tp %u", duet_role_name(wk->role),
                              wk->name, wk->address, tp);
            else
                DUET_LOG_WARN("worker %s %s (%s) left rotation: %s", duet_role_name(wk->role),
                              wk->name, wk->address, err);
            if (w->cfg.on_change)
                w->cfg.on_change(w->cfg.change_arg);
        }
        int64_t deadline = t0 + w->interval_ns;
        struct timespec ts = duet_deadline_timespec(deadline);
        pthread_mutex_lock(&w->lock);
        for (;;) {
            pthread_mutex_lock(&wk->lock);
            bool poked = wk->poke;
            wk->poke = false;
            pthread_mutex_unlock(&wk->lock);
            if (w->stop || poked || wk->state != DUET__ACTIVE || duet_now_ns() >= deadline)
                break;
            pthread_cond_timedwait(&w->cond, &w->lock, &ts);
        }
    }
    wk->loop_done = true; /* from here on nothing needs the locks */
    pthread_mutex_unlock(&w->lock);
    atomic_store(&wk->exited, true);
    return NULL;
}

duet_status_t duet__workers_checker_start(duet__worker_t *wk)
{
    int rc;
    wk->loop_done = false;
    atomic_store(&wk->exited, false);
    rc = pthread_create(&wk->thread, NULL, duet__worker_main, wk);
    if (rc != 0)
        return duet_error(DUET_ERR_INTERNAL, "router: pthread_create: %s", strerror(rc));
    wk->started = true;
    return DUET_OK;
}

/* ---- lifecycle ---- */

static duet_status_t duet__workers_fill(duet_router_workers_t *w, duet_role_t role,
                                        const duet_instance_config_t *inst, int n)
{
    for (int i = 0; i < n; i++) {
        if (inst[i].discover && inst[i].discover[0]) {
            duet__group_t *g = &w->groups[w->n_groups++];
            g->role = role;
            g->tp_config = (uint32_t)inst[i].tp;
            g->local_config = duet_cluster_prefill_local(&inst[i]);
            g->name = duet_strdup(inst[i].name);
            g->text = duet_strdup(inst[i].discover);
            if (g->name == NULL || g->text == NULL)
                return duet_error(DUET_ERR_NO_MEMORY, "router: no memory for workers");
            if (duet_router_disc_parse(inst[i].discover, &g->spec) != DUET_OK)
                return duet_error_wrap(DUET_ERR_CONFIG, "%s[%d].discover: ", duet_role_name(role),
                                       i);
            continue;
        }
        duet__worker_t *wk = duet__workers_slot_alloc(w, role);
        if (wk == NULL)
            return duet_error(DUET_ERR_NO_MEMORY, "router: no memory for workers");
        duet_status_t st =
            duet__workers_slot_fill(wk, NULL, inst[i].name, inst[i].address, (uint32_t)inst[i].tp,
                                    duet_cluster_prefill_local(&inst[i]));
        if (st != DUET_OK)
            return st;
    }
    return DUET_OK;
}

duet_status_t duet_router_workers_create(const duet_cluster_config_t *cfg,
                                         const duet_router_workers_config_t *wc,
                                         duet_router_workers_t **w_p)
{
    duet_router_workers_t *w;
    duet_status_t st;

    if ((st = duet_router_workers_validate(cfg)) != DUET_OK)
        return st;
    if ((w = DUET_NEW(duet_router_workers_t)) == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "router: no memory for workers");
    w->cfg = *wc;
    w->interval_ns = (int64_t)wc->interval_ms * DUET_NS_PER_MS;
    w->grace_ns = wc->grace_ms > 0 ? wc->grace_ms * DUET_NS_PER_MS : 3 * w->interval_ns;
    w->lookup_timeout_ns = w->interval_ns > 5 * DUET_NS_PER_S ? w->interval_ns : 5 * DUET_NS_PER_S;
    w->rnd = (uint64_t)duet_now_ns() ^ (uint64_t)(uintptr_t)w;
    atomic_init(&w->n_slots[0], 0);
    atomic_init(&w->n_slots[1], 0);
    pthread_mutex_init(&w->lock, NULL);
    duet_cond_init_monotonic(&w->cond);
    duet_cond_init_monotonic(&w->disc_cond);
    w->groups = DUET_NEW_ARRAY(duet__group_t, (size_t)(cfg->n_prefill + cfg->n_decode));
    if (w->groups == NULL) {
        st = duet_error(DUET_ERR_NO_MEMORY, "router: no memory for workers");
        goto err;
    }
    if (wc->policy == DUET_ROUTER_POLICY_CACHE_AWARE &&
        (st = duet_router_cache_aware_create(&cfg->router.cache_aware, (size_t)cfg->page_size,
                                             &w->ca)) != DUET_OK)
        goto err;
    if ((st = duet__workers_fill(w, DUET_ROLE_PREFILL, cfg->prefill, cfg->n_prefill)) != DUET_OK ||
        (st = duet__workers_fill(w, DUET_ROLE_DECODE, cfg->decode, cfg->n_decode)) != DUET_OK)
        goto err;
    *w_p = w;
    return DUET_OK;

err:
    duet_router_workers_destroy(w);
    return st;
}

duet_status_t duet_router_workers_start(duet_router_workers_t *w)
{
    duet_status_t st = DUET_OK;
    int rc;

    pthread_mutex_lock(&w->lock);
    for (int r = 0; r < 2 && st == DUET_OK; r++) {
        size_t n = atomic_load(&w->n_slots[r]);
        for (size_t i = 0; i < n && st == DUET_OK; i++) {
            duet__worker_t *wk = duet__slot(w, (duet_role_t)r, i);
            if (wk->state == DUET__ACTIVE && !wk->started)
                st = duet__workers_checker_start(wk);
        }
    }
    pthread_mutex_unlock(&w->lock);
    if (st != DUET_OK)
        return st;
    if (w->n_groups > 0 && !w->disc_started) {
        if ((rc = pthread_create(&w->disc_thread, NULL, duet__workers_disc_main, w)) != 0)
            return duet_error(DUET_ERR_INTERNAL, "router: pthread_create: %s", strerror(rc));
        w->disc_started = true;
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
    pthread_cond_broadcast(&w->disc_cond);
    pthread_mutex_unlock(&w->lock);
    /* discovery first: it starts checkers */
    if (w->disc_started)
        pthread_join(w->disc_thread, NULL);
    w->disc_started = false;
    for (int r = 0; r < 2; r++) {
        for (int c = 0; c < DUET__MAX_CHUNKS && w->chunks[r][c]; c++) {
            for (int k = 0; k < DUET__CHUNK; k++) {
                duet__worker_t *wk = &w->chunks[r][c][k];
                if (wk->started)
                    pthread_join(wk->thread, NULL);
                wk->started = false;
            }
        }
    }
}

void duet_router_workers_destroy(duet_router_workers_t *w)
{
    if (w == NULL)
        return;
    duet_router_workers_stop(w);
    for (size_t i = 0; w->groups && i < w->n_groups; i++) {
        duet_router_disc_lookup_release(w->groups[i].lookup);
        duet_free(w->groups[i].set);
        duet_free(w->groups[i].name);
        duet_free(w->groups[i].text);
    }
    duet_free(w->groups);
    for (int r = 0; r < 2; r++) {
        for (int c = 0; c < DUET__MAX_CHUNKS && w->chunks[r][c]; c++) {
            for (int k = 0; k < DUET__CHUNK; k++) {
                duet__worker_t *wk = &w->chunks[r][c][k];
                pthread_mutex_destroy(&wk->lock);
                duet_free(wk->name);
                duet_free(wk->address);
            }
            duet_free(w->chunks[r][c]);
        }
    }
    duet_router_cache_aware_destroy(w->ca);
    pthread_cond_destroy(&w->disc_cond);
    pthread_cond_destroy(&w->cond);
    pthread_mutex_destroy(&w->lock);
    duet_free(w);
}

/* ---- queries ---- */

size_t duet_router_workers_count(const duet_router_workers_t *w, duet_role_t role)
{
    return atomic_load(&w->n_slots[role]);
}

size_t duet_router_workers_active(duet_router_workers_t *w, duet_role_t role)
{
    size_t n = 0, slots;
    pthread_mutex_lock(&w->lock);
    slots = atomic_load(&w->n_slots[role]);
    for (size_t i = 0; i < slots; i++)
        n += duet__slot(w, role, i)->state == DUET__ACTIVE;
    pthread_mutex_unlock(&w->lock);
    return n;
}

size_t duet_router_workers_healthy(duet_router_workers_t *w, duet_role_t role)
{
    size_t n = 0, slots = atomic_load(&w->n_slots[role]);
    for (size_t i = 0; i < slots; i++)
        n += atomic_load(&duet__slot(w, role, i)->healthy);
    return n;
}

int64_t duet_router_workers_prefill_wait_ms(duet_router_workers_t *w)
{
    int64_t best = -1;
    size_t slots = atomic_load(&w->n_slots[DUET_ROLE_PREFILL]);
    for (size_t i = 0; i < slots; i++) {
        duet__worker_t *wk = duet__slot(w, DUET_ROLE_PREFILL, i);
        if (wk->state != DUET__ACTIVE || !atomic_load(&wk->healthy))
            continue;
        int64_t routed = atomic_load(&wk->routed);
        /* ours that have no first token yet: queued at prefill, or still
         * on their way to it (a decode that has not called it yet is not
         * in prefill's queue_tokens), or recomputed on a decode */
        int64_t inflight = atomic_load(&wk->inflight);
        pthread_mutex_lock(&wk->lock);
        int64_t est = 0; /* not measured yet: no limit */
        if (wk->have_info && !wk->draining && wk->tokens_per_s > 0) {
            double queued = (double)wk->queue_tokens + (double)routed * wk->prompt_mean;
            double ours = (double)inflight * wk->prompt_mean;
            est = (int64_t)((queued > ours ? queued : ours) * 1000.0 / wk->tokens_per_s);
        }
        pthread_mutex_unlock(&wk->lock);
        if (best < 0 || est < best)
            best = est;
    }
    return best < 0 ? 0 : best;
}

bool duet_router_workers_ready(duet_router_workers_t *w)
{
    return duet_router_workers_healthy(w, DUET_ROLE_DECODE) > 0 &&
           (duet_router_workers_healthy(w, DUET_ROLE_PREFILL) > 0 ||
            duet__workers_colocated_healthy(w) > 0);
}

double duet__workers_load(duet__worker_t *wk)
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
    return duet__workers_pick(w, role, avoid, false, NULL, NULL);
}

int duet__workers_pick(duet_router_workers_t *w, duet_role_t role, int avoid, bool colocated,
                       const duet_router_ca_key_t *key, size_t *matched_p)
{
    size_t n = atomic_load(&w->n_slots[role]);
    duet_router_cand_t stack[64], *c = n <= 64 ? stack : duet_malloc(n * sizeof(*c));
    uint64_t inst_stack[64], *inst = n <= 64 ? inst_stack : duet_malloc(n * sizeof(*inst));
    duet_router_ca_choice_t choice = {-1, DUET_ROUTER_CA_LOAD};
    int idx = -1;

    if (matched_p != NULL)
        *matched_p = 0;
    if (c == NULL || inst == NULL)
        goto out_free;
    /* a worker that left between the snapshot and the choice is dropped
     * from the candidates and the choice made again */
    for (int attempt = 0; attempt < 4 && idx < 0; attempt++) {
        size_t eligible = 0;
        for (size_t i = 0; i < n; i++) {
            duet__worker_t *wk = duet__slot(w, role, i);
            c[i].eligible = atomic_load(&wk->healthy) && (!colocated || duet__workers_local(wk));
            c[i].load = c[i].eligible && w->cfg.policy != DUET_ROUTER_POLICY_ROUND_ROBIN
                            ? duet__workers_load(wk)
                            : 0.0;
            inst[i] = atomic_load(&wk->instance);
            eligible += c[i].eligible;
        }
        if (avoid >= 0 && (size_t)avoid < n && c[avoid].eligible && eligible > 1)
            c[avoid].eligible = false;
        pthread_mutex_lock(&w->lock);
        for (int k = 0; k < 4; k++) {
            int i;
            if (w->ca != NULL) {
                duet_router_cache_aware_choose(w->ca, role, c, inst, n, key, &w->cursor[role],
                                               &choice);
                i = choice.idx;
            } else {
                i = duet_router_policy_pick(w->cfg.policy, c, n, &w->cursor[role], &w->rnd);
            }
            if (i < 0)
                break;
            duet__worker_t *wk = duet__slot(w, role, (size_t)i);
            if (wk->state == DUET__ACTIVE && atomic_load(&wk->healthy)) {
                atomic_fetch_add(&wk->inflight, 1);
                if (role == DUET_ROLE_PREFILL)
                    atomic_fetch_add(&wk->routed, 1);
                idx = i;
                break;
            }
            c[i].eligible = false;
        }
        pthread_mutex_unlock(&w->lock);
        if (idx >= 0 || eligible == 0)
            break;
    }
    if (idx >= 0 && w->ca != NULL) {
        size_t m = duet_router_cache_aware_commit(w->ca, role, &choice, inst[idx], key);
        if (matched_p != NULL)
            *matched_p = m;
    }
out_free:
    if (c != stack)
        duet_free(c);
    if (inst != inst_stack)
        duet_free(inst);
    return idx;
}

void duet_router_workers_release(duet_router_workers_t *w, duet_role_t role, int idx)
{
    duet__worker_t *wk = duet__slot_checked(w, role, idx);
    if (wk != NULL && atomic_fetch_sub(&wk->inflight, 1) == 1 && wk->state == DUET__LEAVING) {
        /* the last request on a leaving worker: let discovery free it */
        pthread_mutex_lock(&w->lock);
        w->disc_poke = true;
        pthread_cond_broadcast(&w->disc_cond);
        pthread_mutex_unlock(&w->lock);
    }
}

const char *duet_router_workers_address(const duet_router_workers_t *w, duet_role_t role, int idx)
{
    return duet__slot(w, role, (size_t)idx)->address;
}

const char *duet_router_workers_name(const duet_router_workers_t *w, duet_role_t role, int idx)
{
    return duet__slot(w, role, (size_t)idx)->name;
}

void duet_router_workers_suspect(duet_router_workers_t *w, duet_role_t role, int idx)
{
    duet__worker_t *wk = duet__slot_checked(w, role, idx);
    if (wk == NULL)
        return;
    pthread_mutex_lock(&wk->lock);
    wk->poke = true;
    pthread_mutex_unlock(&wk->lock);
    pthread_mutex_lock(&w->lock);
    pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->lock);
}

uint32_t duet_router_workers_max_pages(const duet_router_workers_t *w, duet_role_t role)
{
    uint32_t max = 0;
    size_t n = duet_router_workers_count(w, role);
    for (size_t i = 0; i < n; i++) {
        duet__worker_t *wk = duet__slot_checked(w, role, (int)i);
        if (wk == NULL)
            continue;
        pthread_mutex_lock(&wk->lock);
        if (wk->state == DUET__ACTIVE && wk->have_info && wk->total_pages > max)
            max = wk->total_pages;
        pthread_mutex_unlock(&wk->lock);
    }
    return max;
}

bool duet_router_workers_snapshot(duet_router_workers_t *w, duet_role_t role, int idx,
                                  duet_router_worker_info_t *info)
{
    duet__worker_t *wk = duet__slot_checked(w, role, idx);
    bool present;

    memset(info, 0, sizeof(*info));
    info->role = role;
    info->last_ok_ms_ago = -1;
    if (wk == NULL)
        return false;
    info->inflight = atomic_load(&wk->inflight);
    info->load = duet__workers_load(wk);
    pthread_mutex_lock(&wk->lock);
    present = wk->state != DUET__FREE;
    info->state = wk->state == DUET__ACTIVE    ? DUET_ROUTER_WORKER_ACTIVE
                  : wk->state == DUET__LEAVING ? DUET_ROUTER_WORKER_LEAVING
                                               : DUET_ROUTER_WORKER_REMOVED;
    info->healthy = atomic_load(&wk->healthy);
    if (present)
        snprintf(info->name, sizeof(info->name), "%s", wk->name ? wk->name : "");
    else /* unique, and never a live worker's name (one row per metric series) */
        snprintf(info->name, sizeof(info->name), "%.96s (removed, slot %d)",
                 wk->name ? wk->name : "-", idx);
    snprintf(info->address, sizeof(info->address), "%s", wk->address ? wk->address : "");
    snprintf(info->group, sizeof(info->group), "%s", wk->group ? wk->group->text : "");
    info->have_info = wk->have_info;
    info->tp = wk->tp;
    info->free_pages = wk->free_pages;
    info->total_pages = wk->total_pages;
    info->queue_depth = wk->queue_depth;
    info->running = wk->running;
    info->max_context = wk->max_context;
    info->draining = wk->draining;
    info->prefill_local = wk->local;
    info->prefills_local = wk->prefills_local;
    info->steps = wk->steps;
    info->forward_ns = wk->forward_ns;
    info->cycles = wk->cycles;
    info->cycle_ns = wk->cycle_ns;
    info->prefills_remote = wk->prefills_remote;
    info->cache = wk->cache;
    info->checks = wk->checks;
    info->failures = wk->failures;
    info->last_ok_ms_ago = wk->last_ok_ns ? (duet_now_ns() - wk->last_ok_ns) / DUET_NS_PER_MS : -1;
    snprintf(info->instance_id, sizeof(info->instance_id), "%s", wk->instance_id);
    snprintf(info->last_error, sizeof(info->last_error), "%s", wk->last_error);
    pthread_mutex_unlock(&wk->lock);
    return present;
}
