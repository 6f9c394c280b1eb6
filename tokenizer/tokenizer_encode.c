/* Encoding: added-token split, normalizer, pre-tokenizer, BPE.
 *
 * The BPE merge loop follows Hugging Face tokenizers' Word::merge_all: a
 * min-heap of candidate merges ordered by (rank, position) over a linked
 * list of symbols, so a whole SentencePiece prompt (one "word") costs
 * O(n log n). */
#include <string.h>

#include "common/alloc.h"
#include "tokenizer/tokenizer_internal.h"

#define DUET__TOK_MAX_TEXT (1 << 28)

typedef struct {
    int32_t id; /* -1: merged into its left neighbour */
    int32_t prev, next;
} duet__tok_sym_t;

typedef struct {
    int32_t rank, pos, id;
} duet__tok_cand_t;

typedef struct {
    const duet_tokenizer_t *tok;
    int32_t *ids;
    size_t n, cap;
    duet__tok_buf_t norm[2]; /* normalizer ping-pong */
    duet__tok_buf_t pre;     /* pre-tokenizer rewrite (prefix, Metaspace) */
    duet__tok_buf_t word;    /* a word with its added prefix / mapped text */
    duet__tok_sym_t *sym;
    size_t n_sym, sym_cap;
    duet__tok_cand_t *heap;
    size_t n_heap, heap_cap;
} duet__tok_enc_t;

static duet_status_t duet__tok_enc_push(duet__tok_enc_t *e, int32_t id)
{
    if (e->n == e->cap) {
        size_t cap = e->cap ? e->cap * 2 : 256;
        int32_t *p = duet_realloc(e->ids, cap * sizeof(int32_t));
        if (p == NULL)
            return duet_error(DUET_ERR_NO_MEMORY, "tokenizer: no memory for %zu ids", cap);
        e->ids = p;
        e->cap = cap;
    }
    e->ids[e->n++] = id;
    return DUET_OK;
}

/* ---- BPE ---- */

static duet_status_t duet__tok_sym_push(duet__tok_enc_t *e, int32_t id)
{
    if (e->n_sym == e->sym_cap) {
        size_t cap = e->sym_cap ? e->sym_cap * 2 : 64;
        duet__tok_sym_t *p = duet_realloc(e->sym, cap * sizeof(*p));
        if (p == NULL)
            return duet_error(DUET_ERR_NO_MEMORY, "tokenizer: no memory for %zu symbols", cap);
        e->sym = p;
        e->sym_cap = cap;
    }
    duet__tok_sym_t *s = &e->sym[e->n_sym];
    s->id = id;
    s->prev = (int32_t)e->n_sym - 1;
    s->next = -1;
    if (e->n_sym > 0)
        e->sym[e->n_sym - 1].next = (int32_t)e->n_sym;
    e->n_sym++;
    return DUET_OK;
}

static bool duet__tok_cand_less(const duet__tok_cand_t *a, const duet__tok_cand_t *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static duet_status_t duet__tok_heap_push(duet__tok_enc_t *e, int32_t rank, int32_t pos, int32_t id)
{
    if (e->n_heap == e->heap_cap) {
        size_t cap = e->heap_cap ? e->heap_cap * 2 : 64;
        duet__tok_cand_t *p = duet_realloc(e->heap, cap * sizeof(*p));
        if (p == NULL)
            return duet_error(DUET_ERR_NO_MEMORY, "tokenizer: no memory for the merge queue");
        e->heap = p;
        e->heap_cap = cap;
    }
    duet__tok_cand_t c = {rank, pos, id};
    size_t i = e->n_heap++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!duet__tok_cand_less(&c, &e->heap[parent]))
            break;
        e->heap[i] = e->heap[parent];
        i = parent;
    }
    e->heap[i] = c;
    return DUET_OK;
}

static duet__tok_cand_t duet__tok_heap_pop(duet__tok_enc_t *e)
{
    duet__tok_cand_t top = e->heap[0], last = e->heap[--e->n_heap];
    size_t i = 0, n = e->n_heap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && duet__tok_cand_less(&e->heap[c + 1], &e->heap[c]))
            c++;
        if (!duet__tok_cand_less(&e->heap[c], &last))
            break;
        e->heap[i] = e->heap[c];
        i = c;
    }
    if (n > 0)
        e->heap[i] = last;
    return top;
}

