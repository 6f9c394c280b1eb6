/* common/flags: the table-driven command-line parser of every binary: each
 * type, --name VALUE and --name=VALUE, the errors naming the flag, flags
 * outside the table, STOP, and the help text. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/flags.h"
#include "common/log.h"

typedef struct {
    const char *str;
    int i;
    int64_t big;
    double d;
    int choice;
    bool on, off, help;
    int calls;
    const char *last;
} opts_t;

static const char *const colors[] = {"red", "green", "blue", NULL};

static duet_status_t even(void *dest, const char *flag, const char *value)
{
    opts_t *o = dest;
    int v = atoi(value);
    o->calls++;
    if (v % 2 != 0)
        return duet_error(DUET_ERR_CONFIG, "%s %s: not even", flag, value);
    o->i = v;
    return DUET_OK;
}

#define TABLE(o)                                                                                   \
    {                                                                                              \
        {.type = DUET_FLAG_HEADING, .help = "section"},                                            \
            {"str", DUET_FLAG_STRING, &(o).str, .arg = "S", .help = "a string"},                   \
            {"int", DUET_FLAG_INT, &(o).i, 1, 64, .arg = "N", .help = "an int\nsecond line"},      \
            {"big", DUET_FLAG_INT64, &(o).big, 0, 9007199254740992.0, .arg = "N"},                 \
            {"num", DUET_FLAG_DOUBLE, &(o).d, 0, 0.999, .arg = "X", .help = "a number"},           \
            {"color", DUET_FLAG_CHOICE, &(o).choice, .choices = colors, .arg = "C"},               \
            {"on", DUET_FLAG_TRUE, &(o).on, .help = "switch on"},                                  \
            {"no-off", DUET_FLAG_FALSE, &(o).off, .arg = NULL},                                    \
            {"even", DUET_FLAG_FUNC, &(o), .fn = even, .arg = "N"},                                \
            {"a-very-long-flag-name", DUET_FLAG_STRING, &(o).last, .arg = "VALUE",                 \
             .help = "below"},                                                                     \
            {"help", DUET_FLAG_STOP, &(o).help, .help = "this help"},                              \
    }

static opts_t defaults(void)
{
    opts_t o = {.str = "dflt", .i = 7, .big = -1, .d = 0.5, .choice = 2, .off = true};
    return o;
}

static duet_status_t parse(opts_t *o, int argc, const char *const *argv, duet_flags_other_fn other,
                           void *ud)
{
    const duet_flag_t flags[] = TABLE(*o);
    duet_error_clear();
    return duet_flags_parse(flags, DUET_FLAGS_N(flags), argc, (char *const *)argv, other, ud);
}

#define PARSE(o, ...)                                                                              \
    parse(&(o), (int)(sizeof((const char *[]){"prog", __VA_ARGS__}) / sizeof(const char *)),       \
          (const char *[]){"prog", __VA_ARGS__}, NULL, NULL)

static void expect_error(opts_t *o, const char *want, int argc, const char *const *argv)
{
    opts_t before = *o;
    assert_int_equal(parse(o, argc, argv, NULL, NULL), DUET_ERR_CONFIG);
    assert_string_equal(duet_error_msg(), want);
    assert_int_equal(o->i, before.i); /* a bad value leaves the destination alone */
    assert_true(o->d == before.d);
}

#define EXPECT_ERROR(o, want, ...)                                                                 \
    expect_error(&(o), want,                                                                       \
                 (int)(sizeof((const char *[]){"prog", __VA_ARGS__}) / sizeof(const char *)),      \
                 (const char *[]){"prog", __VA_ARGS__})

static void test_defaults_untouched(void **state)
{
    (void)state;
    opts_t o = defaults();
    const char *argv[] = {"prog"};
    assert_int_equal(parse(&o, 1, argv, NULL, NULL), DUET_OK);
    assert_string_equal(o.str, "dflt");
    assert_int_equal(o.i, 7);
    assert_int_equal(o.big, -1);
    assert_true(o.d == 0.5);
    assert_int_equal(o.choice, 2);
    assert_false(o.on);
    assert_true(o.off);
    assert_false(o.help);
}

