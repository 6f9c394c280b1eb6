/* The one KV-head ownership rule (kv/heads.h): allowed combinations, and
 * holders() agreeing with owned() for every allowed (H, tp) up to 64. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "kv/heads.h"

static void test_check(void **state)
{
    (void)state;
    assert_int_equal(duet_kv_heads_check(8, 4), DUET_OK);
    assert_int_equal(duet_kv_heads_check(2, 8), DUET_OK);
    assert_int_equal(duet_kv_heads_check(1, 64), DUET_OK);
    assert_int_equal(duet_kv_heads_check(6, 4), DUET_ERR_CONFIG);
    assert_non_null(strstr(duet_error_msg(), "num_key_value_heads 6 is not divisible by tp"));
    assert_int_equal(duet_kv_heads_check(4, 6), DUET_ERR_CONFIG);
    assert_non_null(strstr(duet_error_msg(), "tp is not a multiple of num_key_value_heads 4"));
    assert_int_equal(duet_kv_heads_check(4, 0), DUET_ERR_CONFIG);
    assert_int_equal(duet_kv_heads_check(4, DUET_TP_MAX + 1), DUET_ERR_CONFIG);
    assert_int_equal(duet_kv_heads_check(0, 2), DUET_ERR_CONFIG);
}

static void test_owned_and_holders_agree(void **state)
{
    (void)state;
    int checked = 0;
    for (int H = 1; H <= 16; H++) {
        for (int tp = 1; tp <= DUET_TP_MAX; tp++) {
            if (duet_kv_heads_check(H, tp) != DUET_OK)
                continue;
            int per_head[16] = {0};
            for (int r = 0; r < tp; r++) {
                int h0, n;
                duet_kv_heads_owned(H, tp, r, &h0, &n);
                assert_true(n >= 1 && h0 >= 0 && h0 + n <= H);
                for (int h = h0; h < h0 + n; h++)
                    per_head[h]++;
            }
            for (int h = 0; h < H; h++) {
                int r0, count = duet_kv_heads_holders(H, tp, h, &r0);
                assert_int_equal(count, per_head[h]);
                assert_int_equal(count, H >= tp ? 1 : tp / H);
                for (int r = 0; r < tp; r++) {
                    int h0, n;
                    duet_kv_heads_owned(H, tp, r, &h0, &n);
                    int holds = h >= h0 && h < h0 + n;
                    assert_int_equal(holds, r >= r0 && r < r0 + count);
                }
            }
            checked++;
        }
    }
    assert_true(checked > 50);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_check),
                                       cmocka_unit_test(test_owned_and_holders_agree)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
