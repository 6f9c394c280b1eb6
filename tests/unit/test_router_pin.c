/* Pinned picks (router/fleet/workers_pin.c; docs/api-logprobs.md "Fork-style
 * sharing"): the choices 1..n-1 of a request take choice 0's worker only
 * while it is the same instance, in rotation, a local prefiller when
 * colocated, and not overloaded; never a slot that left the table.  A
 * worker table from a parsed cluster config, its checkers never started:
 * the test sets the slots' health, loads and instances itself. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/alloc.h"
#include "common/cluster.h"
#include "router/fleet/workers_internal.h"

static const char duet__config[] =
    "{\"model\": \"x\", \"kv\": {\"page_size\": 16},"
    " \"prefill\": [{\"name\": \"p\", \"address\": \"127.0.0.1:1\"}],"
    " \"decode\": [{\"name\": \"d0\", \"address\": \"127.0.0.1:2\"},"
    "              {\"name\": \"d1\", \"address\": \"127.0.0.1:3\","
    "               \"prefill_local\": \"always\"},"
    "              {\"name\": \"d2\", \"address\": \"127.0.0.1:4\"}]}";

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
    for (int i = 0; i < 3; i++) /* in rotation, idle */
        atomic_store(&duet__slot(f->w, DUET_ROLE_DECODE, (size_t)i)->healthy, true);
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

static duet_router_pin_t pin_of(duet_router_workers_t *w, int idx)
{
    duet_router_pin_t pin = {idx, duet_router_workers_instance(w, DUET_ROLE_DECODE, idx)};
    return pin;
}

static int pick(duet_router_workers_t *w, const duet_router_pin_t *pin, bool colocated)
{
    return duet_router_workers_pick_pinned(w, DUET_ROLE_DECODE, colocated, pin, 16.0, 1.5, NULL,
                                           NULL);
}

static int64_t inflight(duet_router_workers_t *w, int idx)
{
    return atomic_load(&duet__slot(w, DUET_ROLE_DECODE, (size_t)idx)->inflight);
}

static void test_pinned_taken(void **state)
{
    duet__fixture_t *f = *state;
    duet_router_pin_t pin = pin_of(f->w, 2);

    assert_int_equal(pick(f->w, &pin, false), 2);
    assert_int_equal(inflight(f->w, 2), 1);
    assert_int_equal(inflight(f->w, 0), 0);
    duet_router_workers_release(f->w, DUET_ROLE_DECODE, 2);
    assert_int_equal(inflight(f->w, 2), 0);
}

static void test_no_pin(void **state)
{
    duet__fixture_t *f = *state;
    duet_router_pin_t none = {-1, 0}, far = {64, 0};

    assert_int_equal(pick(f->w, NULL, false), -1);
    assert_int_equal(pick(f->w, &none, false), -1);
    assert_int_equal(pick(f->w, &far, false), -1);
}

/* A restarted daemon (its slot's instance bumped) has an empty cache. */
static void test_other_instance(void **state)
{
    duet__fixture_t *f = *state;
    duet_router_pin_t pin = pin_of(f->w, 0);

    atomic_fetch_add(&duet__slot(f->w, DUET_ROLE_DECODE, 0)->instance, 1);
    assert_int_equal(pick(f->w, &pin, false), -1);
    assert_int_equal(inflight(f->w, 0), 0);
    pin = pin_of(f->w, 0);
    assert_int_equal(pick(f->w, &pin, false), 0);
    duet_router_workers_release(f->w, DUET_ROLE_DECODE, 0);
}

/* Out of rotation (a failed check or draining) or leaving the table. */
static void test_not_in_rotation(void **state)
{
    duet__fixture_t *f = *state;
    duet__worker_t *wk = duet__slot(f->w, DUET_ROLE_DECODE, 0);
    duet_router_pin_t pin = pin_of(f->w, 0);

    atomic_store(&wk->healthy, false);
    assert_int_equal(pick(f->w, &pin, false), -1);
    atomic_store(&wk->healthy, true);
    atomic_store(&wk->state, DUET__LEAVING);
    assert_int_equal(pick(f->w, &pin, false), -1);
    atomic_store(&wk->state, DUET__ACTIVE);
    assert_int_equal(inflight(f->w, 0), 0);
}

/* Colocated (no healthy prefill): only a decode that prefills locally. */
static void test_colocated(void **state)
{
    duet__fixture_t *f = *state;
    duet_router_pin_t d0 = pin_of(f->w, 0), d1 = pin_of(f->w, 1);

    assert_int_equal(pick(f->w, &d0, true), -1);
    assert_int_equal(pick(f->w, &d1, true), 1);
    duet_router_workers_release(f->w, DUET_ROLE_DECODE, 1);
}

/* The load limit: taken within 16 of the least loaded eligible worker (or
 * within 1.5 x it); refused beyond both. */
static void test_overloaded(void **state)
{
    duet__fixture_t *f = *state;
    duet__worker_t *wk = duet__slot(f->w, DUET_ROLE_DECODE, 0);
    duet_router_pin_t pin = pin_of(f->w, 0);

    atomic_store(&wk->inflight, 16); /* load 16 vs 0: within 16 */
    assert_int_equal(pick(f->w, &pin, false), 0);
    assert_int_equal(inflight(f->w, 0), 17); /* 17 vs 0: beyond both */
    assert_int_equal(pick(f->w, &pin, false), -1);
    assert_int_equal(inflight(f->w, 0), 17);
    /* the others busy too: 17 is within 1.5 x 12 */
    atomic_store(&duet__slot(f->w, DUET_ROLE_DECODE, 1)->inflight, 12);
    atomic_store(&duet__slot(f->w, DUET_ROLE_DECODE, 2)->inflight, 12);
    assert_int_equal(pick(f->w, &pin, false), 0);
    /* an idle worker out of rotation does not count */
    atomic_store(&duet__slot(f->w, DUET_ROLE_DECODE, 2)->inflight, 0);
    atomic_store(&duet__slot(f->w, DUET_ROLE_DECODE, 2)->healthy, false);
    assert_int_equal(pick(f->w, &pin, false), 0);
    atomic_store(&wk->inflight, 0);
    atomic_store(&duet__slot(f->w, DUET_ROLE_DECODE, 1)->inflight, 0);
    atomic_store(&duet__slot(f->w, DUET_ROLE_DECODE, 2)->healthy, true);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_pinned_taken, setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_pin, setup, teardown),
        cmocka_unit_test_setup_teardown(test_other_instance, setup, teardown),
        cmocka_unit_test_setup_teardown(test_not_in_rotation, setup, teardown),
        cmocka_unit_test_setup_teardown(test_colocated, setup, teardown),
        cmocka_unit_test_setup_teardown(test_overloaded, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
