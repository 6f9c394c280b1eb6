/* The router's OpenAI layer: request parsing and validation (every bad
 * input names its field and is a 400), response / chunk / error JSON
 * shapes, SSE framing and JSON string escaping, out-of-memory paths. */
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

static void test_completion_defaults(void **state)
{
    duet_router_oai_req_t r;
    duet_router_oai_error_t e;
    long live = duet_alloc_live();
    (void)state;

    assert_int_equal(
        parse("{\"model\":\"m\",\"prompt\":\"Once upon\"}", DUET_ROUTER_API_COMPLETIONS, &r, &e),
        DUET_OK);
    assert_string_equal(r.model, "m");
    assert_true(r.has_text);
    assert_string_equal(r.prompt_text, "Once upon");
    assert_int_equal(r.prompt_text_len, 9);
    assert_int_equal(r.max_tokens, 16); /* OpenAI's default for completions */
    assert_true(r.temperature == 1.0);
    assert_true(r.top_p == 1.0);
    assert_int_equal(r.top_k, 0);
    assert_false(r.has_seed);
    assert_false(r.stream);
    assert_int_equal(r.n_stop, 0);
    duet_router_oai_req_cleanup(&r);
    assert_int_equal(duet_alloc_live(), live);
}

static void test_completion_fields(void **state)
{
    duet_router_oai_req_t r;
    duet_router_oai_error_t e;
    (void)state;

    assert_int_equal(
        parse("{\"prompt\":[1,2,511],\"max_tokens\":1000,\"temperature\":0,\"top_p\":0.5,"
              "\"top_k\":-1,\"seed\":-3,\"stop\":[\"a\",\"bc\"],\"stop_token_ids\":[2],"
              "\"n\":1,\"stream\":true,\"stream_options\":{\"include_usage\":true},"
              "\"ignore_eos\":true,\"logprobs\":null,\"echo\":false,\"user\":\"x\","
              "\"presence_penalty\":0}",
              DUET_ROUTER_API_COMPLETIONS, &r, &e),
        DUET_OK);
    assert_false(r.has_text);
    assert_int_equal(r.n_prompt_ids, 3);
    assert_int_equal(r.prompt_ids[2], 511);
    assert_int_equal(r.max_tokens, 1000);
    assert_true(r.temperature == 0.0);
    assert_true(r.top_p == 0.5);
    assert_int_equal(r.top_k, 0);
    assert_true(r.has_seed);
    assert_true(r.seed == (uint64_t)(int64_t)-3);
    assert_int_equal(r.n_stop, 2);
    assert_string_equal(r.stop[1], "bc");
    assert_int_equal(r.n_stop_ids, 1);
    assert_true(r.stream && r.include_usage && r.ignore_eos);
    assert_null(r.model);
    duet_router_oai_req_cleanup(&r);

    /* one-element batches and a single stop string */
    assert_int_equal(
        parse("{\"prompt\":[\"hi\"],\"stop\":\"x\"}", DUET_ROUTER_API_COMPLETIONS, &r, &e),
        DUET_OK);
    assert_string_equal(r.prompt_text, "hi");
    assert_int_equal(r.n_stop, 1);
    assert_string_equal(r.stop[0], "x");
    duet_router_oai_req_cleanup(&r);
    assert_int_equal(
        parse("{\"prompt\":[[5,6]],\"max_tokens\":null}", DUET_ROUTER_API_COMPLETIONS, &r, &e),
        DUET_OK);
    assert_int_equal(r.n_prompt_ids, 2);
    assert_int_equal(r.max_tokens, 16);
    duet_router_oai_req_cleanup(&r);
}

