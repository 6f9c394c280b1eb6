/* duet-chat-render TEMPLATE: render the chat template in the file TEMPLATE
 * with duet's interpreter (router/chat), the variables being the members of
 * the JSON object read from stdin (messages, tools, bos_token, eos_token,
 * add_generation_prompt, ...), and write the prompt to stdout.  Test-only:
 * tests/clients/chat_templates_ref.mjs compares it with @huggingface/jinja.
 * Exit 1 with the error on stderr when the template does not compile or
 * render. */
#include <stdio.h>

#include <cjson/cJSON.h>

#include "common/alloc.h"
#include "common/json.h"
#include "router/chat/chat_template.h"

static char *duet__read_stdin(size_t *len_p)
{
    size_t cap = 4096, len = 0;
    char *buf = duet_malloc(cap);
    while (buf != NULL) {
        size_t n = fread(buf + len, 1, cap - len, stdin);
        len += n;
        if (n == 0)
            break;
        if (len == cap) {
            char *nb = duet_realloc(buf, cap * 2);
            if (nb == NULL) {
                duet_free(buf);
                return NULL;
            }
            buf = nb;
            cap *= 2;
        }
    }
    *len_p = len;
    return buf;
}

int main(int argc, char **argv)
{
    char *src = NULL, *ctx_text = NULL, *out = NULL;
    size_t src_len = 0, ctx_len = 0, out_len = 0;
    cJSON *ctx = NULL;
    duet_router_chat_tmpl_t *tmpl = NULL;
    duet_status_t st;
    int rc = 1;

    if (argc != 2) {
        fprintf(stderr, "usage: duet-chat-render TEMPLATE < context.json\n");
        return 2;
    }
    if ((st = duet_file_read(argv[1], &src, &src_len)) != DUET_OK)
        goto out;
    if ((ctx_text = duet__read_stdin(&ctx_len)) == NULL) {
        fprintf(stderr, "duet-chat-render: cannot read stdin\n");
        goto done;
    }
    if ((st = duet_json_parse(ctx_text, ctx_len, "context", &ctx)) != DUET_OK)
        goto out;
    if ((st = duet_router_chat_tmpl_compile(src, &tmpl)) != DUET_OK)
        goto out;
    duet_router_chat_vars_t vars = {NULL, 0, "", "", false, ctx};
    if ((st = duet_router_chat_tmpl_render(tmpl, &vars, &out, &out_len)) != DUET_OK)
        goto out;
    rc = fwrite(out, 1, out_len, stdout) == out_len ? 0 : 1;
    goto done;
out:
    fprintf(stderr, "duet-chat-render: %s\n", duet_error_msg());
done:
    duet_free(out);
    duet_router_chat_tmpl_destroy(tmpl);
    cJSON_Delete(ctx);
    duet_free(ctx_text);
    duet_free(src);
    return rc;
}
