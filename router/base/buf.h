/* A growable byte buffer for building HTTP bodies, JSON and SSE frames.
 *
 * Append functions return false when memory runs out; the buffer then keeps
 * what it had and remembers the failure in `oom` so a builder can append a
 * whole message and check once.  Not thread-safe: the owner locks. */
#ifndef DUET_ROUTER_BASE_BUF_H
#define DUET_ROUTER_BASE_BUF_H

#include <stdbool.h>
#include <stddef.h>

typedef struct {
    char *data; /* NUL-terminated when cap > 0; [off, len) is unread */
    size_t off; /* bytes already consumed from the front */
    size_t len;
    size_t cap;
    bool oom;
} duet_router_buf_t;

void duet_router_buf_init(duet_router_buf_t *b);
void duet_router_buf_cleanup(duet_router_buf_t *b);
void duet_router_buf_reset(duet_router_buf_t *b);

bool duet_router_buf_append(duet_router_buf_t *b, const void *p, size_t n);
bool duet_router_buf_puts(duet_router_buf_t *b, const char *s);
bool duet_router_buf_printf(duet_router_buf_t *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* A JSON string literal (with quotes) of n bytes of UTF-8: ", \ and control
 * characters are escaped; invalid UTF-8 becomes U+FFFD so the output is
 * always valid JSON. */
bool duet_router_buf_json_str(duet_router_buf_t *b, const char *s, size_t n);

/* Unread bytes. */
static inline size_t duet_router_buf_unread(const duet_router_buf_t *b)
{
    return b->len - b->off;
}
/* Copy up to max unread bytes into dst and consume them; returns the count. */
size_t duet_router_buf_take(duet_router_buf_t *b, char *dst, size_t max);
/* Hand the data over (NUL-terminated, duet_malloc'd; the unread part only)
 * and reset the buffer.  NULL when empty and nothing could be allocated. */
char *duet_router_buf_steal(duet_router_buf_t *b, size_t *len_p);

#endif
