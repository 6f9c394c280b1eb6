/* Pinned picks (workers.h "pinned picks"): the choices 1..n-1 of an n > 1
 * request go to the decode (and prefill) instance that served choice 0's
 * prompt, whose prefix cache now holds it (docs/api-logprobs.md "Fork-style
 * sharing").  The pin is a preference, never a bypass: the worker must be
 * the same instance, in rotation and not overloaded, else the ordinary
 * pick runs. */
#include "router/fleet/workers_internal.h"

uint64_t duet_router_workers_instance(duet_router_workers_t *w, duet_role_t role, int idx)
{
    if (idx < 0 || (size_t)idx >= atomic_load(&w->n_slots[role]))
        return 0;
    return atomic_load(&duet__slot(w, role, (size_t)idx)->instance);
}

/* Is wk a candidate at all (healthy; with colocated, prefills locally)? */
static bool duet__eligible(duet__worker_t *wk, bool colocated)
{
    return atomic_load(&wk->healthy) && (!colocated || duet__workers_local(wk));
}

int duet_router_workers_pick_pinned(duet_router_workers_t *w, duet_role_t role, bool colocated,
                                    const duet_router_pin_t *pin, double balance_abs,
                                    double balance_rel, const duet_router_ca_key_t *key,
                                    size_t *matched_p)
{
    size_t n = atomic_load(&w->n_slots[role]);
    duet__worker_t *wk;
    double load, min_load;
    int idx = -1;

    if (matched_p != NULL)
        *matched_p = 0;
    if (pin == NULL || pin->idx < 0 || (size_t)pin->idx >= n)
        return -1;
    wk = duet__slot(w, role, (size_t)pin->idx);
    if (atomic_load(&wk->instance) != pin->instance || !duet__eligible(wk, colocated))
        return -1;
    /* the load limit: the imbalance rule of the cache_aware policy */
    load = min_load = duet__workers_load(wk);
    for (size_t i = 0; i < n; i++) {
        duet__worker_t *o = duet__slot(w, role, i);
        if (o != wk && duet__eligible(o, colocated)) {
            double l = duet__workers_load(o);
            if (l < min_load)
                min_load = l;
        }
    }
    if (load - min_load > balance_abs && load > balance_rel * min_load)
        return -1;
    pthread_mutex_lock(&w->lock);
    if (wk->state == DUET__ACTIVE && atomic_load(&wk->healthy) &&
        atomic_load(&wk->instance) == pin->instance) {
        atomic_fetch_add(&wk->inflight, 1);
        if (role == DUET_ROLE_PREFILL)
            atomic_fetch_add(&wk->routed, 1);
        idx = pin->idx;
    }
    pthread_mutex_unlock(&w->lock);
    if (idx >= 0 && w->ca != NULL) {
        duet_router_ca_choice_t choice = {idx, DUET_ROUTER_CA_PREFIX};
        size_t m = duet_router_cache_aware_commit(w->ca, role, &choice, pin->instance, key);
        if (matched_p != NULL)
            *matched_p = m;
    }
    return idx;
}
