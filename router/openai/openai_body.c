/* Checks on the raw bytes of a request body that a parsed cJSON tree can no
 * longer show (docs/security.md, "Input limits"): a NUL byte, raw or as the
 * escape \u0000, would cut a C string (a prompt) short without a word. */
#include <ctype.h>
#include <string.h>

#include "router/openai/openai.h"

#define DUET__KEY_SHOWN 64

static bool duet__is_nul_escape(const char *s, size_t left)
{
    return left >= 6 && s[1] == 'u' && memcmp(s + 2, "0000", 4) == 0;
}

static duet_status_t duet__nul_found(const char *body, size_t key_at, size_t key_len, size_t at,
                                     duet_router_oai_error_t *err)
{
    if (key_len == 0)
        return duet_router_oai_fail(err, 400, NULL, NULL,
                                    "the request body has a NUL character at byte %zu: NUL is "
                                    "not allowed in strings",
                                    at);
    return duet_router_oai_fail(err, 400, NULL, NULL,
                                "\"%.*s\" has a NUL character (byte %zu of the body): NUL is not "
                                "allowed in prompts or other strings",
                                (int)(key_len > DUET__KEY_SHOWN ? DUET__KEY_SHOWN : key_len),
                                body + key_at, at);
}

duet_status_t duet_router_oai_check_body(const char *body, size_t len, duet_router_oai_error_t *err)
{
    bool in_str = false, after_str = false;
    size_t str_at = 0, str_len = 0, key_at = 0, key_len = 0;

    for (size_t i = 0; i < len; i++) {
        char c = body[i];
        if (c == '\0')
            return duet__nul_found(body, key_at, key_len, i, err);
        if (in_str) {
            if (c == '\\') {
                if (duet__is_nul_escape(body + i, len - i))
                    return duet__nul_found(body, key_at, key_len, i, err);
                i++; /* the escaped character */
            } else if (c == '"') {
                in_str = false;
                after_str = true;
                str_len = i - str_at;
            }
            continue;
        }
        if (c == '"') {
            in_str = true;
            str_at = i + 1;
        } else if (c == ':' && after_str) {
            key_at = str_at; /* the string just closed was a key */
            key_len = str_len;
            after_str = false;
        } else if (!isspace((unsigned char)c)) {
            after_str = false;
        }
    }
    return DUET_OK;
}
