/* Decoding, whole and streaming.
 *
 * Model: every id contributes bytes (its piece after the per-token decoder
 * steps: Replace, ByteFallback <0xNN> -> byte, ByteLevel alphabet -> byte,
 * Metaspace); the byte stream is turned into text by an incremental UTF-8
 * decoder that replaces each maximal invalid subpart with U+FFFD (as Rust's
 * from_utf8_lossy, Python's "replace" and WHATWG do); finally Strip removes
 * leading characters at the very start.  duet_tokenizer_decode runs the same
 * state machine as the streaming decoder, so the two agree by construction.
 *
 * One deviation from Hugging Face: its ByteFallback turns a run of <0xNN>
 * tokens that is not valid UTF-8 as a whole into one U+FFFD per byte, which
 * cannot be streamed; here valid characters inside such a run survive. */
#include <string.h>

#include "common/alloc.h"
#include "tokenizer/tokenizer_internal.h"

/* ---- per-id bytes ---- */

static duet_status_t duet__tok_replace_all(const char *s, size_t n, const char *from,
                                           const char *to, duet__tok_buf_t *out)
{
    size_t fl = strlen(from), tl = strlen(to);
    duet_status_t st = DUET_OK;
    out->len = 0;
    if ((st = duet__tok_buf_reserve(out, n)) != DUET_OK)
        return st;
    for (size_t p = 0; p < n && st == DUET_OK;) {
        if (n - p >= fl && memcmp(s + p, from, fl) == 0) {
            st = duet__tok_buf_put(out, to, tl);
            p += fl;
        } else {
            st = duet__tok_buf_put(out, s + p, 1);
            p++;
        }
    }
    return st;
}

static int duet__tok_hex(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f')
        return (c | 0x20) - 'a' + 10;
    return -1;
}

/* Bytes of one piece after the per-token decoder steps, into out. */
static duet_status_t duet__tok_piece_bytes(const duet_tokenizer_t *tok, const char *p, size_t n,
                                           const char *from[], const char *to[], int n_replace,
                                           bool byte_fallback, duet__tok_buf_t tmp[2],
                                           duet__tok_buf_t *out)
{
    duet_status_t st;
    int cur = -1;

    out->len = 0;
    switch (tok->dec_kind) {
    case DUET__TOK_DEC_NONE:
        return duet__tok_buf_put(out, p, n);
    case DUET__TOK_DEC_METASPACE:
        return duet__tok_replace_all(p, n, tok->dec_repl, " ", out);
    case DUET__TOK_DEC_BYTELEVEL:
        for (size_t i = 0; i < n;) {
            uint32_t cp;
            i += duet__tok_utf8_next(p, n, i, &cp);
            int b = duet__tok_cp_to_byte(cp);
            if (b < 0) { /* not in the alphabet: the token's own UTF-8 */
                out->len = 0;
                return duet__tok_buf_put(out, p, n);
            }
            char c = (char)b;
            if ((st = duet__tok_buf_put(out, &c, 1)) != DUET_OK)
                return st;
        }
        return duet__tok_buf_put(out, "", 0);
    case DUET__TOK_DEC_CHAIN:
        break;
    }
    for (int i = 0; i < n_replace; i++) {
        const char *src = cur < 0 ? p : tmp[cur].data;
        size_t sn = cur < 0 ? n : tmp[cur].len;
        int nxt = cur < 0 ? 0 : !cur;
        if ((st = duet__tok_replace_all(src, sn, from[i], to[i], &tmp[nxt])) != DUET_OK)
            return st;
        cur = nxt;
    }
    const char *s = cur < 0 ? p : tmp[cur].data;
    size_t sn = cur < 0 ? n : tmp[cur].len;
    if (byte_fallback && sn == 6 && memcmp(s, "<0x", 3) == 0 && s[5] == '>' &&
        duet__tok_hex(s[3]) >= 0 && duet__tok_hex(s[4]) >= 0) {
        char b = (char)(duet__tok_hex(s[3]) * 16 + duet__tok_hex(s[4]));
        return duet__tok_buf_put(out, &b, 1);
    }
    return duet__tok_buf_put(out, s, sn);
}

