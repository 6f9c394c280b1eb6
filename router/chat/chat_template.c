/* Chat-template compiler: arena, segmenter (text / {{ }} / {% %} / {# #}
 * with whitespace control, trim_blocks and lstrip_blocks), tag lexer and a
 * recursive-descent parser into duet__node_t trees. */
#include <ctype.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "router/chat/chat_template_internal.h"

struct duet__arena_chunk {
    duet__arena_chunk_t *next;
    max_align_t data[];
};

void *duet__tmpl_arena_alloc(duet__arena_t *a, size_t n)
{
    n = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
    if (a->head == NULL || a->used + n > a->cap) {
        size_t cap = n > 16384 ? n : 16384;
        duet__arena_chunk_t *c = duet_malloc(sizeof(*c) + cap);
        if (c == NULL)
            return NULL;
        c->next = a->head;
        a->head = c;
        a->used = 0;
        a->cap = cap;
    }
    void *p = (char *)a->head->data + a->used;
    a->used += n;
    a->total += n;
    memset(p, 0, n);
    return p;
}

char *duet__tmpl_arena_strndup(duet__arena_t *a, const char *s, size_t n)
{
    char *p = duet__tmpl_arena_alloc(a, n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = '\0';
    }
    return p;
}

void duet__tmpl_arena_free(duet__arena_t *a)
{
    duet__arena_chunk_t *c = a->head;
    while (c) {
        duet__arena_chunk_t *next = c->next;
        duet_free(c);
        c = next;
    }
    memset(a, 0, sizeof(*a));
}

/* ---- segmenter ---- */

typedef enum { DUET__SEG_TEXT, DUET__SEG_EXPR, DUET__SEG_STMT } duet__seg_kind_t;

typedef struct {
    duet__seg_kind_t kind;
    const char *p; /* text, or the tag's inside */
    size_t n;
    int line;
} duet__seg_t;

typedef struct {
    duet__arena_t *arena;
    duet__seg_t *segs;
    size_t nsegs, cap, pos;
    /* tag lexer */
    const char *t, *tend;
    int line;
    int depth; /* nesting of expressions and blocks (the parser recurses) */
    duet_status_t err;
} duet__parser_t;

static duet_status_t duet__perr(duet__parser_t *ps, duet_status_t st, const char *what)
{
    if (ps->err == DUET_OK)
        ps->err = duet_error(st, "chat template line %d: %s", ps->line, what);
    return ps->err;
}

/* Deeper nesting than any real template; bounds the parser's recursion
 * (found by fuzz/fuzz_chat_template: ((((... overflowed the stack). */
#define DUET__MAX_NEST 100

static bool duet__nest_in(duet__parser_t *ps)
{
    if (ps->depth >= DUET__MAX_NEST) {
        duet__perr(ps, DUET_ERR_UNSUPPORTED, "nested more than 100 levels deep");
        return false;
    }
    ps->depth++;
    return true;
}

/* The line of p, counting on from the last position asked (segment asks in
 * source order: linear, where counting from the start each time was
 * quadratic in the template's size). */
typedef struct {
    const char *src, *at;
    int line;
} duet__lines_t;

static int duet__line_of(duet__lines_t *lc, const char *p)
{
    if (lc->at == NULL || p < lc->at) {
        lc->at = lc->src;
        lc->line = 1;
    }
    for (; lc->at < p; lc->at++)
        lc->line += *lc->at == '\n';
    return lc->line;
}

static bool duet__seg_push(duet__parser_t *ps, duet__seg_kind_t kind, const char *p, size_t n,
                           int line)
{
    if (kind == DUET__SEG_TEXT && n == 0)
        return true;
    if (ps->nsegs == ps->cap) {
        size_t cap = ps->cap ? ps->cap * 2 : 64;
        duet__seg_t *s = duet__tmpl_arena_alloc(ps->arena, cap * sizeof(*s));
        if (s == NULL)
            return false;
        if (ps->nsegs)
            memcpy(s, ps->segs, ps->nsegs * sizeof(*s));
        ps->segs = s;
        ps->cap = cap;
    }
    ps->segs[ps->nsegs++] = (duet__seg_t){kind, p, n, line};
    return true;
}

