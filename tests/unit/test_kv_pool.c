/* KV page allocator: all-or-nothing, contiguous when it can be, no double
 * free, counts return to the baseline. */
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

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_page_alloc)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
