/* The router's choices and logprobs (docs/api-logprobs.md): n, best_of,
 * several prompts, logprobs / top_logprobs / echo in the completions and
 * chat shapes, and the rendered logprobs JSON of both APIs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "common/alloc.h"
#include "router/openai/openai.h"

static const duet_router_oai_limits_t lim = {
    .max_tokens_limit = 1000, .vocab_size = 512, .default_max_tokens = 16};

static duet_status_t parse(const char *body, duet_router_api_t api, duet_router_oai_req_t *req,
                           duet_router_oai_error_t *err)
{
    return duet_router_oai_parse(body, strlen(body), api, &lim, req, err);
}

static void test_parse(void **state)
{
    duet_router_oai_req_t r;
    duet_router_oai_error_t e;
    long live = duet_alloc_live();
    (void)state;

    assert_int_equal(parse("{\"prompt\":\"a\"}", DUET_ROUTER_API_COMPLETIONS, &r, &e), DUET_OK);
    assert_true(r.n == 1 && !r.logprobs && !r.echo && duet_router_oai_n_prompts(&r) == 1);
    duet_router_oai_req_cleanup(&r);

    assert_int_equal(parse("{\"prompt\":[\"ab\",[5,6,7],\"c\"],\"n\":3,\"best_of\":3,"
                           "\"logprobs\":5,\"echo\":true}",
                           DUET_ROUTER_API_COMPLETIONS, &r, &e),
                     DUET_OK);
    assert_int_equal(r.n, 3);
    assert_true(r.logprobs && r.top_logprobs == 5 && r.echo);
    assert_int_equal(duet_router_oai_n_prompts(&r), 3);
    duet_router_oai_prompt_t p = duet_router_oai_prompt(&r, 0);
    assert_true(p.has_text && strcmp(p.text, "ab") == 0);
    p = duet_router_oai_prompt(&r, 1);
    assert_true(!p.has_text && p.n_ids == 3 && p.ids[2] == 7);
    p = duet_router_oai_prompt(&r, 2);
    assert_true(p.has_text && p.text_len == 1);
    duet_router_oai_req_cleanup(&r);

    /* logprobs 0: logprobs of the tokens, no alternatives */
    assert_int_equal(
        parse("{\"prompt\":[[1,2]],\"logprobs\":0}", DUET_ROUTER_API_COMPLETIONS, &r, &e), DUET_OK);
    assert_true(r.logprobs && r.top_logprobs == 0 && duet_router_oai_n_prompts(&r) == 1);
    duet_router_oai_req_cleanup(&r);

    assert_int_equal(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                           "\"logprobs\":true,\"top_logprobs\":20,\"n\":2}",
                           DUET_ROUTER_API_CHAT, &r, &e),
                     DUET_OK);
    assert_true(r.logprobs && r.top_logprobs == 20 && r.n == 2);
    duet_router_oai_req_cleanup(&r);

    /* a bad later prompt frees the ones parsed */
    assert_int_equal(
        parse("{\"prompt\":[\"a\",\"b\",[1,999]]}", DUET_ROUTER_API_COMPLETIONS, &r, &e),
        DUET_ERR_INVALID);
    assert_string_equal(e.param, "prompt");
    assert_int_equal(parse("{\"prompt\":[\"a\",\"b\",[]]}", DUET_ROUTER_API_COMPLETIONS, &r, &e),
                     DUET_ERR_INVALID);
    assert_int_equal(duet_alloc_live(), live);
}

static const struct {
    duet_router_api_t api;
    const char *body;
    const char *param;
    const char *word;
} bad[] = {
    {DUET_ROUTER_API_COMPLETIONS, "{\"prompt\":\"a\",\"n\":0}", "n", "1..16"},
    {DUET_ROUTER_API_COMPLETIONS, "{\"prompt\":\"a\",\"n\":2.5}", "n", "1..16"},
    {DUET_ROUTER_API_COMPLETIONS, "{\"prompt\":\"a\",\"n\":2,\"best_of\":1}", "best_of", "equal n"},
    {DUET_ROUTER_API_COMPLETIONS, "{\"prompt\":\"a\",\"logprobs\":true}", "logprobs", "0..5"},
    {DUET_ROUTER_API_COMPLETIONS, "{\"prompt\":\"a\",\"logprobs\":-1}", "logprobs", "0..5"},
    {DUET_ROUTER_API_COMPLETIONS, "{\"prompt\":\"a\",\"top_logprobs\":3}", "top_logprobs",
     "chat field"},
    {DUET_ROUTER_API_COMPLETIONS, "{\"prompt\":[\"a\",\"a\",\"a\",\"a\",\"a\"],\"n\":13}", "n",
     "at most 64"},
    {DUET_ROUTER_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":1}",
     "logprobs", "boolean"},
    {DUET_ROUTER_API_CHAT,
     "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,\"top_logprobs\":21}",
     "top_logprobs", "0..20"},
    {DUET_ROUTER_API_CHAT,
     "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":1}", "top_logprobs",
     "needs logprobs"},
    {DUET_ROUTER_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"echo\":true}",
     "echo", "completions field"},
};