/* End of a tag opened at p (after the 2-char opener), skipping strings. */
static const char *duet__tag_end(const char *p, char close)
{
    char quote = 0;
    for (; *p; p++) {
        if (quote) {
            if (*p == '\\' && p[1])
                p++;
            else if (*p == quote)
                quote = 0;
        } else if (close != '#' && (*p == '\'' || *p == '"')) {
            quote = *p;
        } else if (*p == close && p[1] == '}') {
            return p;
        }
    }
    return NULL;
}

static duet_status_t duet__segment(duet__parser_t *ps, const char *src)
{
    const char *p = src;
    bool strip_next = false, trim_nl = false;
    duet__lines_t lines = {src, NULL, 1};

    for (;;) {
        const char *open = p;
        while ((open = strchr(open, '{')) != NULL && open[1] != '{' && open[1] != '%' &&
               open[1] != '#')
            open++;
        const char *text_end = open ? open : p + strlen(p);
        const char *ts = p;
        if (strip_next)
            while (ts < text_end && isspace((unsigned char)*ts))
                ts++;
        else if (trim_nl && ts < text_end && *ts == '\n')
            ts++;
        else if (trim_nl && ts + 1 < text_end && ts[0] == '\r' && ts[1] == '\n')
            ts += 2;
        const char *te = text_end;
        if (open) {
            char kind = open[1];
            bool minus = open[2] == '-', plus = open[2] == '+';
            if (minus) {
                while (te > ts && isspace((unsigned char)te[-1]))
                    te--;
            } else if (kind != '{' && !plus) { /* lstrip_blocks */
                const char *q = te;
                while (q > ts && (q[-1] == ' ' || q[-1] == '\t'))
                    q--;
                if (q == src || q[-1] == '\n')
                    te = q;
            }
        }
        if (!duet__seg_push(ps, DUET__SEG_TEXT, ts, (size_t)(te - ts), duet__line_of(&lines, ts)))
            return duet__perr(ps, DUET_ERR_NO_MEMORY, "out of memory");
        if (!open)
            return DUET_OK;
        char kind = open[1];
        char close = kind == '{' ? '}' : kind;
        const char *in = open + 2;
        if (*in == '-' || *in == '+')
            in++;
        const char *end = duet__tag_end(in, close);
        ps->line = duet__line_of(&lines, open);
        if (end == NULL)
            return duet__perr(ps, DUET_ERR_FORMAT, "unterminated tag");
        const char *in_end = end;
        strip_next = end > in && end[-1] == '-';
        if (strip_next || (end > in && end[-1] == '+'))
            in_end--;
        trim_nl = kind != '{';
        if (kind != '#' && !duet__seg_push(ps, kind == '{' ? DUET__SEG_EXPR : DUET__SEG_STMT, in,
                                           (size_t)(in_end - in), ps->line))
            return duet__perr(ps, DUET_ERR_NO_MEMORY, "out of memory");
        p = end + 2;
    }
}

/* ---- tag lexer ---- */

typedef enum { DUET__T_END, DUET__T_NAME, DUET__T_STR, DUET__T_INT, DUET__T_OP } duet__tok_kind_t;

typedef struct {
    duet__tok_kind_t kind;
    const char *p;
    size_t n;
    int64_t i;
} duet__tok_t;

static void duet__skip_ws(duet__parser_t *ps)
{
    while (ps->t < ps->tend && isspace((unsigned char)*ps->t))
        ps->t++;
}

