/* Chat-template evaluation: values (undefined, none, bool, int, string,
 * list, dict, function), scopes, expressions, filters, tests, methods and
 * statements.  Every value of one render lives in that render's arena. */
#include <ctype.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/alloc.h"
#include "router/base/buf.h"
#include "router/chat/chat_template_internal.h"

#define DUET__MAX_OUTPUT (16u << 20)
#define DUET__MAX_STEPS  10000000u
#define DUET__MAX_DEPTH  256

/* never written: every undefined value is this one */
duet__val_t duet__tmpl_undef = {.kind = DUET__V_UNDEF};

duet__val_t *duet__tmpl_fail(duet__rs_t *rs, duet_status_t st, int line, const char *fmt,
                             const char *arg)
{
    if (rs->err == DUET_OK) {
        char msg[512];
        snprintf(msg, sizeof(msg), fmt, arg);
        rs->err = st == DUET_ERR_INVALID && line == 0
                      ? duet_error(st, "%s", msg)
                      : duet_error(st, "chat template line %d: %s", line, msg);
    }
    return NULL;
}

duet__val_t *duet__tmpl_new(duet__rs_t *rs, duet__vkind_t kind)
{
    duet__val_t *v = duet__tmpl_arena_alloc(&rs->arena, sizeof(*v));
    if (v == NULL)
        return duet__tmpl_fail(rs, DUET_ERR_NO_MEMORY, 0, "%s", "out of memory");
    v->kind = kind;
    return v;
}

duet__val_t *duet__tmpl_int(duet__rs_t *rs, duet__vkind_t kind, int64_t i)
{
    duet__val_t *v = duet__tmpl_new(rs, kind);
    if (v)
        v->i = i;
    return v;
}

duet__val_t *duet__tmpl_str(duet__rs_t *rs, const char *s, size_t n, bool copy)
{
    duet__val_t *v = duet__tmpl_new(rs, DUET__V_STR);
    if (v == NULL)
        return NULL;
    v->s = copy ? duet__tmpl_arena_strndup(&rs->arena, s, n) : s;
    v->n = n;
    if (v->s == NULL)
        return duet__tmpl_fail(rs, DUET_ERR_NO_MEMORY, 0, "%s", "out of memory");
    return v;
}

bool duet__tmpl_push(duet__rs_t *rs, duet__val_t *coll, duet__val_t *item, const char *key)
{
    if (coll->n == coll->cap) {
        size_t cap = coll->cap ? coll->cap * 2 : 8;
        duet__val_t **items = duet__tmpl_arena_alloc(&rs->arena, cap * sizeof(*items));
        const char **keys = duet__tmpl_arena_alloc(&rs->arena, cap * sizeof(*keys));
        if (items == NULL || keys == NULL)
            return duet__tmpl_fail(rs, DUET_ERR_NO_MEMORY, 0, "%s", "out of memory"), false;
        if (coll->n) {
            memcpy(items, coll->items, coll->n * sizeof(*items));
            memcpy(keys, coll->keys, coll->n * sizeof(*keys));
        }
        coll->items = items;
        coll->keys = keys;
        coll->cap = cap;
    }
    coll->keys[coll->n] = key;
    coll->items[coll->n++] = item;
    return true;
}

duet__val_t *duet__tmpl_dict_get(const duet__val_t *d, const char *key, size_t klen)
{
    for (size_t i = 0; i < d->n; i++)
        if (strlen(d->keys[i]) == klen && memcmp(d->keys[i], key, klen) == 0)
            return d->items[i];
    return NULL;
}

bool duet__tmpl_dict_set(duet__rs_t *rs, duet__val_t *d, const char *key, duet__val_t *v)
{
    for (size_t i = 0; i < d->n; i++) {
        if (strcmp(d->keys[i], key) == 0) {
            d->items[i] = v;
            return true;
        }
    }
    return duet__tmpl_push(rs, d, v, key);
}

bool duet__tmpl_truthy(const duet__val_t *v)
{
    switch (v->kind) {
    case DUET__V_BOOL:
    case DUET__V_INT:
        return v->i != 0;
    case DUET__V_STR:
    case DUET__V_LIST:
    case DUET__V_DICT:
        return v->n != 0;
    case DUET__V_FUNC:
        return true;
    default:
        return false;
    }
}