static duet_status_t duet__tok_try_pair(duet__tok_enc_t *e, int32_t pos)
{
    int32_t rank, id, next = e->sym[pos].next;
    if (next < 0 || !duet__tok_merge_find(e->tok, e->sym[pos].id, e->sym[next].id, &rank, &id))
        return DUET_OK;
    return duet__tok_heap_push(e, rank, pos, id);
}

/* Merge the symbols e->sym[0..n_sym) and append the resulting ids. */
static duet_status_t duet__tok_bpe_merge(duet__tok_enc_t *e)
{
    duet_status_t st;
    e->n_heap = 0;
    for (size_t i = 0; i + 1 < e->n_sym; i++) {
        if ((st = duet__tok_try_pair(e, (int32_t)i)) != DUET_OK)
            return st;
    }
    while (e->n_heap > 0) {
        duet__tok_cand_t c = duet__tok_heap_pop(e);
        duet__tok_sym_t *s = &e->sym[c.pos];
        int32_t rank, id;
        if (s->id < 0 || s->next < 0)
            continue;
        duet__tok_sym_t *r = &e->sym[s->next];
        if (!duet__tok_merge_find(e->tok, s->id, r->id, &rank, &id) || id != c.id)
            continue;
        s->id = c.id;
        r->id = -1;
        s->next = r->next;
        if (s->next >= 0)
            e->sym[s->next].prev = c.pos;
        if ((s->prev >= 0 && (st = duet__tok_try_pair(e, s->prev)) != DUET_OK) ||
            (st = duet__tok_try_pair(e, c.pos)) != DUET_OK)
            return st;
    }
    for (int32_t i = e->n_sym > 0 ? 0 : -1; i >= 0; i = e->sym[i].next) {
        if ((st = duet__tok_enc_push(e, e->sym[i].id)) != DUET_OK)
            return st;
    }
    return DUET_OK;
}

/* One character (its text in the model alphabet) that is not in the vocab:
 * byte fallback, else <unk> (fused when fuse_unk), else dropped. */
static duet_status_t duet__tok_unknown_char(duet__tok_enc_t *e, const char *c, size_t n,
                                            bool *pending_unk)
{
    const duet_tokenizer_t *tok = e->tok;
    duet_status_t st;
    if (tok->byte_fallback) {
        bool all = true;
        for (size_t i = 0; i < n; i++)
            all = all && tok->byte_tok[(unsigned char)c[i]] >= 0;
        if (all) {
            for (size_t i = 0; i < n; i++) {
                if ((st = duet__tok_sym_push(e, tok->byte_tok[(unsigned char)c[i]])) != DUET_OK)
                    return st;
            }
            *pending_unk = false;
            return DUET_OK;
        }
    }
    if (tok->unk_id < 0)
        return DUET_OK;
    if (*pending_unk && tok->fuse_unk)
        return DUET_OK;
    *pending_unk = true;
    return duet__tok_sym_push(e, tok->unk_id);
}

/* BPE over one pre-token w[0..n) (raw bytes; mapped to the GPT-2 alphabet
 * first for byte-level models). */