/* Look at the next token without consuming it. */
static duet__tok_t duet__peek(duet__parser_t *ps)
{
    duet__tok_t tk = {DUET__T_END, NULL, 0, 0};
    duet__skip_ws(ps);
    const char *p = ps->t;
    if (p >= ps->tend)
        return tk;
    tk.p = p;
    if (isalpha((unsigned char)*p) || *p == '_') {
        while (p < ps->tend && (isalnum((unsigned char)*p) || *p == '_'))
            p++;
        tk.kind = DUET__T_NAME;
    } else if (isdigit((unsigned char)*p)) {
        while (p < ps->tend && isdigit((unsigned char)*p)) {
            int d = *p++ - '0';
            if (tk.i > (INT64_MAX - d) / 10) { /* found by fuzz/fuzz_chat_template */
                tk.kind = DUET__T_END;
                tk.p = NULL;
                duet__perr(ps, DUET_ERR_FORMAT, "integer literal out of range");
                return tk;
            }
            tk.i = tk.i * 10 + d;
        }
        tk.kind = DUET__T_INT;
    } else if (*p == '\'' || *p == '"') {
        char q = *p++;
        while (p < ps->tend && *p != q)
            p += (*p == '\\' && p + 1 < ps->tend) ? 2 : 1;
        if (p >= ps->tend) {
            tk.kind = DUET__T_END;
            tk.p = NULL;
            duet__perr(ps, DUET_ERR_FORMAT, "unterminated string");
            return tk;
        }
        p++;
        tk.kind = DUET__T_STR;
    } else {
        static const char *const two[] = {"==", "!=", "<=", ">=", "//", "**"};
        tk.kind = DUET__T_OP;
        p++;
        for (size_t k = 0; k < sizeof(two) / sizeof(two[0]); k++)
            if (ps->tend - tk.p >= 2 && memcmp(tk.p, two[k], 2) == 0)
                p = tk.p + 2;
    }
    tk.n = (size_t)(p - tk.p);
    return tk;
}

static duet__tok_t duet__next(duet__parser_t *ps)
{
    duet__tok_t tk = duet__peek(ps);
    if (tk.kind != DUET__T_END)
        ps->t = tk.p + tk.n;
    return tk;
}

static bool duet__tok_is(duet__tok_t tk, const char *s)
{
    return tk.kind != DUET__T_END && tk.kind != DUET__T_STR && strlen(s) == tk.n &&
           memcmp(tk.p, s, tk.n) == 0;
}

static bool duet__accept(duet__parser_t *ps, const char *s)
{
    if (!duet__tok_is(duet__peek(ps), s))
        return false;
    duet__next(ps);
    return true;
}

static bool duet__expect(duet__parser_t *ps, const char *s)
{
    if (duet__accept(ps, s))
        return true;
    char msg[64];
    snprintf(msg, sizeof(msg), "expected '%s'", s);
    duet__perr(ps, DUET_ERR_FORMAT, msg);
    return false;
}

static duet__node_t *duet__node_new(duet__parser_t *ps, duet__node_kind_t kind)
{
    duet__node_t *n = duet__tmpl_arena_alloc(ps->arena, sizeof(*n));
    if (n == NULL) {
        duet__perr(ps, DUET_ERR_NO_MEMORY, "out of memory");
        return NULL;
    }
    n->kind = kind;
    n->line = ps->line;
    return n;
}

/* Decode a string literal's escapes into the arena. */
static duet__node_t *duet__string_lit(duet__parser_t *ps, duet__tok_t tk)
{
    duet__node_t *n = duet__node_new(ps, DUET__E_STR);
    char *out = n ? duet__tmpl_arena_alloc(ps->arena, tk.n) : NULL;
    size_t k = 0;
    if (out == NULL)
        return NULL;
    for (size_t i = 1; i + 1 < tk.n; i++) {
        char c = tk.p[i];
        if (c == '\\' && i + 2 < tk.n) {
            c = tk.p[++i];
            c = c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : c;
        }
        out[k++] = c;
    }
    n->s = out;
    n->slen = k;
    return n;
}

static duet__node_t *duet__expr(duet__parser_t *ps);

