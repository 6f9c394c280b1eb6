#include "router/fleet/policy.h"

#include <stdio.h>
#include <string.h>

/* The one spelling of each policy, in enum order. */
static const char *const duet__policy_names[DUET_ROUTER_N_POLICIES] = {
    [DUET_ROUTER_POLICY_ROUND_ROBIN] = "round_robin",
    [DUET_ROUTER_POLICY_LEAST_LOAD] = "least_load",
    [DUET_ROUTER_POLICY_POWER_OF_TWO] = "power_of_two",
    [DUET_ROUTER_POLICY_CACHE_AWARE] = "cache_aware",
};

int duet_router_policy_parse(const char *name)
{
    for (int p = 0; p < DUET_ROUTER_N_POLICIES; p++)
        if (strcmp(name, duet__policy_names[p]) == 0)
            return p;
    return -1;
}

const char *duet_router_policy_name(duet_router_policy_t p)
{
    if ((int)p < 0 || (int)p >= DUET_ROUTER_N_POLICIES)
        return "?";
    return duet__policy_names[p];
}

void duet_router_policy_list(char *buf, size_t cap, const char *sep, const char *last_sep)
{
    size_t off = 0;
    if (cap == 0)
        return;
    buf[0] = '\0';
    for (int p = 0; p < DUET_ROUTER_N_POLICIES && off < cap; p++) {
        const char *s = p == 0 ? "" : p == DUET_ROUTER_N_POLICIES - 1 ? last_sep : sep;
        int k = snprintf(buf + off, cap - off, "%s%s", s, duet__policy_names[p]);
        if (k < 0)
            return;
        off += (size_t)k;
    }
}

duet_status_t duet_router_policy_check(const char *name, const char *key,
                                       duet_router_policy_t *policy_p)
{
    char names[128];
    int p = duet_router_policy_parse(name);
    if (p < 0) {
        duet_router_policy_list(names, sizeof(names), ", ", " or ");
        return duet_error(DUET_ERR_CONFIG, "%s: '%s' is not %s", key, name, names);
    }
    *policy_p = (duet_router_policy_t)p;
    return DUET_OK;
}

double duet_router_load_score(uint32_t queue_depth, uint32_t running, uint32_t free_pages,
                              uint32_t total_pages, int64_t inflight)
{
    double active = (double)queue_depth + (double)running;
    double used = 0.0;
    if (inflight > 0 && (double)inflight > active)
        active = (double)inflight;
    if (total_pages > 0 && free_pages <= total_pages)
        used = 1.0 - (double)free_pages / (double)total_pages;
    return active + 2.0 * used;
}

uint64_t duet_router_rand_next(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

int duet_router_policy_pick(duet_router_policy_t policy, const duet_router_cand_t *cands, size_t n,
                            uint64_t *cursor, uint64_t *rnd_state)
{
    size_t eligible = 0, start;
    int best = -1;

    for (size_t i = 0; i < n; i++)
        eligible += cands[i].eligible;
    if (eligible == 0)
        return -1;
    /* the cursor is one past the previous choice: rotation skips the
     * ineligible without giving their turn to their neighbour */
    start = (size_t)(*cursor % n);
    switch (policy) {
    case DUET_ROUTER_POLICY_ROUND_ROBIN:
        for (size_t k = 0; k < n && best < 0; k++) {
            size_t i = (start + k) % n;
            if (cands[i].eligible)
                best = (int)i;
        }
        *cursor = (uint64_t)best + 1;
        return best;
    case DUET_ROUTER_POLICY_LEAST_LOAD:
    case DUET_ROUTER_POLICY_CACHE_AWARE: /* without a prompt (policy_cache.h) */
        for (size_t k = 0; k < n; k++) {
            size_t i = (start + k) % n;
            if (cands[i].eligible && (best < 0 || cands[i].load < cands[best].load))
                best = (int)i;
        }
        *cursor = (uint64_t)best + 1;
        return best;
    case DUET_ROUTER_POLICY_POWER_OF_TWO: {
        /* the r-th eligible candidate, for two distinct r */
        size_t r1 = (size_t)(duet_router_rand_next(rnd_state) % eligible), r2 = r1;
        int a = -1, b = -1;
        if (eligible > 1) {
            r2 = (size_t)(duet_router_rand_next(rnd_state) % (eligible - 1));
            if (r2 >= r1)
                r2++;
        }
        for (size_t i = 0, r = 0; i < n; i++) {
            if (!cands[i].eligible)
                continue;
            if (r == r1)
                a = (int)i;
            if (r == r2)
                b = (int)i;
            r++;
        }
        return cands[b].load < cands[a].load ? b : a;
    }
    }
    return -1;
}
