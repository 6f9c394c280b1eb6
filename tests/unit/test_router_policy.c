/* Worker selection policies (their names, the router's check of
 * router.policy, the picks) and the load score, and the metrics' histogram
 * placement and Prometheus rendering. */
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
#include "router/base/metrics.h"
#include "router/fleet/policy.h"
#include "router/router.h"

static void test_parse(void **state)
{
    (void)state;
    assert_int_equal(duet_router_policy_parse("round_robin"), DUET_ROUTER_POLICY_ROUND_ROBIN);
    assert_int_equal(duet_router_policy_parse("least_load"), DUET_ROUTER_POLICY_LEAST_LOAD);
    assert_int_equal(duet_router_policy_parse("power_of_two"), DUET_ROUTER_POLICY_POWER_OF_TWO);
    assert_int_equal(duet_router_policy_parse("random"), -1);
    for (int p = 0; p < DUET_ROUTER_N_POLICIES; p++)
        assert_int_equal(duet_router_policy_parse(duet_router_policy_name(p)), p);
}

/* A config file holding `text`; its path in path (cap bytes). */
static void write_config(const char *text, char *path, size_t cap)
{
    int fd;
    snprintf(path, cap, "/tmp/duet-test-policy-XXXXXX");
    fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
}

static void router_rejects(const char *config, const char *policy_flag, const char *needle)
{
    char path[64];
    duet_router_options_t opt;
    duet_router_t *rt = NULL;
    long live = duet_alloc_live();
    write_config(config, path, sizeof(path));
    duet_router_options_init(&opt);
    opt.config_path = path;
    opt.policy = policy_flag;
    assert_int_equal(duet_router_create(&opt, &rt), DUET_ERR_CONFIG);
    unlink(path);
    assert_null(rt);
    if (strstr(duet_error_msg(), needle) == NULL)
        fail_msg("message '%s' lacks '%s'", duet_error_msg(), needle);
    assert_int_equal(duet_alloc_live(), live);
}

/* The cluster config keeps router.policy a string; the router checks it at
 * start-up (and so in --check-config, which is a start-up that stops). */
static void test_config_policy(void **state)
{
    duet_router_policy_t p = DUET_ROUTER_POLICY_LEAST_LOAD;
    char names[128];
    (void)state;
    router_rejects("{\"model\": \"x\", \"router\": {\"policy\": \"random\"}}", NULL,
                   "router.policy: 'random' is not round_robin, least_load, power_of_two or "
                   "cache_aware");
    router_rejects("{\"model\": \"x\"}", "fastest", "router.policy: 'fastest' is not");
    assert_int_equal(duet_router_policy_check("power_of_two", "k", &p), DUET_OK);
    assert_int_equal(p, DUET_ROUTER_POLICY_POWER_OF_TWO);
    assert_int_equal(duet_router_policy_check("Round_Robin", "k", &p), DUET_ERR_CONFIG);
    assert_int_equal(p, DUET_ROUTER_POLICY_POWER_OF_TWO);
    duet_router_policy_list(names, sizeof(names), " | ", " | ");
    assert_string_equal(names, "round_robin | least_load | power_of_two | cache_aware");
    duet_router_policy_list(names, 12, ", ", " or ");
    assert_string_equal(names, "round_robin");
}

static void test_none_eligible(void **state)
{
    duet_router_cand_t c[3] = {{false, 0}, {false, 0}, {false, 0}};
    uint64_t cur = 0, rnd = 1;
    (void)state;
    for (int p = 0; p < DUET_ROUTER_N_POLICIES; p++) {
        assert_int_equal(duet_router_policy_pick(p, c, 3, &cur, &rnd), -1);
        assert_int_equal(duet_router_policy_pick(p, c, 0, &cur, &rnd), -1);
    }
}

static void test_round_robin(void **state)
{
    duet_router_cand_t c[4] = {{true, 9}, {false, 0}, {true, 0}, {true, 5}};
    uint64_t cur = 0, rnd = 1;
    int counts[4] = {0};
    (void)state;
    /* each eligible one in turn, whatever the load; the ineligible never */
    int seq[8];
    for (int i = 0; i < 8; i++) {
        seq[i] = duet_router_policy_pick(DUET_ROUTER_POLICY_ROUND_ROBIN, c, 4, &cur, &rnd);
        counts[seq[i]]++;
    }
    assert_int_equal(counts[1], 0);
    assert_true(counts[0] >= 2 && counts[2] >= 2 && counts[3] >= 2);
    for (int i = 1; i < 8; i++) /* never the same one twice in a row */
        assert_int_not_equal(seq[i], seq[i - 1]);
    /* all eligible: exactly cyclic */
    duet_router_cand_t d[3] = {{true, 0}, {true, 0}, {true, 0}};
    cur = 0;
    for (int i = 0; i < 9; i++)
        assert_int_equal(duet_router_policy_pick(DUET_ROUTER_POLICY_ROUND_ROBIN, d, 3, &cur, &rnd),
                         i % 3);
}

static void test_least_load(void **state)
{
    duet_router_cand_t c[4] = {{true, 3}, {true, 1}, {false, 0}, {true, 2}};
    uint64_t cur = 0, rnd = 1;
    int counts[4] = {0};
    (void)state;
    for (int i = 0; i < 10; i++)
        assert_int_equal(duet_router_policy_pick(DUET_ROUTER_POLICY_LEAST_LOAD, c, 4, &cur, &rnd),
                         1);
    /* ties are shared, not always the first */
    duet_router_cand_t t[3] = {{true, 1}, {true, 1}, {true, 1}};
    for (int i = 0; i < 30; i++)
        counts[duet_router_policy_pick(DUET_ROUTER_POLICY_LEAST_LOAD, t, 3, &cur, &rnd)]++;
    assert_int_equal(counts[0], 10);
    assert_int_equal(counts[1], 10);
    assert_int_equal(counts[2], 10);
}

