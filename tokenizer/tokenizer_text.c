/* Text primitives of the tokenizer: UTF-8, Unicode classes, NFC, the GPT-2
 * byte alphabet and the split-pattern scanners. */
#include "tokenizer/tokenizer_text.h"

#include <string.h>

#include "common/alloc.h"

/* ---- UTF-8 ---- */

size_t duet__tok_utf8_next(const char *s, size_t len, size_t pos, uint32_t *cp)
{
    const unsigned char *u = (const unsigned char *)s + pos;
    size_t left = len - pos;
    unsigned char c = u[0];
    uint32_t v;
    size_t n;
    unsigned char lo = 0x80, hi = 0xBF;

    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    if (c >= 0xC2 && c <= 0xDF) {
        n = 2;
        v = c & 0x1Fu;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        v = c & 0x0Fu;
        if (c == 0xE0)
            lo = 0xA0;
        else if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        v = c & 0x07u;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F;
    } else {
        *cp = DUET__TOK_INVALID_BASE + c;
        return 1;
    }
    if (left < n || u[1] < lo || u[1] > hi)
        goto invalid;
    for (size_t i = 1; i < n; i++) {
        if (i > 1 && (u[i] < 0x80 || u[i] > 0xBF))
            goto invalid;
        v = (v << 6) | (u[i] & 0x3Fu);
    }
    *cp = v;
    return n;
invalid:
    *cp = DUET__TOK_INVALID_BASE + c;
    return 1;
}

size_t duet__tok_utf8_put(uint32_t cp, char *out)
{
    unsigned char *o = (unsigned char *)out;
    if (cp >= DUET__TOK_INVALID_BASE) {
        o[0] = (unsigned char)(cp - DUET__TOK_INVALID_BASE);
        return 1;
    }
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* ---- classes ---- */

static uint32_t duet__tok_range_find(const duet__tok_range_t *r, size_t n, uint32_t cp)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cp < r[mid].first)
            hi = mid;
        else if (cp > r[mid].last)
            lo = mid + 1;
        else
            return r[mid].value;
    }
    return 0;
}

duet__tok_cls_t duet__tok_cls(uint32_t cp)
{
    if (cp < 0x80) {
        if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z')
            return DUET__TOK_CLS_LETTER;
        if (cp >= '0' && cp <= '9')
            return DUET__TOK_CLS_NUMBER;
        return cp == '_' ? DUET__TOK_CLS_CONNECTOR : DUET__TOK_CLS_OTHER;
    }
    if (cp >= DUET__TOK_INVALID_BASE)
        return DUET__TOK_CLS_OTHER;
    return (duet__tok_cls_t)duet__tok_range_find(duet__tok_cls_ranges, duet__tok_cls_ranges_n, cp);
}

bool duet__tok_is_space(uint32_t cp)
{
    if (cp < 0x80)
        return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
           cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/* ---- buffer ---- */

duet_status_t duet__tok_buf_reserve(duet__tok_buf_t *b, size_t extra)
{
    size_t need = b->len + extra + 1;
    if (need <= b->cap)
        return DUET_OK;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need)
        cap *= 2;
    char *d = duet_realloc(b->data, cap);
    if (d == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "tokenizer: no memory for %zu bytes", cap);
    b->data = d;
    b->cap = cap;
    return DUET_OK;
}

duet_status_t duet__tok_buf_put(duet__tok_buf_t *b, const void *data, size_t n)
{
    duet_status_t st = duet__tok_buf_reserve(b, n);
    if (st != DUET_OK)
        return st;
    if (n > 0)
        memcpy(b->data + b->len, data, n);
    b->len += n;
    b->data[b->len] = '\0';
    return DUET_OK;
}

void duet__tok_buf_free(duet__tok_buf_t *b)
{
    duet_free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

/* ---- NFC ---- */

enum {
    HANGUL_S = 0xAC00,
    HANGUL_L = 0x1100,
    HANGUL_V = 0x1161,
    HANGUL_T = 0x11A7,
    HANGUL_LN = 19,
    HANGUL_VN = 21,
    HANGUL_TN = 28,
    HANGUL_NN = HANGUL_VN * HANGUL_TN,
    HANGUL_SN = HANGUL_LN * HANGUL_NN,
};

static int duet__tok_ccc(uint32_t cp)
{
    if (cp < 0x300 || cp >= DUET__TOK_INVALID_BASE)
        return 0;
    return (int)duet__tok_range_find(duet__tok_ccc_ranges, duet__tok_ccc_ranges_n, cp);
}

static const duet__tok_decomp_t *duet__tok_decomp_find(uint32_t cp)
{
    size_t lo = 0, hi = duet__tok_decomp_n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cp < duet__tok_decomp[mid].a)
            hi = mid;
        else if (cp > duet__tok_decomp[mid].a)
            lo = mid + 1;
        else
            return &duet__tok_decomp[mid];
    }
    return NULL;
}