bool duet__tmpl_equal(const duet__val_t *a, const duet__val_t *b)
{
    bool an = a->kind == DUET__V_INT || a->kind == DUET__V_BOOL;
    bool bn = b->kind == DUET__V_INT || b->kind == DUET__V_BOOL;
    if (an && bn)
        return a->i == b->i;
    if (a->kind != b->kind)
        return false;
    switch (a->kind) {
    case DUET__V_STR:
        return a->n == b->n && memcmp(a->s, b->s, a->n) == 0;
    case DUET__V_LIST:
        if (a->n != b->n)
            return false;
        for (size_t i = 0; i < a->n; i++)
            if (!duet__tmpl_equal(a->items[i], b->items[i]))
                return false;
        return true;
    case DUET__V_DICT:
        return a == b;
    default:
        return true; /* undefined, none */
    }
}

void duet__tmpl_repr(duet_router_buf_t *b, const duet__val_t *v, bool quote)
{
    switch (v->kind) {
    case DUET__V_UNDEF:
        break;
    case DUET__V_NONE:
        duet_router_buf_puts(b, "None");
        break;
    case DUET__V_BOOL:
        duet_router_buf_puts(b, v->i ? "True" : "False");
        break;
    case DUET__V_INT:
        duet_router_buf_printf(b, "%" PRId64, v->i);
        break;
    case DUET__V_STR:
        if (quote)
            duet_router_buf_puts(b, "'");
        duet_router_buf_append(b, v->s, v->n);
        if (quote)
            duet_router_buf_puts(b, "'");
        break;
    case DUET__V_LIST:
        duet_router_buf_puts(b, "[");
        for (size_t i = 0; i < v->n; i++) {
            if (i)
                duet_router_buf_puts(b, ", ");
            duet__tmpl_repr(b, v->items[i], true);
        }
        duet_router_buf_puts(b, "]");
        break;
    case DUET__V_DICT:
        duet_router_buf_puts(b, "{");
        for (size_t i = 0; i < v->n; i++) {
            duet_router_buf_printf(b, "%s'%s': ", i ? ", " : "", v->keys[i]);
            duet__tmpl_repr(b, v->items[i], true);
        }
        duet_router_buf_puts(b, "}");
        break;
    case DUET__V_FUNC:
        duet_router_buf_puts(b, "<function>");
        break;
    }
}

/* The value as a string (Jinja's str()). */
duet__val_t *duet__tmpl_to_str(duet__rs_t *rs, duet__val_t *v)
{
    duet_router_buf_t b;
    duet__val_t *r;

    if (v->kind == DUET__V_STR)
        return v;
    duet_router_buf_init(&b);
    duet__tmpl_repr(&b, v, false);
    r = b.oom ? duet__tmpl_fail(rs, DUET_ERR_NO_MEMORY, 0, "%s", "out of memory")
              : duet__tmpl_str(rs, b.data ? b.data : "", b.len, true);
    duet_router_buf_cleanup(&b);
    return r;
}

static duet__val_t *duet__lookup(duet__rs_t *rs, const char *name)
{
    for (duet__frame_t *f = rs->env; f; f = f->up)
        for (size_t i = f->n; i-- > 0;)
            if (strcmp(f->names[i], name) == 0)
                return f->vals[i];
    return &duet__tmpl_undef;
}

static bool duet__rs_bind(duet__rs_t *rs, const char *name, duet__val_t *v)
{
    duet__frame_t *f = rs->env;
    for (size_t i = 0; i < f->n; i++) {
        if (strcmp(f->names[i], name) == 0) {
            f->vals[i] = v;
            return true;
        }
    }
    if (f->n == sizeof(f->names) / sizeof(f->names[0]))
        return duet__tmpl_fail(rs, DUET_ERR_UNSUPPORTED, 0, "%s", "too many variables in a scope"),
               false;
    f->names[f->n] = name;
    f->vals[f->n++] = v;
    return true;
}

/* Evaluated arguments of a call or filter (at most 8). */
bool duet__tmpl_eval_args(duet__rs_t *rs, const duet__node_t *n, duet__val_t **argv)
{
    if (n->nargs > 8)
        return duet__tmpl_fail(rs, DUET_ERR_UNSUPPORTED, n->line, "%s", "too many arguments"),
               false;
    for (size_t i = 0; i < n->nargs; i++)
        if ((argv[i] = duet__tmpl_eval(rs, n->args[i])) == NULL)
            return false;
    return true;
}

