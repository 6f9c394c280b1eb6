/* The cluster config: a heterogeneous cluster parses, relative model paths
 * resolve against the file, every bad key or value names its path. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/alloc.h"
#include "common/cluster.h"

static duet_status_t parse(const char *text, duet_cluster_config_t **c)
{
    return duet_cluster_parse(text, strlen(text), "test.json", "/etc/duet", c);
}

static void test_good(void **state)
{
    (void)state;
    duet_cluster_config_t *c;
    duet_role_t role;
    long live = duet_alloc_live();
    const char *text =
        "{\"model\": \"models/x\", \"kv\": {\"page_size\": 8},"
        " \"router\": {\"policy\": \"round_robin\", \"http\": \"0.0.0.0:80\"},"
        " \"prefill\": [{\"name\": \"p0\", \"address\": \"h:1\", \"tp\": 2},"
        "               {\"name\": \"p1\", \"address\": \"h:2\", \"tp\": 1, \"backend\": \"cuda\","
        "                \"devices\": [3]}],"
        " \"decode\": [{\"name\": \"d0\", \"address\": \"h:3\", \"listen\": \"0.0.0.0:3\","
        "               \"tp\": 4, \"n_pages\": 100}]}";
    assert_int_equal(parse(text, &c), DUET_OK);
    assert_string_equal(c->model, "/etc/duet/models/x");
    assert_int_equal(c->page_size, 8);
    assert_int_equal(c->n_prefill, 2);
    assert_int_equal(c->n_decode, 1);
    assert_int_equal(c->prefill[0].tp, 2);
    assert_string_equal(c->prefill[0].listen, "h:1");
    assert_int_equal(c->prefill[1].devices[0], 3);
    assert_string_equal(c->decode[0].listen, "0.0.0.0:3");
    assert_string_equal(c->router.policy, "round_robin");
    assert_int_equal(c->router.max_body_bytes, 1 << 20);
    duet_instance_config_t *d = duet_cluster_find(c, "d0", &role);
    assert_non_null(d);
    assert_int_equal(role, DUET_ROLE_DECODE);
    assert_int_equal(duet_cluster_instance_set(d, "tp", "2"), DUET_OK);
    assert_int_equal(d->tp, 2);
    assert_int_equal(duet_cluster_instance_set(d, "tp", "0"), DUET_ERR_CONFIG);
    assert_int_equal(duet_cluster_instance_set(d, "nope", "1"), DUET_ERR_NOT_FOUND);
    assert_null(duet_cluster_find(c, "zz", &role));
    duet_cluster_free(c);
    assert_int_equal(duet_alloc_live(), live);
}

static void expect_error(const char *text, const char *needle)
{
    duet_cluster_config_t *c = NULL;
    duet_status_t st = parse(text, &c);
    if (st == DUET_OK)
        fail_msg("accepted: %s", text);
    if (strstr(duet_error_msg(), needle) == NULL)
        fail_msg("message '%s' lacks '%s'", duet_error_msg(), needle);
}

static void test_errors(void **state)
{
    (void)state;
    long live = duet_alloc_live();
    expect_error("{\"modle\": \"x\"}", "modle: unknown key");
    expect_error("{}", "model: required");
    expect_error("{\"model\": \"x\", \"kv\": {\"page_size\": 0}}", "kv.page_size: 0 is out of range");
    expect_error("{\"model\": \"x\", \"decode\": [{\"name\": \"d\", \"address\": \"a:1\", \"tp\": 0}]}",
                 "decode[0].tp: 0 is out of range 1..64");
    expect_error("{\"model\": \"x\", \"prefill\": [{\"name\": \"p\", \"address\": \"a:1\", \"tpp\": 2}]}",
                 "prefill[0].tpp: unknown key");
    expect_error("{\"model\": \"x\", \"prefill\": [{\"name\": \"p\"}]}",
                 "prefill[0]: needs address or discover");
    expect_error("{\"model\": \"x\", \"prefill\": [{\"name\": \"p\", \"address\": \"a:1\"}],"
                 " \"decode\": [{\"name\": \"p\", \"address\": \"a:2\"}]}",
                 "decode[0].name: 'p' is used twice");
    expect_error("{\"model\": \"x\", \"prefill\": [{\"name\": \"p\", \"address\": \"a:1\", \"tp\": 2,"
                 " \"devices\": [0]}]}",
                 "prefill[0].devices: 1 devices for tp 2");
    expect_error("{\"model\": \"x\", \"prefill\": [{\"name\": \"p\", \"address\": \"a:1\","
                 " \"backend\": \"tpu\"}]}",
                 "prefill[0].backend: 'tpu' is not cpu or cuda");
    expect_error("{\"model\": \"x\", \"router\": {\"max_body_bytes\": \"big\"}}",
                 "router.max_body_bytes: expected a number");
    expect_error("{\"model\": 1", "invalid JSON at line 1");
    /* colocated mode (docs/design-notes.md) */
    expect_error("{\"model\": \"x\", \"decode\": [{\"name\": \"d\", \"address\": \"a:1\","
                 " \"prefill_local\": \"sometimes\"}]}",
                 "decode[0].prefill_local: 'sometimes' is not off, always or auto");
    expect_error("{\"model\": \"x\", \"prefill\": [{\"name\": \"p\", \"address\": \"a:1\","
                 " \"prefill_local\": \"auto\"}]}",
                 "prefill[0].prefill_local: only decode instances prefill locally");
    expect_error("{\"model\": \"x\", \"decode\": [{\"name\": \"d\", \"address\": \"a:1\","
                 " \"prefill_local_max_running\": -1}]}",
                 "decode[0].prefill_local_max_running: -1 is out of range");
    expect_error("{\"model\": \"x\", \"decode\": [{\"name\": \"d\", \"address\": \"a:1\","
                 " \"prefill_chunk_tokens\": -1}]}",
                 "decode[0].prefill_chunk_tokens: -1 is out of range 0..1048576");
    expect_error("{\"model\": \"x\", \"decode\": [{\"name\": \"d\", \"address\": \"a:1\","
                 " \"prefill_chunk_tokens\": \"512\"}]}",
                 "decode[0].prefill_chunk_tokens: expected a number");
    assert_int_equal(duet_alloc_live(), live);
}

