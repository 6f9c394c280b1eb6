/* The header section of a request, as RFC 9112 writes it (docs/security.md
 * "Strict HTTP/1.1 framing"): what libmicrohttpd 0.9.75 lets through and
 * the router refuses with 400 and Connection: close.
 *
 * libmicrohttpd parses the header in place in its read buffer: the CR and
 * LF that end a line and the colon after a field name become NUL bytes,
 * the name and the value are pointers into that buffer, and the section
 * spans [method, method + MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE).  What it
 * tolerates leaves a mark in that layout that no well-formed request has:
 *  - a bare LF ends a line with one NUL instead of two;
 *  - a NUL inside a value ends MHD's copy of the value early (strlen), so
 *    the bytes after the value are not the two line-end NULs
 *    (`Authorization: Bearer <key>\0junk` would pass as `Bearer <key>`);
 *  - an obs-fold line (starting with SP or HT) is glued onto the previous
 *    field's *name* in a new pool block (MHD 0.9.75: `Transfer-Encoding:\r\n
 *    chunked` becomes a field `Transfer-Encodingchunked` with an empty
 *    value), so that name is not where the line starts;
 *  - whitespace before the colon stays in the name (`Transfer-Encoding `),
 *    which is then not a token.
 * So the walk below rebuilds the section from the fields MHD reports, in
 * order, and refuses the request unless every byte is accounted for: the
 * request line, then per field the name (a token), one NUL (the colon),
 * optional SP/HT, the value (no control byte but HT), two NULs (CRLF), and
 * two NULs (the empty line) at the very end.  Reads stay inside the
 * section.  The layout is libmicrohttpd 0.9.75's (Debian 12); newer
 * versions reject these themselves (MHD_OPTION_CLIENT_DISCIPLINE_LVL), and
 * there only the field-name and value checks run. */
#include <stdint.h>
#include <string.h>

#include "router/http/http_internal.h"

typedef struct {
    const char *base, *end; /* the header section */
    const char *pos;        /* where the next field must start */
    const char *why;        /* set on the first problem */
} duet__walk_t;

static bool duet__tchar(unsigned char c)
{
    /* RFC 9110 section 5.6.2 */
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

static bool duet__inside(const duet__walk_t *w, const char *p, size_t n)
{
    uintptr_t b = (uintptr_t)w->base, e = (uintptr_t)w->end, q = (uintptr_t)p;
    return q >= b && q <= e && n <= e - q;
}

static enum MHD_Result duet__walk_field(void *cls, enum MHD_ValueKind kind, const char *key,
                                        size_t key_size, const char *value, size_t value_size)
{
    duet__walk_t *w = cls;

    (void)kind;
    if (key == NULL || key_size == 0) {
        w->why = "a header field without a name";
        return MHD_NO;
    }
    for (size_t i = 0; i < key_size; i++) {
        if (!duet__tchar((unsigned char)key[i])) {
            w->why = key[i] == ' ' || key[i] == '\t'
                         ? "whitespace in a header field name (before the colon?)"
                         : "a header field name that is not a token";
            return MHD_NO;
        }
    }
    for (size_t i = 0; value != NULL && i < value_size; i++) {
        unsigned char c = (unsigned char)value[i];
        if ((c < 0x20 && c != '\t') || c == 0x7f) {
            w->why = "a control character in a header field value";
            return MHD_NO;
        }
    }
#if MHD_VERSION < 0x00097700
    const char *p = w->pos;
    /* the name where the line starts, then its colon */
    if (key != p || !duet__inside(w, p, key_size + 1) || p[key_size] != '\0') {
        w->why = "a header line that does not start where the previous one ended (obs-fold, "
                 "or a NUL in the previous one)";
        return MHD_NO;
    }
    p += key_size + 1;
    while (p < value && duet__inside(w, p, 1) && (*p == ' ' || *p == '\t'))
        p++;
    if (value != p || !duet__inside(w, p, value_size + 2)) {
        w->why = "a header field value that is not where its line has it";
        return MHD_NO;
    }
    p += value_size;
    if (p[0] != '\0' || p[1] != '\0') {
        w->why = "a NUL in a header field value, or a header line ended by a bare LF";
        return MHD_NO;
    }
    w->pos = p + 2;
#endif
    return MHD_YES;
}

const char *duet__http_strict_why(duet__hreq_t *r, const char *method, const char *version)
{
    duet__walk_t w = {0};

#if MHD_VERSION < 0x00097700
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE);
    size_t vlen = version != NULL ? strlen(version) : 0;

    if (ci == NULL || method == NULL || version == NULL)
        return "the request header could not be checked";
    w.base = method;
    w.end = method + ci->header_size;
    /* the request line ends after the version: CR LF */
    if (!duet__inside(&w, version, vlen + 2) || version[vlen] != '\0' || version[vlen + 1] != '\0')
        return "a request line ended by a bare LF";
    w.pos = version + vlen + 2;
#else
    (void)method;
    (void)version;
#endif
    MHD_get_connection_values_n(r->conn, MHD_HEADER_KIND, duet__walk_field, &w);
    if (w.why != NULL)
        return w.why;
#if MHD_VERSION < 0x00097700
    /* and the empty line: CR LF, the last bytes of the section */
    if (w.pos + 2 != w.end || w.pos[0] != '\0' || w.pos[1] != '\0')
        return "a header section ended by a bare LF";
#endif
    return NULL;
}
