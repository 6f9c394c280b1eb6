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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chatml),     cmocka_unit_test(test_llama2),
        cmocka_unit_test(test_whitespace), cmocka_unit_test(test_expressions),
        cmocka_unit_test(test_errors),     cmocka_unit_test(test_oom),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