/* body -> the field the 400 names (NULL: none) and a word of the message */
static const struct {
    const char *body;
    const char *param;
    const char *word;
} bad_completions[] = {
    {"{\"prompt\":", NULL, "JSON"},
    {"[1,2]", NULL, "object"},
    {"{}", "prompt", "required"},
    {"{\"prompt\":\"\"}", "prompt", "empty"},
    {"{\"prompt\":[]}", "prompt", "empty"},
    {"{\"prompt\":[\"a\",5]}", "prompt", "prompt[1] must be a string"},
    {"{\"prompt\":12}", "prompt", "string"},
    {"{\"prompt\":[1,-2]}", "prompt", "non-negative"},
    {"{\"prompt\":[1,2.5]}", "prompt", "integer"},
    {"{\"prompt\":[1,512]}", "prompt", "out of range"},
    {"{\"prompt\":\"a\",\"model\":3}", "model", "string"},
    {"{\"prompt\":\"a\",\"max_tokens\":\"5\"}", "max_tokens", "integer"},
    {"{\"prompt\":\"a\",\"max_tokens\":1.5}", "max_tokens", "integer"},
    {"{\"prompt\":\"a\",\"max_tokens\":0}", "max_tokens", "at least 1"},
    {"{\"prompt\":\"a\",\"max_tokens\":-1}", "max_tokens", "at least 1"},
    {"{\"prompt\":\"a\",\"max_tokens\":1001}", "max_tokens", "at most 1000"},
    {"{\"prompt\":\"a\",\"max_tokens\":1e300}", "max_tokens", "integer"},
    {"{\"prompt\":\"a\",\"temperature\":-0.1}", "temperature", "in ["},
    {"{\"prompt\":\"a\",\"temperature\":\"hot\"}", "temperature", "number"},
    {"{\"prompt\":\"a\",\"top_p\":0}", "top_p", "(0"},
    {"{\"prompt\":\"a\",\"top_p\":1.5}", "top_p", "1]"},
    {"{\"prompt\":\"a\",\"top_k\":-2}", "top_k", ">= -1"},
    {"{\"prompt\":\"a\",\"seed\":\"x\"}", "seed", "integer"},
    {"{\"prompt\":\"a\",\"stop\":5}", "stop", "string"},
    {"{\"prompt\":\"a\",\"stop\":[\"\"]}", "stop", "non-empty"},
    {"{\"prompt\":\"a\",\"stop\":[1]}", "stop", "non-empty"},
    {"{\"prompt\":\"a\",\"n\":17}", "n", "1..16"},
    {"{\"prompt\":\"a\",\"best_of\":3}", "best_of", "must equal n"},
    {"{\"prompt\":\"a\",\"echo\":1}", "echo", "boolean"},
    {"{\"prompt\":\"a\",\"logprobs\":6}", "logprobs", "0..5"},
    {"{\"prompt\":\"a\",\"frequency_penalty\":0.5}", "frequency_penalty", "not supported"},
    {"{\"prompt\":\"a\",\"stream\":\"yes\"}", "stream", "boolean"},
    {"{\"prompt\":\"a\",\"stream_options\":3}", "stream_options", "object"},
    {"{\"prompt\":\"a\",\"stream_options\":{\"include_usage\":1}}", "include_usage", "boolean"},
    {"{\"prompt\":\"a\",\"ignore_eos\":1}", "ignore_eos", "boolean"},
    {"{\"prompt\":\"a\",\"stop_token_ids\":[600]}", "stop_token_ids", "out of range"},
    /* issue 13: bad input that used to pass */
    {"{\"prompt\":\"a\"} xyz", NULL, "after the JSON object (at byte 15)"},
    {"{\"prompt\":\"a\"}{\"prompt\":\"b\"}", NULL, "after the JSON object"},
    {"{\"prompt\":\"ab\\u0000cd\"}", NULL, "\"prompt\" has a NUL"},
    {"{\"prompt\":\"a\",\"stop\":[\"x\\u0000\"]}", NULL, "\"stop\" has a NUL"},
    {"{\"prompt\":\"a\",\"logit_bias\":{\"50\":100}}", "logit_bias", "not supported"},
    {"{\"prompt\":\"a\",\"logit_bias\":[]}", "logit_bias", "not supported"},
    {"{\"prompt\":\"a\",\"stop_token_ids\":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,"
     "1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]}",
     "stop_token_ids", "at most 64"},
};

/* What the checks above must still let through, and a raw NUL byte (which
 * a C-string table cannot hold). */
