/* Regressions for what the fuzz harnesses (fuzz/) found, one test per
 * finding, each named after the harness; the inputs themselves are in
 * fuzz/corpus/<harness>/regress-*.  These run in the ASan/UBSan unit build
 * too, where the undefined behaviour of the old code is a crash. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "common/alloc.h"
#include "router/chat_template.h"

/* fuzz_chat_template: an integer literal past INT64_MAX overflowed while
 * being read (signed overflow); now a compile error naming it. */
static void test_chat_template_int_literal(void **state)
{
    duet_router_chat_tmpl_t *t = NULL;
    duet_router_chat_vars_t v = {NULL, 0, "", "", false};
    char *out = NULL;
    size_t len = 0;
    long live = duet_alloc_live();
    (void)state;

    assert_int_equal(duet_router_chat_tmpl_compile("{{ 55555555555555555555 }}", &t),
                     DUET_ERR_FORMAT);
    assert_non_null(strstr(duet_error_msg(), "integer literal out of range"));
    assert_int_equal(duet_router_chat_tmpl_compile("{{ 9223372036854775808 }}", &t),
                     DUET_ERR_FORMAT);
    /* the largest one still reads */
    assert_int_equal(duet_router_chat_tmpl_compile("{{ 9223372036854775807 }}", &t), DUET_OK);
    assert_int_equal(duet_router_chat_tmpl_render(t, &v, &out, &len), DUET_OK);
    assert_string_equal(out, "9223372036854775807");
    duet_free(out);
    duet_router_chat_tmpl_destroy(t);
    assert_int_equal(duet_alloc_live(), live);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chat_template_int_literal),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