static void test_every_type_both_forms(void **state)
{
    (void)state;
    opts_t o = defaults();
    assert_int_equal(PARSE(o, "--str", "abc", "--int", "64", "--big=9007199254740992", "--num=0.25",
                           "--color", "green", "--on", "--no-off", "--even=12"),
                     DUET_OK);
    assert_string_equal(o.str, "abc");
    assert_int_equal(o.i, 12); /* --even wrote it after --int */
    assert_int_equal(o.big, 9007199254740992LL);
    assert_true(o.d == 0.25);
    assert_int_equal(o.choice, 1);
    assert_true(o.on);
    assert_false(o.off);
    assert_int_equal(o.calls, 1);

    o = defaults();
    assert_int_equal(PARSE(o, "--int=1", "--str=", "--color=red", "--big", "1e3"), DUET_OK);
    assert_int_equal(o.i, 1);
    assert_string_equal(o.str, ""); /* an empty value is a value ("--http ''": off) */
    assert_int_equal(o.choice, 0);
    assert_int_equal(o.big, 1000); /* an integral number is an integer */

    o = defaults();
    assert_int_equal(PARSE(o, "--str", "a=b", "--str=c=d", "--int", "3", "--int", "5"), DUET_OK);
    assert_string_equal(o.str, "c=d"); /* the later one wins; '=' only splits once */
    assert_int_equal(o.i, 5);

    o = defaults();
    assert_int_equal(PARSE(o, "--str", "--int"), DUET_OK); /* the next word is the value */
    assert_string_equal(o.str, "--int");
}

static void test_errors_name_the_flag(void **state)
{
    (void)state;
    opts_t o = defaults();
    EXPECT_ERROR(o, "--bogus: unknown flag", "--bogus");
    EXPECT_ERROR(o, "--bogus: unknown flag", "--bogus=1");
    EXPECT_ERROR(o, "--in: unknown flag", "--in", "3"); /* no abbreviations */
    EXPECT_ERROR(o, "--int: needs a value", "--int");
    EXPECT_ERROR(o, "--on: takes no value", "--on=1");
    EXPECT_ERROR(o, "--int 0: expected an integer in [1, 64]", "--int", "0");
    EXPECT_ERROR(o, "--int 65: expected an integer in [1, 64]", "--int=65");
    EXPECT_ERROR(o, "--int 2.5: expected an integer in [1, 64]", "--int", "2.5");
    EXPECT_ERROR(o, "--int x: expected an integer in [1, 64]", "--int", "x");
    EXPECT_ERROR(o, "--int : expected an integer in [1, 64]", "--int", "");
    EXPECT_ERROR(o, "--big -1: expected an integer in [0, 9007199254740992]", "--big", "-1");
    EXPECT_ERROR(o, "--num 1: expected a number in [0, 0.999]", "--num", "1");
    EXPECT_ERROR(o, "--num nan: expected a number in [0, 0.999]", "--num", "nan");
    EXPECT_ERROR(o, "--num 0.5x: expected a number in [0, 0.999]", "--num", "0.5x");
    EXPECT_ERROR(o, "--color pink: expected red, green or blue", "--color", "pink");
    EXPECT_ERROR(o, "unexpected argument 'file'", "file");
    EXPECT_ERROR(o, "unexpected argument '-x'", "-x");
    EXPECT_ERROR(o, "unexpected argument '--=1'", "--=1");
    EXPECT_ERROR(o, "unexpected argument 'x'", "--", "x");
    /* the first error stops the parse: nothing after it is applied */
    o = defaults();
    assert_int_equal(PARSE(o, "--int", "0", "--str", "late"), DUET_ERR_CONFIG);
    assert_string_equal(o.str, "dflt");
    /* a FUNC's own error comes through as it is */
    o = defaults();
    assert_int_equal(PARSE(o, "--even", "3"), DUET_ERR_CONFIG);
    assert_string_equal(duet_error_msg(), "--even 3: not even");
    /* a name too long for any table */
    char name[300];
    memset(name, 'a', sizeof(name) - 1);
    name[0] = name[1] = '-';
    name[sizeof(name) - 1] = '\0';
    assert_int_equal(PARSE(o, name), DUET_ERR_CONFIG);
    assert_non_null(strstr(duet_error_msg(), "unknown flag"));
}

