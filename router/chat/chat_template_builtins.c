/* Chat-template builtins: filters, tests and string/dict methods. */
#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "router/chat/chat_template_internal.h"

#define DUET__ARG(k) (n->nargs > (k) ? argv[k] : &duet__tmpl_undef)

/* str.strip/lstrip/rstrip: whitespace, or the bytes of chars when given
 * (a string; none means whitespace). */
static duet__val_t *duet__strip(duet__rs_t *rs, duet__val_t *s, bool left, bool right,
                                const duet__val_t *chars, int line)
{
    const char *p = s->s, *e = s->s + s->n;
    bool ws = chars == NULL || chars->kind == DUET__V_UNDEF || chars->kind == DUET__V_NONE;
    if (!ws && chars->kind != DUET__V_STR)
        return duet__tmpl_fail(rs, DUET_ERR_INVALID, line, "%s", "strip needs a string");
#define DUET__STRIP_OK(c)                                                                          \
    (ws ? isspace((unsigned char)(c)) != 0 : memchr(chars->s, (c), chars->n) != NULL)
    while (left && p < e && DUET__STRIP_OK(*p))
        p++;
    while (right && e > p && DUET__STRIP_OK(e[-1]))
        e--;
#undef DUET__STRIP_OK
    return duet__tmpl_str(rs, p, (size_t)(e - p), false);
}

static duet__val_t *duet__case(duet__rs_t *rs, duet__val_t *s, int mode)
{
    /* mode 0 lower, 1 upper, 2 title, 3 capitalize (ASCII letters only) */
    char *o = duet__tmpl_arena_strndup(&rs->arena, s->s, s->n);
    bool start = true;
    if (o == NULL)
        return duet__tmpl_fail(rs, DUET_ERR_NO_MEMORY, 0, "%s", "out of memory");
    for (size_t i = 0; i < s->n; i++) {
        unsigned char c = (unsigned char)o[i];
        bool up = mode == 1 || ((mode == 2 || mode == 3) && start);
        if (mode == 3 && i > 0)
            up = false;
        o[i] = (char)(up ? toupper(c) : tolower(c));
        start = !isalnum(c);
    }
    return duet__tmpl_str(rs, o, s->n, false);
}

static duet__val_t *duet__replace(duet__rs_t *rs, duet__val_t *s, duet__val_t *from,
                                  duet__val_t *to, int line)
{
    duet_router_buf_t b;
    duet__val_t *r;

    if (s->kind != DUET__V_STR || from->kind != DUET__V_STR || to->kind != DUET__V_STR)
        return duet__tmpl_fail(rs, DUET_ERR_INVALID, line, "%s", "replace needs strings");
    if (from->n == 0)
        return s;
    duet_router_buf_init(&b);
    for (size_t i = 0; i < s->n;) {
        if (i + from->n <= s->n && memcmp(s->s + i, from->s, from->n) == 0) {
            duet_router_buf_append(&b, to->s, to->n);
            i += from->n;
        } else {
            duet_router_buf_append(&b, s->s + i++, 1);
        }
    }
    r = b.oom ? duet__tmpl_fail(rs, DUET_ERR_NO_MEMORY, 0, "%s", "out of memory")
              : duet__tmpl_str(rs, b.data ? b.data : "", b.len, true);
    duet_router_buf_cleanup(&b);
    return r;
}

/* A newline and indent * level spaces, for tojson(indent=N). */
static void duet__json_nl(duet_router_buf_t *b, int64_t indent, int64_t level)
{
    duet_router_buf_puts(b, "\n");
    for (int64_t i = 0; i < indent * level; i++)
        duet_router_buf_puts(b, " ");
}

/* Python's json.dumps as transformers' tojson calls it: ", " and ": "
 * separators, or with indent > 0 one item a line (", " becoming ","). */
