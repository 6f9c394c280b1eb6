/* The cache_aware policy (router/fleet/policy_cache.h) and its index
 * (router/fleet/cache_index.h): page keys, longest match, LRU eviction under the
 * cap, the choice (prefix, balance override, min_match_ratio), a slot's new
 * instance, concurrent use, and router.cache_aware in the cluster config. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/alloc.h"
#include "common/cluster.h"
#include "router/base/buf.h"
#include "router/fleet/cache_index.h"
#include "router/fleet/policy_cache.h"
#include "router/router.h"

#define PS 4 /* page size of these tests */

/* n token ids: a "system prompt" of sys tokens (ids 1000+), then tokens
 * drawn from seed. */
static void prompt(int32_t *ids, size_t n, size_t sys, uint32_t seed)
{
    for (size_t i = 0; i < n; i++)
        ids[i] =
            i < sys ? (int32_t)(1000 + i) : (int32_t)((seed * 2654435761u + i * 40503u) % 30000);
}

static void test_keys(void **state)
{
    int32_t a[23], b[23];
    uint64_t *ka, *kb;
    size_t na, nb;
    (void)state;
    prompt(a, 23, 12, 1);
    prompt(b, 23, 12, 2); /* equal for 12 tokens: pages 0..2 */
    assert_int_equal(duet_router_cache_keys(a, 23, PS, &ka, &na), DUET_OK);
    assert_int_equal(duet_router_cache_keys(b, 23, PS, &kb, &nb), DUET_OK);
    assert_int_equal(na, 5); /* 23 tokens: 5 full pages, the partial one has no key */
    assert_int_equal(nb, 5);
    for (size_t k = 0; k < 3; k++)
        assert_true(ka[k] == kb[k] && ka[k] != 0);
    for (size_t k = 3; k < 5; k++) /* chained: once apart, apart for good */
        assert_true(ka[k] != kb[k]);
    /* a change in page 0 changes every key */
    b[0] = 7;
    duet_free(kb);
    assert_int_equal(duet_router_cache_keys(b, 23, PS, &kb, &nb), DUET_OK);
    for (size_t k = 0; k < 5; k++)
        assert_true(ka[k] != kb[k]);
    duet_free(ka);
    duet_free(kb);
    /* shorter than a page: no key */
    assert_int_equal(duet_router_cache_keys(a, 3, PS, &ka, &na), DUET_OK);
    assert_null(ka);
    assert_int_equal(na, 0);
}

static void test_index_match(void **state)
{
    duet_router_cache_index_t *ci;
    uint64_t k1[6] = {11, 12, 13, 14, 15, 16}, k2[4] = {11, 12, 23, 24}, k3[3] = {31, 32, 33};
    long live = duet_alloc_live();
    (void)state;
    assert_int_equal(duet_router_cache_index_create(100, &ci), DUET_OK);
    assert_int_equal(duet_router_cache_index_match(ci, k1, 6), 0);
    duet_router_cache_index_insert(ci, k1, 6);
    assert_int_equal(duet_router_cache_index_pages(ci), 6);
    assert_int_equal(duet_router_cache_index_match(ci, k1, 6), 6);
    assert_int_equal(duet_router_cache_index_match(ci, k1, 3), 3);
    assert_int_equal(duet_router_cache_index_match(ci, k2, 4), 2); /* shares 2 pages */
    assert_int_equal(duet_router_cache_index_match(ci, k3, 3), 0);
    duet_router_cache_index_insert(ci, k2, 4);
    assert_int_equal(duet_router_cache_index_pages(ci), 8); /* 11, 12 once */
    assert_int_equal(duet_router_cache_index_match(ci, k2, 4), 4);
    /* many more keys than the first node block: growth keeps every key */
    uint64_t many[300];
    for (int i = 0; i < 300; i++)
        many[i] = 1000 + (uint64_t)i * 7919;
    duet_router_cache_index_destroy(ci);
    assert_int_equal(duet_router_cache_index_create(1000, &ci), DUET_OK);
    duet_router_cache_index_insert(ci, many, 300);
    assert_int_equal(duet_router_cache_index_match(ci, many, 300), 300);
    duet_router_cache_index_clear(ci);
    assert_int_equal(duet_router_cache_index_pages(ci), 0);
    assert_int_equal(duet_router_cache_index_match(ci, many, 300), 0);
    duet_router_cache_index_insert(ci, many, 300);
    assert_int_equal(duet_router_cache_index_match(ci, many, 300), 300);
    duet_router_cache_index_destroy(ci);
    assert_int_equal(duet_alloc_live(), live);
}