duet_status_t duet__tok_decoder_prepare(duet_tokenizer_t *tok, const char *from[], const char *to[],
                                        int n_replace, bool byte_fallback)
{
    duet__tok_buf_t tmp[2] = {{0}, {0}}, one = {0}, all = {0};
    duet_status_t st = DUET_OK;

    tok->dec_off = duet_malloc((size_t)tok->n_ids * sizeof(uint32_t));
    tok->dec_len = duet_malloc((size_t)tok->n_ids * sizeof(uint32_t));
    if (tok->dec_off == NULL || tok->dec_len == NULL) {
        st = duet_error(DUET_ERR_NO_MEMORY, "%s: no memory for the decoder", tok->path);
        goto out;
    }
    tok->max_dec_len = 1;
    for (int32_t id = 0; id < tok->n_ids; id++) {
        tok->dec_off[id] = (uint32_t)all.len;
        tok->dec_len[id] = 0;
        if (tok->piece_len[id] == UINT32_MAX)
            continue;
        const char *p = tok->arena.data + tok->piece_off[id];
        size_t n = tok->piece_len[id];
        if ((st = duet__tok_piece_bytes(tok, p, n, from, to, n_replace, byte_fallback, tmp,
                                        &one)) != DUET_OK ||
            (st = duet__tok_buf_put(&all, one.data, one.len)) != DUET_OK)
            goto out;
        tok->dec_len[id] = (uint32_t)one.len;
        if (one.len > tok->max_dec_len)
            tok->max_dec_len = one.len;
        if (n > tok->max_dec_len)
            tok->max_dec_len = n;
    }
    if ((st = duet__tok_buf_put(&all, "", 0)) != DUET_OK)
        goto out;
    tok->dec_arena = all.data;
    all.data = NULL;
out:
    duet__tok_buf_free(&tmp[0]);
    duet__tok_buf_free(&tmp[1]);
    duet__tok_buf_free(&one);
    duet__tok_buf_free(&all);
    return st;
}

/* ---- the streaming state machine ---- */

typedef struct {
    bool first;     /* no token seen yet (separator, Metaspace first token) */
    int strip_left; /* leading strip characters still to drop */
    int n_pend, need;
    unsigned char pend[4];
} duet__tok_dstate_t;

struct duet_detok {
    const duet_tokenizer_t *tok;
    bool skip_special;
    duet__tok_dstate_t s;
    char *scratch;
    size_t scratch_cap;
};

/* Output of one step: text (lossy UTF-8) or raw bytes. */
typedef struct {
    char *data; /* room for duet_detok_max_chunk() bytes */
    size_t len;
    bool raw;   /* bytes as they are, no UTF-8 repair */
    char strip; /* the Strip decoder's character */
} duet__tok_sink_t;

static void duet__tok_emit_char(duet__tok_dstate_t *s, duet__tok_sink_t *o, const char *c, size_t n)
{
    if (s->strip_left > 0) {
        if (n == 1 && c[0] == o->strip) {
            s->strip_left--;
            return;
        }
        s->strip_left = 0;
    }
    memcpy(o->data + o->len, c, n);
    o->len += n;
}

static void duet__tok_emit_fffd(duet__tok_dstate_t *s, duet__tok_sink_t *o)
{
    duet__tok_emit_char(s, o, "\xEF\xBF\xBD", 3);
}

static void duet__tok_feed_byte(duet__tok_dstate_t *s, duet__tok_sink_t *o, unsigned char b)
{
    if (o->raw) {
        duet__tok_emit_char(s, o, (const char *)&b, 1);
        return;
    }
    for (;;) {
        if (s->n_pend == 0) {
            if (b < 0x80) {
                duet__tok_emit_char(s, o, (const char *)&b, 1);
            } else if (b >= 0xC2 && b <= 0xF4) {
                s->pend[0] = b;
                s->n_pend = 1;
                s->need = b <= 0xDF ? 2 : b <= 0xEF ? 3 : 4;
            } else {
                duet__tok_emit_fffd(s, o);
            }
            return;
        }
        unsigned char lo = 0x80, hi = 0xBF, lead = s->pend[0];
        if (s->n_pend == 1) {
            if (lead == 0xE0)
                lo = 0xA0;
            else if (lead == 0xED)
                hi = 0x9F;
            else if (lead == 0xF0)
                lo = 0x90;
            else if (lead == 0xF4)
                hi = 0x8F;
        }
        if (b >= lo && b <= hi) {
            s->pend[s->n_pend++] = b;
            if (s->n_pend == s->need) {
                duet__tok_emit_char(s, o, (const char *)s->pend, (size_t)s->need);
                s->n_pend = 0;
            }
            return;
        }
        duet__tok_emit_fffd(s, o); /* the maximal subpart so far; retry b */
        s->n_pend = 0;
    }
}

