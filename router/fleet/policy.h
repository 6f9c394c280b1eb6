/* Worker selection policies (DESIGN §7), pure functions over a snapshot of
 * candidates so they can be tested without a cluster.  Prefill and decode
 * are picked independently with the same policy.
 *
 *   round_robin   the next eligible candidate after the previous choice
 *   least_load    the eligible candidate with the lowest load score; ties
 *                 go to the first one after the previous choice, so
 *                 equal workers share traffic
 *   power_of_two  two distinct eligible candidates drawn at random, the
 *                 less loaded one wins (ties: the first drawn)
 *   cache_aware   the longest prefix this router already sent there, unless
 *                 the load is imbalanced (policy_cache.h); here, without a
 *                 prompt, it picks as least_load
 *
 * The load score (duet_router_load_score) of a worker is
 *   max(queue_depth + running, inflight)  +  2 * used_page_fraction
 * where queue_depth/running/free/total pages come from the worker's Info
 * and inflight is what this router has sent there and not yet seen finish
 * (it reacts at once, between Info polls).  Lower is better. */
#ifndef DUET_ROUTER_FLEET_POLICY_H
#define DUET_ROUTER_FLEET_POLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef enum {
    DUET_ROUTER_POLICY_ROUND_ROBIN = 0,
    DUET_ROUTER_POLICY_LEAST_LOAD = 1,
    DUET_ROUTER_POLICY_POWER_OF_TWO = 2,
    DUET_ROUTER_POLICY_CACHE_AWARE = 3,
} duet_router_policy_t;

#define DUET_ROUTER_N_POLICIES 4

/* The policy called name ("round_robin" | "least_load" | "power_of_two" |
 * "cache_aware"),
 * or -1 when there is none. */
int duet_router_policy_parse(const char *name);
/* The policy's name (static storage; "?" for a value out of range). */
const char *duet_router_policy_name(duet_router_policy_t p);
/* Every policy's name into buf (truncated to cap), separated by sep and,
 * before the last, by last_sep: "round_robin, least_load or power_of_two". */
void duet_router_policy_list(char *buf, size_t cap, const char *sep, const char *last_sep);
/* The policy called name; DUET_ERR_CONFIG naming the config key `key` and
 * listing the policies when there is none (then *policy_p is untouched).
 * The cluster config keeps router.policy a string: this is its check. */
duet_status_t duet_router_policy_check(const char *name, const char *key,
                                       duet_router_policy_t *policy_p);

typedef struct {
    bool eligible; /* healthy and not excluded */
    double load;   /* lower is better */
} duet_router_cand_t;

double duet_router_load_score(uint32_t queue_depth, uint32_t running, uint32_t free_pages,
                              uint32_t total_pages, int64_t inflight);

/* Pick a candidate: its index, or -1 when none is eligible.  cursor is the
 * caller's rotating counter (advanced here); rnd_state is the caller's
 * random state (splitmix64, advanced here).  The caller serialises calls
 * that share cursor/rnd_state (or passes thread-local ones). */
int duet_router_policy_pick(duet_router_policy_t policy, const duet_router_cand_t *cands, size_t n,
                            uint64_t *cursor, uint64_t *rnd_state);

/* splitmix64 step. */
uint64_t duet_router_rand_next(uint64_t *state);

#endif