static void test_prefill_local(void **state)
{
    (void)state;
    duet_cluster_config_t *c = NULL;
    assert_int_equal(parse("{\"model\": \"x\", \"decode\": [{\"name\": \"a\", \"address\": "
                           "\"a:1\"}, {\"name\": \"b\", \"address\": \"b:1\", \"prefill_local\": "
                           "\"auto\", \"prefill_local_max_tokens\": 64}, {\"name\": \"c\", "
                           "\"address\": \"c:1\", \"prefill_local\": \"always\", "
                           "\"prefill_chunk_tokens\": 0}]}",
                           &c),
                     DUET_OK);
    assert_int_equal(duet_cluster_prefill_local(&c->decode[0]), DUET_PREFILL_LOCAL_OFF);
    assert_int_equal(duet_cluster_prefill_local(&c->decode[1]), DUET_PREFILL_LOCAL_AUTO);
    assert_int_equal(duet_cluster_prefill_local(&c->decode[2]), DUET_PREFILL_LOCAL_ALWAYS);
    assert_int_equal(c->decode[1].prefill_local_max_tokens, 64);
    assert_int_equal(c->decode[1].prefill_local_max_running, 8);
    /* chunked prefill: on by default, 0 turns it off */
    assert_int_equal(c->decode[0].prefill_chunk_tokens, 512);
    assert_int_equal(c->decode[2].prefill_chunk_tokens, 0);
    /* an override is checked by the daemon (duet_cluster_instance_check) */
    assert_int_equal(duet_cluster_instance_set(&c->decode[0], "prefill_local", "maybe"), DUET_OK);
    assert_int_equal(duet_cluster_instance_check(&c->decode[0], "decode", "decode[a]"),
                     DUET_ERR_CONFIG);
    assert_non_null(strstr(duet_error_msg(), "decode[a].prefill_local: 'maybe' is not"));
    duet_cluster_free(c);
}

