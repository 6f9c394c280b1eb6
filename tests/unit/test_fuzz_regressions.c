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
#include "router/chat/chat_template.h"

/* fuzz_chat_template: an integer literal past INT64_MAX overflowed while
 * being read (signed overflow); now a compile error naming it. */
static void test_chat_template_int_literal(void **state)
{
    duet_router_chat_tmpl_t *t = NULL;
    duet_router_chat_vars_t v = {NULL, 0, "", "", false, NULL};
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
    duet_router_chat_vars_t v = {NULL, 0, "", "", false, NULL};
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
    duet_router_chat_vars_t v = {NULL, 0, "", "", false, NULL};
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

static char *repeat(const char *head, const char *unit, size_t n, const char *mid,
                    const char *unit2, const char *tail)
{
    size_t a = strlen(unit), b = unit2 ? strlen(unit2) : 0;
    char *s = duet_malloc(strlen(head) + n * (a + b) + strlen(mid) + strlen(tail) + 1), *p = s;
    assert_non_null(s);
    p += sprintf(p, "%s", head);
    for (size_t i = 0; i < n; i++)
        p += sprintf(p, "%s", unit);
    p += sprintf(p, "%s", mid);
    for (size_t i = 0; unit2 && i < n; i++)
        p += sprintf(p, "%s", unit2);
    sprintf(p, "%s", tail);
    return s;
}

/* fuzz_chat_template: "{{ ((((...", a long chain of not / - and nested
 * blocks recursed in the parser until the stack overflowed; now a compile
 * error past 100 levels.  A long operator chain (1+1+...+1) parses
 * iteratively but evaluation recursed as deep: a render error past 256. */
static void test_chat_template_nesting(void **state)
{
    static const struct {
        const char *head, *unit, *mid, *unit2, *tail;
    } deep[] = {
        {"{{ ", "(", "1", ")", " }}"},
        {"{{ ", "[", "1", "]", " }}"},
        {"{{ ", "not ", "1", NULL, " }}"},
        {"{{ ", "-", "1", NULL, " }}"},
        {"", "{% if 1 %}", "x", "{% endif %}", ""},
        {"", "{% for m in messages %}", "x", "{% endfor %}", ""},
    };
    duet_router_chat_tmpl_t *t = NULL;
    long live = duet_alloc_live();
    (void)state;

    for (size_t i = 0; i < sizeof(deep) / sizeof(deep[0]); i++) {
        /* far past any stack */
        char *src =
            repeat(deep[i].head, deep[i].unit, 200000, deep[i].mid, deep[i].unit2, deep[i].tail);
        assert_int_equal(duet_router_chat_tmpl_compile(src, &t), DUET_ERR_UNSUPPORTED);
        assert_non_null(strstr(duet_error_msg(), "nested more than 100 levels deep"));
        duet_free(src);
        /* what real templates nest is fine */
        src = repeat(deep[i].head, deep[i].unit, 40, deep[i].mid, deep[i].unit2, deep[i].tail);
        if (duet_router_chat_tmpl_compile(src, &t) != DUET_OK)
            fail_msg("%s: %s", src, duet_error_msg());
        duet_router_chat_tmpl_destroy(t);
        duet_free(src);
    }
    char *src = repeat("{{ 1", "+1", 100000, "", NULL, " }}");
    render_fails(src, "nested more than 256 levels deep");
    duet_free(src);
    char *out = render_ok("{{ 1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1 }}");
    assert_string_equal(out, "30");
    duet_free(out);
    /* error lines are still counted right */
    assert_int_equal(duet_router_chat_tmpl_compile("a\n{{ x }}\n\n{% if %}", &t), DUET_ERR_FORMAT);
    assert_non_null(strstr(duet_error_msg(), "line 4"));
    assert_int_equal(duet_alloc_live(), live);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chat_template_int_literal),
        cmocka_unit_test(test_chat_template_int_overflow),
        cmocka_unit_test(test_chat_template_concat_ints),
        cmocka_unit_test(test_chat_template_nesting),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