static void duet__tojson(duet_router_buf_t *b, const duet__val_t *v, int64_t indent, int64_t level)
{
    switch (v->kind) {
    case DUET__V_STR:
        duet_router_buf_json_str(b, v->s, v->n);
        break;
    case DUET__V_BOOL:
        duet_router_buf_puts(b, v->i ? "true" : "false");
        break;
    case DUET__V_INT:
        duet_router_buf_printf(b, "%" PRId64, v->i);
        break;
    case DUET__V_LIST:
    case DUET__V_DICT:
        duet_router_buf_puts(b, v->kind == DUET__V_LIST ? "[" : "{");
        for (size_t i = 0; i < v->n; i++) {
            if (i)
                duet_router_buf_puts(b, indent > 0 ? "," : ", ");
            if (indent > 0)
                duet__json_nl(b, indent, level + 1);
            if (v->kind == DUET__V_DICT) {
                duet_router_buf_json_str(b, v->keys[i], strlen(v->keys[i]));
                duet_router_buf_puts(b, ": ");
            }
            duet__tojson(b, v->items[i], indent, level + 1);
        }
        if (indent > 0 && v->n > 0)
            duet__json_nl(b, indent, level);
        duet_router_buf_puts(b, v->kind == DUET__V_LIST ? "]" : "}");
        break;
    default:
        duet_router_buf_puts(b, "null");
        break;
    }
}

static duet__val_t *duet__select(duet__rs_t *rs, const duet__node_t *n, duet__val_t *v,
                                 duet__val_t **argv, bool keep);
static duet__val_t *duet__items(duet__rs_t *rs, const duet__node_t *n, const duet__val_t *v);