static duet__val_t *duet__call(duet__rs_t *rs, const duet__node_t *n)
{
    duet__val_t *f, *argv[8];

    if (n->a->kind == DUET__E_ATTR) {
        duet__val_t *self = duet__tmpl_eval(rs, n->a->a);
        if (self == NULL)
            return NULL;
        if (self->kind != DUET__V_DICT ||
            duet__tmpl_dict_get(self, n->a->s, strlen(n->a->s)) == NULL)
            return duet__tmpl_method(rs, n, self, n->a->s);
    }
    if ((f = duet__tmpl_eval(rs, n->a)) == NULL)
        return NULL;
    if (f->kind != DUET__V_FUNC)
        return duet__tmpl_fail(rs, DUET_ERR_INVALID, n->line, "%s", "calling a non-function");
    if (!duet__tmpl_eval_args(rs, n, argv))
        return NULL;
    if (f->i == DUET__F_RAISE) {
        duet__val_t *msg = n->nargs ? duet__tmpl_to_str(rs, argv[0]) : NULL;
        if (n->nargs && msg == NULL)
            return NULL;
        return duet__tmpl_fail(rs, DUET_ERR_INVALID, 0, "%s",
                               msg ? duet__tmpl_arena_strndup(&rs->arena, msg->s, msg->n)
                                   : "the chat template raised an error");
    }
    /* namespace(k=v, ...) */
    duet__val_t *d = duet__tmpl_new(rs, DUET__V_DICT);
    for (size_t i = 0; d && i < n->nargs; i++) {
        if (n->kw[i] == NULL)
            return duet__tmpl_fail(rs, DUET_ERR_UNSUPPORTED, n->line, "%s",
                                   "namespace() takes keyword arguments only");
        if (!duet__tmpl_dict_set(rs, d, n->kw[i], argv[i]))
            return NULL;
    }
    return d;
}

static duet__val_t *duet__index(duet__rs_t *rs, const duet__node_t *n, duet__val_t *obj,
                                duet__val_t *key)
{
    if (obj->kind == DUET__V_DICT) {
        duet__val_t *r;
        if (key->kind != DUET__V_STR)
            return &duet__tmpl_undef;
        r = duet__tmpl_dict_get(obj, key->s, key->n);
        return r ? r : &duet__tmpl_undef;
    }
    if ((obj->kind == DUET__V_LIST || obj->kind == DUET__V_STR) && key->kind == DUET__V_INT) {
        int64_t i = key->i < 0 ? key->i + (int64_t)obj->n : key->i;
        if (i < 0 || i >= (int64_t)obj->n)
            return &duet__tmpl_undef;
        return obj->kind == DUET__V_LIST ? obj->items[i] : duet__tmpl_str(rs, obj->s + i, 1, false);
    }
    if (obj->kind == DUET__V_UNDEF)
        return &duet__tmpl_undef;
    return duet__tmpl_fail(rs, DUET_ERR_INVALID, n->line, "%s", "cannot index this value");
}

/* Python's seq[lo:hi:step]; a string only with step 1. */
static duet__val_t *duet__slice(duet__rs_t *rs, const duet__node_t *n)
{
    duet__val_t *obj = duet__tmpl_eval(rs, n->a), *lo = NULL, *hi = NULL, *st = NULL, *r;
    int64_t len, a, b, step = 1;

    if (obj == NULL || (n->b && (lo = duet__tmpl_eval(rs, n->b)) == NULL) ||
        (n->c && (hi = duet__tmpl_eval(rs, n->c)) == NULL) ||
        (n->d && (st = duet__tmpl_eval(rs, n->d)) == NULL))
        return NULL;
    if (obj->kind != DUET__V_LIST && obj->kind != DUET__V_STR)
        return duet__tmpl_fail(rs, DUET_ERR_INVALID, n->line, "%s", "slicing a non-sequence");
    if (st && st->kind == DUET__V_INT)
        step = st->i;
    if (step == 0 || step == INT64_MIN)
        return duet__tmpl_fail(rs, DUET_ERR_INVALID, n->line, "%s", "bad slice step");
    if (step != 1 && obj->kind == DUET__V_STR)
        return duet__tmpl_fail(rs, DUET_ERR_UNSUPPORTED, n->line, "%s",
                               "slicing a string with a step");
    len = (int64_t)obj->n;
    /* Python's PySlice_AdjustIndices: bounds clamp to [0, len] going
     * forward, [-1, len - 1] going backward. */
    int64_t lo_min = step > 0 ? 0 : -1, hi_max = step > 0 ? len : len - 1;
    a = step > 0 ? 0 : len - 1;
    b = step > 0 ? len : -1;
    if (lo && lo->kind == DUET__V_INT)
        a = lo->i < 0 ? (lo->i < -len ? lo_min : lo->i + len) : lo->i > hi_max ? hi_max : lo->i;
    if (hi && hi->kind == DUET__V_INT)
        b = hi->i < 0 ? (hi->i < -len ? lo_min : hi->i + len) : hi->i > hi_max ? hi_max : hi->i;
    if (obj->kind == DUET__V_STR)
        return duet__tmpl_str(rs, obj->s + a, (size_t)(b > a ? b - a : 0), false);
    if ((r = duet__tmpl_new(rs, DUET__V_LIST)) == NULL)
        return NULL;
    for (int64_t i = a; step > 0 ? i < b : i > b; i += step) {
        if (!duet__tmpl_push(rs, r, obj->items[i], NULL))
            return NULL;
        if ((step > 0 && i > INT64_MAX - step) || (step < 0 && i < INT64_MIN - step))
            break;
    }
    return r;
}

