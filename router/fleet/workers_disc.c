/* The discovery thread of duet_router_workers (see workers.h): resolves
 * each discover group, reconciles its workers with the answer
 * (discovery.h), frees the slots of workers that left. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/sync.h"
#include "router/fleet/workers_internal.h"

/* how often the discovery thread looks at a lookup still running: soon at
 * first (most answer in a millisecond), then less often */
#define DUET__LOOKUP_POLL_NS      (20 * DUET_NS_PER_MS)
#define DUET__LOOKUP_SLOW_POLL_NS (100 * DUET_NS_PER_MS)

/* Apply one lookup outcome to a group (discovery thread). */
static void duet__group_outcome(duet_router_workers_t *w, duet__group_t *g, int err,
                                const duet_router_disc_addr_t *addrs, size_t n, int64_t now)
{
    duet_router_disc_action_t action;
    duet_router_disc_event_t ev = duet_router_disc_outcome(&g->st, err, now, w->grace_ns, &action);
    const char *role = duet_role_name(g->role);
    char eb[160];

    if (err != 0)
        duet__count(w->cfg.metrics ? &w->cfg.metrics->discovery_failures : NULL);
    if (action == DUET_ROUTER_DISC_APPLY) {
        duet_router_disc_addr_t *copy = DUET_NEW_ARRAY(duet_router_disc_addr_t, n ? n : 1);
        if (copy == NULL) {
            DUET_LOG_ERROR("discover %s %s: no memory for %zu addresses; keeping the last set",
                           role, g->name, n);
            return;
        }
        memcpy(copy, addrs, n * sizeof(*addrs));
        duet_free(g->set);
        g->set = copy;
        g->n_set = n;
        if (!g->resolved)
            DUET_LOG_INFO("discover %s %s (%s): %zu addresses", role, g->name, g->text, n);
        g->resolved = true;
    } else if (action == DUET_ROUTER_DISC_DROP) {
        duet_free(g->set);
        g->set = NULL;
        g->n_set = 0;
    }
    duet_router_disc_err_str(err, eb, sizeof(eb));
    switch (ev) {
    case DUET_ROUTER_DISC_EV_FAILING:
        if (g->n_set > 0)
            DUET_LOG_WARN("discover %s %s (%s): lookup failed: %s; keeping its %zu known workers "
                          "for %lld ms",
                          role, g->name, g->text, eb, g->n_set,
                          (long long)(w->grace_ns / DUET_NS_PER_MS));
        else
            DUET_LOG_WARN("discover %s %s (%s): lookup failed: %s; no workers from it, retrying "
                          "every %lld ms",
                          role, g->name, g->text, eb, (long long)(w->interval_ns / DUET_NS_PER_MS));
        break;
    case DUET_ROUTER_DISC_EV_DROPPED:
        DUET_LOG_WARN("discover %s %s (%s): still failing after %lld ms (%s): dropping its workers",
                      role, g->name, g->text, (long long)(w->grace_ns / DUET_NS_PER_MS), eb);
        break;
    case DUET_ROUTER_DISC_EV_RECOVERED:
        DUET_LOG_INFO("discover %s %s (%s): resolves again: %zu addresses", role, g->name, g->text,
                      n);
        break;
    default:
        break;
    }
}

/* A leaving worker whose address resolves again comes back, out of
 * rotation until its checker passes again (under w->lock). */
static duet_status_t duet__revive_locked(duet_router_workers_t *w, duet__worker_t *wk)
{
    if (wk->started && wk->loop_done) { /* its checker is ending: a new one */
        pthread_join(wk->thread, NULL);
        wk->started = false;
    }
    pthread_mutex_lock(&wk->lock);
    wk->state = DUET__ACTIVE;
    wk->poke = true;
    snprintf(wk->last_error, sizeof(wk->last_error), "resolved again; not checked yet");
    pthread_mutex_unlock(&wk->lock);
    pthread_cond_broadcast(&w->cond);
    DUET_LOG_INFO("worker %s %s (%s) is back in %s; checking it (%lld requests in flight)",
                  duet_role_name(wk->role), wk->name, wk->address, wk->group->text,
                  (long long)atomic_load(&wk->inflight));
    return wk->started ? DUET_OK : duet__workers_checker_start(wk);
}