static void test_body_edges(void **state)
{
    duet_router_oai_req_t r;
    duet_router_oai_error_t e;
    long live = duet_alloc_live();
    static const char *const ok[] = {
        "{\"prompt\":\"a\"} \r\n\t",
        "{\"prompt\":\"a\",\"logit_bias\":{}}",
        "{\"prompt\":\"a\",\"logit_bias\":null}",
        "{\"prompt\":\"a\\\\u0000\"}", /* an escaped backslash, then "u0000" */
        "{\"prompt\":\"a\\u0001\\\"u0000\"}",
    };
    static const char raw[] = "{\"prompt\":\"ab\0cd\"}";
    (void)state;

    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        if (parse(ok[i], DUET_ROUTER_API_COMPLETIONS, &r, &e) != DUET_OK)
            fail_msg("body %s: %s", ok[i], e.message);
        duet_router_oai_req_cleanup(&r);
    }
    assert_int_equal(parse("{\"prompt\":\"a\\\\u0000\"}", DUET_ROUTER_API_COMPLETIONS, &r, &e),
                     DUET_OK);
    assert_string_equal(r.prompt_text, "a\\u0000");
    duet_router_oai_req_cleanup(&r);
    assert_int_equal(
        duet_router_oai_parse(raw, sizeof(raw) - 1, DUET_ROUTER_API_COMPLETIONS, &lim, &r, &e),
        DUET_ERR_INVALID);
    assert_int_equal(e.status, 400);
    assert_non_null(strstr(e.message, "\"prompt\" has a NUL"));
    /* chat: the message content is named */
    assert_int_equal(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"x\\u0000\"}]}",
                           DUET_ROUTER_API_CHAT, &r, &e),
                     DUET_ERR_INVALID);
    assert_non_null(strstr(e.message, "\"content\" has a NUL"));
    assert_int_equal(duet_alloc_live(), live);
}

static void test_completion_errors(void **state)
{
    duet_router_oai_req_t r;
    duet_router_oai_error_t e;
    long live = duet_alloc_live();
    (void)state;

    for (size_t i = 0; i < sizeof(bad_completions) / sizeof(bad_completions[0]); i++) {
        memset(&e, 0, sizeof(e));
        duet_status_t st = parse(bad_completions[i].body, DUET_ROUTER_API_COMPLETIONS, &r, &e);
        if (st != DUET_ERR_INVALID || e.status != 400 ||
            strcmp(e.type, "invalid_request_error") != 0 ||
            (bad_completions[i].param == NULL) != (e.param == NULL) ||
            (e.param && strcmp(e.param, bad_completions[i].param) != 0) ||
            strstr(e.message, bad_completions[i].word) == NULL)
            fail_msg("body %s: status %d param %s message '%s'", bad_completions[i].body, e.status,
                     e.param ? e.param : "(null)", e.message);
        assert_null(r.prompt_text); /* cleaned up */
    }
    assert_int_equal(duet_alloc_live(), live);
}

static void test_chat(void **state)
{
    duet_router_oai_req_t r;
    duet_router_oai_error_t e;
    (void)state;

    assert_int_equal(
        parse("{\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},"
              "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
              "{\"type\":\"text\",\"text\":\"b\"}]},{\"role\":\"assistant\",\"content\":null}],"
              "\"max_completion_tokens\":7,\"add_generation_prompt\":false}",
              DUET_ROUTER_API_CHAT, &r, &e),
        DUET_OK);
    assert_int_equal(r.n_msgs, 3);
    assert_string_equal(r.msgs[0].role, "system");
    assert_string_equal(r.msgs[1].content, "ab");
    assert_string_equal(r.msgs[2].content, "");
    assert_int_equal(r.max_tokens, 7);
    assert_false(r.add_generation_prompt);
    duet_router_oai_req_cleanup(&r);

    assert_int_equal(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
                           DUET_ROUTER_API_CHAT, &r, &e),
                     DUET_OK);
    assert_int_equal(r.max_tokens, 0); /* chat: no default, the context decides */
    assert_true(r.add_generation_prompt);
    duet_router_oai_req_cleanup(&r);

    static const char *const bad[] = {
        "{}",
        "{\"messages\":{}}",
        "{\"messages\":[]}",
        "{\"messages\":[{\"content\":\"x\"}]}",
        "{\"messages\":[{\"role\":\"user\",\"content\":5}]}",
        "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}",
        "{\"messages\":[\"hi\"]}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_equal(parse(bad[i], DUET_ROUTER_API_CHAT, &r, &e), DUET_ERR_INVALID);
        assert_int_equal(e.status, 400);
        assert_string_equal(e.param, "messages");
    }
}