static void test_index_eviction(void **state)
{
    duet_router_cache_index_t *ci;
    uint64_t a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8}, c[3] = {9, 10, 11}, big[12];
    long live = duet_alloc_live();
    (void)state;
    assert_int_equal(duet_router_cache_index_create(8, &ci), DUET_OK);
    duet_router_cache_index_insert(ci, a, 4);
    duet_router_cache_index_insert(ci, b, 4);
    assert_int_equal(duet_router_cache_index_pages(ci), 8);
    /* a is the least recent prompt: its deepest pages go first, so what
     * stays of it is still a prefix */
    duet_router_cache_index_insert(ci, c, 3);
    assert_int_equal(duet_router_cache_index_pages(ci), 8);
    assert_int_equal(duet_router_cache_index_evicted(ci), 3);
    assert_int_equal(duet_router_cache_index_match(ci, a, 4), 1);
    assert_int_equal(duet_router_cache_index_match(ci, b, 4), 4);
    assert_int_equal(duet_router_cache_index_match(ci, c, 3), 3);
    /* a match refreshes: b touched, then a new prompt evicts a's rest and c's tail */
    duet_router_cache_index_insert(ci, b, 4);
    uint64_t d[2] = {20, 21};
    duet_router_cache_index_insert(ci, d, 2);
    assert_int_equal(duet_router_cache_index_match(ci, a, 4), 0);
    assert_int_equal(duet_router_cache_index_match(ci, c, 3), 2);
    assert_int_equal(duet_router_cache_index_match(ci, b, 4), 4);
    /* a prompt longer than the cap keeps its first max_pages pages */
    for (int i = 0; i < 12; i++)
        big[i] = 100 + (uint64_t)i;
    duet_router_cache_index_insert(ci, big, 12);
    assert_int_equal(duet_router_cache_index_pages(ci), 8);
    assert_int_equal(duet_router_cache_index_match(ci, big, 12), 8);
    assert_int_equal(duet_router_cache_index_match(ci, b, 4), 0);
    duet_router_cache_index_destroy(ci);
    assert_int_equal(duet_alloc_live(), live);
}

/* Out of memory at every allocation: no crash, no leak, and what could
 * be recorded matches. */
static void test_index_no_memory(void **state)
{
    uint64_t keys[200];
    (void)state;
    for (int i = 0; i < 200; i++)
        keys[i] = 500 + (uint64_t)i;
    for (long fail = 0; fail < 8; fail++) {
        duet_router_cache_index_t *ci = NULL;
        long live = duet_alloc_live();
        duet_alloc_fail_after(fail);
        duet_status_t st = duet_router_cache_index_create(150, &ci);
        if (st == DUET_OK) {
            duet_router_cache_index_insert(ci, keys, 200);
            duet_router_cache_index_insert(ci, keys + 50, 100);
            size_t m = duet_router_cache_index_match(ci, keys, 200);
            assert_true(m <= 150);
            assert_true(duet_router_cache_index_pages(ci) <= 150);
        }
        duet_alloc_fail_after(-1);
        duet_router_cache_index_destroy(ci);
        assert_int_equal(duet_alloc_live(), live);
    }
}

static duet_router_cache_aware_config_t cfg_default(void)
{
    duet_router_cache_aware_config_t c = {.balance_abs_threshold = 4,
                                          .balance_rel_threshold = 1.5,
                                          .min_match_ratio = 0.3,
                                          .max_tree_tokens = 1 << 16};
    return c;
}