static void test_bad(void **state)
{
    duet_router_oai_req_t r;
    duet_router_oai_error_t e;
    long live = duet_alloc_live();
    (void)state;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        memset(&e, 0, sizeof(e));
        if (parse(bad[i].body, bad[i].api, &r, &e) != DUET_ERR_INVALID || e.status != 400 ||
            e.param == NULL || strcmp(e.param, bad[i].param) != 0 ||
            strstr(e.message, bad[i].word) == NULL)
            fail_msg("body %s: status %d param %s message '%s'", bad[i].body, e.status,
                     e.param ? e.param : "(null)", e.message);
    }
    assert_int_equal(duet_alloc_live(), live);
}

/* token id i reads " t<i>", and 300 a lone byte that is not UTF-8 */
static size_t fake_tok(void *ud, int32_t id, char *buf, size_t cap)
{
    (void)ud;
    if (id == 300) {
        buf[0] = (char)0xE2;
        return 1;
    }
    return (size_t)snprintf(buf, cap, " t%d", id);
}

static void test_render(void **state)
{
    duet_router_oai_lp_t lps[3] = {
        {.id = 7, .has_logprob = false},
        {.id = 8,
         .has_logprob = true,
         .logprob = -0.25f,
         .n_top = 2,
         .top_ids = {8, 9},
         .top_logprobs = {-0.25f, -1.5f}},
        {.id = 300, .has_logprob = true, .logprob = -3.0f, .n_top = 0},
    };
    duet_router_buf_t b;
    size_t off = 4;
    (void)state;

    duet_router_buf_init(&b);
    assert_true(duet_router_oai_render_logprobs(&b, DUET_ROUTER_API_COMPLETIONS, lps, 3, fake_tok,
                                                NULL, &off));
    cJSON *j = cJSON_ParseWithLength(b.data, b.len);
    assert_non_null(j);
    char *s = cJSON_PrintUnformatted(cJSON_GetObjectItem(j, "token_logprobs"));
    assert_string_equal(s, "[null,-0.25,-3]");
    cJSON_free(s);
    s = cJSON_PrintUnformatted(cJSON_GetObjectItem(j, "top_logprobs"));
    assert_string_equal(s, "[null,{\" t8\":-0.25,\" t9\":-1.5},{}]");
    cJSON_free(s);
    s = cJSON_PrintUnformatted(cJSON_GetObjectItem(j, "text_offset"));
    assert_string_equal(s, "[4,7,10]");
    cJSON_free(s);
    assert_int_equal(off, 11);
    assert_string_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "tokens"), 0)->valuestring,
                        " t7");
    cJSON_Delete(j);

    duet_router_buf_reset(&b);
    assert_true(duet_router_oai_render_logprobs(&b, DUET_ROUTER_API_CHAT, lps + 1, 2, fake_tok,
                                                NULL, NULL));
    j = cJSON_ParseWithLength(b.data, b.len);
    assert_non_null(j);
    cJSON *c = cJSON_GetObjectItem(j, "content");
    assert_int_equal(cJSON_GetArraySize(c), 2);
    s = cJSON_PrintUnformatted(cJSON_GetArrayItem(c, 0));
    assert_string_equal(s, "{\"token\":\" t8\",\"logprob\":-0.25,\"bytes\":[32,116,56],"
                           "\"top_logprobs\":[{\"token\":\" t8\",\"logprob\":-0.25,\"bytes\":"
                           "[32,116,56]},{\"token\":\" t9\",\"logprob\":-1.5,\"bytes\":[32,116,"
                           "57]}]}");
    cJSON_free(s);
    /* a byte that is not UTF-8 on its own: exact in bytes */
    s = cJSON_PrintUnformatted(cJSON_GetObjectItem(cJSON_GetArrayItem(c, 1), "bytes"));
    assert_string_equal(s, "[226]");
    cJSON_free(s);
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(j, "refusal")));
    cJSON_Delete(j);

    /* a choice with its index and logprobs */
    duet_router_buf_reset(&b);
    assert_true(duet_router_oai_render_choice(&b, DUET_ROUTER_API_COMPLETIONS, 5, "hi", 2,
                                              "{\"x\":1}", 7, "length"));
    assert_string_equal(b.data, "{\"index\":5,\"text\":\"hi\",\"logprobs\":{\"x\":1},"
                                "\"finish_reason\":\"length\"}");
    duet_router_buf_cleanup(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_bad),
        cmocka_unit_test(test_render),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