/* Comma-separated arguments up to `close`, with name=value keywords. */
static bool duet__args(duet__parser_t *ps, duet__node_t *n, const char *close, bool dict)
{
    duet__node_t *items[64];
    const char *kws[64];
    size_t k = 0;

    while (!duet__accept(ps, close)) {
        if (k > 0 && !duet__expect(ps, ","))
            return false;
        if (duet__accept(ps, close))
            break;
        if (k + 2 > 64)
            return duet__perr(ps, DUET_ERR_UNSUPPORTED, "too many arguments"), false;
        kws[k] = NULL;
        const char *save = ps->t;
        duet__tok_t name = duet__next(ps);
        if (!dict && name.kind == DUET__T_NAME && duet__tok_is(duet__peek(ps), "=")) {
            duet__next(ps);
            kws[k] = duet__tmpl_arena_strndup(ps->arena, name.p, name.n);
        } else {
            ps->t = save;
        }
        if ((items[k++] = duet__expr(ps)) == NULL)
            return false;
        if (dict) {
            if (!duet__expect(ps, ":") || (items[k++] = duet__expr(ps)) == NULL)
                return false;
            kws[k - 1] = NULL;
        }
    }
    n->nargs = k;
    n->args = duet__tmpl_arena_alloc(ps->arena, (k ? k : 1) * sizeof(*n->args));
    n->kw = duet__tmpl_arena_alloc(ps->arena, (k ? k : 1) * sizeof(*n->kw));
    if (n->args == NULL || n->kw == NULL)
        return duet__perr(ps, DUET_ERR_NO_MEMORY, "out of memory"), false;
    memcpy(n->args, items, k * sizeof(*items));
    memcpy(n->kw, kws, k * sizeof(*kws));
    return true;
}

static duet__node_t *duet__primary(duet__parser_t *ps)
{
    duet__tok_t tk = duet__next(ps);
    duet__node_t *n;

    if (ps->err)
        return NULL;
    switch (tk.kind) {
    case DUET__T_STR:
        n = duet__string_lit(ps, tk);
        /* adjacent literals concatenate, as in Python */
        while (n && duet__peek(ps).kind == DUET__T_STR) {
            duet__node_t *m = duet__string_lit(ps, duet__next(ps));
            char *s = m ? duet__tmpl_arena_alloc(ps->arena, n->slen + m->slen + 1) : NULL;
            if (s == NULL)
                return NULL;
            memcpy(s, n->s, n->slen);
            memcpy(s + n->slen, m->s, m->slen);
            n->s = s;
            n->slen += m->slen;
        }
        return n;
    case DUET__T_INT:
        if ((n = duet__node_new(ps, DUET__E_INT)))
            n->i = tk.i;
        return n;
    case DUET__T_NAME:
        if (duet__tok_is(tk, "true") || duet__tok_is(tk, "True") || duet__tok_is(tk, "false") ||
            duet__tok_is(tk, "False")) {
            if ((n = duet__node_new(ps, DUET__E_BOOL)))
                n->i = tk.p[0] == 't' || tk.p[0] == 'T';
            return n;
        }
        if (duet__tok_is(tk, "none") || duet__tok_is(tk, "None"))
            return duet__node_new(ps, DUET__E_NONE);
        if ((n = duet__node_new(ps, DUET__E_NAME)))
            n->s = duet__tmpl_arena_strndup(ps->arena, tk.p, tk.n);
        return n;
    case DUET__T_OP:
        if (duet__tok_is(tk, "(")) {
            n = duet__expr(ps);
            return n && duet__expect(ps, ")") ? n : NULL;
        }
        if (duet__tok_is(tk, "[")) {
            n = duet__node_new(ps, DUET__E_LIST);
            return n && duet__args(ps, n, "]", false) ? n : NULL;
        }
        if (duet__tok_is(tk, "{")) {
            n = duet__node_new(ps, DUET__E_DICT);
            return n && duet__args(ps, n, "}", true) ? n : NULL;
        }
        break;
    default:
        break;
    }
    duet__perr(ps, DUET_ERR_FORMAT, "unexpected token in expression");
    return NULL;
}