/* Route ids among n candidates (loads given, all eligible, instance 1);
 * returns the index and its reason and matched tokens. */
static int route(duet_router_cache_aware_t *ca, duet_role_t role, const int32_t *ids, size_t n_ids,
                 const double *loads, size_t n, uint64_t *cursor, duet_router_ca_reason_t *why,
                 size_t *matched)
{
    duet_router_cand_t c[8];
    uint64_t inst[8];
    duet_router_ca_choice_t ch;
    duet_router_ca_key_t key;
    uint64_t *keys;
    assert_int_equal(duet_router_cache_keys(ids, n_ids, PS, &keys, &key.n_keys), DUET_OK);
    key.keys = keys;
    key.n_tokens = n_ids;
    for (size_t i = 0; i < n; i++) {
        c[i].eligible = loads[i] >= 0;
        c[i].load = loads[i];
        inst[i] = 1;
    }
    duet_router_cache_aware_choose(ca, role, c, inst, n, &key, cursor, &ch);
    if (ch.idx >= 0) {
        size_t m = duet_router_cache_aware_commit(ca, role, &ch, 1, &key);
        if (matched)
            *matched = m;
    }
    if (why)
        *why = ch.reason;
    duet_free(keys);
    return ch.idx;
}

static void test_policy_prefix(void **state)
{
    duet_router_cache_aware_config_t cfg = cfg_default();
    duet_router_cache_aware_t *ca;
    double loads[3] = {0, 0, 0};
    int32_t ids[64];
    uint64_t cur = 0;
    duet_router_ca_reason_t why;
    size_t matched;
    int first[4];
    long live = duet_alloc_live();
    (void)state;
    assert_int_equal(duet_router_cache_aware_create(&cfg, PS, &ca), DUET_OK);
    /* four distinct system prompts: nothing matches, least load spreads
     * them (ties rotate) */
    for (uint32_t s = 0; s < 4; s++) {
        prompt(ids, 64, 0, 100 + s);
        first[s] = route(ca, DUET_ROLE_PREFILL, ids, 64, loads, 3, &cur, &why, &matched);
        assert_int_equal(why, DUET_ROUTER_CA_LOAD);
        assert_int_equal(matched, 0);
    }
    assert_true(first[0] != first[1] && first[1] != first[2] && first[0] != first[2]);
    /* the same 48-token prefix with other tails: always where it went */
    for (uint32_t s = 0; s < 4; s++) {
        for (int r = 0; r < 5; r++) {
            prompt(ids, 64, 0, 100 + s);
            prompt(ids + 48, 16, 0, 7000 + (uint32_t)r * 13 + s);
            assert_int_equal(route(ca, DUET_ROLE_PREFILL, ids, 64, loads, 3, &cur, &why, &matched),
                             first[s]);
            assert_int_equal(why, DUET_ROUTER_CA_PREFIX);
            assert_true(matched >= 48);
        }
    }
    /* the other role has its own indexes */
    prompt(ids, 64, 0, 100);
    route(ca, DUET_ROLE_DECODE, ids, 64, loads, 3, &cur, &why, &matched);
    assert_int_equal(why, DUET_ROUTER_CA_LOAD);
    duet_router_ca_stats_t st;
    duet_router_cache_aware_stats(ca, DUET_ROLE_PREFILL, first[0], &st);
    assert_true(st.routed[DUET_ROUTER_CA_PREFIX] >= 5);
    assert_true(st.matched_tokens >= 5 * 48);
    assert_true(st.tree_tokens > 0);
    uint64_t hist[DUET_ROUTER_CA_RATIO_BUCKETS];
    duet_router_cache_aware_ratio_hist(ca, DUET_ROLE_PREFILL, hist);
    assert_int_equal(hist[0], 4); /* the four first prompts */
    duet_router_cache_aware_destroy(ca);
    assert_int_equal(duet_alloc_live(), live);
}

