/* Chat templates: the Jinja subset renders real Hugging Face templates
 * (ChatML, Qwen2-style, Llama-2) exactly, honours whitespace control and
 * trim_blocks/lstrip_blocks, reports raise_exception as the client's error
 * and refuses what it does not implement at compile time. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "common/alloc.h"
#include "router/chat/chat_template.h"

static duet_router_chat_msg_t msgs4[] = {
    {"system", "Be brief."},
    {"user", "Hi"},
    {"assistant", "Hello!"},
    {"user", "Tell a story"},
};

static char *render(const char *src, const duet_router_chat_msg_t *m, size_t n, bool gen,
                    duet_status_t want)
{
    duet_router_chat_tmpl_t *t;
    duet_router_chat_vars_t v = {m, n, "<s>", "</s>", gen, NULL};
    char *out = NULL;
    size_t len = 0;

    if (duet_router_chat_tmpl_compile(src, &t) != DUET_OK)
        fail_msg("compile: %s", duet_error_msg());
    duet_status_t st = duet_router_chat_tmpl_render(t, &v, &out, &len);
    duet_router_chat_tmpl_destroy(t);
    if (st != want)
        fail_msg("render: %s (%s)", duet_status_name(st), duet_error_msg());
    if (out)
        assert_int_equal(strlen(out), len);
    return out;
}

static void check(const char *src, const duet_router_chat_msg_t *m, size_t n, bool gen,
                  const char *expect)
{
    long live = duet_alloc_live();
    char *out = render(src, m, n, gen, DUET_OK);
    if (strcmp(out, expect) != 0)
        fail_msg("template %s\n got: [%s]\nwant: [%s]", src, out, expect);
    duet_free(out);
    assert_int_equal(duet_alloc_live(), live);
}

static void test_chatml(void **state)
{
    (void)state;
    /* tests/data/tokenizers/bytelevel_qwen2/tokenizer_config.json */
    check("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
          "{% endfor %}",
          msgs4 + 1, 2, false,
          "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!"
          "<|im_end|>\n");
    /* Qwen2-style: default system prompt, generation prompt */
    const char *qwen =
        "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
        "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
        "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
        "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
        "{% endif %}";
    check(qwen, msgs4 + 1, 1, true,
          "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi"
          "<|im_end|>\n<|im_start|>assistant\n");
    check(qwen, msgs4, 2, false,
          "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
}

static const char *llama2 =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}"
    "{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
    "{% for message in loop_messages %}{% if (message['role'] == 'user') != "
    "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and "
    "system_message != false %}{% set content = '<<SYS>>\\n' + system_message + "
    "'\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = "
    "message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + "
    "'[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}";

static void test_llama2(void **state)
{
    (void)state;
    check(llama2, msgs4, 4, true,
          "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello! </s><s>[INST] Tell a "
          "story [/INST]");
    check(llama2, msgs4 + 1, 1, true, "<s>[INST] Hi [/INST]");

    /* roles that do not alternate: the template's own message, as INVALID */
    duet_router_chat_msg_t bad[] = {{"user", "a"}, {"user", "b"}};
    char *out = render(llama2, bad, 2, true, DUET_ERR_INVALID);
    assert_null(out);
    assert_non_null(strstr(duet_error_msg(), "Conversation roles must alternate"));
}

static void test_whitespace(void **state)
{
    duet_router_chat_msg_t m[] = {{"user", "hi"}, {"assistant", "yo"}};
    (void)state;
    /* trim_blocks + lstrip_blocks: lines holding only block tags vanish */
    check("{% for m in messages %}\n  {% if m.role == 'user' %}\nU: {{ m.content }}\n"
          "  {% else %}\nA: {{ m.content }}\n  {% endif %}\n{% endfor %}\n",
          m, 2, false, "U: hi\nA: yo\n");
    /* explicit - strips on either side, + keeps the indentation */
    check("a  \n  {%- if true -%}  \n b {%- endif %}\n\n{{- ' c ' -}}\n d", m, 0, false, "ab c d");
    check("x\n  {%+ if true %}y{% endif %}", m, 0, false, "x\n  y");
    check("{# a comment #}\n{{ 'z' }}{# another\nline #}", m, 0, false, "z");
}

