/* The cache_aware policy in the worker table (policy_cache.h,
 * docs/kv-aware-routing.md): keyed picks and its metrics. */
#include <stdio.h>

#include "router/fleet/workers_internal.h"

int duet_router_workers_pick_keyed(duet_router_workers_t *w, duet_role_t role, int avoid,
                                   bool colocated, const duet_router_ca_key_t *key,
                                   size_t *matched_p)
{
    return duet__workers_pick(w, role, avoid, colocated, key, matched_p);
}

void duet_router_workers_cache_record_output(duet_router_workers_t *w, duet_role_t role, int idx,
                                             const duet_router_ca_tokens_t *t)
{
    if (w->ca == NULL || idx < 0 || (size_t)idx >= atomic_load(&w->n_slots[role]))
        return;
    duet_router_cache_aware_record_output(
        w->ca, role, idx, atomic_load(&duet__slot(w, role, (size_t)idx)->instance), t);
}

/* One per-worker series: name{role,name[,reason]} value. */
static void duet__series(duet_router_buf_t *b, const char *metric, duet_role_t role,
                         const char *name, const char *reason, uint64_t v)
{
    if (reason != NULL)
        duet_router_buf_printf(b,
                               "duet_router_cache_aware_%s{role=\"%s\",name=\"%s\",reason=\"%s\"} "
                               "%llu\n",
                               metric, duet_role_name(role), name, reason, (unsigned long long)v);
    else
        duet_router_buf_printf(b, "duet_router_cache_aware_%s{role=\"%s\",name=\"%s\"} %llu\n",
                               metric, duet_role_name(role), name, (unsigned long long)v);
}

void duet_router_workers_cache_render(duet_router_workers_t *w, duet_router_buf_t *b)
{
    static const char *const metrics[][3] = {
        {"routed_total", "counter",
         "Requests routed to the worker by reason: prefix (longest match), balance (load "
         "imbalance overrode it), load (match below min_match_ratio: least loaded)"},
        {"matched_tokens_total", "counter",
         "Prompt tokens whose prefix this router had already sent to the worker, at routing"},
        {"prompt_tokens_total", "counter", "Prompt tokens routed to the worker"},
        {"output_tokens_total", "counter",
         "Generated tokens recorded for the worker (decode: its prefix cache keeps their pages)"},
        {"tree_tokens", "gauge", "Prompt tokens the router remembers for the worker"},
        {"evicted_tokens_total", "counter", "Remembered tokens dropped by the LRU cap"},
    };
    static const char *const ratio_names[DUET_ROUTER_CA_RATIO_BUCKETS] = {
        "none", "le25", "le50", "le75", "partial", "full"};

    if (w->ca == NULL)
        return;
    for (size_t m = 0; m < sizeof(metrics) / sizeof(metrics[0]); m++) {
        duet_router_buf_printf(b,
                               "# HELP duet_router_cache_aware_%s %s\n"
                               "# TYPE duet_router_cache_aware_%s %s\n",
                               metrics[m][0], metrics[m][2], metrics[m][0], metrics[m][1]);
        for (int role = 0; role < 2; role++) {
            for (size_t i = 0; i < duet_router_workers_count(w, role); i++) {
                duet_router_worker_info_t wi;
                duet_router_ca_stats_t st;
                if (!duet_router_workers_snapshot(w, role, (int)i, &wi))
                    continue; /* a free slot */
                duet_router_cache_aware_stats(w->ca, role, (int)i, &st);
                switch (m) {
                case 0:
                    for (int r = 0; r < DUET_ROUTER_CA_N_REASONS; r++)
                        duet__series(b, metrics[m][0], role, wi.name,
                                     duet_router_cache_aware_reason_name(r), st.routed[r]);
                    break;
                case 1:
                    duet__series(b, metrics[m][0], role, wi.name, NULL, st.matched_tokens);
                    break;
                case 2:
                    duet__series(b, metrics[m][0], role, wi.name, NULL, st.prompt_tokens);
                    break;
                case 3:
                    duet__series(b, metrics[m][0], role, wi.name, NULL, st.output_tokens);
                    break;
                case 4:
                    duet__series(b, metrics[m][0], role, wi.name, NULL, st.tree_tokens);
                    break;
                default:
                    duet__series(b, metrics[m][0], role, wi.name, NULL, st.evicted_tokens);
                    break;
                }
            }
        }
    }
    duet_router_buf_puts(b, "# HELP duet_router_cache_aware_match_total Routed requests by the "
                            "share of the prompt already sent to the chosen worker: none, "
                            "le25/le50/le75 (at most that percentage), partial (more, not all), "
                            "full (the whole prompt)\n"
                            "# TYPE duet_router_cache_aware_match_total counter\n");
    for (int role = 0; role < 2; role++) {
        uint64_t counts[DUET_ROUTER_CA_RATIO_BUCKETS];
        duet_router_cache_aware_ratio_hist(w->ca, role, counts);
        for (int k = 0; k < DUET_ROUTER_CA_RATIO_BUCKETS; k++)
            duet_router_buf_printf(b,
                                   "duet_router_cache_aware_match_total{role=\"%s\",share=\"%s\"} "
                                   "%llu\n",
                                   duet_role_name(role), ratio_names[k],
                                   (unsigned long long)counts[k]);
    }
}
