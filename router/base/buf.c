#include "router/base/buf.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"

void duet_router_buf_init(duet_router_buf_t *b)
{
    memset(b, 0, sizeof(*b));
}

void duet_router_buf_cleanup(duet_router_buf_t *b)
{
    duet_free(b->data);
    memset(b, 0, sizeof(*b));
}

void duet_router_buf_reset(duet_router_buf_t *b)
{
    b->off = b->len = 0;
    b->oom = false;
    if (b->data)
        b->data[0] = '\0';
}

static bool duet__buf_reserve(duet_router_buf_t *b, size_t extra)
{
    if (b->oom)
        return false;
    if (b->off > 0 && b->off == b->len) {
        b->off = b->len = 0;
    } else if (b->off > 4096 && b->off * 2 > b->len) {
        memmove(b->data, b->data + b->off, b->len - b->off);
        b->len -= b->off;
        b->off = 0;
    }
    if (b->len + extra + 1 <= b->cap)
        return true;
    if (extra > SIZE_MAX / 2 - b->len) {
        b->oom = true;
        return false;
    }
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1)
        cap *= 2;
    char *p = duet_realloc(b->data, cap);
    if (p == NULL) {
        b->oom = true;
        return false;
    }
    b->data = p;
    b->cap = cap;
    return true;
}

bool duet_router_buf_append(duet_router_buf_t *b, const void *p, size_t n)
{
    if (!duet__buf_reserve(b, n))
        return false;
    if (n)
        memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
    return true;
}

bool duet_router_buf_puts(duet_router_buf_t *b, const char *s)
{
    return duet_router_buf_append(b, s, strlen(s));
}

bool duet_router_buf_printf(duet_router_buf_t *b, const char *fmt, ...)
{
    va_list ap;
    char small[256];
    int n;

    va_start(ap, fmt);
    n = vsnprintf(small, sizeof(small), fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->oom = true;
        return false;
    }
    if ((size_t)n < sizeof(small))
        return duet_router_buf_append(b, small, (size_t)n);
    if (!duet__buf_reserve(b, (size_t)n))
        return false;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return true;
}

/* Length of the valid UTF-8 sequence at s (n bytes left), 0 if invalid. */
static size_t duet__utf8_seq(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    size_t len;
    uint32_t cp;

    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        len = 2, cp = c & 0x1F;
    else if (c >= 0xE0 && c <= 0xEF)
        len = 3, cp = c & 0x0F;
    else if (c >= 0xF0 && c <= 0xF4)
        len = 4, cp = c & 0x07;
    else
        return 0;
    if (n < len)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
        (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
        return 0;
    return len;
}

bool duet_router_buf_json_str(duet_router_buf_t *b, const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, run = 0;

    if (!duet_router_buf_append(b, "\"", 1))
        return false;
    while (i < n) {
        unsigned char c = p[i];
        const char *esc = NULL;
        char u[8];
        size_t k;

        if (c >= 0x20 && c != '"' && c != '\\' && c < 0x80) {
            i++;
            run++;
            continue;
        }
        if (c >= 0x80 && (k = duet__utf8_seq(p + i, n - i)) != 0) {
            i += k;
            run += k;
            continue;
        }
        duet_router_buf_append(b, p + i - run, run);
        run = 0;
        switch (c) {
        case '"':
            esc = "\\\"";
            break;
        case '\\':
            esc = "\\\\";
            break;
        case '\n':
            esc = "\\n";
            break;
        case '\r':
            esc = "\\r";
            break;
        case '\t':
            esc = "\\t";
            break;
        case '\b':
            esc = "\\b";
            break;
        case '\f':
            esc = "\\f";
            break;
        default:
            if (c < 0x20) {
                snprintf(u, sizeof(u), "\\u%04x", c);
                esc = u;
            } else {
                esc = "\xEF\xBF\xBD"; /* invalid UTF-8 byte -> U+FFFD */
            }
            break;
        }
        duet_router_buf_puts(b, esc);
        i++;
    }
    duet_router_buf_append(b, p + i - run, run);
    duet_router_buf_append(b, "\"", 1);
    return !b->oom;
}

size_t duet_router_buf_take(duet_router_buf_t *b, char *dst, size_t max)
{
    size_t n = b->len - b->off;
    if (n > max)
        n = max;
    memcpy(dst, b->data + b->off, n);
    b->off += n;
    if (b->off == b->len)
        b->off = b->len = 0;
    return n;
}

char *duet_router_buf_steal(duet_router_buf_t *b, size_t *len_p)
{
    char *out;
    size_t n = b->len - b->off;

    if (b->data == NULL || b->off > 0) {
        out = duet_malloc(n + 1);
        if (out == NULL)
            return NULL;
        if (n)
            memcpy(out, b->data + b->off, n);
        out[n] = '\0';
        duet_free(b->data);
    } else {
        out = b->data;
    }
    memset(b, 0, sizeof(*b));
    if (len_p)
        *len_p = n;
    return out;
}