static void test_policy_balance(void **state)
{
    duet_router_cache_aware_config_t cfg = cfg_default();
    duet_router_cache_aware_t *ca;
    double loads[2] = {0, 0};
    int32_t ids[64];
    uint64_t cur = 0;
    duet_router_ca_reason_t why;
    (void)state;
    assert_int_equal(duet_router_cache_aware_create(&cfg, PS, &ca), DUET_OK);
    prompt(ids, 64, 64, 1);
    int home = route(ca, DUET_ROLE_DECODE, ids, 64, loads, 2, &cur, &why, NULL);
    assert_true(home >= 0);
    /* the home is busier, within the thresholds: the prefix still wins */
    loads[home] = 4;
    loads[!home] = 1;
    assert_int_equal(route(ca, DUET_ROLE_DECODE, ids, 64, loads, 2, &cur, &why, NULL), home);
    assert_int_equal(why, DUET_ROUTER_CA_PREFIX);
    /* over both thresholds (diff 5 > 4 and 6 > 1.5 * 1): the least loaded */
    loads[home] = 6;
    assert_int_equal(route(ca, DUET_ROLE_DECODE, ids, 64, loads, 2, &cur, &why, NULL), !home);
    assert_int_equal(why, DUET_ROUTER_CA_BALANCE);
    /* a large absolute spread but a small ratio (100 vs 90): the prefix;
     * both instances hold it now, so the less loaded of them */
    loads[home] = 100;
    loads[!home] = 90;
    assert_int_equal(route(ca, DUET_ROLE_DECODE, ids, 64, loads, 2, &cur, &why, NULL), !home);
    assert_int_equal(why, DUET_ROUTER_CA_PREFIX);
    /* an ineligible candidate is never chosen, whatever it holds */
    loads[!home] = -1;
    loads[home] = 0;
    assert_int_equal(route(ca, DUET_ROLE_DECODE, ids, 64, loads, 2, &cur, &why, NULL), home);
    loads[home] = -1;
    assert_int_equal(route(ca, DUET_ROLE_DECODE, ids, 64, loads, 2, &cur, &why, NULL), -1);
    duet_router_cache_aware_destroy(ca);
}

static void test_policy_min_ratio_and_restart(void **state)
{
    duet_router_cache_aware_config_t cfg = cfg_default();
    duet_router_cache_aware_t *ca;
    duet_router_cand_t c[2] = {{true, 0}, {true, 0}};
    uint64_t inst[2] = {1, 1}, cur = 0, *keys;
    duet_router_ca_choice_t ch;
    duet_router_ca_key_t key;
    int32_t ids[64];
    double loads[2] = {0, 0};
    duet_router_ca_reason_t why;
    size_t matched;
    (void)state;
    assert_int_equal(duet_router_cache_aware_create(&cfg, PS, &ca), DUET_OK);
    prompt(ids, 64, 16, 1);
    int home = route(ca, DUET_ROLE_PREFILL, ids, 64, loads, 2, &cur, &why, NULL);
    /* 16 of 64 tokens shared = 0.25 < 0.3: least load, not the prefix */
    prompt(ids, 64, 16, 2);
    loads[home] = 1;
    route(ca, DUET_ROLE_PREFILL, ids, 64, loads, 2, &cur, &why, &matched);
    assert_int_equal(why, DUET_ROUTER_CA_LOAD);
    /* 24 of 64 = 0.375: the prefix */
    prompt(ids, 64, 16, 1);
    prompt(ids + 24, 40, 0, 99);
    loads[home] = 0;
    loads[!home] = 1;
    assert_int_equal(route(ca, DUET_ROLE_PREFILL, ids, 64, loads, 2, &cur, &why, &matched), home);
    assert_int_equal(why, DUET_ROUTER_CA_PREFIX);
    assert_int_equal(matched, 24);
    /* the home slot now holds a new instance: nothing matches there */
    prompt(ids, 64, 16, 1);
    assert_int_equal(duet_router_cache_keys(ids, 64, PS, &keys, &key.n_keys), DUET_OK);
    key.keys = keys;
    key.n_tokens = 64;
    inst[home] = 2;
    c[home].load = 0;
    c[!home].load = 1;
    duet_router_cache_aware_choose(ca, DUET_ROLE_PREFILL, c, inst, 2, &key, &cur, &ch);
    assert_int_equal(ch.reason, DUET_ROUTER_CA_LOAD);
    assert_int_equal(ch.idx, home); /* the least loaded */
    assert_int_equal(duet_router_cache_aware_commit(ca, DUET_ROLE_PREFILL, &ch, 2, &key), 0);
    duet_router_ca_stats_t st;
    duet_router_cache_aware_stats(ca, DUET_ROLE_PREFILL, home, &st);
    assert_int_equal(st.routed[DUET_ROUTER_CA_PREFIX], 0); /* counts start over */
    assert_int_equal(st.tree_tokens, 64);
    duet_free(keys);
    duet_router_cache_aware_destroy(ca);
}

