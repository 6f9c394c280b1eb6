/* Internals of the chat-template interpreter shared by chat_template.c (lexer,
 * parser) and chat_template_eval.c (values, evaluation).  Every node and
 * value lives in an arena freed as a whole. */
#ifndef DUET_ROUTER_CHAT_CHAT_TEMPLATE_INTERNAL_H
#define DUET_ROUTER_CHAT_CHAT_TEMPLATE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "router/chat/chat_template.h"

typedef struct duet__arena_chunk duet__arena_chunk_t;
typedef struct {
    duet__arena_chunk_t *head;
    size_t used, cap;
    size_t total; /* bytes handed out, for the runaway limit */
} duet__arena_t;

void *duet__tmpl_arena_alloc(duet__arena_t *a, size_t n); /* zeroed; NULL when out of memory */
char *duet__tmpl_arena_strndup(duet__arena_t *a, const char *s, size_t n);
void duet__tmpl_arena_free(duet__arena_t *a);

typedef enum {
    /* statements */
    DUET__N_TEXT,
    DUET__N_OUTPUT, /* a = expr */
    DUET__N_IF,     /* a = cond, body, orelse */
    DUET__N_FOR,    /* s = target (s2 = second target), a = iterable, b = filter, body, orelse */
    DUET__N_SET,    /* s = name (s2 = attribute for ns.attr), a = value */
    /* expressions */
    DUET__E_STR,  /* s, slen */
    DUET__E_INT,  /* i */
    DUET__E_BOOL, /* i */
    DUET__E_NONE,
    DUET__E_NAME,   /* s */
    DUET__E_ATTR,   /* a.s */
    DUET__E_INDEX,  /* a[b] */
    DUET__E_SLICE,  /* a[b:c:d], b/c/d may be NULL */
    DUET__E_CALL,   /* a(args), kw names in kw[] (NULL for positional) */
    DUET__E_FILTER, /* a | s(args) */
    DUET__E_TEST,   /* a is [not (i=1)] s */
    DUET__E_NOT,    /* not a */
    DUET__E_NEG,    /* -a */
    DUET__E_BINOP,  /* a op b */
    DUET__E_AND,
    DUET__E_OR,
    DUET__E_COND, /* b if a else c */
    DUET__E_LIST, /* args */
    DUET__E_DICT, /* args: key, value, key, value... */
} duet__node_kind_t;

typedef enum {
    DUET__OP_ADD,
    DUET__OP_SUB,
    DUET__OP_MUL,
    DUET__OP_DIV,
    DUET__OP_FLOORDIV,
    DUET__OP_MOD,
    DUET__OP_CONCAT,
    DUET__OP_EQ,
    DUET__OP_NE,
    DUET__OP_LT,
    DUET__OP_GT,
    DUET__OP_LE,
    DUET__OP_GE,
    DUET__OP_IN,
    DUET__OP_NOT_IN,
} duet__op_t;

typedef struct duet__node duet__node_t;
struct duet__node {
    duet__node_kind_t kind;
    int line;
    const char *s, *s2;
    size_t slen;
    int64_t i;
    duet__op_t op;
    duet__node_t *a, *b, *c, *d;
    duet__node_t **args;
    const char **kw;
    size_t nargs;
    duet__node_t *body, *orelse; /* statement lists */
    duet__node_t *next;          /* next statement */
};

struct duet_router_chat_tmpl {
    duet__arena_t arena;
    duet__node_t *root;
};

/* ---- evaluation (chat_template_eval.c, chat_template_builtins.c) ---- */

#include <stdbool.h>

#include "router/base/buf.h"
#include "common/status.h"

typedef enum {
    DUET__V_UNDEF,
    DUET__V_NONE,
    DUET__V_BOOL,
    DUET__V_INT,
    DUET__V_STR,
    DUET__V_LIST,
    DUET__V_DICT,
    DUET__V_FUNC,
} duet__vkind_t;

typedef struct duet__val duet__val_t;
struct duet__val {
    duet__vkind_t kind;
    int64_t i;           /* bool, int; function id */
    const char *s;       /* string (not NUL-terminated necessarily) */
    size_t n;            /* string length; list/dict length */
    duet__val_t **items; /* list items, dict values */
    const char **keys;   /* dict keys (NUL-terminated) */
    size_t cap;
    const duet__val_t *self; /* bound method receiver */
};

enum { DUET__F_RAISE = 1, DUET__F_NAMESPACE, DUET__F_METHOD };

typedef struct duet__frame duet__frame_t;
struct duet__frame {
    duet__frame_t *up;
    const char *names[32];
    duet__val_t *vals[32];
    size_t n;
};

typedef struct {
    duet__arena_t arena;
    duet_router_buf_t out;
    duet__frame_t *env;
    duet_status_t err;
    size_t steps;
    int depth; /* duet__tmpl_eval's recursion */
} duet__rs_t;

extern duet__val_t duet__tmpl_undef;

/* Record the first error (message: fmt with one string argument) and
 * return NULL. */
duet__val_t *duet__tmpl_fail(duet__rs_t *rs, duet_status_t st, int line, const char *fmt,
                             const char *arg);
duet__val_t *duet__tmpl_new(duet__rs_t *rs, duet__vkind_t kind);
duet__val_t *duet__tmpl_int(duet__rs_t *rs, duet__vkind_t kind, int64_t i);
duet__val_t *duet__tmpl_str(duet__rs_t *rs, const char *s, size_t n, bool copy);
bool duet__tmpl_push(duet__rs_t *rs, duet__val_t *coll, duet__val_t *item, const char *key);
duet__val_t *duet__tmpl_dict_get(const duet__val_t *d, const char *key, size_t klen);
bool duet__tmpl_dict_set(duet__rs_t *rs, duet__val_t *d, const char *key, duet__val_t *v);
bool duet__tmpl_truthy(const duet__val_t *v);
bool duet__tmpl_equal(const duet__val_t *a, const duet__val_t *b);
void duet__tmpl_repr(duet_router_buf_t *b, const duet__val_t *v, bool quote);
duet__val_t *duet__tmpl_to_str(duet__rs_t *rs, duet__val_t *v);
duet__val_t *duet__tmpl_eval(duet__rs_t *rs, const duet__node_t *n);
bool duet__tmpl_eval_args(duet__rs_t *rs, const duet__node_t *n, duet__val_t **argv);

/* builtins: `v | name(args)`, `v is [not] name`, `self.name(args)` */
duet__val_t *duet__tmpl_filter(duet__rs_t *rs, const duet__node_t *n, duet__val_t *v);
duet__val_t *duet__tmpl_test(duet__rs_t *rs, const duet__node_t *n);
duet__val_t *duet__tmpl_method(duet__rs_t *rs, const duet__node_t *n, const duet__val_t *self,
                               const char *m);

#endif
