/* Overload is not failure (docs/migration.md "Overload"): the router's
 * estimate of a prefill's queue wait (router/fleet/workers.c
 * duet_router_workers_prefill_wait_ms) and the prefill's batch bound
 * (node/deadline.h duet_node_batch_tokens).  Both were found by the
 * overload run of bench/overload.py on a loaded machine: requests the
 * router had sent but a decode had not yet passed on to prefill were not
 * counted, so admission let in far more than the prefill could start in
 * time; and a 2048-token batch on a prefill measured at ~165 tokens/s took
 * longer than transfer.timeout_ms after its start, so decode timed its
 * transfers out and cut the link. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/alloc.h"
#include "common/cluster.h"
#include "node/deadline.h"
#include "router/fleet/workers_internal.h"

static const char duet__config[] =
    "{\"model\": \"x\", \"kv\": {\"page_size\": 16},"
    " \"transfer\": {\"timeout_ms\": 10000},"
    " \"prefill\": [{\"name\": \"p\", \"address\": \"127.0.0.1:1\"}],"
    " \"decode\": [{\"name\": \"d\", \"address\": \"127.0.0.1:2\"}]}";

typedef struct {
    duet_cluster_config_t *cfg;
    duet_router_workers_t *w;
} duet__fixture_t;

static int setup(void **state)
{
    duet__fixture_t *f = DUET_NEW(duet__fixture_t);
    duet_router_workers_config_t wc = {.policy = DUET_ROUTER_POLICY_LEAST_LOAD,
                                       .interval_ms = 1000};
    assert_non_null(f);
    assert_int_equal(
        duet_cluster_parse(duet__config, strlen(duet__config), "test", "/tmp", &f->cfg), DUET_OK);
    assert_int_equal(duet_router_workers_create(f->cfg, &wc, &f->w), DUET_OK);
    atomic_store(&duet__slot(f->w, DUET_ROLE_PREFILL, 0)->healthy, true);
    atomic_store(&duet__slot(f->w, DUET_ROLE_DECODE, 0)->healthy, true);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    duet__fixture_t *f = *state;
    duet_router_workers_destroy(f->w);
    duet_cluster_free(f->cfg);
    duet_free(f);
    return 0;
}

/* The prefill's Info as the health check stores it. */
static void info(duet_router_workers_t *w, uint64_t queue_tokens, double rate, uint32_t mean)
{
    duet__worker_t *wk = duet__slot(w, DUET_ROLE_PREFILL, 0);
    pthread_mutex_lock(&wk->lock);
    wk->have_info = true;
    wk->queue_tokens = queue_tokens;
    wk->tokens_per_s = rate;
    wk->prompt_mean = mean;
    pthread_mutex_unlock(&wk->lock);
    atomic_store(&wk->routed, 0);
}

static void test_wait_from_queue(void **state)
{
    duet__fixture_t *f = *state;
    duet__worker_t *wk = duet__slot(f->w, DUET_ROLE_PREFILL, 0);

    /* no rate measured yet: no limit */
    assert_int_equal(duet_router_workers_prefill_wait_ms(f->w), 0);
    /* 2000 tokens queued at 1000 tokens/s */
    info(f->w, 2000, 1000.0, 500);
    assert_int_equal(duet_router_workers_prefill_wait_ms(f->w), 2000);
    /* and two picked for it since that Info, 500 tokens each */
    atomic_store(&wk->routed, 2);
    atomic_store(&wk->inflight, 2);
    assert_int_equal(duet_router_workers_prefill_wait_ms(f->w), 3000);
}

static void test_wait_counts_ours_not_yet_queued(void **state)
{
    duet__fixture_t *f = *state;
    duet__worker_t *wk = duet__slot(f->w, DUET_ROLE_PREFILL, 0);

    /* prefill's queue is empty, but 20 of our requests on it have no
     * first token (waiting in a decode's queue, or recomputed there):
     * they are still ahead of a new one */
    info(f->w, 0, 165.0, 700);
    atomic_store(&wk->inflight, 20);
    int64_t est = duet_router_workers_prefill_wait_ms(f->w);
    assert_true(est >= 84000 && est <= 85000); /* 20 x 700 / 165 s */
    /* the queue's own count wins when it is the larger (other routers) */
    info(f->w, 100000, 1000.0, 700);
    assert_int_equal(duet_router_workers_prefill_wait_ms(f->w), 100000);
}

static void test_batch_tokens(void **state)
{
    duet__fixture_t *f = *state;
    const duet_cluster_config_t *c = f->cfg;

    assert_int_equal(c->transfer_timeout_ms, 10000);
    /* no rate yet, or a fast prefill: max_batch_tokens */
    assert_int_equal(duet_node_batch_tokens(c, 2048, 0.0), 2048);
    assert_int_equal(duet_node_batch_tokens(c, 2048, 100000.0), 2048);
    /* 165 tokens/s: a batch computes within 5 s (half the timeout) */
    assert_int_equal(duet_node_batch_tokens(c, 2048, 165.0), 825);
    /* very slow: at least one token (the first request always goes) */
    assert_int_equal(duet_node_batch_tokens(c, 2048, 0.1), 1);
    assert_int_equal(duet_node_batch_tokens(c, 0, 0.0), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_wait_from_queue, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wait_counts_ours_not_yet_queued, setup, teardown),
        cmocka_unit_test_setup_teardown(test_batch_tokens, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
