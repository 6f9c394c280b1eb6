/* The prefix caches of the workers as the router sees them in their Info
 * (docs/prefix-cache.md): duet_prefix_cache_* metrics per instance, for
 * /metrics (sum them in the query for a cluster's rate). */
#include "router/fleet/workers_internal.h"

void duet__workers_info_cache(duet__worker_t *wk, const Duet__V1__InfoResponse *info)
{
    wk->cache = (duet_router_cache_stats_t){
        .on = info->prefix_cache,
        .cached_pages = info->cached_pages,
        .shared_pages = info->shared_pages,
        .in_use_pages = info->in_use_pages,
        .lookups = info->cache_lookups,
        .lookup_tokens = info->cache_lookup_tokens,
        .hit_tokens = info->cache_hit_tokens,
        .hit_pages = info->cache_hit_pages,
        .inserted_pages = info->cache_inserted_pages,
        .evictions = info->cache_evictions,
    };
}

static double duet__cache_stat(const duet_router_cache_stats_t *c, int f)
{
    switch (f) {
    case 0:
        return c->on;
    case 1:
        return c->cached_pages;
    case 2:
        return c->shared_pages;
    case 3:
        return (double)c->lookups;
    case 4:
        return (double)c->lookup_tokens;
    case 5:
        return (double)c->hit_tokens;
    case 6:
        return (double)c->hit_pages;
    case 7:
        return (double)c->inserted_pages;
    default:
        return (double)c->evictions;
    }
}

void duet_router_cache_metrics_render(duet_router_workers_t *w, duet_router_buf_t *b)
{
    static const char *const fields[][3] = {
        {"enabled", "gauge", "1 when the worker's prefix cache is on"},
        {"cached_pages", "gauge", "KV pages kept by the worker's prefix cache"},
        {"shared_pages", "gauge", "Cached pages that requests hold now"},
        {"lookups_total", "counter", "Prompts looked up in the prefix cache"},
        {"lookup_tokens_total", "counter", "Prompt tokens looked up"},
        {"hit_tokens_total", "counter", "Prompt tokens found cached (not computed or sent)"},
        {"hit_pages_total", "counter", "KV pages found cached"},
        {"inserted_pages_total", "counter", "KV pages added to the prefix cache"},
        {"evictions_total", "counter", "Cached pages evicted to make room"},
    };
    for (size_t f = 0; f < sizeof(fields) / sizeof(fields[0]); f++) {
        duet_router_buf_printf(b,
                               "# HELP duet_prefix_cache_%s %s\n# TYPE duet_prefix_cache_%s %s\n",
                               fields[f][0], fields[f][2], fields[f][0], fields[f][1]);
        for (int role = 0; role < 2; role++) {
            for (size_t i = 0; i < duet_router_workers_count(w, role); i++) {
                duet_router_worker_info_t wi;
                if (!duet_router_workers_snapshot(w, role, (int)i, &wi) || !wi.have_info)
                    continue;
                duet_router_buf_printf(b, "duet_prefix_cache_%s{role=\"%s\",name=\"%s\"} %g\n",
                                       fields[f][0], duet_role_name(role), wi.name,
                                       duet__cache_stat(&wi.cache, (int)f));
            }
        }
    }
}