static uint32_t duet__tok_compose(uint32_t a, uint32_t b)
{
    if (a >= HANGUL_L && a < HANGUL_L + HANGUL_LN && b >= HANGUL_V && b < HANGUL_V + HANGUL_VN)
        return HANGUL_S + ((a - HANGUL_L) * HANGUL_VN + (b - HANGUL_V)) * HANGUL_TN;
    if (a >= HANGUL_S && a < HANGUL_S + HANGUL_SN && (a - HANGUL_S) % HANGUL_TN == 0 &&
        b > HANGUL_T && b < HANGUL_T + HANGUL_TN)
        return a + (b - HANGUL_T);
    size_t lo = 0, hi = duet__tok_comp_n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const duet__tok_decomp_t *e = &duet__tok_comp[mid];
        if (a < e->a || (a == e->a && b < e->b))
            hi = mid;
        else if (a > e->a || b > e->b)
            lo = mid + 1;
        else
            return e->c;
    }
    return 0;
}

/* Canonical decomposition of cp appended to cps (grown as needed). */
static duet_status_t duet__tok_decompose(uint32_t cp, uint32_t **cps, size_t *n, size_t *cap)
{
    uint32_t stack[32];
    int top = 0;
    stack[top++] = cp;
    while (top > 0) {
        uint32_t c = stack[--top];
        const duet__tok_decomp_t *d = NULL;
        if (c >= HANGUL_S && c < HANGUL_S + HANGUL_SN) {
            uint32_t si = c - HANGUL_S;
            uint32_t t = si % HANGUL_TN;
            if (t != 0)
                stack[top++] = HANGUL_T + t;
            stack[top++] = HANGUL_V + (si % HANGUL_NN) / HANGUL_TN;
            stack[top++] = HANGUL_L + si / HANGUL_NN;
            continue;
        }
        if (c >= 0xC0 && c < DUET__TOK_INVALID_BASE && (d = duet__tok_decomp_find(c)) != NULL &&
            top < 30) {
            if (d->c != 0)
                stack[top++] = d->c;
            stack[top++] = d->b;
            continue;
        }
        if (*n == *cap) {
            size_t nc = *cap ? *cap * 2 : 64;
            uint32_t *p = duet_realloc(*cps, nc * sizeof(*p));
            if (p == NULL)
                return duet_error(DUET_ERR_NO_MEMORY, "tokenizer: nfc: no memory");
            *cps = p;
            *cap = nc;
        }
        (*cps)[(*n)++] = c;
    }
    return DUET_OK;
}

duet_status_t duet__tok_nfc(const char *s, size_t len, duet__tok_buf_t *out)
{
    uint32_t *cps = NULL;
    size_t n = 0, cap = 0, pos = 0;
    duet_status_t st;
    bool simple = true;

    for (size_t i = 0; i < len; i++) {
        if ((unsigned char)s[i] >= 0xCC) { /* lead bytes of code points >= U+0300 */
            simple = false;
            break;
        }
    }
    if (simple)
        return duet__tok_buf_put(out, s, len);

    while (pos < len) {
        uint32_t cp;
        pos += duet__tok_utf8_next(s, len, pos, &cp);
        if ((st = duet__tok_decompose(cp, &cps, &n, &cap)) != DUET_OK)
            goto err_free;
    }
    /* canonical ordering: stable insertion sort inside runs of non-starters */
    for (size_t i = 1; i < n; i++) {
        int cc = duet__tok_ccc(cps[i]);
        if (cc == 0)
            continue;
        size_t j = i;
        uint32_t c = cps[i];
        while (j > 0 && duet__tok_ccc(cps[j - 1]) > cc) {
            cps[j] = cps[j - 1];
            j--;
        }
        cps[j] = c;
    }
    /* canonical composition */
    size_t w = 0;
    long starter = -1;
    int last_cc = -1; /* ccc of the last char kept after the starter; -1: none */
    for (size_t i = 0; i < n; i++) {
        uint32_t c = cps[i];
        int cc = duet__tok_ccc(c);
        if (starter >= 0 && (last_cc < 0 || (last_cc < cc && last_cc != 0))) {
            uint32_t comp = duet__tok_compose(cps[starter], c);
            if (comp != 0) {
                cps[starter] = comp;
                continue;
            }
        }
        if (cc == 0) {
            starter = (long)w;
            last_cc = -1;
        } else {
            last_cc = cc;
        }
        cps[w++] = c;
    }
    if ((st = duet__tok_buf_reserve(out, w * 4)) != DUET_OK)
        goto err_free;
    for (size_t i = 0; i < w; i++)
        out->len += duet__tok_utf8_put(cps[i], out->data + out->len);
    out->data[out->len] = '\0';
    st = DUET_OK;
err_free:
    duet_free(cps);
    return st;
}