static void duet__tok_feed_id(const duet_tokenizer_t *tok, bool skip_special, duet__tok_dstate_t *s,
                              duet__tok_sink_t *o, int32_t id)
{
    if (tok->piece_len[id] == UINT32_MAX || (skip_special && tok->special[id]))
        return;
    if (tok->dec_kind == DUET__TOK_DEC_NONE && !s->first)
        duet__tok_feed_byte(s, o, ' ');
    if (tok->dec_kind == DUET__TOK_DEC_METASPACE && s->first && tok->dec_ms_strip_first) {
        const char *p = tok->arena.data + tok->piece_off[id], *r = tok->dec_repl;
        size_t n = tok->piece_len[id], rl = strlen(r);
        for (size_t i = 0; i < n;) {
            if (n - i >= rl && memcmp(p + i, r, rl) == 0) {
                i += rl;
                continue;
            }
            duet__tok_feed_byte(s, o, (unsigned char)p[i++]);
        }
    } else {
        const char *p = tok->dec_arena + tok->dec_off[id];
        for (uint32_t i = 0; i < tok->dec_len[id]; i++)
            duet__tok_feed_byte(s, o, (unsigned char)p[i]);
    }
    s->first = false;
}

static void duet__tok_flush(duet__tok_dstate_t *s, duet__tok_sink_t *o)
{
    if (!o->raw && s->n_pend > 0) {
        duet__tok_emit_fffd(s, o);
        s->n_pend = 0;
    }
}

static void duet__tok_dstate_init(const duet_tokenizer_t *tok, duet__tok_dstate_t *s)
{
    memset(s, 0, sizeof(*s));
    s->first = true;
    s->strip_left = tok->strip_start;
}

size_t duet_detok_max_chunk(const duet_tokenizer_t *tok)
{
    /* every byte may become U+FFFD, plus a flushed pending sequence, a
     * separator and the NUL */
    return 3 * (tok->max_dec_len + 2) + 4;
}

duet_status_t duet_detok_create(const duet_tokenizer_t *tok, bool skip_special, duet_detok_t **dt_p)
{
    duet_detok_t *dt;
    if (tok == NULL || dt_p == NULL)
        return duet_error(DUET_ERR_INVALID, "detok: bad arguments");
    if ((dt = DUET_NEW(duet_detok_t)) == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "detok: no memory");
    dt->tok = tok;
    dt->skip_special = skip_special;
    dt->scratch_cap = duet_detok_max_chunk(tok);
    if ((dt->scratch = duet_malloc(dt->scratch_cap)) == NULL) {
        duet_free(dt);
        return duet_error(DUET_ERR_NO_MEMORY, "detok: no memory");
    }
    duet__tok_dstate_init(tok, &dt->s);
    *dt_p = dt;
    return DUET_OK;
}

void duet_detok_destroy(duet_detok_t *dt)
{
    if (dt == NULL)
        return;
    duet_free(dt->scratch);
    duet_free(dt);
}

/* Copy the scratch output to out, or roll the state back when it does not
 * fit. */
static duet_status_t duet__tok_detok_out(duet_detok_t *dt, const duet__tok_dstate_t *saved,
                                         const duet__tok_sink_t *o, char *out, size_t out_cap,
                                         size_t *out_len_p)
{
    if (out == NULL || o->len + 1 > out_cap) {
        dt->s = *saved;
        if (out != NULL && out_cap > 0)
            out[0] = '\0';
        return duet_error(DUET_ERR_TOO_LONG, "detok: output needs %zu bytes, capacity %zu",
                          o->len + 1, out_cap);
    }
    memcpy(out, o->data, o->len);
    out[o->len] = '\0';
    if (out_len_p != NULL)
        *out_len_p = o->len;
    return DUET_OK;
}

duet_status_t duet_detok_push(duet_detok_t *dt, int32_t id, char *out, size_t out_cap,
                              size_t *out_len_p)
{
    duet__tok_dstate_t saved = dt->s;
    duet__tok_sink_t o = {dt->scratch, 0, false, dt->tok->strip_char};

    if (id < 0 || id >= dt->tok->n_ids) {
        if (out != NULL && out_cap > 0)
            out[0] = '\0';
        return duet_error(DUET_ERR_INVALID, "detok: token id %d out of range 0..%d", id,
                          dt->tok->n_ids - 1);
    }
    duet__tok_feed_id(dt->tok, dt->skip_special, &dt->s, &o, id);
    return duet__tok_detok_out(dt, &saved, &o, out, out_cap, out_len_p);
}