static void test_parse_oom(void **state)
{
    const char *body = "{\"prompt\":\"hello\",\"stop\":[\"a\",\"b\",\"c\"],\"model\":\"m\","
                       "\"stop_token_ids\":[1,2]}";
    const char *chat = "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\","
                       "\"text\":\"a\"}]},{\"role\":\"assistant\",\"content\":\"b\"}]}";
    long live = duet_alloc_live();
    (void)state;

    for (int api = 0; api < 2; api++) {
        int ok_at = -1;
        for (long n = 0; n < 64 && ok_at < 0; n++) {
            duet_router_oai_req_t r;
            duet_router_oai_error_t e;
            duet_alloc_fail_after(n);
            duet_status_t st = parse(api ? chat : body, api, &r, &e);
            duet_alloc_fail_after(-1);
            if (st == DUET_OK) {
                ok_at = (int)n;
                duet_router_oai_req_cleanup(&r);
            } else {
                assert_int_equal(st, DUET_ERR_NO_MEMORY);
                assert_int_equal(e.status, 500);
            }
            assert_int_equal(duet_alloc_live(), live);
        }
        assert_true(ok_at > 0);
    }
}

static cJSON *json_of(duet_router_buf_t *b)
{
    cJSON *j = cJSON_Parse(b->data);
    assert_non_null(j);
    return j;
}

static void test_render_response(void **state)
{
    duet_router_oai_meta_t m = {DUET_ROUTER_API_COMPLETIONS, "cmpl-1", 1700000000, "stories"};
    duet_router_oai_usage_t u = {5, 3};
    duet_router_buf_t b;
    (void)state;

    duet_router_buf_init(&b);
    assert_true(duet_router_oai_render_response(&b, &m, "a \"b\"\n", 6, "length", &u));
    cJSON *j = json_of(&b);
    assert_string_equal(cJSON_GetObjectItem(j, "id")->valuestring, "cmpl-1");
    assert_string_equal(cJSON_GetObjectItem(j, "object")->valuestring, "text_completion");
    assert_int_equal(cJSON_GetObjectItem(j, "created")->valuedouble, 1700000000);
    assert_string_equal(cJSON_GetObjectItem(j, "model")->valuestring, "stories");
    cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    assert_int_equal(cJSON_GetObjectItem(c0, "index")->valueint, 0);
    assert_string_equal(cJSON_GetObjectItem(c0, "text")->valuestring, "a \"b\"\n");
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(c0, "logprobs")));
    assert_string_equal(cJSON_GetObjectItem(c0, "finish_reason")->valuestring, "length");
    cJSON *usage = cJSON_GetObjectItem(j, "usage");
    assert_int_equal(cJSON_GetObjectItem(usage, "prompt_tokens")->valueint, 5);
    assert_int_equal(cJSON_GetObjectItem(usage, "completion_tokens")->valueint, 3);
    assert_int_equal(cJSON_GetObjectItem(usage, "total_tokens")->valueint, 8);
    cJSON_Delete(j);

    duet_router_buf_reset(&b);
    m.api = DUET_ROUTER_API_CHAT;
    assert_true(duet_router_oai_render_response(&b, &m, "hi", 2, "stop", &u));
    j = json_of(&b);
    assert_string_equal(cJSON_GetObjectItem(j, "object")->valuestring, "chat.completion");
    c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    cJSON *msg = cJSON_GetObjectItem(c0, "message");
    assert_string_equal(cJSON_GetObjectItem(msg, "role")->valuestring, "assistant");
    assert_string_equal(cJSON_GetObjectItem(msg, "content")->valuestring, "hi");
    assert_string_equal(cJSON_GetObjectItem(c0, "finish_reason")->valuestring, "stop");
    cJSON_Delete(j);
    duet_router_buf_cleanup(&b);
}