static void test_expressions(void **state)
{
    duet_router_chat_msg_t m[] = {{"user", "  Hi there  "}, {"assistant", "ok"}};
    (void)state;
    check("{{ 1 + 2 * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ (1 + 2) * 3 }}", m, 0, false,
          "7 3 -4 1 9");
    check("{{ messages | length }} {{ messages[0].content | trim }} {{ 'ab' | upper }}"
          " {{ messages[-1]['role'] }} {{ nothing | default('dflt') }}",
          m, 2, false, "2 Hi there AB assistant dflt");
    check("{{ messages[0].content.strip().lower() }}|{{ 'a-b-c'.split('-') | join('+') }}"
          "|{{ 'abc'[1:] }}|{{ 'abc'[:-1] }}|{{ 'x' ~ 3 ~ true }}",
          m, 2, false, "hi there|a+b+c|bc|ab|x3True");
    check("{% if 'ss' in 'assist' and not ('zz' in 'assist') %}yes{% endif %}"
          "{% if 3 is odd and 4 is even and x is not defined and none is none %}!{% endif %}",
          m, 0, false, "yes!");
    check("{{ [1, 2] + [3] }}{{ {'a': 1}['a'] }}{{ messages[0] | tojson }}", m, 1, false,
          "[1, 2, 3]1{\"role\": \"user\", \"content\": \"  Hi there  \"}");
    check("{% set ns = namespace(found=false) %}{% for x in messages %}"
          "{% if x.role == 'assistant' %}{% set ns.found = true %}{% endif %}{% endfor %}"
          "{{ ns.found }}",
          m, 2, false, "True");
    check("{% for x in [] %}a{% else %}empty{% endfor %}|{% for x in messages if x.role == "
          "'assistant' %}{{ loop.index }}/{{ loop.length }}:{{ x.content }}{% endfor %}",
          m, 2, false, "empty|1/1:ok");
    check("{% if false %}a{% elif 1 > 2 %}b{% elif 'a' < 'b' %}c{% else %}d{% endif %}"
          "{{ 'y' if messages else 'n' }}{{ 'p' if not messages else 'q' }}",
          m, 0, false, "cnp");
    check("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}"
          "{{ messages[0].get('role') }}{{ bos_token }}{{ eos_token }}",
          m, 1, false, "a=1;b=2;user<s></s>");
}

static void test_errors(void **state)
{
    static const struct {
        const char *src;
        duet_status_t st;
    } bad[] = {
        {"{{ 1 + }}", DUET_ERR_FORMAT},
        {"{% if x %}a", DUET_ERR_FORMAT},
        {"{% for x in y %}a{% endif %}", DUET_ERR_FORMAT},
        {"{{ 'abc }}", DUET_ERR_FORMAT},
        {"{{ x ", DUET_ERR_FORMAT},
        {"{% macro f() %}x{% endmacro %}", DUET_ERR_UNSUPPORTED},
        {"{% set x %}a{% endset %}", DUET_ERR_UNSUPPORTED},
        {"{% for x in y recursive %}{% endfor %}", DUET_ERR_UNSUPPORTED},
    };
    duet_router_chat_tmpl_t *t;
    long live = duet_alloc_live();
    (void)state;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        duet_status_t st = duet_router_chat_tmpl_compile(bad[i].src, &t);
        if (st != bad[i].st)
            fail_msg("%s: %s (%s)", bad[i].src, duet_status_name(st), duet_error_msg());
        assert_non_null(strstr(duet_error_msg(), "chat template line"));
    }
    /* runtime: an unknown filter, arithmetic on strings */
    char *out = render("{{ 'a' | frobnicate }}", msgs4, 1, false, DUET_ERR_UNSUPPORTED);
    assert_null(out);
    out = render("{{ 'a' - 1 }}", msgs4, 1, false, DUET_ERR_INVALID);
    assert_null(out);
    /* runaway output is bounded: 64^3 x 100 bytes would be 26 MB */
    duet_router_chat_msg_t many[64];
    for (size_t i = 0; i < 64; i++)
        many[i] = (duet_router_chat_msg_t){"user", "x"};
    out = render("{% for a in messages %}{% for b in messages %}{% for c in messages %}"
                 "{{ '0123456789012345678901234567890123456789012345678901234567890123456789"
                 "012345678901234567890123456789' }}{% endfor %}{% endfor %}{% endfor %}",
                 many, 64, false, DUET_ERR_TOO_LONG);
    assert_null(out);
    assert_int_equal(duet_alloc_live(), live);
}

static void test_oom(void **state)
{
    duet_router_chat_tmpl_t *t;
    duet_router_chat_vars_t v = {msgs4, 4, "<s>", "</s>", true, NULL};
    long live = duet_alloc_live();
    bool compiled = false, rendered = false;
    (void)state;

    for (long n = 0; n < 200 && !rendered; n++) {
        char *out = NULL;
        duet_alloc_fail_after(n);
        duet_status_t st = duet_router_chat_tmpl_compile(llama2, &t);
        if (st == DUET_OK) {
            compiled = true;
            st = duet_router_chat_tmpl_render(t, &v, &out, NULL);
            duet_router_chat_tmpl_destroy(t);
        }
        duet_alloc_fail_after(-1);
        if (st == DUET_OK) {
            rendered = true;
            duet_free(out);
        } else {
            assert_int_equal(st, DUET_ERR_NO_MEMORY);
        }
        assert_int_equal(duet_alloc_live(), live);
    }
    assert_true(compiled && rendered);
}

