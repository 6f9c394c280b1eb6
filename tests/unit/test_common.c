/* common/: status strings, error detail, allocator failure injection and the
 * declarative config table. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/alloc.h"
#include "common/json.h"
#include "common/status.h"

static void test_status_strings(void **state)
{
    (void)state;
    assert_string_equal(duet_status_str(DUET_OK), "ok");
    assert_string_equal(duet_status_str(DUET_ERR_TIMEOUT), "deadline exceeded");
    assert_string_equal(duet_status_name(DUET_ERR_EXHAUSTED), "DUET_ERR_EXHAUSTED");
    assert_string_equal(duet_status_str((duet_status_t)-999), "unknown status");
}

static void test_error_detail(void **state)
{
    (void)state;
    duet_error_clear();
    assert_string_equal(duet_error_msg(), "no detail");
    assert_int_equal(duet_error(DUET_ERR_FORMAT, "tensor %s: bad", "x"), DUET_ERR_FORMAT);
    assert_string_equal(duet_error_msg(), "tensor x: bad");
    duet_error_wrap(DUET_ERR_FORMAT, "%s: ", "model.safetensors");
    assert_string_equal(duet_error_msg(), "model.safetensors: tensor x: bad");
}

static void test_alloc_failure_injection(void **state)
{
    (void)state;
    long live = duet_alloc_live();
    duet_alloc_fail_after(1);
    void *a = duet_malloc(16);
    void *b = duet_malloc(16);
    duet_alloc_fail_after(-1);
    assert_non_null(a);
    assert_null(b);
    duet_free(a);
    assert_int_equal(duet_alloc_live(), live);
}

typedef struct {
    int tp;
    double temp;
    bool flag;
    char *name;
} cfg_t;

static const duet_cfg_field_t cfg_fields[] = {
    DUET_CFG_F_INT(cfg_t, tp, 1, 8, 1, "tensor parallel size"),
    DUET_CFG_F_DOUBLE(cfg_t, temp, 0, 2, 1.0, "temperature"),
    DUET_CFG_F_BOOL(cfg_t, flag, 0, "a flag"),
    DUET_CFG_F_STRING(cfg_t, name, "x", "a name"),
};
#define N_FIELDS (sizeof(cfg_fields) / sizeof(cfg_fields[0]))

static duet_status_t parse(const char *text, cfg_t *c)
{
    cJSON *j = NULL;
    duet_status_t st = duet_json_parse(text, strlen(text), "test", &j);
    if (st != DUET_OK)
        return st;
    st = duet_cfg_parse(j, "prefill[1]", cfg_fields, N_FIELDS, c);
    cJSON_Delete(j);
    return st;
}

static void test_config_table(void **state)
{
    (void)state;
    cfg_t c;
    assert_int_equal(duet_cfg_defaults(cfg_fields, N_FIELDS, &c), DUET_OK);
    assert_int_equal(c.tp, 1);
    assert_string_equal(c.name, "x");
    assert_int_equal(parse("{\"tp\": 4, \"name\": \"p0\", \"flag\": true}", &c), DUET_OK);
    assert_int_equal(c.tp, 4);
    assert_true(c.flag);
    assert_string_equal(c.name, "p0");

    assert_int_equal(parse("{\"tpp\": 4}", &c), DUET_ERR_CONFIG);
    assert_string_equal(duet_error_msg(), "prefill[1].tpp: unknown key");
    assert_int_equal(parse("{\"tp\": 9}", &c), DUET_ERR_CONFIG);
    assert_string_equal(duet_error_msg(), "prefill[1].tp: 9 is out of range 1..8");
    assert_int_equal(parse("{\"tp\": 2.5}", &c), DUET_ERR_CONFIG);
    assert_int_equal(parse("{\"tp\": \"2\"}", &c), DUET_ERR_CONFIG);
    assert_string_equal(duet_error_msg(), "prefill[1].tp: expected a number");
    assert_int_equal(parse("{\"tp\": ", &c), DUET_ERR_FORMAT);

    assert_int_equal(duet_cfg_set_str(cfg_fields, N_FIELDS, &c, "tp", "2"), DUET_OK);
    assert_int_equal(c.tp, 2);
    assert_int_equal(duet_cfg_set_str(cfg_fields, N_FIELDS, &c, "tp", "two"), DUET_ERR_CONFIG);
    assert_int_equal(duet_cfg_set_str(cfg_fields, N_FIELDS, &c, "nope", "1"),
                     DUET_ERR_NOT_FOUND);
    duet_cfg_free(cfg_fields, N_FIELDS, &c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status_strings),
        cmocka_unit_test(test_error_detail),
        cmocka_unit_test(test_alloc_failure_injection),
        cmocka_unit_test(test_config_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
