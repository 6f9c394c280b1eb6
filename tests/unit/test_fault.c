/* common/fault.h: named fault points armed from DUET_FAULTS (read once, at
 * the first query) and in-process, the spec's parsing (a bad spec arms
 * nothing), counted points, and the compiled-out constants (fault_off.c is
 * this program's second file, compiled with DUET_FAULT_INJECTION 0 whatever
 * the build says). */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/fault.h"
#include "common/status.h"

/* fault_off.c */
int fault_off_check(const char **why_p);

#if DUET_FAULT_INJECTION

/* First test to run: nothing has queried a point yet, so DUET_FAULTS set
 * here is what the first query reads; setting it later changes nothing. */
static void test_env_read_once(void **state)
{
    (void)state;
    setenv("DUET_FAULTS", "prefill.delay_ms=250,,decode.kv_copy_fail", 1);
    assert_int_equal(duet_fault_init_from_env(), DUET_OK);
    assert_int_equal(duet_fault_value("prefill.delay_ms", 0), 250);
    assert_true(duet_fault("prefill.delay_ms"));
    assert_int_equal(duet_fault_value("decode.kv_copy_fail", 0), 1); /* a bare name: 1 */
    assert_true(duet_fault("decode.kv_copy_fail"));
    assert_false(duet_fault("decode.step_delay_ms"));
    assert_int_equal(duet_fault_value("decode.step_delay_ms", -7), -7);
    setenv("DUET_FAULTS", "decode.step_delay_ms=5", 1);
    assert_int_equal(duet_fault_init_from_env(), DUET_OK);
    assert_false(duet_fault("decode.step_delay_ms"));
    unsetenv("DUET_FAULTS");
    duet_fault_reset();
    assert_false(duet_fault("prefill.delay_ms"));
    assert_int_equal(duet_fault_value("prefill.delay_ms", 0), 0);
}

static void test_arm_disarm(void **state)
{
    (void)state;
    duet_fault_reset();
    assert_false(duet_fault("comm.fail_after"));
    assert_int_equal(duet_fault_value("comm.fail_after", -1), -1);
    assert_int_equal(duet_fault_arm("comm.fail_after", 0), DUET_OK);
    /* armed with 0: a value, but not a true switch */
    assert_int_equal(duet_fault_value("comm.fail_after", -1), 0);
    assert_false(duet_fault("comm.fail_after"));
    assert_int_equal(duet_fault_arm("comm.fail_after", 40), DUET_OK);
    assert_int_equal(duet_fault_value("comm.fail_after", -1), 40);
    assert_true(duet_fault("comm.fail_after"));
    assert_int_equal(duet_fault_disarm("comm.fail_after"), DUET_OK);
    assert_int_equal(duet_fault_value("comm.fail_after", -1), -1);
    /* names outside the table: refused to arm, never armed */
    assert_int_equal(duet_fault_arm("comm.fail_aftr", 1), DUET_ERR_NOT_FOUND);
    assert_non_null(strstr(duet_error_msg(), "comm.fail_aftr"));
    assert_int_equal(duet_fault_disarm("nope"), DUET_ERR_NOT_FOUND);
    assert_false(duet_fault("comm.fail_aftr"));
    assert_int_equal(duet_fault_value("", 3), 3);
}

static void test_spec(void **state)
{
    (void)state;
    static const struct {
        const char *spec, *error;
    } bad[] = {
        {"nope=1", "unknown fault point \"nope\""},
        {"prefill.delay_ms=1500,nope", "unknown fault point \"nope\""},
        {"prefill.delay_ms=", "prefill.delay_ms: bad value"},
        {"prefill.delay_ms=15x", "bad value \"15x\""},
        {"prefill.delay_ms=99999999999999999999999", "bad value"},
        {"prefill.delay_ms = 5", "unknown fault point"},
    };
    duet_fault_reset();
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_equal(duet_fault_load(bad[i].spec), DUET_ERR_INVALID);
        assert_non_null(strstr(duet_error_msg(), bad[i].error));
        /* nothing of a bad spec is armed, not even its good entries */
        assert_false(duet_fault("prefill.delay_ms"));
    }
    assert_int_equal(duet_fault_load(""), DUET_OK);
    assert_false(duet_fault("prefill.delay_ms"));
    assert_int_equal(duet_fault_load(",prefill.delay_ms=1,decode.step_delay_ms=-3,"
                                     "prefill.delay_ms=2"),
                     DUET_OK);
    assert_int_equal(duet_fault_value("prefill.delay_ms", 0), 2); /* the last one wins */
    assert_int_equal(duet_fault_value("decode.step_delay_ms", 0), -3);
    duet_fault_reset();
}

static void test_count(void **state)
{
    (void)state;
    duet_fault_count_t c;
    duet_fault_reset();
    duet_fault_count_init(&c, "xfer.corrupt_put");
    for (int i = 0; i < 10; i++)
        assert_false(duet_fault_count_hit(&c)); /* disarmed */
    assert_int_equal(duet_fault_count_arm(&c, 2), DUET_OK);
    assert_false(duet_fault_count_hit(&c));
    assert_false(duet_fault_count_hit(&c));
    assert_true(duet_fault_count_hit(&c)); /* the third event from arming */
    for (int i = 0; i < 10; i++)
        assert_false(duet_fault_count_hit(&c)); /* once */
    assert_int_equal(duet_fault_count_arm(&c, 0), DUET_OK);
    assert_int_equal(duet_fault_count_arm(&c, -5), DUET_OK); /* disarms */
    assert_false(duet_fault_count_hit(&c));
    /* a counter made while its point is armed starts armed */
    assert_int_equal(duet_fault_arm("xfer.corrupt_put", 1), DUET_OK);
    duet_fault_count_init(&c, "xfer.corrupt_put");
    assert_false(duet_fault_count_hit(&c));
    assert_true(duet_fault_count_hit(&c));
    duet_fault_reset();
}

#else /* this build has no fault points: what the product sees */

static void test_compiled_out(void **state)
{
    (void)state;
    duet_fault_count_t c;
    setenv("DUET_FAULTS", "prefill.delay_ms=250", 1);
    assert_int_equal(duet_fault_init_from_env(), DUET_OK); /* ignored, with a warning */
    assert_false(duet_fault("prefill.delay_ms"));
    assert_int_equal(duet_fault_value("prefill.delay_ms", 0), 0);
    assert_int_equal(duet_fault_arm("prefill.delay_ms", 1), DUET_ERR_UNSUPPORTED);
    assert_int_equal(duet_fault_load("prefill.delay_ms=1"), DUET_ERR_UNSUPPORTED);
    assert_int_equal(duet_fault_load(""), DUET_OK);
    duet_fault_count_init(&c, "xfer.corrupt_put");
    assert_int_equal(duet_fault_count_arm(&c, 0), DUET_ERR_UNSUPPORTED);
    assert_int_equal(duet_fault_count_arm(&c, -1), DUET_OK);
    assert_false(duet_fault_count_hit(&c));
    unsetenv("DUET_FAULTS");
}

#endif

/* The header's compiled-out constants, whatever this build is. */
static void test_header_off(void **state)
{
    (void)state;
    const char *why = NULL;
    int rc = fault_off_check(&why);
    if (rc != 0)
        fail_msg("compiled out: %s", why);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
#if DUET_FAULT_INJECTION
        cmocka_unit_test(test_env_read_once),
        cmocka_unit_test(test_arm_disarm),
        cmocka_unit_test(test_spec),
        cmocka_unit_test(test_count),
#else
        cmocka_unit_test(test_compiled_out),
#endif
        cmocka_unit_test(test_header_off),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