/* Generated tokens (docs/kv-aware-routing.md "Generated tokens"): the
 * output of a request is recorded on its decode, all but its last token
 * (whose KV the decode never computed), so the next turn of the
 * conversation (prompt + output + new text) matches through the output's
 * pages. */
static void test_record_output(void **state)
{
    duet_router_cache_aware_config_t cfg = cfg_default();
    duet_router_cache_aware_t *ca;
    duet_router_ca_tokens_t t;
    duet_router_ca_stats_t st;
    duet_router_ca_reason_t why;
    double loads[2] = {0, 0};
    int32_t turn2[24], out[9];
    uint64_t cur = 0;
    size_t matched;
    long live = duet_alloc_live();
    (void)state;
    assert_int_equal(duet_router_cache_aware_create(&cfg, PS, &ca), DUET_OK);
    prompt(turn2, 24, 0, 5);
    memcpy(out, turn2 + 10, sizeof(out));
    /* turn 1: a 10-token prompt (2 full pages) routed to `home` */
    int home = route(ca, DUET_ROLE_DECODE, turn2, 10, loads, 2, &cur, &why, &matched);
    assert_true(home >= 0);
    assert_int_equal(duet_router_ca_tokens_init(&t, turn2, 10), DUET_OK);
    duet_router_ca_tokens_append(&t, out, 1); /* one output token: no page past the prompt's */
    duet_router_cache_aware_record_output(ca, DUET_ROLE_DECODE, home, 1, &t);
    duet_router_cache_aware_stats(ca, DUET_ROLE_DECODE, home, &st);
    assert_int_equal(st.output_tokens, 0);
    assert_int_equal(st.tree_tokens, 2 * PS);
    duet_router_ca_tokens_append(&t, out + 1, 3);
    duet_router_ca_tokens_append(&t, out + 4, 5); /* 9 output tokens, in chunks */
    assert_int_equal(t.n, 19);
    /* a slot holding another instance now: nothing recorded */
    duet_router_cache_aware_record_output(ca, DUET_ROLE_DECODE, home, 2, &t);
    duet_router_cache_aware_record_output(ca, DUET_ROLE_DECODE, !home, 1, &t); /* no index */
    duet_router_cache_aware_stats(ca, DUET_ROLE_DECODE, home, &st);
    assert_int_equal(st.output_tokens, 0);
    duet_router_cache_aware_record_output(ca, DUET_ROLE_DECODE, home, 1, &t);
    duet_router_cache_aware_stats(ca, DUET_ROLE_DECODE, home, &st);
    assert_int_equal(st.output_tokens, 8); /* 18 tokens with KV: 4 full pages */
    assert_int_equal(st.tree_tokens, 4 * PS);
    /* turn 2 = prompt + output + 5 new tokens: 16 tokens matched (4 pages,
     * not the 5th: it holds the last output token), so it stays home even
     * though home is the busier one */
    loads[home] = 2;
    assert_int_equal(route(ca, DUET_ROLE_DECODE, turn2, 24, loads, 2, &cur, &why, &matched), home);
    assert_int_equal(why, DUET_ROUTER_CA_PREFIX);
    assert_int_equal(matched, 4 * PS);
    /* the prefill role never saw it */
    duet_router_cache_aware_stats(ca, DUET_ROLE_PREFILL, home, &st);
    assert_int_equal(st.tree_tokens, 0);
    duet_router_ca_tokens_free(&t);
    duet_router_ca_tokens_free(&t); /* zeroed: fine */
    /* out of memory while the output grows: what it holds is still a
     * prefix, and nothing leaks */
    for (long fail = 0; fail < 3; fail++) {
        assert_int_equal(duet_router_ca_tokens_init(&t, turn2, 10), DUET_OK);
        duet_alloc_fail_after(fail);
        for (int i = 0; i < 40; i++)
            duet_router_ca_tokens_append(&t, out, 9);
        duet_alloc_fail_after(-1);
        assert_true(t.n >= 10 && t.n <= t.cap && memcmp(t.ids, turn2, 10 * sizeof(int32_t)) == 0);
        duet_router_cache_aware_record_output(ca, DUET_ROLE_DECODE, home, 1, &t);
        duet_router_ca_tokens_free(&t);
    }
    duet_router_cache_aware_destroy(ca);
    assert_int_equal(duet_alloc_live(), live);
}