/* Strip "data: " and the blank line of one SSE event and parse it. */
static cJSON *sse_json(const char *ev)
{
    char tmp[4096];
    size_t n = strlen(ev);
    assert_true(strncmp(ev, "data: ", 6) == 0);
    assert_true(n >= 8 && strcmp(ev + n - 2, "\n\n") == 0);
    memcpy(tmp, ev + 6, n - 8);
    tmp[n - 8] = '\0';
    assert_null(strchr(tmp, '\n')); /* one data line */
    cJSON *j = cJSON_Parse(tmp);
    assert_non_null(j);
    return j;
}

static void test_render_chunks(void **state)
{
    duet_router_oai_meta_t m = {DUET_ROUTER_API_COMPLETIONS, "cmpl-2", 5, "mm"};
    duet_router_oai_usage_t u = {2, 4};
    duet_router_buf_t b;
    (void)state;

    duet_router_buf_init(&b);
    duet_router_oai_render_chunk(&b, &m, "x\ny", 3, NULL, false);
    cJSON *j = sse_json(b.data);
    assert_string_equal(cJSON_GetObjectItem(j, "object")->valuestring, "text_completion");
    cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    assert_string_equal(cJSON_GetObjectItem(c0, "text")->valuestring, "x\ny");
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(c0, "finish_reason")));
    cJSON_Delete(j);

    duet_router_buf_reset(&b);
    duet_router_oai_render_chunk(&b, &m, "", 0, "stop", false);
    j = sse_json(b.data);
    c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    assert_string_equal(cJSON_GetObjectItem(c0, "finish_reason")->valuestring, "stop");
    cJSON_Delete(j);

    duet_router_buf_reset(&b);
    duet_router_oai_render_usage_chunk(&b, &m, &u);
    j = sse_json(b.data);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "choices")), 0);
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"), "total_tokens")->valueint,
                     6);
    cJSON_Delete(j);

    /* chat: the first chunk carries the role, later ones only content */
    m.api = DUET_ROUTER_API_CHAT;
    duet_router_buf_reset(&b);
    duet_router_oai_render_chunk(&b, &m, "He", 2, NULL, true);
    j = sse_json(b.data);
    assert_string_equal(cJSON_GetObjectItem(j, "object")->valuestring, "chat.completion.chunk");
    cJSON *d =
        cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "delta");
    assert_string_equal(cJSON_GetObjectItem(d, "role")->valuestring, "assistant");
    assert_string_equal(cJSON_GetObjectItem(d, "content")->valuestring, "He");
    cJSON_Delete(j);
    duet_router_buf_reset(&b);
    duet_router_oai_render_chunk(&b, &m, "llo", 3, NULL, false);
    j = sse_json(b.data);
    d = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "delta");
    assert_null(cJSON_GetObjectItem(d, "role"));
    assert_string_equal(cJSON_GetObjectItem(d, "content")->valuestring, "llo");
    cJSON_Delete(j);
    duet_router_buf_reset(&b);
    duet_router_oai_render_chunk(&b, &m, "", 0, "length", false);
    j = sse_json(b.data);
    c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(c0, "delta")), 0);
    assert_string_equal(cJSON_GetObjectItem(c0, "finish_reason")->valuestring, "length");
    cJSON_Delete(j);
    duet_router_buf_cleanup(&b);
}

