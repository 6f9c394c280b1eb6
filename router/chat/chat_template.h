/* Chat templates: a small interpreter for the Jinja subset that Hugging Face
 * chat templates (tokenizer_config.json "chat_template") use, so ChatML,
 * Llama-2, Mistral-style and similar templates render as transformers'
 * apply_chat_template does (trim_blocks and lstrip_blocks on).
 *
 * Supported: text, {{ expr }}, {% if/elif/else/endif %}, {% for x in expr
 * [if cond] %}...{% else %}{% endfor %} with loop.index/index0/first/last/
 * length/revindex/revindex0, {% set name = expr %} (and ns.attr with
 * namespace()), {# comments #}, whitespace control (-), string/int/bool/none
 * literals, lists, . and [] access, slices [a:b:step] (a string only with
 * step 1), + - * / // % ~, comparisons, in / not in, and/or/not,
 * a if c else b, tests (is [not] defined, none, string, number, mapping,
 * sequence, iterable, true, false, boolean, even, odd), filters (trim,
 * length, count, upper, lower, title, capitalize, string, default/d, first,
 * last, join, replace, tojson[(indent=N)], int, select/reject(test[, arg])
 * with the tests above and equalto/eq/ne, items), string methods (strip,
 * lstrip, rstrip -- with chars as Python's --, upper, lower, startswith,
 * endswith, replace, split, title), dict get/items/keys/values,
 * raise_exception(msg).  Syntax outside the subset fails at compile time
 * naming the construct; an unknown filter, test or method when it runs.
 * Verified byte-equal to @huggingface/jinja on the real Llama-3.1/3.2/3.3
 * and Qwen3 templates (tests/data/chat_templates).
 *
 * A compiled template is immutable: render it from any number of threads. */
#ifndef DUET_ROUTER_CHAT_CHAT_TEMPLATE_H
#define DUET_ROUTER_CHAT_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>

#include "common/status.h"

typedef struct {
    char *role;
    char *content;
} duet_router_chat_msg_t;

typedef struct duet_router_chat_tmpl duet_router_chat_tmpl_t;

/* Compile a template.  DUET_ERR_FORMAT (syntax) or DUET_ERR_UNSUPPORTED
 * (outside the subset) with a message naming the construct and line. */
duet_status_t duet_router_chat_tmpl_compile(const char *src, duet_router_chat_tmpl_t **tmpl_p);
void duet_router_chat_tmpl_destroy(duet_router_chat_tmpl_t *tmpl);

struct cJSON;

typedef struct {
    const duet_router_chat_msg_t *msgs;
    size_t n_msgs;
    const char *bos_token; /* "" when the model has none */
    const char *eos_token;
    bool add_generation_prompt;
    /* Optional (NULL: none): a JSON object whose members become template
     * variables, replacing those above of the same name -- e.g. messages
     * with tool_calls, tools, enable_thinking.  Numbers must be integers. */
    const struct cJSON *context;
} duet_router_chat_vars_t;

/* Render into a duet_malloc'd NUL-terminated string.  A template's
 * raise_exception() or a type error is DUET_ERR_INVALID with the message in
 * duet_error_msg() (the client's mistake, e.g. roles not alternating);
 * runaway output (> 16 MiB) is DUET_ERR_TOO_LONG. */
duet_status_t duet_router_chat_tmpl_render(const duet_router_chat_tmpl_t *tmpl,
                                           const duet_router_chat_vars_t *vars, char **out_p,
                                           size_t *len_p);

#endif
