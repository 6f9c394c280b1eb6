/* The cache_aware policy (docs/kv-aware-routing.md), in the manner of
 * sgl-router's: per instance (prefill and decode apart) an approximate
 * index of the prompt prefixes this router sent there (cache_index.h), and
 * per request:
 *
 *   1. load imbalanced -- among the eligible candidates
 *        max_load - min_load > balance_abs_threshold  and
 *        max_load > balance_rel_threshold * min_load
 *      -> the least loaded (reason "balance");
 *   2. else the candidate with the longest matched prefix (ties: lower
 *      load, then rotation), when matched_tokens >= min_match_ratio *
 *      prompt_tokens and > 0 (reason "prefix");
 *   3. else the least loaded (reason "load"; ties rotate, so new prefixes
 *      spread).
 * The chosen instance's index then records the prompt's pages (and a
 * decode's, when the request ends, its output's: record_output).  Loads are
 * the candidates' load scores (policy.h).
 *
 * Candidates are worker slots; instances[i] identifies the instance slot
 * i holds, and a slot whose instance changed starts with an empty
 * index.  Thread-safe: one lock, a leaf (workers.c calls in under its own
 * lock). */
#ifndef DUET_ROUTER_FLEET_POLICY_CACHE_H
#define DUET_ROUTER_FLEET_POLICY_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/cluster.h"
#include "common/status.h"
#include "router/base/buf.h"
#include "router/fleet/policy.h"

typedef struct duet_router_cache_aware duet_router_cache_aware_t;

typedef enum {
    DUET_ROUTER_CA_PREFIX = 0,  /* the longest matched prefix */
    DUET_ROUTER_CA_BALANCE = 1, /* load imbalance overrode the match */
    DUET_ROUTER_CA_LOAD = 2,    /* match too short: the least loaded */
} duet_router_ca_reason_t;

#define DUET_ROUTER_CA_N_REASONS 3

/* A request's routing key: its prompt's page keys (cache_index.h). */
typedef struct {
    const uint64_t *keys;
    size_t n_keys;
    size_t n_tokens; /* the prompt's */
} duet_router_ca_key_t;

typedef struct {
    int idx;
    duet_router_ca_reason_t reason;
} duet_router_ca_choice_t;

/* A request's token ids for recording its output (cache_aware): the
 * prompt's, then each generated id as it comes.  Zeroed: records nothing. */
typedef struct {
    int32_t *ids;
    size_t n, cap, n_prompt;
} duet_router_ca_tokens_t;

/* Per-slot counters for metrics. */
typedef struct {
    uint64_t routed[DUET_ROUTER_CA_N_REASONS];
    uint64_t matched_tokens, prompt_tokens;
    uint64_t output_tokens; /* generated tokens recorded (record_output) */
    uint64_t tree_tokens, evicted_tokens;
} duet_router_ca_stats_t;

#define DUET_ROUTER_CA_RATIO_BUCKETS 6 /* matched/prompt <= 0, .25, .5, .75, <1, 1 */

/* The thresholds come from cfg (router.cache_aware); page_size from
 * kv.page_size.  DUET_ERR_NO_MEMORY. */
duet_status_t duet_router_cache_aware_create(const duet_router_cache_aware_config_t *cfg,
                                             size_t page_size, duet_router_cache_aware_t **ca_p);
/* Accepts NULL. */
void duet_router_cache_aware_destroy(duet_router_cache_aware_t *ca);

/* Choose among cands[0..n) of role, holding instances[0..n), for key
 * (NULL or no full page: only the load counts).  Changes no index.  choice->idx -1: none eligible.
 * cursor rotates ties as in duet_router_policy_pick. */
void duet_router_cache_aware_choose(duet_router_cache_aware_t *ca, duet_role_t role,
                                    const duet_router_cand_t *cands, const uint64_t *instances,
                                    size_t n, const duet_router_ca_key_t *key, uint64_t *cursor,
                                    duet_router_ca_choice_t *choice);
/* The choice was taken (the request goes to slot choice->idx, which holds
 * instance `instance`): record the prompt there and count it.  Returns the
 * matched prefix in tokens (before recording). */
size_t duet_router_cache_aware_commit(duet_router_cache_aware_t *ca, duet_role_t role,
                                      const duet_router_ca_choice_t *choice, uint64_t instance,
                                      const duet_router_ca_key_t *key);

/* Start t with a copy of the prompt's ids.  DUET_ERR_NO_MEMORY. */
duet_status_t duet_router_ca_tokens_init(duet_router_ca_tokens_t *t, const int32_t *prompt,
                                         size_t n);
/* Append generated ids (best effort: without memory t stops growing and
 * records only what it holds). */
void duet_router_ca_tokens_append(duet_router_ca_tokens_t *t, const int32_t *ids, size_t n);
/* Accepts a zeroed t. */
void duet_router_ca_tokens_free(duet_router_ca_tokens_t *t);

/* A request that ran on slot idx (holding `instance`) ended with output:
 * record the full pages of its prompt + output but the last output token
 * (whose KV the decode never computed), as the decode's prefix cache keeps
 * them (docs/kv-aware-routing.md "Generated tokens").  Nothing when the
 * slot's index is of another instance, or there is no page past the
 * prompt's. */
void duet_router_cache_aware_record_output(duet_router_cache_aware_t *ca, duet_role_t role, int idx,
                                           uint64_t instance, const duet_router_ca_tokens_t *t);

/* Slot idx's counters (zero when it never held an index). */
void duet_router_cache_aware_stats(duet_router_cache_aware_t *ca, duet_role_t role, int idx,
                                   duet_router_ca_stats_t *st);
/* The role's histogram of matched/prompt at commit (counts per bucket). */
void duet_router_cache_aware_ratio_hist(duet_router_cache_aware_t *ca, duet_role_t role,
                                        uint64_t counts[DUET_ROUTER_CA_RATIO_BUCKETS]);
/* The label of a reason: "prefix", "balance" or "load". */
const char *duet_router_cache_aware_reason_name(duet_router_ca_reason_t r);

#endif
