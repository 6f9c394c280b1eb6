/* Internals shared by workers.c (table, checkers, lifecycle, queries) and
 * workers_disc.c (the discovery thread).
 *
 * Slots live in fixed chunks that never move, so any thread may read a
 * slot below n_slots without a lock.  Lock order: w->lock, then a slot's
 * lock.  A slot's state changes only under both; pick() re-checks the state
 * under w->lock before counting a request on it, and a slot is freed only
 * once it is LEAVING (so pick no longer takes it) and its in-flight count is
 * zero: an index held by a request therefore always names the same worker.
 * Name and address strings change only while a slot is FREE.  w->lock is a
 * leaf apart from the slots' locks and the cache_aware policy's (itself a
 * leaf): nothing else is taken under it (logging aside), and on_change runs
 * without it. */
#ifndef DUET_ROUTER_FLEET_WORKERS_INTERNAL_H
#define DUET_ROUTER_FLEET_WORKERS_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "duet/v1/common.pb-c.h"
#include "router/fleet/discovery.h"
#include "router/fleet/policy_cache.h"
#include "router/fleet/workers.h"

#define DUET__CHUNK      64
#define DUET__MAX_CHUNKS 64 /* 4096 workers per role */

typedef enum { DUET__FREE = 0, DUET__ACTIVE, DUET__LEAVING } duet__state_t;

typedef struct duet__group duet__group_t;

typedef struct {
    duet_router_workers_t *owner;
    duet_role_t role;
    int index;
    /* set while the slot is FREE */
    duet__group_t *group; /* NULL: a static entry */
    char *name;
    char *address;
    uint32_t tp_config;
    duet_prefill_local_t local_config; /* decode: the config's prefill_local */
    /* under owner->lock */
    pthread_t thread;
    bool started;
    bool loop_done;     /* the checker left its loop */
    atomic_bool exited; /* the checker returned (set last) */
    /* written under owner->lock and lock (atomic: release() peeks) */
    _Atomic duet__state_t state;

    atomic_bool healthy;
    _Atomic int64_t inflight;
    _Atomic int64_t routed; /* prefill: requests picked since its last Info */
    _Atomic uint64_t instance; /* bumped when the slot holds a new instance (cache_aware) */

    pthread_mutex_t lock; /* the fields below */
    bool poke;
    bool have_info;
    uint32_t tp, free_pages, total_pages, queue_depth, running, max_context;
    bool draining;
    /* decode: prefill_local as its Info says (the config's before), and its
     * counts of local and remote prefills */
    duet_prefill_local_t local;
    uint64_t prefills_local, prefills_remote;
    uint64_t steps, forward_ns, cycles, cycle_ns; /* decode step timing (Info) */
    duet_router_cache_stats_t cache;
    /* prefill: its queue as its Info says (duet_router_workers_prefill_wait_ms) */
    uint64_t queue_tokens;
    double tokens_per_s;
    uint32_t prompt_mean;
    uint64_t checks, failures;
    int64_t last_ok_ns;
    char instance_id[64];
    char last_error[160];
} duet__worker_t;

/* A discover entry.  Only the discovery thread touches it after start. */
struct duet__group {
    duet_role_t role;
    char *name; /* the entry's */
    char *text; /* "name:port" as configured */
    duet_router_disc_spec_t spec;
    uint32_t tp_config;
    duet_prefill_local_t local_config;
    duet_router_disc_state_t st;
    duet_router_disc_lookup_t *lookup; /* running, or NULL */
    int64_t lookup_started, next_due;
    duet_router_disc_addr_t *set; /* the members to have */
    size_t n_set;
    bool resolved; /* at least once */
};

struct duet_router_workers {
    duet_router_workers_config_t cfg;
    int64_t interval_ns, grace_ns, lookup_timeout_ns;
    duet__group_t *groups;
    size_t n_groups;

    pthread_mutex_t lock;     /* stop flags, conds, pick state, slot states, chunks */
    pthread_cond_t cond;      /* checkers sleep here */
    pthread_cond_t disc_cond; /* the discovery thread sleeps here */
    bool stop, disc_poke;
    pthread_t disc_thread;
    bool disc_started;
    duet__worker_t *chunks[2][DUET__MAX_CHUNKS];
    _Atomic size_t n_slots[2];
    uint64_t cursor[2];
    uint64_t rnd;
    duet_router_cache_aware_t *ca; /* policy cache_aware; its lock is a leaf under lock */
};

static inline duet__worker_t *duet__slot(const duet_router_workers_t *w, duet_role_t role, size_t i)
{
    return &w->chunks[role][i / DUET__CHUNK][i % DUET__CHUNK];
}

static inline void duet__count(_Atomic uint64_t *counter)
{
    if (counter != NULL)
        atomic_fetch_add_explicit(counter, 1, memory_order_relaxed);
}

/* workers.c; all under w->lock */

/* A FREE slot (the lowest), or a new one; NULL when the table is full or
 * out of memory. */
duet__worker_t *duet__workers_slot_alloc(duet_router_workers_t *w, duet_role_t role);
/* Put a worker into a FREE slot. */
duet_status_t duet__workers_slot_fill(duet__worker_t *wk, duet__group_t *g, const char *name,
                                      const char *address, uint32_t tp, duet_prefill_local_t local);
/* Take an ACTIVE worker out of rotation for good; whether it was healthy
 * (the caller runs on_change once unlocked). */
bool duet__workers_leave_locked(duet_router_workers_t *w, duet__worker_t *wk, const char *why);
/* Start a slot's checker thread. */
duet_status_t duet__workers_checker_start(duet__worker_t *wk);

/* workers.c: pick among the healthy (with colocated: decodes that
 * prefill locally only); key and matched_p as duet_router_workers_pick_keyed */
int duet__workers_pick(duet_router_workers_t *w, duet_role_t role, int avoid, bool colocated,
                       const duet_router_ca_key_t *key, size_t *matched_p);

/* workers.c: a worker's load score (policy.h; any thread) */
double duet__workers_load(duet__worker_t *wk);

/* cache_metrics.c: copy the prefix cache's fields of an Info (wk->lock held) */
void duet__workers_info_cache(duet__worker_t *wk, const Duet__V1__InfoResponse *info);

/* workers_coloc.c */
/* Does the config list a decode with prefill_local not "off"? */
bool duet__workers_any_colocated(const duet_cluster_config_t *cfg);
/* Healthy decodes that prefill locally. */
size_t duet__workers_colocated_healthy(duet_router_workers_t *w);
/* Does the decode wk prefill locally (any thread)? */
bool duet__workers_local(duet__worker_t *wk);
/* Take prefill_local and the prefill counts from an Info (wk->lock held). */
void duet__workers_info_local(duet__worker_t *wk, const Duet__V1__InfoResponse *info);

/* workers_disc.c: the discovery thread (resolve, reconcile, reap). */
void *duet__workers_disc_main(void *arg);

#endif