/* ---- GPT-2 byte alphabet ---- */

static bool duet__tok_byte_printable(unsigned b)
{
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
}

uint32_t duet__tok_byte_to_cp(uint8_t b)
{
    if (duet__tok_byte_printable(b))
        return b;
    /* the others take 256, 257, ... in byte order */
    unsigned k = 0;
    for (unsigned x = 0; x < b; x++)
        k += !duet__tok_byte_printable(x);
    return 256u + k;
}

int duet__tok_cp_to_byte(uint32_t cp)
{
    if (cp < 256)
        return duet__tok_byte_printable(cp) ? (int)cp : -1;
    if (cp >= 256 + 68)
        return -1;
    unsigned k = cp - 256;
    for (unsigned x = 0; x < 256; x++) {
        if (!duet__tok_byte_printable(x) && k-- == 0)
            return (int)x;
    }
    return -1;
}

/* ---- split scanners ---- */

static const char duet__tok_pat_gpt2[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
static const char duet__tok_pat_llama3[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char duet__tok_pat_qwen2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

duet__tok_split_t duet__tok_split_lookup(const char *pattern)
{
    if (strcmp(pattern, duet__tok_pat_gpt2) == 0)
        return DUET__TOK_SPLIT_GPT2;
    if (strcmp(pattern, duet__tok_pat_llama3) == 0)
        return DUET__TOK_SPLIT_LLAMA3;
    if (strcmp(pattern, duet__tok_pat_qwen2) == 0)
        return DUET__TOK_SPLIT_QWEN2;
    return DUET__TOK_SPLIT_NONE;
}

const char *duet__tok_split_pattern(duet__tok_split_t kind)
{
    switch (kind) {
    case DUET__TOK_SPLIT_GPT2:
        return duet__tok_pat_gpt2;
    case DUET__TOK_SPLIT_LLAMA3:
        return duet__tok_pat_llama3;
    case DUET__TOK_SPLIT_QWEN2:
        return duet__tok_pat_qwen2;
    default:
        return "";
    }
}

/* One decoded character of the scan: code point, byte length, class bits. */
typedef struct {
    uint32_t cp;
    size_t n; /* 0 at the end of the text */
    bool letter, number, space, crlf;
} duet__tok_ch_t;

static duet__tok_ch_t duet__tok_ch_at(const char *s, size_t len, size_t pos)
{
    duet__tok_ch_t c = {0, 0, false, false, false, false};
    if (pos >= len)
        return c;
    c.n = duet__tok_utf8_next(s, len, pos, &c.cp);
    duet__tok_cls_t k = duet__tok_cls(c.cp);
    c.letter = k == DUET__TOK_CLS_LETTER;
    c.number = k == DUET__TOK_CLS_NUMBER;
    c.space = duet__tok_is_space(c.cp);
    c.crlf = c.cp == '\r' || c.cp == '\n';
    return c;
}

static bool duet__tok_ch_other(const duet__tok_ch_t *c)
{
    return c->n > 0 && !c->letter && !c->number && !c->space;
}

typedef enum { RUN_LETTER, RUN_NUMBER, RUN_OTHER, RUN_CRLF } duet__tok_run_t;

/* End of the run of kind starting at pos, at most max characters. */
static size_t duet__tok_run(const char *s, size_t len, size_t pos, duet__tok_run_t kind, size_t max)
{
    size_t count = 0;
    while (pos < len && count < max) {
        duet__tok_ch_t c = duet__tok_ch_at(s, len, pos);
        bool ok = (kind == RUN_LETTER && c.letter) || (kind == RUN_NUMBER && c.number) ||
                  (kind == RUN_OTHER && duet__tok_ch_other(&c)) || (kind == RUN_CRLF && c.crlf);
        if (!ok)
            break;
        pos += c.n;
        count++;
    }
    return pos;
}

/* 's 't 're 've 'm 'll 'd after the apostrophe at pos; returns the match end
 * or 0.  icase: (?i:...) with simple case folding (U+017F folds to s). */
static size_t duet__tok_contraction(const char *s, size_t len, size_t pos, bool icase)
{
    static const char *const suffixes[] = {"s", "t", "re", "ve", "m", "ll", "d"};
    size_t start = pos + 1;
    for (size_t k = 0; k < sizeof(suffixes) / sizeof(suffixes[0]); k++) {
        size_t p = start;
        const char *x = suffixes[k];
        for (; *x != '\0'; x++) {
            if (p >= len)
                break;
            unsigned char c = (unsigned char)s[p];
            if (c == (unsigned char)*x || (icase && (c | 0x20) == (unsigned char)*x)) {
                p++;
            } else if (icase && *x == 's' && p + 1 < len && c == 0xC5 &&
                       (unsigned char)s[p + 1] == 0xBF) {
                p += 2;
            } else {
                break;
            }
        }
        if (*x == '\0')
            return p;
    }
    return 0;
}

/* \s*[\r\n]+ | \s+(?!\S) | \s+ (newline_alt selects the first) at a space. */
static size_t duet__tok_spaces(const char *s, size_t len, size_t pos, bool newline_alt)
{
    size_t p = pos, last_start = pos, nl_end = 0, count = 0;
    while (p < len) {
        duet__tok_ch_t c = duet__tok_ch_at(s, len, p);
        if (!c.space)
            break;
        last_start = p;
        p += c.n;
        count++;
        if (c.crlf)
            nl_end = p;
    }
    if (newline_alt && nl_end != 0)
        return nl_end;
    if (p == len || count < 2)
        return p;
    return last_start;
}

size_t duet__tok_split_next(duet__tok_split_t kind, const char *s, size_t len, size_t pos)
{
    duet__tok_ch_t c0 = duet__tok_ch_at(s, len, pos);
    duet__tok_ch_t c1 = duet__tok_ch_at(s, len, pos + c0.n);
    size_t end;

    if (c0.cp == '\'' && (end = duet__tok_contraction(s, len, pos, kind != DUET__TOK_SPLIT_GPT2)))
        return end;
    if (kind == DUET__TOK_SPLIT_GPT2) {
        bool sp = c0.cp == ' ';
        if (sp && c1.letter)
            return duet__tok_run(s, len, pos + 1, RUN_LETTER, SIZE_MAX);
        if (c0.letter)
            return duet__tok_run(s, len, pos, RUN_LETTER, SIZE_MAX);
        if (sp && c1.number)
            return duet__tok_run(s, len, pos + 1, RUN_NUMBER, SIZE_MAX);
        if (c0.number)
            return duet__tok_run(s, len, pos, RUN_NUMBER, SIZE_MAX);
        if (sp && duet__tok_ch_other(&c1))
            return duet__tok_run(s, len, pos + 1, RUN_OTHER, SIZE_MAX);
        if (duet__tok_ch_other(&c0))
            return duet__tok_run(s, len, pos, RUN_OTHER, SIZE_MAX);
        return duet__tok_spaces(s, len, pos, false);
    }
    /* Llama-3 / Qwen2 */
    if (!c0.crlf && !c0.letter && !c0.number && c1.letter)
        return duet__tok_run(s, len, pos + c0.n, RUN_LETTER, SIZE_MAX);
    if (c0.letter)
        return duet__tok_run(s, len, pos, RUN_LETTER, SIZE_MAX);
    if (c0.number)
        return duet__tok_run(s, len, pos, RUN_NUMBER, kind == DUET__TOK_SPLIT_LLAMA3 ? 3 : 1);
    if (c0.cp == ' ' && duet__tok_ch_other(&c1)) {
        end = duet__tok_run(s, len, pos + 1, RUN_OTHER, SIZE_MAX);
        return duet__tok_run(s, len, end, RUN_CRLF, SIZE_MAX);
    }
    if (duet__tok_ch_other(&c0)) {
        end = duet__tok_run(s, len, pos, RUN_OTHER, SIZE_MAX);
        return duet__tok_run(s, len, end, RUN_CRLF, SIZE_MAX);
    }
    return duet__tok_spaces(s, len, pos, true);
}