/* a + b, a - b or a * b (n->op); out of int64 range is the template's
 * error, not wrap-around (found by fuzz/fuzz_chat_template). */
static duet__val_t *duet__arith(duet__rs_t *rs, const duet__node_t *n, int64_t a, int64_t b)
{
    int64_t r;
    bool over = n->op == DUET__OP_SUB   ? __builtin_sub_overflow(a, b, &r)
                : n->op == DUET__OP_MUL ? __builtin_mul_overflow(a, b, &r)
                                        : __builtin_add_overflow(a, b, &r);
    if (over)
        return duet__tmpl_fail(rs, DUET_ERR_INVALID, n->line, "%s", "integer overflow");
    return duet__tmpl_int(rs, DUET__V_INT, r);
}

static duet__val_t *duet__binary(duet__rs_t *rs, const duet__node_t *n)
{
    duet__val_t *a = duet__tmpl_eval(rs, n->a), *b, *r;
    if (a == NULL || (b = duet__tmpl_eval(rs, n->b)) == NULL)
        return NULL;
    bool ints = (a->kind == DUET__V_INT || a->kind == DUET__V_BOOL) &&
                (b->kind == DUET__V_INT || b->kind == DUET__V_BOOL);
    switch (n->op) {
    case DUET__OP_EQ:
        return duet__tmpl_int(rs, DUET__V_BOOL, duet__tmpl_equal(a, b));
    case DUET__OP_NE:
        return duet__tmpl_int(rs, DUET__V_BOOL, !duet__tmpl_equal(a, b));
    case DUET__OP_CONCAT:
        if ((a = duet__tmpl_to_str(rs, a)) == NULL || (b = duet__tmpl_to_str(rs, b)) == NULL)
            return NULL;
        ints = false; /* now two strings: 1 ~ 2 is "12" */
        /* fall through */
    case DUET__OP_ADD:
        if (ints)
            return duet__arith(rs, n, a->i, b->i);
        if (a->kind == DUET__V_STR && b->kind == DUET__V_STR) {
            char *s = duet__tmpl_arena_alloc(&rs->arena, a->n + b->n + 1);
            if (s == NULL)
                return duet__tmpl_fail(rs, DUET_ERR_NO_MEMORY, 0, "%s", "out of memory");
            memcpy(s, a->s, a->n);
            memcpy(s + a->n, b->s, b->n);
            return duet__tmpl_str(rs, s, a->n + b->n, false);
        }
        if (a->kind == DUET__V_LIST && b->kind == DUET__V_LIST) {
            if ((r = duet__tmpl_new(rs, DUET__V_LIST)) == NULL)
                return NULL;
            for (size_t i = 0; i < a->n + b->n; i++)
                if (!duet__tmpl_push(rs, r, i < a->n ? a->items[i] : b->items[i - a->n], NULL))
                    return NULL;
            return r;
        }
        return duet__tmpl_fail(rs, DUET_ERR_INVALID, n->line, "%s",
                               "'+' needs two numbers, strings or lists");
    case DUET__OP_IN:
    case DUET__OP_NOT_IN: {
        bool found = false;
        if (b->kind == DUET__V_STR && a->kind == DUET__V_STR) {
            for (size_t i = 0; !found && i + a->n <= b->n; i++)
                found = memcmp(b->s + i, a->s, a->n) == 0;
        } else if (b->kind == DUET__V_LIST) {
            for (size_t i = 0; !found && i < b->n; i++)
                found = duet__tmpl_equal(a, b->items[i]);
        } else if (b->kind == DUET__V_DICT && a->kind == DUET__V_STR) {
            found = duet__tmpl_dict_get(b, a->s, a->n) != NULL;
        } else if (b->kind != DUET__V_UNDEF) {
            return duet__tmpl_fail(rs, DUET_ERR_INVALID, n->line, "%s", "'in' needs a container");
        }
        return duet__tmpl_int(rs, DUET__V_BOOL, found == (n->op == DUET__OP_IN));
    }
    default:
        break;
    }
    if (a->kind == DUET__V_STR && b->kind == DUET__V_STR &&
        (n->op == DUET__OP_LT || n->op == DUET__OP_GT || n->op == DUET__OP_LE ||
         n->op == DUET__OP_GE)) {
        size_t k = a->n < b->n ? a->n : b->n;
        int c = memcmp(a->s, b->s, k);
        c = c ? c : (a->n > b->n) - (a->n < b->n);
        bool res = n->op == DUET__OP_LT   ? c < 0
                   : n->op == DUET__OP_GT ? c > 0
                   : n->op == DUET__OP_LE ? c <= 0
                                          : c >= 0;
        return duet__tmpl_int(rs, DUET__V_BOOL, res);
    }
    if (!ints)
        return duet__tmpl_fail(rs, DUET_ERR_INVALID, n->line, "%s", "arithmetic on non-numbers");
    switch (n->op) {
    case DUET__OP_SUB:
    case DUET__OP_MUL:
        return duet__arith(rs, n, a->i, b->i);
    case DUET__OP_LT:
        return duet__tmpl_int(rs, DUET__V_BOOL, a->i < b->i);
    case DUET__OP_GT:
        return duet__tmpl_int(rs, DUET__V_BOOL, a->i > b->i);
    case DUET__OP_LE:
        return duet__tmpl_int(rs, DUET__V_BOOL, a->i <= b->i);
    case DUET__OP_GE:
        return duet__tmpl_int(rs, DUET__V_BOOL, a->i >= b->i);
    default:
        break;
    }
    if (b->i == 0)
        return duet__tmpl_fail(rs, DUET_ERR_INVALID, n->line, "%s", "division by zero");
    if (a->i == INT64_MIN && b->i == -1) /* the quotient does not fit (x86 traps) */
        return duet__tmpl_fail(rs, DUET_ERR_INVALID, n->line, "%s", "integer overflow");
    int64_t q = a->i / b->i, m = a->i % b->i;
    if (m != 0 && ((m < 0) != (b->i < 0))) { /* Python floor semantics */
        q--;
        m += b->i;
    }
    return duet__tmpl_int(rs, DUET__V_INT, n->op == DUET__OP_MOD ? m : q);
}

