/* The cache_aware policy (policy_cache.h): per-slot indexes, the choice
 * and the counters. */
#include "router/fleet/policy_cache.h"

#include <pthread.h>
#include <string.h>

#include "common/alloc.h"
#include "router/fleet/cache_index.h"

typedef struct {
    duet_router_cache_index_t *ci; /* NULL until the slot is first chosen */
    uint64_t instance;
    duet_router_ca_stats_t st;
} duet__ca_slot_t;

struct duet_router_cache_aware {
    duet_router_cache_aware_config_t cfg;
    size_t page_size, max_pages;
    pthread_mutex_t lock; /* everything below */
    duet__ca_slot_t *slots[2];
    size_t n_slots[2];
    uint64_t ratio[2][DUET_ROUTER_CA_RATIO_BUCKETS];
};

static const char *const duet__reason_names[DUET_ROUTER_CA_N_REASONS] = {"prefix", "balance",
                                                                         "load"};

const char *duet_router_cache_aware_reason_name(duet_router_ca_reason_t r)
{
    return (unsigned)r < DUET_ROUTER_CA_N_REASONS ? duet__reason_names[r] : "?";
}

duet_status_t duet_router_cache_aware_create(const duet_router_cache_aware_config_t *cfg,
                                             size_t page_size, duet_router_cache_aware_t **ca_p)
{
    duet_router_cache_aware_t *ca = DUET_NEW(duet_router_cache_aware_t);
    if (ca == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "router: no memory for the cache_aware policy");
    ca->cfg = *cfg;
    ca->page_size = page_size ? page_size : 1;
    ca->max_pages = (size_t)cfg->max_tree_tokens / ca->page_size;
    if (ca->max_pages == 0)
        ca->max_pages = 1;
    pthread_mutex_init(&ca->lock, NULL);
    *ca_p = ca;
    return DUET_OK;
}

void duet_router_cache_aware_destroy(duet_router_cache_aware_t *ca)
{
    if (ca == NULL)
        return;
    for (int r = 0; r < 2; r++) {
        for (size_t i = 0; i < ca->n_slots[r]; i++)
            duet_router_cache_index_destroy(ca->slots[r][i].ci);
        duet_free(ca->slots[r]);
    }
    pthread_mutex_destroy(&ca->lock);
    duet_free(ca);
}

/* Slot idx's entry, the table grown to hold it; NULL without memory. */
static duet__ca_slot_t *duet__slot_get(duet_router_cache_aware_t *ca, duet_role_t role, size_t idx)
{
    if (idx >= ca->n_slots[role]) {
        size_t n = idx + 1 > 2 * ca->n_slots[role] ? idx + 1 : 2 * ca->n_slots[role];
        duet__ca_slot_t *s = duet_realloc(ca->slots[role], n * sizeof(*s));
        if (s == NULL)
            return NULL;
        memset(s + ca->n_slots[role], 0, (n - ca->n_slots[role]) * sizeof(*s));
        ca->slots[role] = s;
        ca->n_slots[role] = n;
    }
    return &ca->slots[role][idx];
}

/* Matched pages of key on slot idx holding `instance` (0 when its index
 * is of another instance or absent). */
static size_t duet__match(duet_router_cache_aware_t *ca, duet_role_t role, size_t idx,
                          uint64_t instance, const duet_router_ca_key_t *key)
{
    if (key == NULL || key->n_keys == 0 || idx >= ca->n_slots[role])
        return 0;
    duet__ca_slot_t *s = &ca->slots[role][idx];
    if (s->ci == NULL || s->instance != instance)
        return 0;
    return duet_router_cache_index_match(s->ci, key->keys, key->n_keys);
}

/* The eligible candidate with the lowest load, ties to the first after
 * the cursor; -1 when none. */
static int duet__least_load(const duet_router_cand_t *cands, size_t n, size_t start)
{
    int best = -1;
    for (size_t k = 0; k < n; k++) {
        size_t i = (start + k) % n;
        if (cands[i].eligible && (best < 0 || cands[i].load < cands[best].load))
            best = (int)i;
    }
    return best;
}

void duet_router_cache_aware_choose(duet_router_cache_aware_t *ca, duet_role_t role,
                                    const duet_router_cand_t *cands, const uint64_t *instances,
                                    size_t n, const duet_router_ca_key_t *key, uint64_t *cursor,
                                    duet_router_ca_choice_t *choice)
{
    size_t start = n ? (size_t)(*cursor % n) : 0, best_pages = 0;
    double lo = 0, hi = 0;
    int best = -1, any = 0;

    choice->idx = -1;
    choice->reason = DUET_ROUTER_CA_LOAD;
    for (size_t i = 0; i < n; i++) {
        if (!cands[i].eligible)
            continue;
        if (!any++ || cands[i].load < lo)
            lo = cands[i].load;
        if (any == 1 || cands[i].load > hi)
            hi = cands[i].load;
    }
    if (!any)
        return;
    if (hi - lo > ca->cfg.balance_abs_threshold && hi > ca->cfg.balance_rel_threshold * lo) {
        choice->idx = duet__least_load(cands, n, start);
        choice->reason = DUET_ROUTER_CA_BALANCE;
    } else {
        pthread_mutex_lock(&ca->lock);
        for (size_t k = 0; k < n; k++) {
            size_t i = (start + k) % n, m;
            if (!cands[i].eligible)
                continue;
            m = duet__match(ca, role, i, instances[i], key);
            if (best < 0 || m > best_pages ||
                (m == best_pages && cands[i].load < cands[best].load)) {
                best = (int)i;
                best_pages = m;
            }
        }
        pthread_mutex_unlock(&ca->lock);
        if (best_pages > 0 && (double)(best_pages * ca->page_size) >=
                                  ca->cfg.min_match_ratio * (double)key->n_tokens) {
            choice->idx = best;
            choice->reason = DUET_ROUTER_CA_PREFIX;
        } else {
            choice->idx = duet__least_load(cands, n, start);
        }
    }
    *cursor = (uint64_t)choice->idx + 1;
}