/* Add a worker for a newly resolved address (under w->lock). */
static void duet__join_locked(duet_router_workers_t *w, duet__group_t *g,
                              const duet_router_disc_addr_t *a)
{
    char name[128];
    duet__worker_t *wk = duet__workers_slot_alloc(w, g->role);

    if (wk == NULL) {
        DUET_LOG_ERROR("discover %s %s: no room for worker %s (the table holds %d)",
                       duet_role_name(g->role), g->name, a->addr, DUET__CHUNK * DUET__MAX_CHUNKS);
        return;
    }
    snprintf(name, sizeof(name), "%s/%s", g->name, a->ip);
    if (duet__workers_slot_fill(wk, g, name, a->addr, g->tp_config, g->local_config) != DUET_OK) {
        DUET_LOG_ERROR("discover %s: %s", g->name, duet_error_msg());
        return;
    }
    if (duet__workers_checker_start(wk) != DUET_OK) {
        DUET_LOG_ERROR("discover %s: worker %s: %s", g->name, name, duet_error_msg());
        pthread_mutex_lock(&wk->lock);
        wk->state = DUET__FREE;
        pthread_mutex_unlock(&wk->lock);
        return;
    }
    DUET_LOG_INFO("worker %s %s (%s) joins from %s; checking it", duet_role_name(g->role), name,
                  wk->address, g->text);
    duet__count(w->cfg.metrics ? &w->cfg.metrics->workers_joined : NULL);
}

/* Make the group's workers match g->set (discovery thread). */
static void duet__group_reconcile(duet_router_workers_t *w, duet__group_t *g)
{
    size_t n = atomic_load(&w->n_slots[g->role]), n_m = 0;
    duet_router_disc_member_t *m = duet_malloc((n ? n : 1) * sizeof(*m));
    duet__worker_t **who = duet_malloc((n ? n : 1) * sizeof(*who));
    duet_router_disc_verdict_t *verdict = duet_malloc((n ? n : 1) * sizeof(*verdict));
    bool *add = duet_malloc((g->n_set ? g->n_set : 1) * sizeof(*add));
    bool changed = false;
    char why[320];

    if (m == NULL || who == NULL || verdict == NULL || add == NULL) {
        DUET_LOG_ERROR("discover %s: no memory to reconcile", g->name);
        goto out;
    }
    pthread_mutex_lock(&w->lock);
    if (w->stop) {
        pthread_mutex_unlock(&w->lock);
        goto out;
    }
    n = atomic_load(&w->n_slots[g->role]); /* cannot grow: only this thread adds */
    for (size_t i = 0; i < n; i++) {
        duet__worker_t *wk = duet__slot(w, g->role, i);
        if (wk->group == g && wk->state != DUET__FREE) {
            m[n_m].addr = wk->address;
            m[n_m].active = wk->state == DUET__ACTIVE;
            who[n_m++] = wk;
        }
    }
    duet_router_disc_reconcile(m, n_m, g->set, g->n_set, verdict, add);
    snprintf(why, sizeof(why), "%s no longer resolves to it", g->text);
    for (size_t i = 0; i < n_m; i++) {
        if (verdict[i] == DUET_ROUTER_DISC_LEAVE)
            changed |= duet__workers_leave_locked(w, who[i], why);
        else if (verdict[i] == DUET_ROUTER_DISC_REVIVE && duet__revive_locked(w, who[i]) != DUET_OK)
            DUET_LOG_ERROR("discover %s: worker %s: %s", g->name, who[i]->name, duet_error_msg());
    }
    for (size_t j = 0; j < g->n_set; j++)
        if (add[j])
            duet__join_locked(w, g, &g->set[j]);
    pthread_mutex_unlock(&w->lock);
    if (changed && w->cfg.on_change)
        w->cfg.on_change(w->cfg.change_arg);
out:
    duet_free(m);
    duet_free(who);
    duet_free(verdict);
    duet_free(add);
}

/* Free the slots of workers that left and have nothing in flight any more
 * (discovery thread). */
static void duet__reap(duet_router_workers_t *w)
{
    char *forget[16];
    size_t n_forget = 0;

    pthread_mutex_lock(&w->lock);
    for (int r = 0; r < 2 && !w->stop; r++) {
        size_t n = atomic_load(&w->n_slots[r]);
        for (size_t i = 0; i < n; i++) {
            duet__worker_t *wk = duet__slot(w, (duet_role_t)r, i);
            if (wk->state != DUET__LEAVING)
                continue;
            if (atomic_load(&wk->inflight) > 0 || (wk->started && !atomic_load(&wk->exited)) ||
                n_forget == sizeof(forget) / sizeof(forget[0]))
                continue;    /* a later round */
            if (wk->started) /* it has returned or is returning */
                pthread_join(wk->thread, NULL);
            wk->started = false;
            pthread_mutex_lock(&wk->lock);
            wk->state = DUET__FREE;
            snprintf(wk->last_error, sizeof(wk->last_error), "removed");
            pthread_mutex_unlock(&wk->lock);
            DUET_LOG_INFO("worker %s %s (%s) removed", duet_role_name(wk->role), wk->name,
                          wk->address);
            /* the channel goes too, unless another worker has the address */
            bool shared = false;
            for (int r2 = 0; r2 < 2 && !shared; r2++) {
                size_t n2 = atomic_load(&w->n_slots[r2]);
                for (size_t k = 0; k < n2 && !shared; k++) {
                    duet__worker_t *o = duet__slot(w, (duet_role_t)r2, k);
                    shared =
                        o != wk && o->state != DUET__FREE && strcmp(o->address, wk->address) == 0;
                }
            }
            if (!shared && (forget[n_forget] = duet_strdup(wk->address)) != NULL)
                n_forget++;
        }
        while (n > 0 && duet__slot(w, (duet_role_t)r, n - 1)->state == DUET__FREE)
            n--;
        atomic_store(&w->n_slots[r], n);
    }
    pthread_mutex_unlock(&w->lock);
    for (size_t i = 0; i < n_forget; i++) {
        duet_rpc_client_forget(w->cfg.cli, forget[i]);
        duet_free(forget[i]);
    }
}

