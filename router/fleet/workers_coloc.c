/* Colocated decodes in the worker table (docs/design-notes.md "Colocated
 * mode and conditional disaggregation"): which decodes prefill locally,
 * and the picks that need one. */
#include <string.h>

#include "router/fleet/workers_internal.h"

bool duet__workers_any_colocated(const duet_cluster_config_t *cfg)
{
    for (int i = 0; i < cfg->n_decode; i++)
        if (duet_cluster_prefill_local(&cfg->decode[i]) != DUET_PREFILL_LOCAL_OFF)
            return true;
    return false;
}

bool duet__workers_local(duet__worker_t *wk)
{
    pthread_mutex_lock(&wk->lock);
    bool local = wk->local != DUET_PREFILL_LOCAL_OFF;
    pthread_mutex_unlock(&wk->lock);
    return local;
}

size_t duet__workers_colocated_healthy(duet_router_workers_t *w)
{
    size_t n = 0, slots = atomic_load(&w->n_slots[DUET_ROLE_DECODE]);
    for (size_t i = 0; i < slots; i++) {
        duet__worker_t *wk = duet__slot(w, DUET_ROLE_DECODE, i);
        n += atomic_load(&wk->healthy) && duet__workers_local(wk);
    }
    return n;
}

void duet__workers_info_local(duet__worker_t *wk, const Duet__V1__InfoResponse *info)
{
    static const char *const modes[] = {"off", "always", "auto"};
    /* a daemon that does not say (older, or a prefill) keeps the config's */
    wk->local = wk->local_config;
    for (int m = 0; info->prefill_local != NULL && m < 3; m++)
        if (strcmp(info->prefill_local, modes[m]) == 0)
            wk->local = (duet_prefill_local_t)m;
    wk->prefills_local = info->prefills_local;
    wk->prefills_remote = info->prefills_remote;
    wk->steps = info->decode_steps;
    wk->forward_ns = info->decode_forward_ns;
    wk->cycles = info->decode_cycles;
    wk->cycle_ns = info->decode_cycle_ns;
}

int duet_router_workers_pick_decode(duet_router_workers_t *w, int avoid, bool colocated)
{
    return duet__workers_pick(w, DUET_ROLE_DECODE, avoid, colocated, NULL, NULL);
}

duet_prefill_local_t duet_router_workers_prefill_local(duet_router_workers_t *w, int idx)
{
    duet__worker_t *wk = duet__slot(w, DUET_ROLE_DECODE, (size_t)idx);
    pthread_mutex_lock(&wk->lock);
    duet_prefill_local_t m = wk->local;
    pthread_mutex_unlock(&wk->lock);
    return m;
}