static duet__node_t *duet__postfix(duet__parser_t *ps)
{
    duet__node_t *n = duet__primary(ps), *m;

    while (n) {
        if (duet__accept(ps, ".")) {
            duet__tok_t name = duet__next(ps);
            if (name.kind != DUET__T_NAME)
                return duet__perr(ps, DUET_ERR_FORMAT, "expected a name after '.'"), NULL;
            if ((m = duet__node_new(ps, DUET__E_ATTR)) == NULL)
                return NULL;
            m->a = n;
            m->s = duet__tmpl_arena_strndup(ps->arena, name.p, name.n);
            n = m;
        } else if (duet__accept(ps, "[")) {
            duet__node_t *lo = NULL, *hi = NULL, *step = NULL;
            bool slice = false;
            if (!duet__tok_is(duet__peek(ps), ":") && (lo = duet__expr(ps)) == NULL)
                return NULL;
            if (duet__accept(ps, ":")) {
                slice = true;
                if (!duet__tok_is(duet__peek(ps), "]") && !duet__tok_is(duet__peek(ps), ":") &&
                    (hi = duet__expr(ps)) == NULL)
                    return NULL;
                if (duet__accept(ps, ":") && !duet__tok_is(duet__peek(ps), "]") &&
                    (step = duet__expr(ps)) == NULL)
                    return NULL;
            }
            if (!duet__expect(ps, "]") ||
                (m = duet__node_new(ps, slice ? DUET__E_SLICE : DUET__E_INDEX)) == NULL)
                return NULL;
            m->a = n;
            m->b = lo;
            m->c = hi;
            m->d = step;
            n = m;
        } else if (duet__accept(ps, "(")) {
            if ((m = duet__node_new(ps, DUET__E_CALL)) == NULL || !duet__args(ps, m, ")", false))
                return NULL;
            m->a = n;
            n = m;
        } else {
            break;
        }
    }
    return n;
}

static duet__node_t *duet__filtered(duet__parser_t *ps)
{
    duet__node_t *n = duet__postfix(ps), *m;

    while (n && duet__accept(ps, "|")) {
        duet__tok_t name = duet__next(ps);
        if (name.kind != DUET__T_NAME)
            return duet__perr(ps, DUET_ERR_FORMAT, "expected a filter name"), NULL;
        if ((m = duet__node_new(ps, DUET__E_FILTER)) == NULL)
            return NULL;
        m->a = n;
        m->s = duet__tmpl_arena_strndup(ps->arena, name.p, name.n);
        if (duet__accept(ps, "(") && !duet__args(ps, m, ")", false))
            return NULL;
        n = m;
    }
    return n;
}

static duet__node_t *duet__unary(duet__parser_t *ps)
{
    duet__node_t *n;
    if (duet__accept(ps, "-")) {
        if (!duet__nest_in(ps))
            return NULL;
        if ((n = duet__node_new(ps, DUET__E_NEG)) != NULL)
            n->a = duet__unary(ps);
        ps->depth--;
        return n != NULL && n->a != NULL ? n : NULL;
    }
    return duet__filtered(ps);
}

static duet__node_t *duet__binop(duet__parser_t *ps, duet__node_t *a, duet__op_t op,
                                 duet__node_t *b)
{
    duet__node_t *n;
    if (a == NULL || b == NULL || (n = duet__node_new(ps, DUET__E_BINOP)) == NULL)
        return NULL;
    n->a = a;
    n->b = b;
    n->op = op;
    return n;
}

static duet__node_t *duet__math2(duet__parser_t *ps)
{
    duet__node_t *n = duet__unary(ps);
    for (;;) {
        if (duet__accept(ps, "*"))
            n = duet__binop(ps, n, DUET__OP_MUL, duet__unary(ps));
        else if (duet__accept(ps, "//"))
            n = duet__binop(ps, n, DUET__OP_FLOORDIV, duet__unary(ps));
        else if (duet__accept(ps, "/"))
            n = duet__binop(ps, n, DUET__OP_DIV, duet__unary(ps));
        else if (duet__accept(ps, "%"))
            n = duet__binop(ps, n, DUET__OP_MOD, duet__unary(ps));
        else
            return n;
    }
}

static duet__node_t *duet__math1(duet__parser_t *ps)
{
    duet__node_t *n = duet__math2(ps);
    for (;;) {
        if (duet__accept(ps, "+"))
            n = duet__binop(ps, n, DUET__OP_ADD, duet__math2(ps));
        else if (duet__accept(ps, "-"))
            n = duet__binop(ps, n, DUET__OP_SUB, duet__math2(ps));
        else
            return n;
    }
}

static duet__node_t *duet__concat(duet__parser_t *ps)
{
    duet__node_t *n = duet__math1(ps);
    while (n && duet__accept(ps, "~"))
        n = duet__binop(ps, n, DUET__OP_CONCAT, duet__math1(ps));
    return n;
}