/* Wait a little for g's lookup; take its outcome when it is done, count a
 * timeout per interval while it is stuck (discovery thread). */
static void duet__lookup_poll(duet_router_workers_t *w, duet__group_t *g)
{
    const duet_router_disc_addr_t *addrs;
    size_t n;
    int64_t limit = g->lookup_started + w->lookup_timeout_ns;
    int64_t until = duet_now_ns() + DUET__LOOKUP_POLL_NS;

    if (duet_router_disc_lookup_wait(g->lookup, until < limit ? until : limit)) {
        int err = duet_router_disc_lookup_result(g->lookup, &addrs, &n);
        duet__group_outcome(w, g, err, addrs, n, duet_now_ns());
        duet_router_disc_lookup_release(g->lookup);
        g->lookup = NULL;
    } else if (duet_now_ns() >= limit && duet_now_ns() >= g->next_due) {
        /* still stuck: one more failure per interval (the lookup goes on) */
        g->next_due = duet_now_ns() + w->interval_ns;
        duet__group_outcome(w, g, DUET_ROUTER_DISC_ERR_TIMEOUT, NULL, 0, duet_now_ns());
    }
}

/* A lookup is running and not yet past its timeout. */
static bool duet__resolver_busy(const duet_router_workers_t *w, int64_t now)
{
    for (size_t i = 0; i < w->n_groups; i++)
        if (w->groups[i].lookup != NULL && now - w->groups[i].lookup_started < w->lookup_timeout_ns)
            return true;
    return false;
}

/* One round: take finished lookups, start due ones, reconcile, reap.
 * Lookups run one at a time: the system resolver is shared anyway, and
 * nss_wrapper (the tests' resolver) breaks under concurrent lookups while
 * its hosts file changes.  One stuck past its timeout no longer holds the
 * others back.  Returns when to run again. */
static int64_t duet__disc_round(duet_router_workers_t *w)
{
    int64_t now, wake;
    bool blocked = false;

    for (size_t i = 0; i < w->n_groups; i++)
        if (w->groups[i].lookup != NULL)
            duet__lookup_poll(w, &w->groups[i]);
    for (size_t i = 0; i < w->n_groups; i++) {
        duet__group_t *g = &w->groups[i];
        now = duet_now_ns();
        if (g->lookup != NULL || now < g->next_due)
            continue;
        if (duet__resolver_busy(w, now)) {
            blocked = true;
            break;
        }
        g->lookup_started = now;
        g->next_due = now + w->interval_ns;
        g->lookup = duet_router_disc_lookup_start(&g->spec);
        if (g->lookup == NULL)
            duet__group_outcome(w, g, DUET_ROUTER_DISC_ERR_START, NULL, 0, now);
        else
            duet__lookup_poll(w, g);
    }
    for (size_t i = 0; i < w->n_groups; i++)
        duet__group_reconcile(w, &w->groups[i]);
    duet__reap(w);
    now = duet_now_ns();
    wake = now + w->interval_ns;
    for (size_t i = 0; i < w->n_groups; i++) {
        const duet__group_t *g = &w->groups[i];
        int64_t t = g->next_due;
        if (g->lookup != NULL || blocked)
            t = now + (g->lookup == NULL || now - g->lookup_started < 10 * DUET__LOOKUP_POLL_NS
                           ? DUET__LOOKUP_POLL_NS
                           : DUET__LOOKUP_SLOW_POLL_NS);
        if (t < wake)
            wake = t;
    }
    return wake;
}

void *duet__workers_disc_main(void *arg)
{
    duet_router_workers_t *w = arg;

    duet_thread_set_name("rt-discover");
    pthread_mutex_lock(&w->lock);
    while (!w->stop) {
        w->disc_poke = false;
        pthread_mutex_unlock(&w->lock);
        int64_t wake = duet__disc_round(w);
        struct timespec ts = duet_deadline_timespec(wake);
        pthread_mutex_lock(&w->lock);
        while (!w->stop && !w->disc_poke && duet_now_ns() < wake)
            pthread_cond_timedwait(&w->disc_cond, &w->lock, &ts);
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}