static duet_status_t duet__tok_bpe_word(duet__tok_enc_t *e, const char *w, size_t n)
{
    const duet_tokenizer_t *tok = e->tok;
    bool pending_unk = false;
    duet_status_t st;

    if (n == 0)
        return DUET_OK;
    e->n_sym = 0;
    if (tok->byte_level) {
        if (tok->ignore_merges) {
            e->word.len = 0;
            for (size_t i = 0; i < n; i++) {
                unsigned char b = (unsigned char)w[i];
                if ((st = duet__tok_buf_put(&e->word, tok->byte_utf8[b], tok->byte_utf8_len[b])))
                    return st;
            }
            int32_t id = duet__tok_vocab_find(tok, e->word.data, e->word.len);
            if (id >= 0)
                return duet__tok_enc_push(e, id);
        }
        for (size_t i = 0; i < n; i++) {
            unsigned char b = (unsigned char)w[i];
            if (tok->byte_char[b] >= 0) {
                pending_unk = false;
                st = duet__tok_sym_push(e, tok->byte_char[b]);
            } else {
                st = duet__tok_unknown_char(e, tok->byte_utf8[b], tok->byte_utf8_len[b],
                                            &pending_unk);
            }
            if (st != DUET_OK)
                return st;
        }
    } else {
        if (tok->ignore_merges) {
            int32_t id = duet__tok_vocab_find(tok, w, n);
            if (id >= 0)
                return duet__tok_enc_push(e, id);
        }
        for (size_t i = 0; i < n;) {
            uint32_t cp;
            size_t k = duet__tok_utf8_next(w, n, i, &cp);
            int32_t id = duet__tok_vocab_find(tok, w + i, k);
            if (id >= 0) {
                pending_unk = false;
                st = duet__tok_sym_push(e, id);
            } else {
                st = duet__tok_unknown_char(e, w + i, k, &pending_unk);
            }
            if (st != DUET_OK)
                return st;
            i += k;
        }
    }
    return duet__tok_bpe_merge(e);
}

/* ---- pre-tokenizer ---- */

static duet_status_t duet__tok_word(duet__tok_enc_t *e, const char *w, size_t n)
{
    duet_status_t st;
    if (n > 0 && e->tok->bl_prefix_per_word && w[0] != ' ') {
        duet__tok_buf_t tmp = {0};
        if ((st = duet__tok_buf_put(&tmp, " ", 1)) == DUET_OK &&
            (st = duet__tok_buf_put(&tmp, w, n)) == DUET_OK)
            st = duet__tok_bpe_word(e, tmp.data, tmp.len);
        duet__tok_buf_free(&tmp);
        return st;
    }
    return duet__tok_bpe_word(e, w, n);
}

static duet_status_t duet__tok_metaspace(duet__tok_enc_t *e, const char *s, size_t n, bool at_start)
{
    const duet_tokenizer_t *tok = e->tok;
    const char *r = tok->ms_repl;
    size_t rl = strlen(r);
    duet__tok_buf_t *b = &e->pre;
    duet_status_t st;

    b->len = 0;
    for (size_t i = 0; i < n; i++) {
        st = s[i] == ' ' ? duet__tok_buf_put(b, r, rl) : duet__tok_buf_put(b, s + i, 1);
        if (st != DUET_OK)
            return st;
    }
    bool starts = b->len >= rl && memcmp(b->data, r, rl) == 0;
    if (!starts && (tok->ms_prepend == DUET__TOK_PREPEND_ALWAYS ||
                    (tok->ms_prepend == DUET__TOK_PREPEND_FIRST && at_start))) {
        if ((st = duet__tok_buf_reserve(b, rl)) != DUET_OK)
            return st;
        memmove(b->data + rl, b->data, b->len + 1);
        memcpy(b->data, r, rl);
        b->len += rl;
    }
    /* the word text lives in e->pre while BPE runs on it: nothing below
     * writes to e->pre */
    const char *t = b->data;
    size_t len = b->len, start = 0;
    if (tok->ms_split) {
        for (size_t i = 1; i + rl <= len; i++) {
            if (memcmp(t + i, r, rl) == 0) {
                if ((st = duet__tok_bpe_word(e, t + start, i - start)) != DUET_OK)
                    return st;
                start = i;
                i += rl - 1;
            }
        }
    }
    return duet__tok_bpe_word(e, t + start, len - start);
}