static void test_power_of_two(void **state)
{
    uint64_t cur = 0, rnd = 12345;
    int counts[5] = {0};
    (void)state;
    /* two eligible: both are drawn every time, the lighter one wins */
    duet_router_cand_t two[3] = {{true, 5}, {false, 0}, {true, 1}};
    for (int i = 0; i < 100; i++)
        assert_int_equal(
            duet_router_policy_pick(DUET_ROUTER_POLICY_POWER_OF_TWO, two, 3, &cur, &rnd), 2);
    /* one eligible */
    duet_router_cand_t one[2] = {{false, 0}, {true, 7}};
    assert_int_equal(duet_router_policy_pick(DUET_ROUTER_POLICY_POWER_OF_TWO, one, 2, &cur, &rnd),
                     1);
    /* five: the heaviest never wins (it always meets a lighter one), the
     * lightest wins whenever drawn (2 of 5 draws: ~40%), every other
     * eligible one sometimes */
    duet_router_cand_t five[5] = {{true, 4}, {true, 0}, {true, 2}, {true, 1}, {true, 3}};
    for (int i = 0; i < 5000; i++)
        counts[duet_router_policy_pick(DUET_ROUTER_POLICY_POWER_OF_TWO, five, 5, &cur, &rnd)]++;
    assert_int_equal(counts[0], 0);
    assert_true(counts[1] > 1700 && counts[1] < 2300);
    assert_true(counts[2] > 0 && counts[3] > 0 && counts[4] > 0);
    assert_true(counts[3] > counts[2] && counts[2] > counts[4]);
}

static void test_load_score(void **state)
{
    (void)state;
    /* busy work counts; this router's in-flight count replaces a stale
     * report when larger; page pressure adds up to 2 */
    assert_true(duet_router_load_score(0, 0, 100, 100, 0) == 0.0);
    assert_true(duet_router_load_score(2, 3, 100, 100, 0) == 5.0);
    assert_true(duet_router_load_score(2, 3, 100, 100, 7) == 7.0);
    assert_true(duet_router_load_score(2, 3, 100, 100, 4) == 5.0);
    assert_true(duet_router_load_score(0, 0, 50, 100, 0) == 1.0);
    assert_true(duet_router_load_score(0, 0, 0, 100, 0) == 2.0);
    assert_true(duet_router_load_score(1, 0, 0, 0, 0) == 1.0); /* no page info */
    /* a pool 90% full weighs more than one request on an empty pool */
    assert_true(duet_router_load_score(0, 0, 10, 100, 0) >
                duet_router_load_score(0, 1, 100, 100, 0));
}

static void test_metrics(void **state)
{
    static duet_router_metrics_t m;
    duet_router_buf_t b;
    (void)state;

    duet_router_metrics_init(&m);
    duet_router_hist_observe(&m.ttft, 300000);       /* 0.3 ms -> le 0.0005 */
    duet_router_hist_observe(&m.ttft, 20000000);     /* 20 ms -> le 0.025 */
    duet_router_hist_observe(&m.ttft, 120000000000); /* 120 s -> +Inf only */
    duet_router_metrics_http(&m, DUET_ROUTER_ROUTE_COMPLETIONS, 200);
    duet_router_metrics_http(&m, DUET_ROUTER_ROUTE_COMPLETIONS, 200);
    duet_router_metrics_http(&m, DUET_ROUTER_ROUTE_COMPLETIONS, 429);
    duet_router_metrics_http(&m, DUET_ROUTER_ROUTE_OTHER, 418);
    duet_router_metrics_grpc(&m, 14);
    duet_router_buf_init(&b);
    duet_router_metrics_render(&m, &b);
    const char *want[] = {
        "duet_router_http_requests_total{route=\"/v1/completions\",code=\"200\"} 2\n",
        "duet_router_http_requests_total{route=\"/v1/completions\",code=\"429\"} 1\n",
        "duet_router_http_requests_total{route=\"other\",code=\"other\"} 1\n",
        "duet_router_grpc_requests_total{code=\"UNAVAILABLE\"} 1\n",
        "duet_router_time_to_first_token_seconds_bucket{le=\"0.0005\"} 1\n",
        "duet_router_time_to_first_token_seconds_bucket{le=\"0.01\"} 1\n",
        "duet_router_time_to_first_token_seconds_bucket{le=\"0.025\"} 2\n",
        "duet_router_time_to_first_token_seconds_bucket{le=\"60\"} 2\n",
        "duet_router_time_to_first_token_seconds_bucket{le=\"+Inf\"} 3\n",
        "duet_router_time_to_first_token_seconds_count 3\n",
        "duet_router_time_to_first_token_seconds_sum 120.020300000\n",
        "# TYPE duet_router_inter_token_latency_seconds histogram\n",
        "duet_router_inter_token_latency_seconds_count 0\n",
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
        if (strstr(b.data, want[i]) == NULL)
            fail_msg("missing: %s in\n%s", want[i], b.data);
    duet_router_buf_cleanup(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse),        cmocka_unit_test(test_none_eligible),
        cmocka_unit_test(test_round_robin),  cmocka_unit_test(test_least_load),
        cmocka_unit_test(test_power_of_two), cmocka_unit_test(test_load_score),
        cmocka_unit_test(test_metrics),      cmocka_unit_test(test_config_policy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
