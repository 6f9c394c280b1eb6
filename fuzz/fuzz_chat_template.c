/* The chat-template interpreter (router/chat/chat_template.h) with arbitrary
 * templates and messages: compile, then render.
 *
 * Input: byte 0: bit 0 add_generation_prompt, bit 1 a context; the rest,
 * cut at \x1e (record separator): the template, with bit 1 a JSON object
 * of variables (vars.context: tools, messages with tool_calls...), then
 * role and content pairs.  bos and eos are fixed strings.  A rendered
 * prompt must be a NUL-terminated string of the reported length, within
 * the documented 16 MiB cap. */
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/alloc.h"
#include "fuzz/fuzz.h"
#include "router/chat/chat_template.h"

#define DUET__FUZZ_MAX_MSGS 16

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    duet_fuzz_quiet();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    duet_router_chat_msg_t msgs[DUET__FUZZ_MAX_MSGS];
    duet_fuzz_cut_t cut;
    duet_router_chat_tmpl_t *tmpl = NULL;
    size_t n = 0, len = 0;
    char *src, *out = NULL;
    cJSON *ctx = NULL;

    if (size < 1)
        return 0;
    cut.p = data + 1;
    cut.left = size - 1;
    src = duet_fuzz_next(&cut, 0x1e, NULL);
    if ((data[0] & 2) != 0 && cut.p != NULL) {
        size_t ctx_len = 0;
        char *text = duet_fuzz_next(&cut, 0x1e, &ctx_len);
        ctx = cJSON_ParseWithLength(text, ctx_len);
        free(text);
    }
    while (n < DUET__FUZZ_MAX_MSGS && cut.p != NULL) {
        msgs[n].role = duet_fuzz_next(&cut, 0x1e, NULL);
        msgs[n].content = cut.p ? duet_fuzz_next(&cut, 0x1e, NULL) : strdup("");
        n++;
    }
    if (duet_router_chat_tmpl_compile(src, &tmpl) == DUET_OK) {
        duet_router_chat_vars_t vars = {.msgs = msgs,
                                        .n_msgs = n,
                                        .bos_token = "<s>",
                                        .eos_token = "</s>",
                                        .add_generation_prompt = (data[0] & 1) != 0,
                                        .context = ctx};
        if (duet_router_chat_tmpl_render(tmpl, &vars, &out, &len) == DUET_OK) {
            if (out == NULL || strlen(out) > len || len > (16u << 20)) {
                fprintf(stderr, "render: bad output (len %zu)\n", len);
                abort();
            }
            duet_free(out);
        }
        duet_router_chat_tmpl_destroy(tmpl);
    }
    for (size_t i = 0; i < n; i++) {
        free(msgs[i].role);
        free(msgs[i].content);
    }
    cJSON_Delete(ctx);
    free(src);
    return 0;
}