duet__val_t *duet__tmpl_filter(duet__rs_t *rs, const duet__node_t *n, duet__val_t *v)
{
    duet__val_t *argv[8];
    const char *f = n->s;

    if (!duet__tmpl_eval_args(rs, n, argv))
        return NULL;
    if (strcmp(f, "default") == 0 || strcmp(f, "d") == 0) {
        bool boolean = n->nargs > 1 && duet__tmpl_truthy(argv[1]);
        return (v->kind == DUET__V_UNDEF || (boolean && !duet__tmpl_truthy(v)))
                   ? (n->nargs ? argv[0] : duet__tmpl_str(rs, "", 0, false))
                   : v;
    }
    if (strcmp(f, "length") == 0 || strcmp(f, "count") == 0) {
        if (v->kind != DUET__V_STR && v->kind != DUET__V_LIST && v->kind != DUET__V_DICT)
            return duet__tmpl_fail(rs, DUET_ERR_INVALID, n->line, "%s", "length of a non-sequence");
        return duet__tmpl_int(rs, DUET__V_INT, (int64_t)v->n);
    }
    if (strcmp(f, "string") == 0)
        return duet__tmpl_to_str(rs, v);
    if (strcmp(f, "tojson") == 0) {
        duet_router_buf_t b;
        int64_t indent = 0;
        for (size_t i = 0; i < n->nargs; i++) {
            if ((n->kw[i] != NULL && strcmp(n->kw[i], "indent") != 0) ||
                argv[i]->kind != DUET__V_INT)
                return duet__tmpl_fail(rs, DUET_ERR_UNSUPPORTED, n->line, "%s",
                                       "tojson takes only indent=<int>");
            indent = argv[i]->i < 0 ? 0 : argv[i]->i > 16 ? 16 : argv[i]->i;
        }
        duet_router_buf_init(&b);
        duet__tojson(&b, v, indent, 0);
        duet__val_t *r = b.oom ? duet__tmpl_fail(rs, DUET_ERR_NO_MEMORY, 0, "%s", "out of memory")
                               : duet__tmpl_str(rs, b.data ? b.data : "", b.len, true);
        duet_router_buf_cleanup(&b);
        return r;
    }
    if (strcmp(f, "select") == 0 || strcmp(f, "reject") == 0)
        return duet__select(rs, n, v, argv, f[0] == 's');
    if (strcmp(f, "items") == 0)
        return duet__items(rs, n, v);
    if (strcmp(f, "int") == 0) {
        if (v->kind == DUET__V_INT || v->kind == DUET__V_BOOL)
            return duet__tmpl_int(rs, DUET__V_INT, v->i);
        if (v->kind == DUET__V_STR) {
            char tmp[32];
            snprintf(tmp, sizeof(tmp), "%.*s", (int)(v->n < 31 ? v->n : 31), v->s);
            return duet__tmpl_int(rs, DUET__V_INT, strtoll(tmp, NULL, 10));
        }
        return duet__tmpl_int(rs, DUET__V_INT, 0);
    }
    if (strcmp(f, "first") == 0 || strcmp(f, "last") == 0) {
        if (v->kind != DUET__V_LIST)
            return duet__tmpl_fail(rs, DUET_ERR_INVALID, n->line, "%s", "first/last of a non-list");
        return v->n == 0 ? &duet__tmpl_undef : v->items[f[0] == 'f' ? 0 : v->n - 1];
    }
    if (strcmp(f, "join") == 0) {
        duet_router_buf_t b;
        duet__val_t *sep = n->nargs ? argv[0] : NULL, *r;
        if (v->kind != DUET__V_LIST || (sep && sep->kind != DUET__V_STR))
            return duet__tmpl_fail(rs, DUET_ERR_INVALID, n->line, "%s", "join needs a list");
        duet_router_buf_init(&b);
        for (size_t i = 0; i < v->n; i++) {
            if (i && sep)
                duet_router_buf_append(&b, sep->s, sep->n);
            duet__tmpl_repr(&b, v->items[i], false);
        }
        r = b.oom ? duet__tmpl_fail(rs, DUET_ERR_NO_MEMORY, 0, "%s", "out of memory")
                  : duet__tmpl_str(rs, b.data ? b.data : "", b.len, true);
        duet_router_buf_cleanup(&b);
        return r;
    }
    if (v->kind != DUET__V_STR && v->kind != DUET__V_UNDEF)
        return duet__tmpl_fail(rs, DUET_ERR_INVALID, n->line, "filter '%s' needs a string", f);
    if (v->kind == DUET__V_UNDEF && (v = duet__tmpl_str(rs, "", 0, false)) == NULL)
        return NULL;
    if (strcmp(f, "trim") == 0)
        return duet__strip(rs, v, true, true, NULL, n->line);
    if (strcmp(f, "lower") == 0 || strcmp(f, "upper") == 0)
        return duet__case(rs, v, f[0] == 'u');
    if (strcmp(f, "title") == 0)
        return duet__case(rs, v, 2);
    if (strcmp(f, "capitalize") == 0)
        return duet__case(rs, v, 3);
    if (strcmp(f, "replace") == 0)
        return duet__replace(rs, v, DUET__ARG(0), DUET__ARG(1), n->line);
    return duet__tmpl_fail(rs, DUET_ERR_UNSUPPORTED, n->line, "unsupported filter '%s'", f);
}

/* Test t of v (arg: its argument, for equalto/eq/ne); 1, 0, or -1 after
 * recording the error. */
