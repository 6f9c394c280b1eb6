/* The HTTP request path: a POST body for /v1/completions or
 * /v1/chat/completions -> OpenAI JSON parsing and validation
 * (router/openai/openai.h) -> the chat template or the tokenizer
 * (duet_router_chat_prompt, duet_router_prompt_ids) -> the
 * duet.v1.GenerateRequest that goes to decode, packed and unpacked as on
 * the wire.  The steps and their order are those of the router's submit
 * (router/http/http_gen.c, duet__submit), on a router context holding what it
 * needs for them: the Qwen2-style byte-level tokenizer fixture with its
 * ChatML template, a 512-token context and the default limits.
 *
 * Every error must render as an OpenAI error body that is valid UTF-8
 * JSON with the same message, and so must a response carrying the
 * parsed prompt text (the router echoes no prompt, but the renderer sees
 * arbitrary model text).
 *
 * Input: byte 0 bit 0 picks chat; the rest is the body. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/rpc_pb.h"
#include "fuzz/fuzz.h"
#include "router/job/request.h"

static duet_router_t duet__fuzz_rt;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    duet_router_t *rt = &duet__fuzz_rt;
    const char *tmpl;

    (void)argc;
    (void)argv;
    duet_fuzz_quiet();
    rt->tok = duet_fuzz_tokenizer("tests/data/tokenizers/bytelevel_qwen2");
    tmpl = duet_tokenizer_chat_template(rt->tok);
    if (tmpl == NULL || duet_router_chat_tmpl_compile(tmpl, &rt->chat) != DUET_OK)
        abort();
    rt->model_name = "qwen2-fixture";
    rt->context_len = 512;
    rt->prompt_limit = 512;
    rt->vocab = duet_tokenizer_vocab_size(rt->tok);
    rt->max_tokens_limit = 4096;
    rt->default_max_tokens = 256;
    rt->bos_str = "";
    rt->eos_str = "<|im_end|>";
    return 0;
}

static bool duet__fuzz_utf8_ok(const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t k = c < 0x80             ? 1
                   : (c & 0xE0) == 0xC0 ? 2
                   : (c & 0xF0) == 0xE0 ? 3
                   : (c & 0xF8) == 0xF0 ? 4
                                        : 0;
        if (k == 0 || i + k > n || (k == 2 && c < 0xC2) || (k == 4 && c > 0xF4))
            return false;
        for (size_t j = 1; j < k; j++)
            if ((s[i + j] & 0xC0) != 0x80)
                return false;
        uint32_t cp = k == 1 ? c : c & (0x3F >> (k - 1));
        for (size_t j = 1; j < k; j++)
            cp = cp << 6 | (s[i + j] & 0x3F);
        if ((k == 3 && cp < 0x800) || (k == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
            (cp >= 0xD800 && cp <= 0xDFFF))
            return false;
        i += k;
    }
    return true;
}

/* b holds one JSON document: valid UTF-8 that cJSON parses. */
static cJSON *duet__fuzz_json(const duet_router_buf_t *b, const char *what)
{
    if (b->oom)
        abort();
    const char *s = b->data + b->off;
    size_t n = duet_router_buf_unread(b);
    cJSON *root = cJSON_ParseWithLength(s, n);
    if (!duet__fuzz_utf8_ok((const unsigned char *)s, n) || root == NULL) {
        fprintf(stderr, "%s is not valid UTF-8 JSON: %.*s\n", what, (int)n, s);
        abort();
    }
    return root;
}

static void duet__fuzz_error(const duet_router_oai_error_t *err)
{
    duet_router_buf_t b;
    duet_router_buf_init(&b);
    if (err->status < 400 || err->status > 599 || err->type == NULL)
        abort();
    duet_router_oai_render_error(&b, err);
    cJSON *root = duet__fuzz_json(&b, "error body");
    const cJSON *m = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "error"), "message");
    if (!cJSON_IsString(m))
        abort();
    cJSON_Delete(root);
    duet_router_buf_cleanup(&b);
}

/* The request decode gets, as the HTTP front end builds it
 * (duet_router_gen_from_oai, router/job/request.c); packed, unpacked and
 * compared. */