static duet__node_t *duet__parse_compare(duet__parser_t *ps)
{
    static const struct {
        const char *s;
        duet__op_t op;
    } ops[] = {{"==", DUET__OP_EQ}, {"!=", DUET__OP_NE}, {"<=", DUET__OP_LE}, {">=", DUET__OP_GE},
               {"<", DUET__OP_LT},  {">", DUET__OP_GT},  {"in", DUET__OP_IN}};
    duet__node_t *n = duet__concat(ps);

    while (n) {
        size_t k;
        const char *save = ps->t;
        if (duet__accept(ps, "not")) {
            if (duet__accept(ps, "in")) {
                n = duet__binop(ps, n, DUET__OP_NOT_IN, duet__concat(ps));
                continue;
            }
            ps->t = save;
            return n;
        }
        if (duet__accept(ps, "is")) {
            duet__node_t *m = duet__node_new(ps, DUET__E_TEST);
            if (m == NULL)
                return NULL;
            m->i = duet__accept(ps, "not");
            duet__tok_t name = duet__next(ps);
            if (name.kind != DUET__T_NAME)
                return duet__perr(ps, DUET_ERR_FORMAT, "expected a test name after 'is'"), NULL;
            m->a = n;
            m->s = duet__tmpl_arena_strndup(ps->arena, name.p, name.n);
            n = m;
            continue;
        }
        for (k = 0; k < sizeof(ops) / sizeof(ops[0]); k++)
            if (duet__accept(ps, ops[k].s))
                break;
        if (k == sizeof(ops) / sizeof(ops[0]))
            return n;
        n = duet__binop(ps, n, ops[k].op, duet__concat(ps));
    }
    return n;
}

static duet__node_t *duet__not(duet__parser_t *ps)
{
    duet__node_t *n;
    if (duet__accept(ps, "not")) {
        if (!duet__nest_in(ps))
            return NULL;
        if ((n = duet__node_new(ps, DUET__E_NOT)) != NULL)
            n->a = duet__not(ps);
        ps->depth--;
        return n != NULL && n->a != NULL ? n : NULL;
    }
    return duet__parse_compare(ps);
}

static duet__node_t *duet__logic(duet__parser_t *ps, bool or_level)
{
    duet__node_t *n = or_level ? duet__logic(ps, false) : duet__not(ps), *m;
    while (n && duet__accept(ps, or_level ? "or" : "and")) {
        if ((m = duet__node_new(ps, or_level ? DUET__E_OR : DUET__E_AND)) == NULL)
            return NULL;
        m->a = n;
        if ((m->b = or_level ? duet__logic(ps, false) : duet__not(ps)) == NULL)
            return NULL;
        n = m;
    }
    return n;
}

/* Full expression: `x if c else y` binds loosest. */
static duet__node_t *duet__cond(duet__parser_t *ps)
{
    duet__node_t *n = duet__logic(ps, true), *m;
    if (n && duet__accept(ps, "if")) {
        if ((m = duet__node_new(ps, DUET__E_COND)) == NULL)
            return NULL;
        m->b = n;
        if ((m->a = duet__logic(ps, true)) == NULL)
            return NULL;
        if (duet__accept(ps, "else") && (m->c = duet__expr(ps)) == NULL)
            return NULL;
        n = m;
    }
    return n;
}

static duet__node_t *duet__expr(duet__parser_t *ps)
{
    if (!duet__nest_in(ps))
        return NULL;
    duet__node_t *n = duet__cond(ps);
    ps->depth--;
    return n;
}

/* ---- statements ---- */

static void duet__tag_begin(duet__parser_t *ps, const duet__seg_t *s)
{
    ps->t = s->p;
    ps->tend = s->p + s->n;
    ps->line = s->line;
}

static bool duet__tag_done(duet__parser_t *ps)
{
    if (ps->err)
        return false;
    if (duet__peek(ps).kind != DUET__T_END)
        return duet__perr(ps, DUET_ERR_FORMAT, "unexpected text at the end of a tag"), false;
    return true;
}