static duet_status_t duet__tok_pretokenize(duet__tok_enc_t *e, const char *s, size_t n,
                                           bool at_start)
{
    const duet_tokenizer_t *tok = e->tok;
    duet_status_t st;

    if (n == 0)
        return DUET_OK;
    if (tok->metaspace)
        return duet__tok_metaspace(e, s, n, at_start);
    if (tok->byte_level && tok->bl_prefix_before_split && s[0] != ' ') {
        e->pre.len = 0;
        if ((st = duet__tok_buf_put(&e->pre, " ", 1)) != DUET_OK ||
            (st = duet__tok_buf_put(&e->pre, s, n)) != DUET_OK)
            return st;
        s = e->pre.data;
        n = e->pre.len;
    }
    if (tok->split == DUET__TOK_SPLIT_NONE)
        return duet__tok_word(e, s, n);
    for (size_t pos = 0; pos < n;) {
        size_t end = duet__tok_split_next(tok->split, s, n, pos);
        if ((st = duet__tok_word(e, s + pos, end - pos)) != DUET_OK)
            return st;
        pos = end;
    }
    return DUET_OK;
}

/* ---- added tokens ---- */

static bool duet__tok_is_word_char(uint32_t cp)
{
    return duet__tok_cls(cp) != DUET__TOK_CLS_OTHER;
}

/* Start of the character that ends at pos (pos > 0), its code point in *cp. */
static size_t duet__tok_char_before(const char *s, size_t n, size_t pos, uint32_t *cp)
{
    size_t q = pos - 1;
    while (q > 0 && pos - q < 4 && ((unsigned char)s[q] & 0xC0) == 0x80)
        q--;
    if (q + duet__tok_utf8_next(s, n, q, cp) != pos) { /* not one character: a lone byte */
        q = pos - 1;
        duet__tok_utf8_next(s, n, q, cp);
    }
    return q;
}

/* Leftmost-longest added token in s[from..n) of the given pass; returns its
 * index or -1, with the matched span (after lstrip / rstrip) in *ms, *me. */
static int duet__tok_find_added(const duet_tokenizer_t *tok, const char *s, size_t n, size_t from,
                                bool normalized, size_t *ms, size_t *me)
{
    for (size_t p = from; p < n; p++) {
        unsigned char c = (unsigned char)s[p];
        for (int32_t k = tok->added_first[c]; k < tok->added_first[c + 1]; k++) {
            const duet__tok_added_t *a = &tok->added[k];
            if (a->normalized != normalized || a->len > n - p ||
                memcmp(s + p, tok->arena.data + a->off, a->len) != 0)
                continue;
            size_t st = p, en = p + a->len;
            if (a->single_word) {
                uint32_t cp;
                bool before = false, after = false;
                if (st > 0) {
                    duet__tok_char_before(s, n, st, &cp);
                    before = duet__tok_is_word_char(cp);
                }
                if (en < n) {
                    duet__tok_utf8_next(s, n, en, &cp);
                    after = duet__tok_is_word_char(cp);
                }
                if (before || after)
                    continue;
            }
            while (a->lstrip && st > from) {
                uint32_t cp;
                size_t q = duet__tok_char_before(s, n, st, &cp);
                if (q < from || !duet__tok_is_space(cp))
                    break;
                st = q;
            }
            while (a->rstrip && en < n) {
                uint32_t cp;
                size_t cl = duet__tok_utf8_next(s, n, en, &cp);
                if (!duet__tok_is_space(cp))
                    break;
                en += cl;
            }
            *ms = st;
            *me = en;
            return k;
        }
    }
    return -1;
}

static duet_status_t duet__tok_normalized_part(duet__tok_enc_t *e, const char *s, size_t n,
                                               bool at_start)
{
    const duet_tokenizer_t *tok = e->tok;
    duet_status_t st;
    size_t pos = 0, ms, me;
    int k;

    if (!tok->any_normalized_added)
        return duet__tok_pretokenize(e, s, n, at_start);
    while ((k = duet__tok_find_added(tok, s, n, pos, true, &ms, &me)) >= 0) {
        if ((st = duet__tok_pretokenize(e, s + pos, ms - pos, at_start && pos == 0)) != DUET_OK ||
            (st = duet__tok_enc_push(e, tok->added[k].id)) != DUET_OK)
            return st;
        pos = me;
    }
    return duet__tok_pretokenize(e, s + pos, n - pos, at_start && pos == 0);
}