static void test_error_shape(void **state)
{
    duet_router_oai_error_t e;
    duet_router_buf_t b;
    (void)state;

    static const struct {
        int status;
        const char *type;
    } types[] = {{400, "invalid_request_error"}, {401, "authentication_error"},
                 {404, "invalid_request_error"}, {413, "invalid_request_error"},
                 {429, "rate_limit_error"},      {503, "server_error"},
                 {504, "server_error"}};
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        duet_router_oai_fail(&e, types[i].status, NULL, NULL, "x");
        assert_string_equal(e.type, types[i].type);
    }
    duet_router_oai_fail(&e, 404, "model", "model_not_found", "no model '%s'", "q\"");
    duet_router_buf_init(&b);
    duet_router_oai_render_error(&b, &e);
    cJSON *j = json_of(&b), *err = cJSON_GetObjectItem(j, "error");
    assert_string_equal(cJSON_GetObjectItem(err, "message")->valuestring, "no model 'q\"'");
    assert_string_equal(cJSON_GetObjectItem(err, "type")->valuestring, "invalid_request_error");
    assert_string_equal(cJSON_GetObjectItem(err, "param")->valuestring, "model");
    assert_string_equal(cJSON_GetObjectItem(err, "code")->valuestring, "model_not_found");
    cJSON_Delete(j);

    /* as an SSE event: one data line, null param and code */
    duet_router_oai_fail(&e, 503, NULL, NULL, "decode-1: gone");
    duet_router_buf_reset(&b);
    duet_router_sse_error(&b, &e);
    j = sse_json(b.data);
    err = cJSON_GetObjectItem(j, "error");
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(err, "param")));
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(err, "code")));
    assert_string_equal(cJSON_GetObjectItem(err, "type")->valuestring, "server_error");
    cJSON_Delete(j);
    duet_router_buf_cleanup(&b);
}

static void test_sse_framing(void **state)
{
    duet_router_buf_t b;
    (void)state;

    duet_router_buf_init(&b);
    duet_router_sse_data(&b, "{}", 2);
    assert_string_equal(b.data, "data: {}\n\n");
    duet_router_buf_reset(&b);
    duet_router_sse_data(&b, "a\nb\r\nc", 6);
    assert_string_equal(b.data, "data: a\ndata: b\ndata: c\n\n");
    duet_router_buf_reset(&b);
    duet_router_sse_comment(&b, "keep\nalive");
    assert_string_equal(b.data, ": keep alive\n\n");
    duet_router_buf_reset(&b);
    duet_router_sse_done(&b);
    assert_string_equal(b.data, "data: [DONE]\n\n");

    /* take() drains in pieces and the buffer keeps appending after it */
    char out[8];
    duet_router_buf_reset(&b);
    duet_router_buf_puts(&b, "0123456789");
    assert_int_equal(duet_router_buf_take(&b, out, 4), 4);
    assert_memory_equal(out, "0123", 4);
    duet_router_buf_puts(&b, "ab");
    assert_int_equal(duet_router_buf_unread(&b), 8);
    assert_int_equal(duet_router_buf_take(&b, out, 8), 8);
    assert_memory_equal(out, "456789ab", 8);
    assert_int_equal(duet_router_buf_unread(&b), 0);
    duet_router_buf_cleanup(&b);
}

static void test_json_escape(void **state)
{
    duet_router_buf_t b;
    (void)state;

    duet_router_buf_init(&b);
    duet_router_buf_json_str(&b, "a\"\\\n\t\x01/", 7);
    assert_string_equal(b.data, "\"a\\\"\\\\\\n\\t\\u0001/\"");
    duet_router_buf_reset(&b);
    /* valid multi-byte UTF-8 passes; invalid bytes become U+FFFD */
    duet_router_buf_json_str(&b, "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", 9);
    assert_string_equal(b.data, "\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"");
    duet_router_buf_reset(&b);
    duet_router_buf_json_str(&b,
                             "a\xff"
                             "b\xc3",
                             4);
    assert_string_equal(b.data, "\"a\xef\xbf\xbd"
                                "b\xef\xbf\xbd\"");
    cJSON *j = cJSON_Parse(b.data);
    assert_non_null(j);
    cJSON_Delete(j);
    duet_router_buf_reset(&b);
    duet_router_buf_json_str(&b, "\xed\xa0\x80", 3); /* a UTF-16 surrogate: invalid */
    assert_string_equal(b.data, "\"\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\"");
    duet_router_buf_cleanup(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_completion_defaults), cmocka_unit_test(test_completion_fields),
        cmocka_unit_test(test_completion_errors),   cmocka_unit_test(test_chat),
        cmocka_unit_test(test_parse_oom),           cmocka_unit_test(test_render_response),
        cmocka_unit_test(test_render_chunks),       cmocka_unit_test(test_error_shape),
        cmocka_unit_test(test_sse_framing),         cmocka_unit_test(test_json_escape),
        cmocka_unit_test(test_body_edges),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
