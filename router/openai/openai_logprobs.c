/* OpenAI's logprobs shapes and choice objects (docs/api-logprobs.md).
 * Log-probabilities are printed with 9 significant digits (a float's
 * round trip); a token's text is its bytes, JSON-escaped (bytes that are
 * not UTF-8 on their own, as a byte-fallback piece of a character, print
 * as U+FFFD in the string; chat's "bytes" keeps them exact). */
#include <string.h>

#include "router/openai/openai.h"

#define DUET__TOK_CAP 512

static void duet__lp_num(duet_router_buf_t *b, float v)
{
    duet_router_buf_printf(b, "%.9g", (double)v);
}

static size_t duet__tok(duet_router_oai_tok_fn tok, void *ud, int32_t id, char *buf)
{
    size_t n = tok(ud, id, buf, DUET__TOK_CAP);
    return n < DUET__TOK_CAP ? n : DUET__TOK_CAP;
}

static void duet__bytes(duet_router_buf_t *b, const char *s, size_t n)
{
    duet_router_buf_puts(b, "[");
    for (size_t i = 0; i < n; i++)
        duet_router_buf_printf(b, i ? ",%u" : "%u", (unsigned)(unsigned char)s[i]);
    duet_router_buf_puts(b, "]");
}

static void duet__completions(duet_router_buf_t *b, const duet_router_oai_lp_t *lps, size_t n,
                              duet_router_oai_tok_fn tok, void *ud, size_t *offset_p)
{
    char t[DUET__TOK_CAP];
    size_t off = offset_p ? *offset_p : 0;

    duet_router_buf_puts(b, "{\"tokens\":[");
    for (size_t i = 0; i < n; i++) {
        size_t len = duet__tok(tok, ud, lps[i].id, t);
        if (i)
            duet_router_buf_puts(b, ",");
        duet_router_buf_json_str(b, t, len);
    }
    duet_router_buf_puts(b, "],\"token_logprobs\":[");
    for (size_t i = 0; i < n; i++) {
        if (i)
            duet_router_buf_puts(b, ",");
        if (lps[i].has_logprob)
            duet__lp_num(b, lps[i].logprob);
        else
            duet_router_buf_puts(b, "null");
    }
    duet_router_buf_puts(b, "],\"top_logprobs\":[");
    for (size_t i = 0; i < n; i++) {
        if (i)
            duet_router_buf_puts(b, ",");
        if (!lps[i].has_logprob) {
            duet_router_buf_puts(b, "null");
            continue;
        }
        duet_router_buf_puts(b, "{");
        for (int k = 0; k < lps[i].n_top; k++) {
            size_t len = duet__tok(tok, ud, lps[i].top_ids[k], t);
            if (k)
                duet_router_buf_puts(b, ",");
            duet_router_buf_json_str(b, t, len);
            duet_router_buf_puts(b, ":");
            duet__lp_num(b, lps[i].top_logprobs[k]);
        }
        duet_router_buf_puts(b, "}");
    }
    duet_router_buf_puts(b, "],\"text_offset\":[");
    for (size_t i = 0; i < n; i++) {
        duet_router_buf_printf(b, i ? ",%zu" : "%zu", off);
        off += duet__tok(tok, ud, lps[i].id, t);
    }
    duet_router_buf_puts(b, "]}");
    if (offset_p)
        *offset_p = off;
}

static void duet__chat_entry(duet_router_buf_t *b, duet_router_oai_tok_fn tok, void *ud, int32_t id,
                             float lp)
{
    char t[DUET__TOK_CAP];
    size_t len = duet__tok(tok, ud, id, t);

    duet_router_buf_puts(b, "{\"token\":");
    duet_router_buf_json_str(b, t, len);
    duet_router_buf_puts(b, ",\"logprob\":");
    duet__lp_num(b, lp);
    duet_router_buf_puts(b, ",\"bytes\":");
    duet__bytes(b, t, len);
}

static void duet__chat(duet_router_buf_t *b, const duet_router_oai_lp_t *lps, size_t n,
                       duet_router_oai_tok_fn tok, void *ud)
{
    duet_router_buf_puts(b, "{\"content\":[");
    for (size_t i = 0; i < n; i++) {
        if (i)
            duet_router_buf_puts(b, ",");
        duet__chat_entry(b, tok, ud, lps[i].id, lps[i].logprob);
        duet_router_buf_puts(b, ",\"top_logprobs\":[");
        for (int k = 0; k < lps[i].n_top; k++) {
            if (k)
                duet_router_buf_puts(b, ",");
            duet__chat_entry(b, tok, ud, lps[i].top_ids[k], lps[i].top_logprobs[k]);
            duet_router_buf_puts(b, "}");
        }
        duet_router_buf_puts(b, "]}");
    }
    duet_router_buf_puts(b, "],\"refusal\":null}");
}

bool duet_router_oai_render_logprobs(duet_router_buf_t *b, duet_router_api_t api,
                                     const duet_router_oai_lp_t *lps, size_t n,
                                     duet_router_oai_tok_fn tok, void *ud, size_t *offset_p)
{
    if (api == DUET_ROUTER_API_CHAT)
        duet__chat(b, lps, n, tok, ud);
    else
        duet__completions(b, lps, n, tok, ud, offset_p);
    return !b->oom;
}

bool duet_router_oai_render_choice(duet_router_buf_t *b, duet_router_api_t api, int index,
                                   const char *text, size_t len, const char *lp_json, size_t lp_len,
                                   const char *finish)
{
    duet_router_buf_printf(b, "{\"index\":%d,", index);
    if (api == DUET_ROUTER_API_CHAT) {
        duet_router_buf_puts(b, "\"message\":{\"role\":\"assistant\",\"content\":");
        duet_router_buf_json_str(b, text, len);
        duet_router_buf_puts(b, "},");
    } else {
        duet_router_buf_puts(b, "\"text\":");
        duet_router_buf_json_str(b, text, len);
        duet_router_buf_puts(b, ",");
    }
    duet_router_oai_put_logprobs(b, lp_json, lp_len);
    duet_router_buf_printf(b, ",\"finish_reason\":\"%s\"}", finish);
    return !b->oom;
}