/* The keyword a statement segment starts with. */
static duet__tok_t duet__stmt_word(duet__parser_t *ps, const duet__seg_t *s)
{
    duet__tag_begin(ps, s);
    return duet__peek(ps);
}

static duet__node_t *duet__parse_body(duet__parser_t *ps, const char *const *ends,
                                      duet__tok_t *end_p);

static duet__node_t *duet__if(duet__parser_t *ps)
{
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    duet__node_t *n = duet__node_new(ps, DUET__N_IF);
    duet__tok_t end;

    if (n == NULL || (n->a = duet__expr(ps)) == NULL || !duet__tag_done(ps))
        return NULL;
    n->body = duet__parse_body(ps, ends, &end);
    if (ps->err)
        return NULL;
    if (duet__tok_is(end, "elif")) {
        if ((n->orelse = duet__if(ps)) == NULL)
            return NULL;
    } else if (duet__tok_is(end, "else")) {
        static const char *const endif[] = {"endif", NULL};
        if (!duet__tag_done(ps))
            return NULL;
        n->orelse = duet__parse_body(ps, endif, &end);
        if (ps->err || !duet__tag_done(ps))
            return NULL;
    } else if (!duet__tag_done(ps)) {
        return NULL;
    }
    return n;
}

static duet__node_t *duet__for(duet__parser_t *ps)
{
    static const char *const ends[] = {"else", "endfor", NULL};
    duet__node_t *n = duet__node_new(ps, DUET__N_FOR);
    duet__tok_t name = duet__next(ps), end;

    if (n == NULL || name.kind != DUET__T_NAME)
        return duet__perr(ps, DUET_ERR_FORMAT, "expected a loop variable"), NULL;
    n->s = duet__tmpl_arena_strndup(ps->arena, name.p, name.n);
    if (duet__accept(ps, ",")) {
        name = duet__next(ps);
        if (name.kind != DUET__T_NAME)
            return duet__perr(ps, DUET_ERR_FORMAT, "expected a loop variable"), NULL;
        n->s2 = duet__tmpl_arena_strndup(ps->arena, name.p, name.n);
    }
    if (!duet__expect(ps, "in") || (n->a = duet__logic(ps, true)) == NULL)
        return NULL;
    if (duet__accept(ps, "if") && (n->b = duet__logic(ps, true)) == NULL)
        return NULL;
    if (duet__accept(ps, "recursive"))
        return duet__perr(ps, DUET_ERR_UNSUPPORTED, "recursive loops are not supported"), NULL;
    if (!duet__tag_done(ps))
        return NULL;
    n->body = duet__parse_body(ps, ends, &end);
    if (ps->err || !duet__tag_done(ps))
        return NULL;
    if (duet__tok_is(end, "else")) {
        static const char *const endfor[] = {"endfor", NULL};
        n->orelse = duet__parse_body(ps, endfor, &end);
        if (ps->err || !duet__tag_done(ps))
            return NULL;
    }
    return n;
}

static duet__node_t *duet__set(duet__parser_t *ps)
{
    duet__node_t *n = duet__node_new(ps, DUET__N_SET);
    duet__tok_t name = duet__next(ps);

    if (n == NULL || name.kind != DUET__T_NAME)
        return duet__perr(ps, DUET_ERR_FORMAT, "expected a name after set"), NULL;
    n->s = duet__tmpl_arena_strndup(ps->arena, name.p, name.n);
    if (duet__accept(ps, ".")) {
        name = duet__next(ps);
        if (name.kind != DUET__T_NAME)
            return duet__perr(ps, DUET_ERR_FORMAT, "expected an attribute name"), NULL;
        n->s2 = duet__tmpl_arena_strndup(ps->arena, name.p, name.n);
    }
    if (!duet__tok_is(duet__peek(ps), "="))
        return duet__perr(ps, DUET_ERR_UNSUPPORTED, "block set is not supported"), NULL;
    duet__next(ps);
    if ((n->a = duet__expr(ps)) == NULL || !duet__tag_done(ps))
        return NULL;
    return n;
}

/* Statements until a tag whose keyword is in ends (its segment is consumed,
 * and the lexer is left after the keyword); ends == NULL: until the end. */