duet_status_t duet_detok_flush(duet_detok_t *dt, char *out, size_t out_cap, size_t *out_len_p)
{
    duet__tok_dstate_t saved = dt->s;
    duet__tok_sink_t o = {dt->scratch, 0, false, dt->tok->strip_char};

    duet__tok_flush(&dt->s, &o);
    return duet__tok_detok_out(dt, &saved, &o, out, out_cap, out_len_p);
}

/* Feed ids[from, n) into s, discarding the text (the scratch holds one
 * id's output). */
static void duet__tok_prime_from(const duet_detok_t *dt, duet__tok_dstate_t *s, const int32_t *ids,
                                 size_t from, size_t n)
{
    for (size_t i = from; i < n; i++) {
        duet__tok_sink_t o = {dt->scratch, 0, false, dt->tok->strip_char};
        duet__tok_feed_id(dt->tok, dt->skip_special, s, &o, ids[i]);
    }
}

duet_status_t duet_detok_prime(duet_detok_t *dt, const int32_t *ids, size_t n)
{
    const duet_tokenizer_t *tok = dt->tok;
    duet__tok_dstate_t s = dt->s;
    size_t from = n, bytes = 0;

    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= tok->n_ids)
            return duet_error(DUET_ERR_INVALID, "detok: token id %d (position %zu) out of range 0..%d",
                              ids[i], i, tok->n_ids - 1);
    /* A UTF-8 sequence is at most 4 bytes and the decoder resynchronises
     * within one: from a fresh state, a tail of 2 or more ids holding 16
     * bytes of pieces leaves the same held-back bytes as the whole context
     * (its first id may lose a leading Metaspace there, ASCII).  The
     * start-of-text state (first, strip_left) is the same once the tail
     * has emitted a character; if it has not, the whole context runs. */
    while (from > 0 && (bytes < 16 || n - from < 2)) {
        int32_t id = ids[--from];
        if (tok->piece_len[id] != UINT32_MAX && !(dt->skip_special && tok->special[id]))
            bytes += tok->dec_len[id] + 1; /* + a separator (DEC_NONE) */
    }
    if (from > 0 && dt->s.first) {
        duet__tok_prime_from(dt, &s, ids, from, n);
        if (!s.first && s.strip_left == 0) {
            dt->s = s;
            return DUET_OK;
        }
        s = dt->s;
    }
    duet__tok_prime_from(dt, &s, ids, 0, n);
    dt->s = s;
    return DUET_OK;
}

static duet_status_t duet__tok_decode_any(const duet_tokenizer_t *tok, const int32_t *ids, size_t n,
                                          bool skip_special, bool raw, char **data_p, size_t *len_p)
{
    duet__tok_dstate_t s;
    duet__tok_buf_t b = {0};
    size_t chunk = duet_detok_max_chunk(tok);
    duet_status_t st;

    if (tok == NULL || (ids == NULL && n > 0) || data_p == NULL)
        return duet_error(DUET_ERR_INVALID, "tokenizer: decode: bad arguments");
    duet__tok_dstate_init(tok, &s);
    if ((st = duet__tok_buf_reserve(&b, chunk + 1)) != DUET_OK)
        return st;
    for (size_t i = 0; i <= n; i++) {
        if (i < n && (ids[i] < 0 || ids[i] >= tok->n_ids)) {
            duet__tok_buf_free(&b);
            return duet_error(DUET_ERR_INVALID,
                              "tokenizer: decode: id %d (position %zu) out of "
                              "range 0..%d",
                              ids[i], i, tok->n_ids - 1);
        }
        if ((st = duet__tok_buf_reserve(&b, chunk + 1)) != DUET_OK) {
            duet__tok_buf_free(&b);
            return st;
        }
        duet__tok_sink_t o = {b.data + b.len, 0, raw, tok->strip_char};
        if (i < n)
            duet__tok_feed_id(tok, skip_special, &s, &o, ids[i]);
        else
            duet__tok_flush(&s, &o);
        b.len += o.len;
    }
    b.data[b.len] = '\0';
    *data_p = b.data;
    if (len_p != NULL)
        *len_p = b.len;
    return DUET_OK;
}

duet_status_t duet_tokenizer_decode(const duet_tokenizer_t *tok, const int32_t *ids, size_t n,
                                    bool skip_special, char **text_p)
{
    return duet__tok_decode_any(tok, ids, n, skip_special, false, text_p, NULL);
}

duet_status_t duet_tokenizer_decode_bytes(const duet_tokenizer_t *tok, const int32_t *ids, size_t n,
                                          bool skip_special, char **bytes_p, size_t *len_p)
{
    return duet__tok_decode_any(tok, ids, n, skip_special, true, bytes_p, len_p);
}