static duet__val_t *duet__eval_node(duet__rs_t *rs, const duet__node_t *n)
{
    duet__val_t *v, *w;

    switch (n->kind) {
    case DUET__E_STR:
        return duet__tmpl_str(rs, n->s, n->slen, false);
    case DUET__E_INT:
        return duet__tmpl_int(rs, DUET__V_INT, n->i);
    case DUET__E_BOOL:
        return duet__tmpl_int(rs, DUET__V_BOOL, n->i);
    case DUET__E_NONE:
        return duet__tmpl_new(rs, DUET__V_NONE);
    case DUET__E_NAME:
        return duet__lookup(rs, n->s);
    case DUET__E_ATTR:
        if ((v = duet__tmpl_eval(rs, n->a)) == NULL)
            return NULL;
        if (v->kind == DUET__V_DICT && (w = duet__tmpl_dict_get(v, n->s, strlen(n->s))) != NULL)
            return w;
        return &duet__tmpl_undef;
    case DUET__E_INDEX:
        if ((v = duet__tmpl_eval(rs, n->a)) == NULL || (w = duet__tmpl_eval(rs, n->b)) == NULL)
            return NULL;
        return duet__index(rs, n, v, w);
    case DUET__E_SLICE:
        return duet__slice(rs, n);
    case DUET__E_CALL:
        return duet__call(rs, n);
    case DUET__E_FILTER:
        if ((v = duet__tmpl_eval(rs, n->a)) == NULL)
            return NULL;
        return duet__tmpl_filter(rs, n, v);
    case DUET__E_TEST:
        return duet__tmpl_test(rs, n);
    case DUET__E_NOT:
        if ((v = duet__tmpl_eval(rs, n->a)) == NULL)
            return NULL;
        return duet__tmpl_int(rs, DUET__V_BOOL, !duet__tmpl_truthy(v));
    case DUET__E_NEG:
        if ((v = duet__tmpl_eval(rs, n->a)) == NULL)
            return NULL;
        if (v->kind != DUET__V_INT)
            return duet__tmpl_fail(rs, DUET_ERR_INVALID, n->line, "%s", "negating a non-number");
        if (v->i == INT64_MIN)
            return duet__tmpl_fail(rs, DUET_ERR_INVALID, n->line, "%s", "integer overflow");
        return duet__tmpl_int(rs, DUET__V_INT, -v->i);
    case DUET__E_BINOP:
        return duet__binary(rs, n);
    case DUET__E_AND:
    case DUET__E_OR:
        if ((v = duet__tmpl_eval(rs, n->a)) == NULL)
            return NULL;
        if (duet__tmpl_truthy(v) == (n->kind == DUET__E_OR))
            return v;
        return duet__tmpl_eval(rs, n->b);
    case DUET__E_COND:
        if ((v = duet__tmpl_eval(rs, n->a)) == NULL)
            return NULL;
        if (duet__tmpl_truthy(v))
            return duet__tmpl_eval(rs, n->b);
        return n->c ? duet__tmpl_eval(rs, n->c) : &duet__tmpl_undef;
    case DUET__E_LIST:
    case DUET__E_DICT:
        if ((v = duet__tmpl_new(rs, n->kind == DUET__E_LIST ? DUET__V_LIST : DUET__V_DICT)) == NULL)
            return NULL;
        for (size_t i = 0; i < n->nargs; i += n->kind == DUET__E_LIST ? 1 : 2) {
            const char *key = NULL;
            if (n->kind == DUET__E_DICT) {
                duet__val_t *k = duet__tmpl_eval(rs, n->args[i]);
                if (k == NULL)
                    return NULL;
                if (k->kind != DUET__V_STR)
                    return duet__tmpl_fail(rs, DUET_ERR_UNSUPPORTED, n->line, "%s",
                                           "dict keys must be strings");
                key = duet__tmpl_arena_strndup(&rs->arena, k->s, k->n);
            }
            if ((w = duet__tmpl_eval(rs, n->args[i + (key != NULL)])) == NULL ||
                !duet__tmpl_push(rs, v, w, key))
                return NULL;
        }
        return v;
    default:
        return duet__tmpl_fail(rs, DUET_ERR_INTERNAL, n->line, "%s", "bad expression node");
    }
}