typedef struct {
    duet_router_cache_aware_t *ca;
    uint32_t seed;
    int wrong;
} worker_arg_t;

static void *worker(void *p)
{
    worker_arg_t *a = p;
    double loads[4] = {0, 0, 0, 0};
    int32_t ids[96];
    uint64_t cur = a->seed;
    int home = -1;
    for (int r = 0; r < 2000; r++) {
        duet_router_ca_reason_t why;
        prompt(ids, 96, 0, a->seed); /* this thread's own 64-token prefix ... */
        prompt(ids + 64, 32, 0, a->seed * 1000 + (uint32_t)r);
        int i = route(a->ca, DUET_ROLE_DECODE, ids, 96, loads, 4, &cur, &why, NULL);
        if (home < 0)
            home = i;
        else if (i != home || why != DUET_ROUTER_CA_PREFIX)
            a->wrong++;
    }
    return NULL;
}

/* Threads routing at once: the structure stays consistent (ASan / the
 * counts), and each thread's prefix keeps its home. */
static void test_policy_threads(void **state)
{
    duet_router_cache_aware_config_t cfg = cfg_default();
    duet_router_cache_aware_t *ca;
    pthread_t t[4];
    worker_arg_t a[4];
    uint64_t total = 0;
    (void)state;
    cfg.max_tree_tokens = 1 << 20;
    assert_int_equal(duet_router_cache_aware_create(&cfg, PS, &ca), DUET_OK);
    for (int i = 0; i < 4; i++) {
        a[i] = (worker_arg_t){ca, 11 + (uint32_t)i, 0};
        assert_int_equal(pthread_create(&t[i], NULL, worker, &a[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(a[i].wrong, 0);
    }
    for (int i = 0; i < 4; i++) {
        duet_router_ca_stats_t st;
        duet_router_cache_aware_stats(ca, DUET_ROLE_DECODE, i, &st);
        for (int r = 0; r < DUET_ROUTER_CA_N_REASONS; r++)
            total += st.routed[r];
    }
    assert_int_equal(total, 4 * 2000);
    duet_router_cache_aware_destroy(ca);
}

static void config_rejects(const char *text, const char *needle)
{
    duet_cluster_config_t *cfg = NULL;
    long live = duet_alloc_live();
    assert_int_equal(duet_cluster_parse(text, strlen(text), "test", NULL, &cfg), DUET_ERR_CONFIG);
    assert_null(cfg);
    if (strstr(duet_error_msg(), needle) == NULL)
        fail_msg("message '%s' lacks '%s'", duet_error_msg(), needle);
    assert_int_equal(duet_alloc_live(), live);
}

static void test_config(void **state)
{
    duet_cluster_config_t *cfg;
    const char *dflt = "{\"model\": \"m\"}";
    const char *set =
        "{\"model\": \"m\", \"router\": {\"policy\": \"cache_aware\", \"cache_aware\":"
        " {\"balance_abs_threshold\": 3, \"min_match_ratio\": 0.5,"
        " \"max_tree_tokens\": 4096}}}";
    (void)state;
    assert_int_equal(duet_cluster_parse(dflt, strlen(dflt), "test", NULL, &cfg), DUET_OK);
    assert_true(cfg->router.cache_aware.balance_abs_threshold == 16);
    assert_true(cfg->router.cache_aware.balance_rel_threshold == 1.5);
    assert_true(cfg->router.cache_aware.min_match_ratio == 0.3);
    assert_int_equal(cfg->router.cache_aware.max_tree_tokens, 1 << 21);
    duet_cluster_free(cfg);
    assert_int_equal(duet_cluster_parse(set, strlen(set), "test", NULL, &cfg), DUET_OK);
    assert_true(cfg->router.cache_aware.balance_abs_threshold == 3);
    assert_true(cfg->router.cache_aware.balance_rel_threshold == 1.5); /* default kept */
    assert_true(cfg->router.cache_aware.min_match_ratio == 0.5);
    assert_int_equal(cfg->router.cache_aware.max_tree_tokens, 4096);
    duet_cluster_free(cfg);
    config_rejects("{\"model\": \"m\", \"router\": {\"cache_aware\": {\"min_match_ratio\": 2}}}",
                   "router.cache_aware.min_match_ratio: 2 is out of range 0..1");
    config_rejects("{\"model\": \"m\", \"router\": {\"cache_aware\": {\"balance_rel\": 2}}}",
                   "router.cache_aware.balance_rel");
    config_rejects("{\"model\": \"m\", \"router\": {\"cache_aware\": true}}",
                   "router.cache_aware: expected an object");
    config_rejects(
        "{\"model\": \"m\", \"router\": {\"cache_aware\": {\"balance_rel_threshold\": 0.5}}}",
        "router.cache_aware.balance_rel_threshold: 0.5 is out of range");
    config_rejects("{\"model\": \"m\", \"router\": {\"cache_aware\": {\"max_tree_tokens\": 1.5}}}",
                   "router.cache_aware.max_tree_tokens: 1.5 is not an integer");
}

/* The router refuses a cap below one page, naming the key. */
static void test_router_cap(void **state)
{
    char path[64];
    const char *text = "{\"model\": \"x\", \"kv\": {\"page_size\": 16}, \"router\": {\"policy\": "
                       "\"cache_aware\", \"cache_aware\": {\"max_tree_tokens\": 8}}}";
    duet_router_options_t opt;
    duet_router_t *rt = NULL;
    long live = duet_alloc_live();
    int fd;
    (void)state;
    snprintf(path, sizeof(path), "/tmp/duet-test-cache-XXXXXX");
    fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    duet_router_options_init(&opt);
    opt.config_path = path;
    assert_int_equal(duet_router_create(&opt, &rt), DUET_ERR_CONFIG);
    unlink(path);
    assert_null(rt);
    if (strstr(duet_error_msg(),
               "router.cache_aware.max_tree_tokens: 8 is less than one KV page") == NULL)
        fail_msg("message: %s", duet_error_msg());
    assert_int_equal(duet_alloc_live(), live);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keys),
        cmocka_unit_test(test_index_match),
        cmocka_unit_test(test_index_eviction),
        cmocka_unit_test(test_index_no_memory),
        cmocka_unit_test(test_policy_prefix),
        cmocka_unit_test(test_policy_balance),
        cmocka_unit_test(test_policy_min_ratio_and_restart),
        cmocka_unit_test(test_record_output),
        cmocka_unit_test(test_policy_threads),
        cmocka_unit_test(test_config),
        cmocka_unit_test(test_router_cap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