static void duet__fuzz_generate(const duet_router_oai_req_t *req, int32_t *ids, size_t n_ids)
{
    duet_router_gen_t gen;
    Duet__V1__GenerateRequest g;
    uint8_t *buf = NULL;
    size_t len = 0;

    duet_router_gen_from_oai(&gen, &duet__fuzz_rt, req, ids, n_ids);
    gen.g.request_id = (char *)"cmpl-fuzz";
    g = gen.g;
    if (g.max_tokens < 1 || g.max_tokens > duet__fuzz_rt.max_tokens_limit)
        abort();
    if (duet_pb_pack(&g.base, &buf, &len) != DUET_OK)
        abort();
    Duet__V1__GenerateRequest *u = duet__v1__generate_request__unpack(NULL, len, buf);
    if (u == NULL || u->prompt_case != g.prompt_case || u->token_ids->n_ids != n_ids ||
        u->n_stop != g.n_stop || u->n_stop_token_ids != g.n_stop_token_ids ||
        u->max_tokens != g.max_tokens) {
        fprintf(stderr, "the GenerateRequest does not survive the wire\n");
        abort();
    }
    for (size_t i = 0; i < g.n_stop; i++)
        if (strcmp(u->stop[i], g.stop[i]) != 0)
            abort(); /* a stop string with a NUL would be cut here */
    duet__v1__generate_request__free_unpacked(u, NULL);
    duet_free(buf);
}

static void duet__fuzz_echo(duet_router_api_t api, const char *text, size_t len)
{
    duet_router_oai_meta_t m = {api, "cmpl-fuzz", 1, "qwen2-fixture"};
    duet_router_oai_usage_t u = {1, 2};
    duet_router_buf_t b;

    duet_router_buf_init(&b);
    duet_router_oai_render_response(&b, &m, text, len, "stop", &u);
    cJSON_Delete(duet__fuzz_json(&b, "response"));
    duet_router_buf_cleanup(&b);
    duet_router_buf_init(&b);
    duet_router_oai_render_chunk(&b, &m, text, len, NULL, api == DUET_ROUTER_API_CHAT);
    if (duet_router_buf_unread(&b) < 8 || memcmp(b.data + b.off, "data: ", 6) != 0)
        abort();
    b.off += 6;
    b.len -= 2; /* the event's blank line */
    cJSON_Delete(duet__fuzz_json(&b, "stream chunk"));
    duet_router_buf_cleanup(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    duet_router_t *rt = &duet__fuzz_rt;
    duet_router_oai_limits_t lim = {rt->max_tokens_limit, rt->vocab, 16};
    duet_router_oai_req_t req;
    duet_router_oai_error_t err;
    duet_router_api_t api;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    char *chat_text = NULL, *body;
    size_t chat_len = 0;

    if (size < 1)
        return 0;
    api = (data[0] & 1) ? DUET_ROUTER_API_CHAT : DUET_ROUTER_API_COMPLETIONS;
    /* MHD hands the body over as bytes; copy it so ASan sees its end */
    body = malloc(size - 1 ? size - 1 : 1);
    if (body == NULL)
        abort();
    memcpy(body, data + 1, size - 1);
    if (duet_router_oai_parse(body, size - 1, api, &lim, &req, &err) != DUET_OK) {
        duet__fuzz_error(&err);
        free(body);
        return 0;
    }
    free(body);
    if (req.model != NULL && strcmp(req.model, rt->model_name) != 0) {
        duet_router_oai_fail(&err, 404, "model", "model_not_found",
                             "the model '%s' does not exist (this server serves '%s')", req.model,
                             rt->model_name);
        duet__fuzz_error(&err);
    }
    if (api == DUET_ROUTER_API_CHAT) {
        if (duet_router_chat_prompt(rt, &req, &chat_text, &chat_len, &err) != DUET_OK ||
            duet_router_prompt_ids(rt, chat_text, chat_len, false, NULL, 0, "messages", &ids,
                                   &n_ids, &err) != DUET_OK)
            goto fail;
        duet__fuzz_echo(api, chat_text, chat_len);
    } else {
        if (duet_router_prompt_ids(rt, req.has_text ? req.prompt_text : NULL, req.prompt_text_len,
                                   true, req.prompt_ids, req.n_prompt_ids, "prompt", &ids, &n_ids,
                                   &err) != DUET_OK)
            goto fail;
        if (req.has_text)
            duet__fuzz_echo(api, req.prompt_text, req.prompt_text_len);
    }
    duet__fuzz_generate(&req, ids, n_ids);
    goto out;
fail:
    duet__fuzz_error(&err);
out:
    duet_free(ids);
    duet_free(chat_text);
    duet_router_oai_req_cleanup(&req);
    return 0;
}