/* An operator chain parses into a tree as deep as it is long (1+1+...+1),
 * and evaluation recurses over it: bounded here (found by
 * fuzz/fuzz_chat_template). */
duet__val_t *duet__tmpl_eval(duet__rs_t *rs, const duet__node_t *n)
{
    duet__val_t *v;

    if (rs->err)
        return NULL;
    if (++rs->steps > DUET__MAX_STEPS)
        return duet__tmpl_fail(rs, DUET_ERR_TOO_LONG, n->line, "%s", "template runs too long");
    if (rs->depth >= DUET__MAX_DEPTH)
        return duet__tmpl_fail(rs, DUET_ERR_INVALID, n->line, "%s",
                               "expression nested more than 256 levels deep");
    rs->depth++;
    v = duet__eval_node(rs, n);
    rs->depth--;
    return v;
}

static duet_status_t duet__exec(duet__rs_t *rs, const duet__node_t *n);

static duet_status_t duet__exec_for(duet__rs_t *rs, const duet__node_t *n)
{
    duet__val_t *seq = duet__tmpl_eval(rs, n->a), *items;
    duet__frame_t frame;

    if (seq == NULL)
        return rs->err;
    if (seq->kind == DUET__V_UNDEF || seq->kind == DUET__V_NONE)
        return n->orelse ? duet__exec(rs, n->orelse) : DUET_OK;
    if (seq->kind == DUET__V_DICT) { /* iterating a dict yields its keys */
        if ((items = duet__tmpl_new(rs, DUET__V_LIST)) == NULL)
            return rs->err;
        for (size_t i = 0; i < seq->n; i++)
            if (!duet__tmpl_push(
                    rs, items, duet__tmpl_str(rs, seq->keys[i], strlen(seq->keys[i]), false), NULL))
                return rs->err;
        seq = items;
    }
    if (seq->kind != DUET__V_LIST)
        return duet__tmpl_fail(rs, DUET_ERR_INVALID, n->line, "%s", "for over a non-list"), rs->err;
    /* With a filter, loop.* counts the items that pass: select them first. */
    if ((items = duet__tmpl_new(rs, DUET__V_LIST)) == NULL)
        return rs->err;
    memset(&frame, 0, sizeof(frame));
    frame.up = rs->env;
    rs->env = &frame;
    for (size_t i = 0; i < seq->n; i++) {
        frame.n = 0;
        if (!duet__rs_bind(rs, n->s, seq->items[i]))
            break;
        duet__val_t *keep = n->b ? duet__tmpl_eval(rs, n->b) : NULL;
        if (rs->err)
            break;
        if ((!n->b || duet__tmpl_truthy(keep)) && !duet__tmpl_push(rs, items, seq->items[i], NULL))
            break;
    }
    for (size_t i = 0; i < items->n && !rs->err; i++) {
        duet__val_t *loop = duet__tmpl_new(rs, DUET__V_DICT), *item = items->items[i];
        int64_t len = (int64_t)items->n, k = (int64_t)i;
        frame.n = 0;
        if (loop == NULL ||
            !duet__tmpl_dict_set(rs, loop, "index0", duet__tmpl_int(rs, DUET__V_INT, k)) ||
            !duet__tmpl_dict_set(rs, loop, "index", duet__tmpl_int(rs, DUET__V_INT, k + 1)) ||
            !duet__tmpl_dict_set(rs, loop, "revindex", duet__tmpl_int(rs, DUET__V_INT, len - k)) ||
            !duet__tmpl_dict_set(rs, loop, "revindex0",
                                 duet__tmpl_int(rs, DUET__V_INT, len - k - 1)) ||
            !duet__tmpl_dict_set(rs, loop, "first", duet__tmpl_int(rs, DUET__V_BOOL, k == 0)) ||
            !duet__tmpl_dict_set(rs, loop, "last",
                                 duet__tmpl_int(rs, DUET__V_BOOL, k == len - 1)) ||
            !duet__tmpl_dict_set(rs, loop, "length", duet__tmpl_int(rs, DUET__V_INT, len)) ||
            !duet__rs_bind(rs, "loop", loop))
            break;
        if (n->s2) { /* for k, v in pairs */
            if (item->kind != DUET__V_LIST || item->n != 2) {
                duet__tmpl_fail(rs, DUET_ERR_INVALID, n->line, "%s", "cannot unpack a loop item");
                break;
            }
            if (!duet__rs_bind(rs, n->s, item->items[0]) ||
                !duet__rs_bind(rs, n->s2, item->items[1]))
                break;
        } else if (!duet__rs_bind(rs, n->s, item)) {
            break;
        }
        if (duet__exec(rs, n->body) != DUET_OK)
            break;
    }
    rs->env = frame.up;
    if (rs->err == DUET_OK && items->n == 0 && n->orelse)
        return duet__exec(rs, n->orelse);
    return rs->err;
}