/* The line of `text` that starts with "  " + key (copied into buf), or NULL. */
static const char *line_of(const char *text, const char *key, char *buf, size_t cap)
{
    char start[96];
    const char *p, *e;
    snprintf(start, sizeof(start), "\n  %s ", key);
    if ((p = strstr(text, start)) == NULL)
        return NULL;
    p++;
    e = strchr(p, '\n');
    snprintf(buf, cap, "%.*s", (int)(e ? e - p : (long)strlen(p)), p);
    return buf;
}

/* --help (duet_cluster_describe) and range errors print integer keys'
 * numbers as integers, not as %g's 1.04858e+06. */
static void test_integers_print_as_integers(void **state)
{
    (void)state;
    char *text = NULL, line[256];
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    duet_cluster_describe(f);
    assert_int_equal(fclose(f), 0);
    if (strstr(text, "e+") != NULL)
        fail_msg("--help prints a number in exponent form:\n%s", text);
    assert_non_null(line_of(text, "router.max_body_bytes", line, sizeof(line)));
    if (strstr(line, "default 1048576 ") == NULL || strstr(line, "[64..1073741824]") == NULL)
        fail_msg("router.max_body_bytes: '%s'", line);
    assert_non_null(line_of(text, "prefill[]./decode[].n_pages", line, sizeof(line)));
    if (strstr(line, "default 4096 ") == NULL || strstr(line, "[1..67108864]") == NULL)
        fail_msg("n_pages: '%s'", line);
    free(text);

    long live = duet_alloc_live();
    expect_error("{\"model\": \"x\", \"router\": {\"max_body_bytes\": 2147483648}}",
                 "router.max_body_bytes: 2147483648 is out of range 64..1073741824");
    expect_error("{\"model\": \"x\", \"decode\": [{\"name\": \"d\", \"address\": \"a:1\","
                 " \"max_batch_tokens\": 4000000}]}",
                 "decode[0].max_batch_tokens: 4000000 is out of range 1..1048576");
    assert_int_equal(duet_alloc_live(), live);
}

/* The router's policy names live with the router (router/fleet/policy.h): the
 * cluster config keeps router.policy as given, duet-router rejects an
 * unknown one at start-up (tests/unit/test_router_policy.c). */
/* kv.max_context: the context every limit uses, at most the model's */
static void test_max_context(void **state)
{
    (void)state;
    duet_cluster_config_t *c;
    int ctx = -1;
    long live = duet_alloc_live();
    assert_int_equal(parse("{\"model\": \"x\"}", &c), DUET_OK);
    assert_int_equal(c->max_context, 0);
    assert_int_equal(duet_cluster_context(c, 131072, &ctx), DUET_OK);
    assert_int_equal(ctx, 131072);
    duet_cluster_free(c);
    assert_int_equal(parse("{\"model\": \"x\", \"kv\": {\"max_context\": 32768}}", &c), DUET_OK);
    assert_int_equal(duet_cluster_context(c, 131072, &ctx), DUET_OK);
    assert_int_equal(ctx, 32768);
    assert_int_equal(duet_cluster_context(c, 8192, &ctx), DUET_ERR_CONFIG);
    assert_non_null(strstr(duet_error_msg(), "kv.max_context: 32768 is above the model's "
                                             "max_position_embeddings 8192"));
    assert_int_equal(ctx, 32768); /* untouched on failure */
    duet_cluster_free(c);
    expect_error("{\"model\": \"x\", \"kv\": {\"max_context\": -1}}",
                 "kv.max_context: -1 is out of range");
    assert_int_equal(duet_alloc_live(), live);
}

static void test_policy_is_the_routers(void **state)
{
    (void)state;
    duet_cluster_config_t *c;
    assert_int_equal(parse("{\"model\": \"x\", \"router\": {\"policy\": \"random\"}}", &c),
                     DUET_OK);
    assert_string_equal(c->router.policy, "random");
    duet_cluster_free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_prefill_local),
        cmocka_unit_test(test_integers_print_as_integers),
        cmocka_unit_test(test_policy_is_the_routers),
        cmocka_unit_test(test_max_context),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
