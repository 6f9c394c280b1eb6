/* KV page pool: all-or-nothing, contiguous when it can be, no double
 * free, counts return to the baseline; shared pages are freed only with
 * their last reference. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "kv/pool.h"

static void test_page_alloc(void **state)
{
    (void)state;
    duet_kv_pool_t *pa;
    int32_t a[8], b[8], c[16];

    assert_int_equal(duet_kv_pool_create(16, &pa), DUET_OK);
    assert_int_equal(duet_kv_pool_alloc(pa, 5, a), DUET_OK);
    for (int i = 0; i < 5; i++)
        assert_int_equal(a[i], i);
    assert_int_equal(duet_kv_pool_alloc(pa, 8, b), DUET_OK);
    assert_int_equal(b[0], 5);
    assert_int_equal(duet_kv_pool_free_count(pa), 3);
    /* too many: nothing taken */
    assert_int_equal(duet_kv_pool_alloc(pa, 4, c), DUET_ERR_EXHAUSTED);
    assert_int_equal(duet_kv_pool_free_count(pa), 3);
    /* fragmented: free pages 0..4, take 6 of 8 free -> not contiguous */
    assert_int_equal(duet_kv_pool_release(pa, a, 5), 5);
    assert_int_equal(duet_kv_pool_alloc(pa, 6, c), DUET_OK);
    for (int i = 0; i < 6; i++) {
        for (int j = 0; j < 8; j++)
            assert_int_not_equal(c[i], b[j]);
    }
    /* double free is refused and counted out */
    assert_int_equal(duet_kv_pool_release(pa, c, 6), 6);
    assert_int_equal(duet_kv_pool_release(pa, c, 1), 0);
    int32_t bad = 99;
    assert_int_equal(duet_kv_pool_release(pa, &bad, 1), 0);
    assert_int_equal(duet_kv_pool_release(pa, b, 8), 8);
    assert_int_equal(duet_kv_pool_free_count(pa), 16);
    assert_int_equal(duet_kv_pool_total(pa), 16);
    duet_kv_pool_destroy(pa);
    assert_int_equal(duet_kv_pool_create(0, &pa), DUET_ERR_INVALID);
}

/* A page shared by two owners stays held until both released it; ref on a
 * free or foreign page changes nothing. */
static void test_refcounts(void **state)
{
    (void)state;
    duet_kv_pool_t *pool;
    int32_t a[4], b[4];

    assert_int_equal(duet_kv_pool_create(8, &pool), DUET_OK);
    assert_int_equal(duet_kv_pool_alloc(pool, 4, a), DUET_OK);
    assert_int_equal(duet_kv_pool_refs(pool, a[0]), 1);
    /* a second owner shares the first two pages */
    assert_int_equal(duet_kv_pool_ref(pool, a, 2), DUET_OK);
    assert_int_equal(duet_kv_pool_refs(pool, a[1]), 2);
    assert_int_equal(duet_kv_pool_refs(pool, a[2]), 1);
    /* the first owner lets go of all four: only the unshared two are free */
    assert_int_equal(duet_kv_pool_release(pool, a, 4), 2);
    assert_int_equal(duet_kv_pool_free_count(pool), 6);
    assert_int_equal(duet_kv_pool_refs(pool, a[0]), 1);
    assert_int_equal(duet_kv_pool_refs(pool, a[3]), 0);
    /* a new allocation never hands out a page that is still shared */
    assert_int_equal(duet_kv_pool_alloc(pool, 4, b), DUET_OK);
    for (int i = 0; i < 4; i++)
        assert_true(b[i] != a[0] && b[i] != a[1]);
    /* ref is all-or-nothing: a free page in the list changes no count */
    assert_int_equal(duet_kv_pool_refs(pool, a[2]), 0); /* b took pages 4..7 */
    int32_t mixed[2] = {a[0], a[2]};
    assert_int_equal(duet_kv_pool_ref(pool, mixed, 2), DUET_ERR_INVALID);
    assert_int_equal(duet_kv_pool_refs(pool, a[0]), 1);
    int32_t out_of_range = 8;
    assert_int_equal(duet_kv_pool_ref(pool, &out_of_range, 1), DUET_ERR_INVALID);
    assert_int_equal(duet_kv_pool_refs(pool, 8), -1);
    /* the second owner releases: everything is back */
    assert_int_equal(duet_kv_pool_release(pool, a, 2), 2);
    assert_int_equal(duet_kv_pool_release(pool, b, 4), 4);
    assert_int_equal(duet_kv_pool_free_count(pool), 8);
    duet_kv_pool_destroy(pool);
}

/* A run is consecutive or nothing: fragmentation refuses it while scattered
 * pages would still be free. */
static void test_runs(void **state)
{
    (void)state;
    duet_kv_pool_t *pool;
    int32_t a[8], first;

    assert_int_equal(duet_kv_pool_create(8, &pool), DUET_OK);
    assert_int_equal(duet_kv_pool_alloc_run(pool, 3, &first), DUET_OK);
    assert_int_equal(first, 0);
    assert_int_equal(duet_kv_pool_alloc(pool, 5, a), DUET_OK); /* pages 3..7 */
    int32_t holes[2] = {4, 6};
    assert_int_equal(duet_kv_pool_release(pool, holes, 2), 2);
    assert_int_equal(duet_kv_pool_alloc_run(pool, 2, &first), DUET_ERR_EXHAUSTED);
    assert_int_equal(duet_kv_pool_free_count(pool), 2);
    int32_t five = 5;
    assert_int_equal(duet_kv_pool_release(pool, &five, 1), 1);
    assert_int_equal(duet_kv_pool_alloc_run(pool, 3, &first), DUET_OK);
    assert_int_equal(first, 4);
    assert_int_equal(duet_kv_pool_free_count(pool), 0);
    assert_int_equal(duet_kv_pool_alloc_run(pool, 0, &first), DUET_ERR_INVALID);
    /* a run goes back in one call; a page already free in it is refused */
    assert_int_equal(duet_kv_pool_release_run(pool, 4, 3), 3);
    assert_int_equal(duet_kv_pool_release_run(pool, 5, 2), 0);
    assert_int_equal(duet_kv_pool_free_count(pool), 3);
    duet_kv_pool_destroy(pool);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_page_alloc),
                                       cmocka_unit_test(test_refcounts),
                                       cmocka_unit_test(test_runs)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