static int duet__test_val(duet__rs_t *rs, int line, const char *t, const duet__val_t *v,
                          const duet__val_t *arg)
{
    if (strcmp(t, "defined") == 0)
        return v->kind != DUET__V_UNDEF;
    if (strcmp(t, "undefined") == 0)
        return v->kind == DUET__V_UNDEF;
    if (strcmp(t, "none") == 0)
        return v->kind == DUET__V_NONE;
    if (strcmp(t, "string") == 0)
        return v->kind == DUET__V_STR;
    if (strcmp(t, "number") == 0 || strcmp(t, "integer") == 0)
        return v->kind == DUET__V_INT;
    if (strcmp(t, "mapping") == 0)
        return v->kind == DUET__V_DICT;
    if (strcmp(t, "sequence") == 0 || strcmp(t, "iterable") == 0)
        return v->kind == DUET__V_LIST || v->kind == DUET__V_STR || v->kind == DUET__V_DICT;
    if (strcmp(t, "boolean") == 0)
        return v->kind == DUET__V_BOOL;
    if (strcmp(t, "true") == 0 || strcmp(t, "false") == 0)
        return v->kind == DUET__V_BOOL && v->i == (t[0] == 't');
    if (strcmp(t, "even") == 0 || strcmp(t, "odd") == 0)
        return v->kind == DUET__V_INT && (v->i % 2 == 0) == (t[0] == 'e');
    if (arg != NULL && (strcmp(t, "equalto") == 0 || strcmp(t, "eq") == 0 || strcmp(t, "==") == 0 ||
                        strcmp(t, "ne") == 0 || strcmp(t, "!=") == 0))
        return duet__tmpl_equal(v, arg) == (t[0] == 'e' || t[0] == '=');
    duet__tmpl_fail(rs, DUET_ERR_UNSUPPORTED, line, "unsupported test '%s'", t);
    return -1;
}

duet__val_t *duet__tmpl_test(duet__rs_t *rs, const duet__node_t *n)
{
    duet__val_t *v = duet__tmpl_eval(rs, n->a);
    int r;

    if (v == NULL || (r = duet__test_val(rs, n->line, n->s, v, NULL)) < 0)
        return NULL;
    return duet__tmpl_int(rs, DUET__V_BOOL, (r != 0) != (n->i != 0));
}

/* v | select(test[, arg]) / reject(test[, arg]): the items of a list that
 * pass (fail) the test named by a string. */
static duet__val_t *duet__select(duet__rs_t *rs, const duet__node_t *n, duet__val_t *v,
                                 duet__val_t **argv, bool keep)
{
    duet__val_t *r;
    if (v->kind != DUET__V_LIST || n->nargs < 1 || n->nargs > 2 || argv[0]->kind != DUET__V_STR)
        return duet__tmpl_fail(rs, DUET_ERR_UNSUPPORTED, n->line, "%s",
                               "select/reject need a list and a test name");
    char *t = duet__tmpl_arena_strndup(&rs->arena, argv[0]->s, argv[0]->n);
    if (t == NULL || (r = duet__tmpl_new(rs, DUET__V_LIST)) == NULL)
        return duet__tmpl_fail(rs, DUET_ERR_NO_MEMORY, 0, "%s", "out of memory");
    for (size_t i = 0; i < v->n; i++) {
        int pass = duet__test_val(rs, n->line, t, v->items[i], n->nargs > 1 ? argv[1] : NULL);
        if (pass < 0)
            return NULL;
        if ((pass != 0) == keep && !duet__tmpl_push(rs, r, v->items[i], NULL))
            return NULL;
    }
    return r;
}

/* dict | items: a list of [key, value] pairs. */
static duet__val_t *duet__items(duet__rs_t *rs, const duet__node_t *n, const duet__val_t *v)
{
    duet__val_t *r = duet__tmpl_new(rs, DUET__V_LIST);
    if (v->kind != DUET__V_DICT)
        return duet__tmpl_fail(rs, DUET_ERR_INVALID, n->line, "%s", "items of a non-mapping");
    for (size_t i = 0; r != NULL && i < v->n; i++) {
        duet__val_t *pair = duet__tmpl_new(rs, DUET__V_LIST);
        duet__val_t *key = duet__tmpl_str(rs, v->keys[i], strlen(v->keys[i]), false);
        if (pair == NULL || key == NULL || !duet__tmpl_push(rs, pair, key, NULL) ||
            !duet__tmpl_push(rs, pair, v->items[i], NULL) || !duet__tmpl_push(rs, r, pair, NULL))
            return NULL;
    }
    return r;
}