static duet__node_t *duet__body_in(duet__parser_t *ps, const char *const *ends, duet__tok_t *end_p)
{
    duet__node_t *head = NULL, **tail = &head, *n;

    while (ps->pos < ps->nsegs && !ps->err) {
        const duet__seg_t *s = &ps->segs[ps->pos++];
        if (s->kind == DUET__SEG_TEXT) {
            if ((n = duet__node_new(ps, DUET__N_TEXT)) == NULL)
                return NULL;
            n->s = s->p;
            n->slen = s->n;
        } else if (s->kind == DUET__SEG_EXPR) {
            duet__tag_begin(ps, s);
            if ((n = duet__node_new(ps, DUET__N_OUTPUT)) == NULL ||
                (n->a = duet__expr(ps)) == NULL || !duet__tag_done(ps))
                return NULL;
        } else {
            duet__tok_t w = duet__stmt_word(ps, s);
            for (size_t k = 0; ends && ends[k]; k++) {
                if (duet__tok_is(w, ends[k])) {
                    duet__next(ps);
                    *end_p = w;
                    return head;
                }
            }
            duet__next(ps);
            if (duet__tok_is(w, "if"))
                n = duet__if(ps);
            else if (duet__tok_is(w, "for"))
                n = duet__for(ps);
            else if (duet__tok_is(w, "set"))
                n = duet__set(ps);
            else {
                static const char *const closers[] = {"endif", "endfor", "else", "elif"};
                bool stray = false;
                char msg[96];
                for (size_t k = 0; k < sizeof(closers) / sizeof(closers[0]); k++)
                    stray = stray || duet__tok_is(w, closers[k]);
                snprintf(msg, sizeof(msg), "%s '%.*s'",
                         stray ? "unexpected" : "unsupported statement", (int)(w.n < 32 ? w.n : 32),
                         w.p ? w.p : "");
                duet__perr(ps, stray ? DUET_ERR_FORMAT : DUET_ERR_UNSUPPORTED, msg);
                return NULL;
            }
            if (n == NULL)
                return NULL;
        }
        *tail = n;
        tail = &n->next;
    }
    if (ends != NULL && !ps->err) {
        char msg[64];
        size_t k = 0;
        while (ends[k + 1] != NULL)
            k++;
        snprintf(msg, sizeof(msg), "missing {%% %s %%}", ends[k]);
        duet__perr(ps, DUET_ERR_FORMAT, msg);
    }
    return head;
}

static duet__node_t *duet__parse_body(duet__parser_t *ps, const char *const *ends,
                                      duet__tok_t *end_p)
{
    if (!duet__nest_in(ps))
        return NULL;
    duet__node_t *n = duet__body_in(ps, ends, end_p);
    ps->depth--;
    return n;
}

duet_status_t duet_router_chat_tmpl_compile(const char *src, duet_router_chat_tmpl_t **tmpl_p)
{
    duet_router_chat_tmpl_t *t = DUET_NEW(duet_router_chat_tmpl_t);
    duet__parser_t ps;

    if (t == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "chat template: out of memory");
    memset(&ps, 0, sizeof(ps));
    ps.arena = &t->arena;
    ps.line = 1;
    /* the source is referenced by text nodes: keep a copy in the arena */
    char *copy = duet__tmpl_arena_strndup(&t->arena, src, strlen(src));
    if (copy == NULL || duet__segment(&ps, copy) != DUET_OK) {
        duet_status_t st = ps.err ? ps.err : duet_error(DUET_ERR_NO_MEMORY, "out of memory");
        duet_router_chat_tmpl_destroy(t);
        return st;
    }
    t->root = duet__parse_body(&ps, NULL, NULL);
    if (ps.err) {
        duet_status_t st = ps.err;
        duet_router_chat_tmpl_destroy(t);
        return st;
    }
    *tmpl_p = t;
    return DUET_OK;
}

void duet_router_chat_tmpl_destroy(duet_router_chat_tmpl_t *tmpl)
{
    if (tmpl == NULL)
        return;
    duet__tmpl_arena_free(&tmpl->arena);
    duet_free(tmpl);
}