size_t duet_router_cache_aware_commit(duet_router_cache_aware_t *ca, duet_role_t role,
                                      const duet_router_ca_choice_t *choice, uint64_t instance,
                                      const duet_router_ca_key_t *key)
{
    size_t matched = 0, n_tokens = key ? key->n_tokens : 0, b;
    duet__ca_slot_t *s;

    if (choice->idx < 0)
        return 0;
    pthread_mutex_lock(&ca->lock);
    if ((s = duet__slot_get(ca, role, (size_t)choice->idx)) == NULL)
        goto out_unlock; /* no memory: this request is simply not recorded */
    if (s->ci != NULL && s->instance != instance) {
        /* another instance in the slot: it has none of the old one's cache */
        duet_router_cache_index_destroy(s->ci);
        memset(s, 0, sizeof(*s));
    }
    s->instance = instance;
    if (s->ci == NULL && duet_router_cache_index_create(ca->max_pages, &s->ci) != DUET_OK)
        goto out_unlock;
    if (key != NULL && key->n_keys > 0) {
        matched = duet_router_cache_index_match(s->ci, key->keys, key->n_keys) * ca->page_size;
        duet_router_cache_index_insert(s->ci, key->keys, key->n_keys);
    }
    s->st.routed[choice->reason]++;
    s->st.matched_tokens += matched;
    s->st.prompt_tokens += n_tokens;
    b = matched == 0                  ? 0
        : matched * 4 <= n_tokens     ? 1
        : matched * 2 <= n_tokens     ? 2
        : matched * 4 <= n_tokens * 3 ? 3
        : matched < n_tokens          ? 4
                                      : 5;
    ca->ratio[role][b]++;
out_unlock:
    pthread_mutex_unlock(&ca->lock);
    return matched;
}

duet_status_t duet_router_ca_tokens_init(duet_router_ca_tokens_t *t, const int32_t *prompt,
                                         size_t n)
{
    memset(t, 0, sizeof(*t));
    if ((t->ids = duet_malloc((n ? n : 1) * sizeof(*t->ids))) == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "router: no memory for a prompt's ids");
    if (n > 0)
        memcpy(t->ids, prompt, n * sizeof(*t->ids));
    t->n = t->cap = t->n_prompt = n;
    return DUET_OK;
}

void duet_router_ca_tokens_append(duet_router_ca_tokens_t *t, const int32_t *ids, size_t n)
{
    if (t->ids == NULL || n == 0)
        return;
    if (t->n + n > t->cap) {
        size_t cap = t->cap * 2 > t->n + n ? t->cap * 2 : t->n + n + 64;
        int32_t *p = duet_realloc(t->ids, cap * sizeof(*p));
        if (p == NULL) {
            t->cap = t->n; /* full: what it holds is still a prefix */
            return;
        }
        t->ids = p;
        t->cap = cap;
    }
    memcpy(t->ids + t->n, ids, n * sizeof(*ids));
    t->n += n;
}

void duet_router_ca_tokens_free(duet_router_ca_tokens_t *t)
{
    duet_free(t->ids);
    memset(t, 0, sizeof(*t));
}

void duet_router_cache_aware_record_output(duet_router_cache_aware_t *ca, duet_role_t role, int idx,
                                           uint64_t instance, const duet_router_ca_tokens_t *t)
{
    size_t n_kv = t->n > t->n_prompt ? t->n - 1 : 0, n_keys = 0;
    uint64_t *keys = NULL;
    duet__ca_slot_t *s;

    /* no full page past the prompt's: its pages were recorded at commit */
    if (idx < 0 || n_kv / ca->page_size <= t->n_prompt / ca->page_size ||
        duet_router_cache_keys(t->ids, n_kv, ca->page_size, &keys, &n_keys) != DUET_OK)
        return;
    pthread_mutex_lock(&ca->lock);
    if ((size_t)idx < ca->n_slots[role] && (s = &ca->slots[role][idx])->ci != NULL &&
        s->instance == instance) {
        duet_router_cache_index_insert(s->ci, keys, n_keys);
        s->st.output_tokens += n_kv - t->n_prompt;
    }
    pthread_mutex_unlock(&ca->lock);
    duet_free(keys);
}

void duet_router_cache_aware_stats(duet_router_cache_aware_t *ca, duet_role_t role, int idx,
                                   duet_router_ca_stats_t *st)
{
    memset(st, 0, sizeof(*st));
    pthread_mutex_lock(&ca->lock);
    if (idx >= 0 && (size_t)idx < ca->n_slots[role]) {
        duet__ca_slot_t *s = &ca->slots[role][idx];
        *st = s->st;
        if (s->ci != NULL) {
            st->tree_tokens = duet_router_cache_index_pages(s->ci) * ca->page_size;
            st->evicted_tokens = duet_router_cache_index_evicted(s->ci) * ca->page_size;
        }
    }
    pthread_mutex_unlock(&ca->lock);
}

void duet_router_cache_aware_ratio_hist(duet_router_cache_aware_t *ca, duet_role_t role,
                                        uint64_t counts[DUET_ROUTER_CA_RATIO_BUCKETS])
{
    pthread_mutex_lock(&ca->lock);
    memcpy(counts, ca->ratio[role], sizeof(ca->ratio[role]));
    pthread_mutex_unlock(&ca->lock);
}