duet__val_t *duet__tmpl_method(duet__rs_t *rs, const duet__node_t *n, const duet__val_t *self,
                               const char *m)
{
    duet__val_t *argv[8], *s = (duet__val_t *)self;

    if (!duet__tmpl_eval_args(rs, n, argv))
        return NULL;
    if (self->kind == DUET__V_STR) {
        if (strcmp(m, "strip") == 0 || strcmp(m, "lstrip") == 0 || strcmp(m, "rstrip") == 0)
            return duet__strip(rs, s, m[0] != 'r', m[0] != 'l', DUET__ARG(0), n->line);
        if (strcmp(m, "lower") == 0 || strcmp(m, "upper") == 0)
            return duet__case(rs, s, m[0] == 'u');
        if (strcmp(m, "title") == 0 || strcmp(m, "capitalize") == 0)
            return duet__case(rs, s, m[0] == 't' ? 2 : 3);
        if (strcmp(m, "replace") == 0)
            return duet__replace(rs, s, DUET__ARG(0), DUET__ARG(1), n->line);
        if (strcmp(m, "startswith") == 0 || strcmp(m, "endswith") == 0) {
            duet__val_t *x = DUET__ARG(0);
            if (x->kind != DUET__V_STR)
                return duet__tmpl_fail(rs, DUET_ERR_INVALID, n->line, "%s needs a string", m);
            bool r =
                x->n <= s->n && memcmp(m[0] == 's' ? s->s : s->s + s->n - x->n, x->s, x->n) == 0;
            return duet__tmpl_int(rs, DUET__V_BOOL, r);
        }
        if (strcmp(m, "split") == 0) {
            duet__val_t *sep = DUET__ARG(0), *list = duet__tmpl_new(rs, DUET__V_LIST);
            if (list == NULL || sep->kind != DUET__V_STR || sep->n == 0)
                return list ? duet__tmpl_fail(rs, DUET_ERR_UNSUPPORTED, n->line, "%s",
                                              "split needs a separator")
                            : NULL;
            size_t start = 0;
            for (size_t i = 0; i + sep->n <= s->n;) {
                if (memcmp(s->s + i, sep->s, sep->n) == 0) {
                    if (!duet__tmpl_push(rs, list,
                                         duet__tmpl_str(rs, s->s + start, i - start, false), NULL))
                        return NULL;
                    i += sep->n;
                    start = i;
                } else {
                    i++;
                }
            }
            if (!duet__tmpl_push(rs, list, duet__tmpl_str(rs, s->s + start, s->n - start, false),
                                 NULL))
                return NULL;
            return list;
        }
    } else if (self->kind == DUET__V_DICT) {
        if (strcmp(m, "get") == 0) {
            duet__val_t *k = DUET__ARG(0), *r;
            if (k->kind != DUET__V_STR)
                return duet__tmpl_fail(rs, DUET_ERR_INVALID, n->line, "%s",
                                       "get needs a string key");
            r = duet__tmpl_dict_get(self, k->s, k->n);
            return r ? r : n->nargs > 1 ? argv[1] : duet__tmpl_new(rs, DUET__V_NONE);
        }
        if (strcmp(m, "items") == 0 || strcmp(m, "keys") == 0 || strcmp(m, "values") == 0) {
            duet__val_t *list = duet__tmpl_new(rs, DUET__V_LIST);
            for (size_t i = 0; list && i < self->n; i++) {
                duet__val_t *key = duet__tmpl_str(rs, self->keys[i], strlen(self->keys[i]), false);
                duet__val_t *item = m[0] == 'k' ? key : m[0] == 'v' ? self->items[i] : NULL;
                if (m[0] == 'i' && (item = duet__tmpl_new(rs, DUET__V_LIST)) != NULL &&
                    (!duet__tmpl_push(rs, item, key, NULL) ||
                     !duet__tmpl_push(rs, item, self->items[i], NULL)))
                    return NULL;
                if (item == NULL || !duet__tmpl_push(rs, list, item, NULL))
                    return NULL;
            }
            return list;
        }
    }
    return duet__tmpl_fail(rs, DUET_ERR_UNSUPPORTED, n->line, "unsupported method '%s'", m);
}