static void test_stop_and_help_alias(void **state)
{
    (void)state;
    opts_t o = defaults();
    /* --help ends the parse: what follows is not looked at */
    assert_int_equal(PARSE(o, "--int", "3", "--help", "--bogus", "--int", "0"), DUET_OK);
    assert_true(o.help);
    assert_int_equal(o.i, 3);
    o = defaults();
    assert_int_equal(PARSE(o, "-h", "--bogus"), DUET_OK);
    assert_true(o.help);
    o = defaults();
    assert_int_equal(PARSE(o, "--"), DUET_OK);

    /* -h means --help only where there is one */
    int v = 0;
    const duet_flag_t one[] = {{"v", DUET_FLAG_INT, &v, 0, 9, .arg = "N"}};
    const char *argv[] = {"prog", "-h"};
    assert_int_equal(duet_flags_parse(one, 1, 2, (char *const *)argv, NULL, NULL), DUET_ERR_CONFIG);
    assert_string_equal(duet_error_msg(), "unexpected argument '-h'");
}

typedef struct {
    char seen[8][32];
    int n;
} other_t;

static duet_status_t other_fn(void *ud, const char *name, const char *value)
{
    other_t *ot = ud;
    if (strcmp(name, "refuse") == 0)
        return duet_error(DUET_ERR_INVALID, "--refuse: not now");
    if (strncmp(name, "key-", 4) != 0)
        return DUET_ERR_NOT_FOUND;
    snprintf(ot->seen[ot->n++], sizeof(ot->seen[0]), "%s=%s", name, value);
    return DUET_OK;
}

static void test_flags_outside_the_table(void **state)
{
    (void)state;
    opts_t o = defaults();
    other_t ot = {0};
    const char *argv[] = {"prog", "--key-a", "1", "--int", "4", "--key-b=x=y", "--key-c", ""};
    assert_int_equal(parse(&o, 8, argv, other_fn, &ot), DUET_OK);
    assert_int_equal(ot.n, 3);
    assert_string_equal(ot.seen[0], "key-a=1");
    assert_string_equal(ot.seen[1], "key-b=x=y");
    assert_string_equal(ot.seen[2], "key-c=");
    assert_int_equal(o.i, 4);

    const char *unknown[] = {"prog", "--nokey", "1"};
    assert_int_equal(parse(&o, 3, unknown, other_fn, &ot), DUET_ERR_CONFIG);
    assert_string_equal(duet_error_msg(), "--nokey: unknown flag");
    const char *refused[] = {"prog", "--refuse", "1"};
    assert_int_equal(parse(&o, 3, refused, other_fn, &ot), DUET_ERR_INVALID);
    assert_string_equal(duet_error_msg(), "--refuse: not now");
    const char *novalue[] = {"prog", "--key-z"};
    assert_int_equal(parse(&o, 2, novalue, other_fn, &ot), DUET_ERR_CONFIG);
    assert_string_equal(duet_error_msg(), "--key-z: needs a value");
}

static void test_log_level(void **state)
{
    (void)state;
    const duet_flag_t flags[] = {
        {"log-level", DUET_FLAG_FUNC, NULL, .fn = duet_flag_log_level, .arg = "L"},
    };
    const char *ok[] = {"prog", "--log-level", "debug"};
    const char *bad[] = {"prog", "--log-level=loud"};
    assert_int_equal(duet_flags_parse(flags, 1, 3, (char *const *)ok, NULL, NULL), DUET_OK);
    assert_true(duet_log_enabled(DUET_LOG_LEVEL_DEBUG));
    assert_int_equal(duet_flags_parse(flags, 1, 2, (char *const *)bad, NULL, NULL),
                     DUET_ERR_CONFIG);
    assert_string_equal(duet_error_msg(),
                        "--log-level loud: expected error, warn, info, debug or trace");
    duet_log_set_level(DUET_LOG_LEVEL_WARN);
}

static void test_help_text(void **state)
{
    (void)state;
    opts_t o = defaults();
    const duet_flag_t flags[] = TABLE(o);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    duet_flags_help(f, flags, DUET_FLAGS_N(flags));
    assert_int_equal(fclose(f), 0);
    const char *want = "section\n"
                       "  --str S               a string\n"
                       "  --int N               an int\n"
                       "                        second line\n"
                       "  --big N\n"
                       "  --num X               a number\n"
                       "  --color C\n"
                       "  --on                  switch on\n"
                       "  --no-off\n"
                       "  --even N\n"
                       "  --a-very-long-flag-name VALUE\n"
                       "                        below\n"
                       "  --help                this help\n";
    assert_string_equal(text, want);
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_untouched),
        cmocka_unit_test(test_every_type_both_forms),
        cmocka_unit_test(test_errors_name_the_flag),
        cmocka_unit_test(test_stop_and_help_alias),
        cmocka_unit_test(test_flags_outside_the_table),
        cmocka_unit_test(test_log_level),
        cmocka_unit_test(test_help_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