/* Normalize a raw segment and encode it. */
static duet_status_t duet__tok_segment(duet__tok_enc_t *e, const char *s, size_t n, bool at_start)
{
    const duet_tokenizer_t *tok = e->tok;
    duet_status_t st;
    int cur = 0;

    if (n == 0)
        return DUET_OK;
    if (tok->n_norm == 0)
        return duet__tok_normalized_part(e, s, n, at_start);
    e->norm[0].len = 0;
    if ((st = duet__tok_buf_put(&e->norm[0], s, n)) != DUET_OK)
        return st;
    for (int i = 0; i < tok->n_norm; i++) {
        const duet__tok_norm_t *nm = &tok->norm[i];
        duet__tok_buf_t *in = &e->norm[cur], *out = &e->norm[!cur];
        out->len = 0;
        if (nm->kind == DUET__TOK_NORM_PREPEND) {
            if (in->len == 0)
                continue;
            st = duet__tok_buf_put(out, nm->a, strlen(nm->a));
            if (st == DUET_OK)
                st = duet__tok_buf_put(out, in->data, in->len);
        } else if (nm->kind == DUET__TOK_NORM_REPLACE) {
            size_t al = strlen(nm->a), bl = strlen(nm->b), p = 0;
            st = DUET_OK;
            while (st == DUET_OK && p < in->len) {
                if (in->len - p >= al && memcmp(in->data + p, nm->a, al) == 0) {
                    st = duet__tok_buf_put(out, nm->b, bl);
                    p += al;
                } else {
                    st = duet__tok_buf_put(out, in->data + p, 1);
                    p++;
                }
            }
        } else {
            st = duet__tok_nfc(in->data, in->len, out);
        }
        if (st != DUET_OK)
            return st;
        cur = !cur;
    }
    return duet__tok_normalized_part(e, e->norm[cur].data, e->norm[cur].len, at_start);
}

duet_status_t duet_tokenizer_encode(const duet_tokenizer_t *tok, const char *text, size_t len,
                                    bool add_special, int32_t **ids_p, size_t *n_p)
{
    duet__tok_enc_t e;
    duet_status_t st = DUET_OK;
    size_t pos = 0, ms, me;
    int k;

    if (tok == NULL || (text == NULL && len > 0) || ids_p == NULL || n_p == NULL)
        return duet_error(DUET_ERR_INVALID, "tokenizer: encode: bad arguments");
    if (len > DUET__TOK_MAX_TEXT) /* symbol positions are int32_t */
        return duet_error(DUET_ERR_TOO_LONG, "tokenizer: encode: %zu bytes (limit %d)", len,
                          DUET__TOK_MAX_TEXT);
    memset(&e, 0, sizeof(e));
    e.tok = tok;
    if ((st = duet__tok_enc_push(&e, 0)) != DUET_OK) /* allocate up front */
        goto err_free;
    e.n = 0;
    for (int i = 0; add_special && i < tok->n_prefix && st == DUET_OK; i++)
        st = duet__tok_enc_push(&e, tok->prefix[i]);
    while (st == DUET_OK && tok->n_added > 0 &&
           (k = duet__tok_find_added(tok, text, len, pos, false, &ms, &me)) >= 0) {
        if ((st = duet__tok_segment(&e, text + pos, ms - pos, pos == 0)) == DUET_OK)
            st = duet__tok_enc_push(&e, tok->added[k].id);
        pos = me;
    }
    if (st == DUET_OK)
        st = duet__tok_segment(&e, text + pos, len - pos, pos == 0);
    for (int i = 0; add_special && i < tok->n_suffix && st == DUET_OK; i++)
        st = duet__tok_enc_push(&e, tok->suffix[i]);
    if (st != DUET_OK)
        goto err_free;
    *ids_p = e.ids;
    *n_p = e.n;
    e.ids = NULL;
err_free:
    duet_free(e.ids);
    duet__tok_buf_free(&e.norm[0]);
    duet__tok_buf_free(&e.norm[1]);
    duet__tok_buf_free(&e.pre);
    duet__tok_buf_free(&e.word);
    duet_free(e.sym);
    duet_free(e.heap);
    return st;
}