static duet_status_t duet__exec(duet__rs_t *rs, const duet__node_t *n)
{
    for (; n && rs->err == DUET_OK; n = n->next) {
        duet__val_t *v;
        switch (n->kind) {
        case DUET__N_TEXT:
            duet_router_buf_append(&rs->out, n->s, n->slen);
            break;
        case DUET__N_OUTPUT:
            if ((v = duet__tmpl_eval(rs, n->a)) == NULL)
                break;
            if (v->kind == DUET__V_STR) {
                duet_router_buf_append(&rs->out, v->s, v->n);
            } else {
                duet__tmpl_repr(&rs->out, v, false);
            }
            break;
        case DUET__N_IF:
            if ((v = duet__tmpl_eval(rs, n->a)) == NULL)
                break;
            duet__exec(rs, duet__tmpl_truthy(v) ? n->body : n->orelse);
            break;
        case DUET__N_FOR:
            duet__exec_for(rs, n);
            break;
        case DUET__N_SET:
            if ((v = duet__tmpl_eval(rs, n->a)) == NULL)
                break;
            if (n->s2) {
                duet__val_t *ns = duet__lookup(rs, n->s);
                if (ns->kind != DUET__V_DICT)
                    duet__tmpl_fail(rs, DUET_ERR_INVALID, n->line, "%s",
                                    "set on an attribute of a non-namespace");
                else
                    duet__tmpl_dict_set(rs, ns, n->s2, v);
            } else {
                duet__rs_bind(rs, n->s, v);
            }
            break;
        default:
            duet__tmpl_fail(rs, DUET_ERR_INTERNAL, n->line, "%s", "bad statement node");
            break;
        }
        if (rs->out.oom)
            duet__tmpl_fail(rs, DUET_ERR_NO_MEMORY, 0, "%s", "out of memory");
        else if (rs->out.len > DUET__MAX_OUTPUT || rs->arena.total > 8 * (size_t)DUET__MAX_OUTPUT)
            duet__tmpl_fail(rs, DUET_ERR_TOO_LONG, n->line, "%s", "rendered prompt is too long");
    }
    return rs->err;
}

/* A JSON value as a template value (strings and keys point into the cJSON
 * tree, which outlives the render). */
