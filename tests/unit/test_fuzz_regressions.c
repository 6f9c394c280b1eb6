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

static char *render_ok(const char *src)
{
    duet_router_chat_tmpl_t *t = NULL;
    duet_router_chat_vars_t v = {NULL, 0, "", "", false};
    char *out = NULL;
    size_t len = 0;

    assert_int_equal(duet_router_chat_tmpl_compile(src, &t), DUET_OK);
    duet_status_t st = duet_router_chat_tmpl_render(t, &v, &out, &len);
    duet_router_chat_tmpl_destroy(t);
    if (st != DUET_OK)
        fail_msg("%s: %s (%s)", src, duet_status_name(st), duet_error_msg());
    return out;
}

static void render_fails(const char *src, const char *why)
{
    duet_router_chat_tmpl_t *t = NULL;
    duet_router_chat_vars_t v = {NULL, 0, "", "", false};
    char *out = NULL;
    size_t len = 0;

    assert_int_equal(duet_router_chat_tmpl_compile(src, &t), DUET_OK);
    duet_status_t st = duet_router_chat_tmpl_render(t, &v, &out, &len);
    duet_router_chat_tmpl_destroy(t);
    if (st != DUET_ERR_INVALID || strstr(duet_error_msg(), why) == NULL)
        fail_msg("%s: %s (%s), want INVALID with '%s'", src, duet_status_name(st), duet_error_msg(),
                 why);
    assert_null(out);
}

/* fuzz_chat_template: integer arithmetic wrapped (signed overflow), and
 * INT64_MIN // -1 trapped (SIGFPE on x86): now the template's error. */
static void test_chat_template_int_overflow(void **state)
{
    long live = duet_alloc_live();
    (void)state;

    render_fails("{{ 9223372036854775807 + 1 }}", "integer overflow");
    render_fails("{{ -9223372036854775807 - 2 }}", "integer overflow");
    render_fails("{{ 4611686018427387904 * 2 }}", "integer overflow");
    render_fails("{{ (-9223372036854775807 - 1) // -1 }}", "integer overflow");
    render_fails("{{ (-9223372036854775807 - 1) % -1 }}", "integer overflow");
    render_fails("{{ -(-9223372036854775807 - 1) }}", "integer overflow");
    char *out = render_ok("{{ 9223372036854775806 + 1 }} {{ -9223372036854775807 - 1 }} "
                          "{{ -7 // 2 }} {{ -7 % 2 }} {{ 3 * -4 }}");
    assert_string_equal(out, "9223372036854775807 -9223372036854775808 -4 1 -12");
    duet_free(out);
    assert_int_equal(duet_alloc_live(), live);
}

/* Seen while fixing the above: '~' of two numbers added them. */
static void test_chat_template_concat_ints(void **state)
{
    (void)state;
    char *out = render_ok("{{ 1 ~ 2 }}|{{ 1 + 2 }}|{{ 'a' ~ 3 }}");
    assert_string_equal(out, "12|3|a3");
    duet_free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chat_template_int_literal),
        cmocka_unit_test(test_chat_template_int_overflow),
        cmocka_unit_test(test_chat_template_concat_ints),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