/* Render src with the variables of the JSON object ctx (vars.context);
 * the expected texts are what Python's jinja2 renders. */
static void check_ctx(const char *src, const char *ctx, duet_status_t want, const char *expect)
{
    duet_router_chat_tmpl_t *t;
    cJSON *j = cJSON_Parse(ctx);
    duet_router_chat_vars_t v = {msgs4, 4, "<s>", "</s>", false, j};
    char *out = NULL;
    long live = duet_alloc_live();

    assert_non_null(j);
    if (duet_router_chat_tmpl_compile(src, &t) != DUET_OK)
        fail_msg("compile %s: %s", src, duet_error_msg());
    duet_status_t st = duet_router_chat_tmpl_render(t, &v, &out, NULL);
    duet_router_chat_tmpl_destroy(t);
    cJSON_Delete(j);
    if (st != want)
        fail_msg("render %s: %s (%s)", src, duet_status_name(st), duet_error_msg());
    if (expect != NULL && strcmp(out, expect) != 0)
        fail_msg("template %s\n got: [%s]\nwant: [%s]", src, out, expect);
    duet_free(out);
    assert_int_equal(duet_alloc_live(), live);
}

static void test_context(void **state)
{
    (void)state;
    /* context members are variables, replacing messages & co */
    check_ctx("{{ messages | length }} {{ messages[0].tool_calls[0].function.name }} "
              "{{ enable_thinking is false }} {{ tools is none }} {{ bos_token }}",
              "{\"messages\": [{\"role\": \"assistant\", \"content\": null, \"tool_calls\": "
              "[{\"function\": {\"name\": \"f\", \"arguments\": {}}}]}], "
              "\"enable_thinking\": false, \"tools\": null}",
              DUET_OK, "1 f True True <s>");
    check_ctx("{{ tools | tojson(indent=2) }}|{{ tools | tojson }}",
              "{\"tools\": [{\"a\": 1, \"b\": [1, 2], \"c\": {}, \"d\": []}]}", DUET_OK,
              "[\n  {\n    \"a\": 1,\n    \"b\": [\n      1,\n      2\n    ],\n    \"c\": {},\n"
              "    \"d\": []\n  }\n]|[{\"a\": 1, \"b\": [1, 2], \"c\": {}, \"d\": []}]");
    /* slices with a step, as Python's */
    check_ctx(
        "{{ xs[::-1] | join(',') }} {{ xs[::2] | join(',') }} {{ xs[-1:0:-2] | join(',') }} "
        "{{ xs[5:1:-1] | join(',') }} {{ xs[1::-1] | join(',') }} {{ xs[-9::3] | join(',') }}",
        "{\"xs\": [1, 2, 3, 4]}", DUET_OK, "4,3,2,1 1,3 4,2 4,3 2,1 1,4");
    check_ctx("{{ xs[::0] }}", "{\"xs\": [1]}", DUET_ERR_INVALID, NULL);
    check_ctx("{{ s[::-1] }}", "{\"s\": \"ab\"}", DUET_ERR_UNSUPPORTED, NULL);
    /* strip with chars, as Python's str methods */
    check_ctx("[{{ s.strip('\\n') }}][{{ s.lstrip('\\n ') }}][{{ s.rstrip() }}][{{ s | trim }}]",
              "{\"s\": \"\\n x \\n\"}", DUET_OK, "[ x ][x \n][\n x][x]");
    /* select / reject with a test name, items */
    check_ctx("{{ xs | reject('equalto', 'b') | join(', ') }};{{ xs | select('equalto', 'b') | "
              "join }};{{ ns | select('odd') | join }};"
              "{% for k, v in d | items %}{{ k }}={{ v }},{% endfor %}",
              "{\"xs\": [\"a\", \"b\", \"c\"], \"ns\": [1, 2, 3], \"d\": {\"x\": \"1\", \"y\": 2}}",
              DUET_OK, "a, c;b;13;x=1,y=2,");
    check_ctx("{{ xs | reject('nosuchtest') | join }}", "{\"xs\": [1]}", DUET_ERR_UNSUPPORTED,
              NULL);
    /* numbers must be integers; the context must be an object */
    check_ctx("{{ x }}", "{\"x\": 1.5}", DUET_ERR_UNSUPPORTED, NULL);
    check_ctx("{{ x }}", "[1]", DUET_ERR_INVALID, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chatml),     cmocka_unit_test(test_llama2),
        cmocka_unit_test(test_whitespace), cmocka_unit_test(test_expressions),
        cmocka_unit_test(test_errors),     cmocka_unit_test(test_oom),
        cmocka_unit_test(test_context),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