static duet__val_t *duet__from_json(duet__rs_t *rs, const cJSON *j, int depth)
{
    duet__val_t *v;
    if (depth > 64)
        return duet__tmpl_fail(rs, DUET_ERR_UNSUPPORTED, 0, "%s", "context nested too deeply");
    if (cJSON_IsNull(j))
        return duet__tmpl_new(rs, DUET__V_NONE);
    if (cJSON_IsBool(j))
        return duet__tmpl_int(rs, DUET__V_BOOL, cJSON_IsTrue(j));
    if (cJSON_IsString(j))
        return duet__tmpl_str(rs, j->valuestring, strlen(j->valuestring), false);
    if (cJSON_IsNumber(j)) {
        double d = j->valuedouble;
        if (!(d >= -9e15 && d <= 9e15) || d != (double)(int64_t)d)
            return duet__tmpl_fail(rs, DUET_ERR_UNSUPPORTED, 0, "%s",
                                   "context numbers must be integers");
        return duet__tmpl_int(rs, DUET__V_INT, (int64_t)d);
    }
    if (!cJSON_IsArray(j) && !cJSON_IsObject(j))
        return duet__tmpl_fail(rs, DUET_ERR_INVALID, 0, "%s", "bad context value");
    if ((v = duet__tmpl_new(rs, cJSON_IsArray(j) ? DUET__V_LIST : DUET__V_DICT)) == NULL)
        return NULL;
    for (const cJSON *c = j->child; c != NULL; c = c->next) {
        duet__val_t *item = duet__from_json(rs, c, depth + 1);
        if (item == NULL)
            return NULL;
        if (v->kind == DUET__V_LIST ? !duet__tmpl_push(rs, v, item, NULL)
                                    : !duet__tmpl_dict_set(rs, v, c->string, item))
            return NULL;
    }
    return v;
}

duet_status_t duet_router_chat_tmpl_render(const duet_router_chat_tmpl_t *tmpl,
                                           const duet_router_chat_vars_t *vars, char **out_p,
                                           size_t *len_p)
{
    duet__rs_t rs;
    duet__frame_t globals;
    duet__val_t *msgs;
    duet_status_t st;

    memset(&rs, 0, sizeof(rs));
    memset(&globals, 0, sizeof(globals));
    rs.env = &globals;
    duet_router_buf_init(&rs.out);
    if ((msgs = duet__tmpl_new(&rs, DUET__V_LIST)) == NULL)
        goto out;
    for (size_t i = 0; i < vars->n_msgs; i++) {
        duet__val_t *m = duet__tmpl_new(&rs, DUET__V_DICT);
        const duet_router_chat_msg_t *cm = &vars->msgs[i];
        if (m == NULL ||
            !duet__tmpl_dict_set(&rs, m, "role",
                                 duet__tmpl_str(&rs, cm->role, strlen(cm->role), false)) ||
            !duet__tmpl_dict_set(&rs, m, "content",
                                 duet__tmpl_str(&rs, cm->content, strlen(cm->content), false)) ||
            !duet__tmpl_push(&rs, msgs, m, NULL))
            goto out;
    }
    duet__rs_bind(&rs, "messages", msgs);
    duet__rs_bind(&rs, "bos_token",
                  duet__tmpl_str(&rs, vars->bos_token, strlen(vars->bos_token), false));
    duet__rs_bind(&rs, "eos_token",
                  duet__tmpl_str(&rs, vars->eos_token, strlen(vars->eos_token), false));
    duet__rs_bind(&rs, "add_generation_prompt",
                  duet__tmpl_int(&rs, DUET__V_BOOL, vars->add_generation_prompt));
    duet__rs_bind(&rs, "raise_exception", duet__tmpl_int(&rs, DUET__V_FUNC, DUET__F_RAISE));
    duet__rs_bind(&rs, "namespace", duet__tmpl_int(&rs, DUET__V_FUNC, DUET__F_NAMESPACE));
    if (vars->context != NULL && !cJSON_IsObject(vars->context))
        duet__tmpl_fail(&rs, DUET_ERR_INVALID, 0, "%s", "context is not a JSON object");
    for (const cJSON *c = vars->context ? vars->context->child : NULL; c && !rs.err; c = c->next) {
        duet__val_t *v = duet__from_json(&rs, c, 0);
        if (v != NULL)
            duet__rs_bind(&rs, c->string, v);
    }
    if (rs.err == DUET_OK)
        duet__exec(&rs, tmpl->root);
out:
    st = rs.err;
    if (st == DUET_OK) {
        duet_router_buf_append(&rs.out, "", 0);
        size_t len = rs.out.len;
        char *s = duet_router_buf_steal(&rs.out, NULL);
        if (s == NULL) {
            st = duet_error(DUET_ERR_NO_MEMORY, "chat template: out of memory");
        } else {
            *out_p = s;
            if (len_p)
                *len_p = len;
        }
    }
    duet_router_buf_cleanup(&rs.out);
    duet__tmpl_arena_free(&rs.arena);
    return st;
}
