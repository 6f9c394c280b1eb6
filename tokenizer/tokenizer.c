/* Loading a Hugging Face tokenizer.json (+ tokenizer_config.json) into the
 * immutable duet_tokenizer_t.  Encoding is in tokenizer_encode.c, decoding in
 * tokenizer_decode.c, the synthetic writer in tokenizer_synth.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/alloc.h"
#include "common/json.h"
#include "tokenizer/tokenizer_internal.h"

#define DUET__TOK_MAX_IDS (1 << 24)

uint64_t duet__tok_hash(const char *s, size_t len)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    return h ^ (h >> 29);
}

static const char *duet__tok_piece_at(const duet_tokenizer_t *tok, int32_t id, size_t *len)
{
    *len = tok->piece_len[id];
    return tok->arena.data + tok->piece_off[id];
}

int32_t duet__tok_vocab_find(const duet_tokenizer_t *tok, const char *s, size_t len)
{
    uint32_t i = (uint32_t)duet__tok_hash(s, len) & tok->vhash_mask;
    for (;;) {
        int32_t id = tok->vhash[i];
        if (id < 0)
            return -1;
        size_t plen;
        const char *p = duet__tok_piece_at(tok, id, &plen);
        if (plen == len && memcmp(p, s, len) == 0)
            return id;
        i = (i + 1) & tok->vhash_mask;
    }
}

int duet__tok_merge_find(const duet_tokenizer_t *tok, int32_t left, int32_t right, int32_t *rank,
                         int32_t *id)
{
    uint64_t key = ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
    uint64_t i = duet__tok_hash((const char *)&key, sizeof(key)) & tok->mhash_mask;
    for (;;) {
        const duet__tok_merge_t *m = &tok->mhash[i];
        if (m->key == UINT64_MAX)
            return 0;
        if (m->key == key) {
            *rank = m->rank;
            *id = m->id;
            return 1;
        }
        i = (i + 1) & tok->mhash_mask;
    }
}

/* ---- small JSON helpers ---- */

const char *duet__tok_type(const cJSON *obj)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(obj, "type");
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

/* Optional bool: absent or null leaves *out. */
duet_status_t duet__tok_opt_bool(const cJSON *obj, const char *key, const char *path,
                                 const char *where, bool *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (v == NULL || cJSON_IsNull(v))
        return DUET_OK;
    if (!cJSON_IsBool(v))
        return duet_error(DUET_ERR_FORMAT, "%s: %s.%s: expected true or false", path, where, key);
    *out = cJSON_IsTrue(v);
    return DUET_OK;
}

duet_status_t duet__tok_req_string(const cJSON *obj, const char *key, const char *path,
                                   const char *where, const char **out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsString(v))
        return duet_error(DUET_ERR_FORMAT, "%s: %s.%s: missing or not a string", path, where, key);
    *out = v->valuestring;
    return DUET_OK;
}

duet_status_t duet__tok_int(const cJSON *v, const char *path, const char *where, int32_t max,
                            int32_t *out)
{
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble >= max ||
        v->valuedouble != (double)(int32_t)v->valuedouble)
        return duet_error(DUET_ERR_FORMAT, "%s: %s: expected an integer in 0..%d", path, where,
                          max - 1);
    *out = (int32_t)v->valuedouble;
    return DUET_OK;
}

/* A string-with-replace pattern {"String": s}; {"Regex": r} is unsupported. */
duet_status_t duet__tok_pattern_string(const cJSON *obj, const char *path, const char *where,
                                       const char **out)
{
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(obj, "pattern");
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(pat, "String");
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
    if (cJSON_IsString(r))
        return duet_error(DUET_ERR_UNSUPPORTED, "%s: %s.pattern: regex \"%s\" is not supported",
                          path, where, r->valuestring);
    if (!cJSON_IsString(s))
        return duet_error(DUET_ERR_FORMAT, "%s: %s.pattern: expected {\"String\": ...}", path,
                          where);
    *out = s->valuestring;
    return DUET_OK;
}

duet_status_t duet__tok_ids_append(duet_tokenizer_t *tok, int32_t **ids, int *n, int32_t id)
{
    int32_t *p = duet_realloc(*ids, (size_t)(*n + 1) * sizeof(int32_t));
    if (p == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "%s: no memory for the post-processor", tok->path);
    p[(*n)++] = id;
    *ids = p;
    return DUET_OK;
}

/* ---- vocab, merges, added tokens ---- */

static duet_status_t duet__tok_set_piece(duet_tokenizer_t *tok, int32_t id, const char *s,
                                         size_t len)
{
    uint32_t off = (uint32_t)tok->arena.len;
    duet_status_t st = duet__tok_buf_put(&tok->arena, s, len);
    if (st != DUET_OK)
        return st;
    /* keep the terminating NUL of every piece for duet_tokenizer_piece */
    if ((st = duet__tok_buf_reserve(&tok->arena, 1)) != DUET_OK)
        return st;
    tok->arena.len++;
    tok->piece_off[id] = off;
    tok->piece_len[id] = (uint32_t)len;
    return DUET_OK;
}

static duet_status_t duet__tok_load_vocab(duet_tokenizer_t *tok, const cJSON *vocab,
                                          const cJSON *added)
{
    const char *path = tok->path;
    int32_t max_id = -1, n = 0;
    const cJSON *it;
    duet_status_t st;

    cJSON_ArrayForEach(it, vocab)
    {
        int32_t id = 0;
        char where[64];
        snprintf(where, sizeof(where), "model.vocab[\"%.32s\"]", it->string);
        if ((st = duet__tok_int(it, path, where, DUET__TOK_MAX_IDS, &id)) != DUET_OK)
            return st;
        max_id = id > max_id ? id : max_id;
        n++;
    }
    if (n == 0)
        return duet_error(DUET_ERR_FORMAT, "%s: model.vocab: empty", path);
    cJSON_ArrayForEach(it, added)
    {
        int32_t id = 0;
        if ((st = duet__tok_int(cJSON_GetObjectItemCaseSensitive(it, "id"), path,
                                "added_tokens[].id", DUET__TOK_MAX_IDS, &id)) != DUET_OK)
            return st;
        max_id = id > max_id ? id : max_id;
    }
    tok->n_ids = max_id + 1;
    tok->piece_off = DUET_NEW_ARRAY(uint32_t, (size_t)tok->n_ids);
    tok->piece_len = duet_malloc((size_t)tok->n_ids * sizeof(uint32_t));
    tok->special = DUET_NEW_ARRAY(uint8_t, (size_t)tok->n_ids);
    uint32_t cap = 16;
    while (cap < (uint32_t)n * 2)
        cap *= 2;
    tok->vhash = duet_malloc(cap * sizeof(int32_t));
    if (tok->piece_off == NULL || tok->piece_len == NULL || tok->special == NULL ||
        tok->vhash == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "%s: no memory for %d ids", path, tok->n_ids);
    memset(tok->piece_len, 0xFF, (size_t)tok->n_ids * sizeof(uint32_t));
    memset(tok->vhash, 0xFF, cap * sizeof(int32_t));
    tok->vhash_mask = cap - 1;

    cJSON_ArrayForEach(it, vocab)
    {
        int32_t id = (int32_t)it->valuedouble;
        size_t len = strlen(it->string);
        if (tok->piece_len[id] != UINT32_MAX)
            return duet_error(DUET_ERR_FORMAT,
                              "%s: model.vocab: id %d is used by \"%s\" and \"%s\"", path, id,
                              tok->arena.data + tok->piece_off[id], it->string);
        if ((st = duet__tok_set_piece(tok, id, it->string, len)) != DUET_OK)
            return st;
        uint32_t h = (uint32_t)duet__tok_hash(it->string, len) & tok->vhash_mask;
        while (tok->vhash[h] >= 0)
            h = (h + 1) & tok->vhash_mask;
        tok->vhash[h] = id;
    }
    return DUET_OK;
}

static duet_status_t duet__tok_merge_side(const duet_tokenizer_t *tok, int idx, const char *s,
                                          size_t len, int32_t *id)
{
    *id = duet__tok_vocab_find(tok, s, len);
    if (*id < 0)
        return duet_error(DUET_ERR_FORMAT, "%s: model.merges[%d]: \"%.*s\" is not in the vocab",
                          tok->path, idx, (int)len, s);
    return DUET_OK;
}

static duet_status_t duet__tok_load_merges(duet_tokenizer_t *tok, const cJSON *merges)
{
    const char *path = tok->path;
    int n = cJSON_GetArraySize(merges), idx = 0;
    uint64_t cap = 16;
    const cJSON *it;
    duet__tok_buf_t both = {0};
    duet_status_t st = DUET_OK;

    while (cap < (uint64_t)n * 2)
        cap *= 2;
    tok->mhash = duet_malloc(cap * sizeof(duet__tok_merge_t));
    if (tok->mhash == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "%s: no memory for %d merges", path, n);
    for (uint64_t i = 0; i < cap; i++)
        tok->mhash[i].key = UINT64_MAX;
    tok->mhash_mask = cap - 1;

    cJSON_ArrayForEach(it, merges)
    {
        const char *a, *b;
        size_t alen, blen;
        int32_t ia, ib, im;
        if (cJSON_IsString(it)) {
            const char *sp = strchr(it->valuestring, ' ');
            if (sp == NULL || strchr(sp + 1, ' ') != NULL) {
                st = duet_error(DUET_ERR_FORMAT,
                                "%s: model.merges[%d]: \"%s\" is not two pieces separated by one "
                                "space",
                                path, idx, it->valuestring);
                goto out;
            }
            a = it->valuestring;
            alen = (size_t)(sp - a);
            b = sp + 1;
            blen = strlen(b);
        } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 &&
                   cJSON_IsString(cJSON_GetArrayItem(it, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(it, 1))) {
            a = cJSON_GetArrayItem(it, 0)->valuestring;
            b = cJSON_GetArrayItem(it, 1)->valuestring;
            alen = strlen(a);
            blen = strlen(b);
        } else {
            st = duet_error(DUET_ERR_FORMAT,
                            "%s: model.merges[%d]: expected \"a b\" or [\"a\", \"b\"]", path, idx);
            goto out;
        }
        if ((st = duet__tok_merge_side(tok, idx, a, alen, &ia)) != DUET_OK ||
            (st = duet__tok_merge_side(tok, idx, b, blen, &ib)) != DUET_OK)
            goto out;
        both.len = 0;
        if ((st = duet__tok_buf_put(&both, a, alen)) != DUET_OK ||
            (st = duet__tok_buf_put(&both, b, blen)) != DUET_OK)
            goto out;
        if ((st = duet__tok_merge_side(tok, idx, both.data, both.len, &im)) != DUET_OK)
            goto out;
        uint64_t key = ((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib;
        uint64_t h = duet__tok_hash((const char *)&key, sizeof(key)) & tok->mhash_mask;
        while (tok->mhash[h].key != UINT64_MAX && tok->mhash[h].key != key)
            h = (h + 1) & tok->mhash_mask;
        if (tok->mhash[h].key == UINT64_MAX) { /* the first rank of a duplicate wins */
            tok->mhash[h].key = key;
            tok->mhash[h].rank = idx;
            tok->mhash[h].id = im;
        }
        idx++;
    }
    tok->n_merges = idx;
out:
    duet__tok_buf_free(&both);
    return st;
}

static int duet__tok_added_cmp(const void *pa, const void *pb, void *arg)
{
    const duet__tok_added_t *a = pa, *b = pb;
    const char *arena = arg;
    unsigned char ca = a->len ? (unsigned char)arena[a->off] : 0;
    unsigned char cb = b->len ? (unsigned char)arena[b->off] : 0;
    if (ca != cb)
        return ca < cb ? -1 : 1;
    if (a->len != b->len)
        return a->len > b->len ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

static duet_status_t duet__tok_load_added(duet_tokenizer_t *tok, const cJSON *added)
{
    const char *path = tok->path;
    int n = cJSON_GetArraySize(added), k = 0;
    const cJSON *it;
    duet_status_t st;

    if (n == 0)
        return DUET_OK;
    tok->added = DUET_NEW_ARRAY(duet__tok_added_t, (size_t)n);
    if (tok->added == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "%s: no memory for added tokens", path);
    cJSON_ArrayForEach(it, added)
    {
        duet__tok_added_t *a = &tok->added[k];
        const char *content = NULL;
        char where[32];
        snprintf(where, sizeof(where), "added_tokens[%d]", k);
        if ((st = duet__tok_req_string(it, "content", path, where, &content)) != DUET_OK)
            return st;
        if (content[0] == '\0')
            return duet_error(DUET_ERR_FORMAT, "%s: %s.content: empty", path, where);
        a->id = (int32_t)cJSON_GetObjectItemCaseSensitive(it, "id")->valuedouble;
        if ((st = duet__tok_opt_bool(it, "special", path, where, &a->special)) != DUET_OK ||
            (st = duet__tok_opt_bool(it, "normalized", path, where, &a->normalized)) != DUET_OK ||
            (st = duet__tok_opt_bool(it, "lstrip", path, where, &a->lstrip)) != DUET_OK ||
            (st = duet__tok_opt_bool(it, "rstrip", path, where, &a->rstrip)) != DUET_OK ||
            (st = duet__tok_opt_bool(it, "single_word", path, where, &a->single_word)) != DUET_OK)
            return st;
        size_t len = strlen(content);
        size_t plen;
        if (tok->piece_len[a->id] == UINT32_MAX ||
            (duet__tok_piece_at(tok, a->id, &plen), plen != len) ||
            memcmp(tok->arena.data + tok->piece_off[a->id], content, len) != 0) {
            if ((st = duet__tok_set_piece(tok, a->id, content, len)) != DUET_OK)
                return st;
        }
        a->off = tok->piece_off[a->id];
        a->len = (uint32_t)len;
        tok->special[a->id] = a->special;
        tok->any_normalized_added |= a->normalized;
        k++;
    }
    tok->n_added = k;
    qsort_r(tok->added, (size_t)k, sizeof(*tok->added), duet__tok_added_cmp, tok->arena.data);
    int j = 0;
    for (int b = 0; b < 256; b++) {
        tok->added_first[b] = j;
        while (j < k && (unsigned char)tok->arena.data[tok->added[j].off] == b)
            j++;
    }
    tok->added_first[256] = k;
    return DUET_OK;
}

/* ---- model section ---- */

static duet_status_t duet__tok_load_model(duet_tokenizer_t *tok, const cJSON *root)
{
    const char *path = tok->path, *type;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    const cJSON *vocab, *merges, *v;
    duet_status_t st;

    if (!cJSON_IsObject(model))
        return duet_error(DUET_ERR_FORMAT, "%s: model: missing or not an object", path);
    type = duet__tok_type(model);
    vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (type != NULL && strcmp(type, "BPE") != 0)
        return duet_error(DUET_ERR_UNSUPPORTED, "%s: model.type \"%s\" is not supported (only BPE)",
                          path, type);
    if (type == NULL && merges == NULL)
        return duet_error(DUET_ERR_UNSUPPORTED, "%s: model.type: missing and not a BPE model",
                          path);
    if (!cJSON_IsObject(vocab))
        return duet_error(DUET_ERR_FORMAT, "%s: model.vocab: missing or not an object", path);
    if (!cJSON_IsArray(merges))
        return duet_error(DUET_ERR_FORMAT, "%s: model.merges: missing or not an array", path);
    if (added != NULL && !cJSON_IsNull(added) && !cJSON_IsArray(added))
        return duet_error(DUET_ERR_FORMAT, "%s: added_tokens: not an array", path);
    if (cJSON_IsNull(added))
        added = NULL;

    if ((st = duet__tok_opt_bool(model, "byte_fallback", path, "model", &tok->byte_fallback)) ||
        (st = duet__tok_opt_bool(model, "fuse_unk", path, "model", &tok->fuse_unk)) ||
        (st = duet__tok_opt_bool(model, "ignore_merges", path, "model", &tok->ignore_merges)))
        return st;
    v = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (v != NULL && !cJSON_IsNull(v) && !(cJSON_IsNumber(v) && v->valuedouble == 0.0))
        return duet_error(DUET_ERR_UNSUPPORTED, "%s: model.dropout: BPE dropout is not supported",
                          path);
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (size_t i = 0; i < 2; i++) {
        v = cJSON_GetObjectItemCaseSensitive(model, affixes[i]);
        if (v != NULL && !cJSON_IsNull(v) && !(cJSON_IsString(v) && v->valuestring[0] == '\0'))
            return duet_error(DUET_ERR_UNSUPPORTED, "%s: model.%s is not supported", path,
                              affixes[i]);
    }
    if ((st = duet__tok_load_vocab(tok, vocab, added)) != DUET_OK ||
        (st = duet__tok_load_merges(tok, merges)) != DUET_OK)
        return st;
    v = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
    if (cJSON_IsString(v)) {
        tok->unk_id = duet__tok_vocab_find(tok, v->valuestring, strlen(v->valuestring));
        if (tok->unk_id < 0)
            return duet_error(DUET_ERR_FORMAT, "%s: model.unk_token: \"%s\" is not in the vocab",
                              path, v->valuestring);
    } else if (v != NULL && !cJSON_IsNull(v)) {
        return duet_error(DUET_ERR_FORMAT, "%s: model.unk_token: not a string", path);
    }
    return duet__tok_load_added(tok, added);
}

static void duet__tok_byte_tables(duet_tokenizer_t *tok)
{
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof(name), "<0x%02X>", b);
        tok->byte_tok[b] = duet__tok_vocab_find(tok, name, 6);
        size_t n = duet__tok_utf8_put(duet__tok_byte_to_cp((uint8_t)b), tok->byte_utf8[b]);
        tok->byte_utf8_len[b] = (uint8_t)n;
        tok->byte_char[b] = duet__tok_vocab_find(tok, tok->byte_utf8[b], n);
    }
}

/* ---- tokenizer_config.json ---- */

/* Id of a token text: added tokens first, then the vocab; -1 when absent. */
static int32_t duet__tok_find_token(const duet_tokenizer_t *tok, const char *s)
{
    size_t len = strlen(s);
    for (int i = 0; i < tok->n_added; i++) {
        const duet__tok_added_t *a = &tok->added[i];
        if (a->len == len && memcmp(tok->arena.data + a->off, s, len) == 0)
            return a->id;
    }
    return duet__tok_vocab_find(tok, s, len);
}

/* bos / eos not named by a config: the synthetic <|bos|>/<|eos|>, then the
 * usual spellings, then the template's first special token for BOS. */
static void duet__tok_default_specials(duet_tokenizer_t *tok)
{
    static const char *const bos_names[] = {"<|bos|>", "<s>", "<|begin_of_text|>"};
    static const char *const eos_names[] = {"<|eos|>", "</s>", "<|end_of_text|>", "<|endoftext|>"};
    if (tok->bos == -2) {
        tok->bos = -1;
        for (size_t i = 0; i < sizeof(bos_names) / sizeof(bos_names[0]) && tok->bos < 0; i++)
            tok->bos = duet__tok_find_token(tok, bos_names[i]);
        if (tok->bos < 0 && tok->n_prefix > 0)
            tok->bos = tok->prefix[0];
    }
    if (tok->eos == -2) {
        tok->eos = -1;
        for (size_t i = 0; i < sizeof(eos_names) / sizeof(eos_names[0]) && tok->eos < 0; i++)
            tok->eos = duet__tok_find_token(tok, eos_names[i]);
    }
}

/* bos_token / eos_token: a string, {"content": ...} or null.  *found is set
 * when the key is present (null counts: the model has no such token). */
static duet_status_t duet__tok_config_token(const duet_tokenizer_t *tok, const cJSON *cfg,
                                            const char *cfg_path, const char *key, int32_t *id,
                                            bool *found)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    const char *s;

    *found = v != NULL;
    if (v == NULL || cJSON_IsNull(v)) {
        *id = -1;
        return DUET_OK;
    }
    if (cJSON_IsObject(v))
        v = cJSON_GetObjectItemCaseSensitive(v, "content");
    if (!cJSON_IsString(v))
        return duet_error(DUET_ERR_FORMAT, "%s: %s: expected a string or {\"content\": ...}",
                          cfg_path, key);
    s = v->valuestring;
    *id = duet__tok_find_token(tok, s);
    if (*id < 0)
        return duet_error(DUET_ERR_FORMAT, "%s: %s: \"%s\" is not a token of %s", cfg_path, key, s,
                          tok->path);
    return DUET_OK;
}

static duet_status_t duet__tok_load_config(duet_tokenizer_t *tok, const char *cfg_path)
{
    cJSON *cfg = NULL;
    const cJSON *tmpl;
    bool has_bos = false, has_eos = false, add_bos = false, add_eos = false;
    bool add_bos_set, add_eos_set;
    duet_status_t st;

    if ((st = duet_json_load_file(cfg_path, &cfg)) != DUET_OK)
        return st;
    if (!cJSON_IsObject(cfg)) {
        st = duet_error(DUET_ERR_FORMAT, "%s: not a JSON object", cfg_path);
        goto out;
    }
    if ((st = duet__tok_config_token(tok, cfg, cfg_path, "bos_token", &tok->bos, &has_bos)) ||
        (st = duet__tok_config_token(tok, cfg, cfg_path, "eos_token", &tok->eos, &has_eos)))
        goto out;
    if (!has_bos)
        tok->bos = -2; /* not given: fall back on conventions */
    if (!has_eos)
        tok->eos = -2;
    duet__tok_default_specials(tok);
    add_bos_set = cJSON_GetObjectItemCaseSensitive(cfg, "add_bos_token") != NULL &&
                  !cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(cfg, "add_bos_token"));
    add_eos_set = cJSON_GetObjectItemCaseSensitive(cfg, "add_eos_token") != NULL &&
                  !cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(cfg, "add_eos_token"));
    if ((st = duet__tok_opt_bool(cfg, "add_bos_token", cfg_path, "config", &add_bos)) ||
        (st = duet__tok_opt_bool(cfg, "add_eos_token", cfg_path, "config", &add_eos)))
        goto out;
    /* As transformers' LlamaTokenizerFast does: explicit flags rebuild the
     * template around the sequence. */
    if (add_bos_set) {
        tok->n_prefix = 0;
        if (add_bos && tok->bos >= 0 &&
            (st = duet__tok_ids_append(tok, &tok->prefix, &tok->n_prefix, tok->bos)) != DUET_OK)
            goto out;
    }
    if (add_eos_set) {
        tok->n_suffix = 0;
        if (add_eos && tok->eos >= 0 &&
            (st = duet__tok_ids_append(tok, &tok->suffix, &tok->n_suffix, tok->eos)) != DUET_OK)
            goto out;
    }
    tmpl = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
    if (cJSON_IsArray(tmpl)) { /* [{"name", "template"}]: take "default", else the first */
        const cJSON *it, *pick = NULL;
        cJSON_ArrayForEach(it, tmpl)
        {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(it, "name");
            if (pick == NULL || (cJSON_IsString(name) && strcmp(name->valuestring, "default") == 0))
                pick = it;
        }
        tmpl = cJSON_GetObjectItemCaseSensitive(pick, "template");
    }
    if (cJSON_IsString(tmpl)) {
        if ((tok->chat_template = duet_strdup(tmpl->valuestring)) == NULL) {
            st = duet_error(DUET_ERR_NO_MEMORY, "%s: no memory for chat_template", cfg_path);
            goto out;
        }
    } else if (tmpl != NULL && !cJSON_IsNull(tmpl)) {
        st = duet_error(DUET_ERR_FORMAT, "%s: chat_template: expected a string", cfg_path);
        goto out;
    }
    st = DUET_OK;
out:
    cJSON_Delete(cfg);
    return st;
}

/* ---- public ---- */

duet_status_t duet_tokenizer_load_files(const char *tokenizer_json, const char *config_path,
                                        duet_tokenizer_t **tok_p)
{
    duet_tokenizer_t *tok;
    cJSON *root = NULL;
    duet_status_t st;

    if (tokenizer_json == NULL || tok_p == NULL)
        return duet_error(DUET_ERR_INVALID, "tokenizer: no path");
    if ((tok = DUET_NEW(duet_tokenizer_t)) == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "%s: no memory", tokenizer_json);
    tok->unk_id = -1;
    tok->bos = tok->eos = -2;
    if ((tok->path = duet_strdup(tokenizer_json)) == NULL) {
        st = duet_error(DUET_ERR_NO_MEMORY, "%s: no memory", tokenizer_json);
        goto err_destroy;
    }
    if ((st = duet_json_load_file(tokenizer_json, &root)) != DUET_OK)
        goto err_destroy;
    if (!cJSON_IsObject(root)) {
        st = duet_error(DUET_ERR_FORMAT, "%s: not a JSON object", tokenizer_json);
        goto err_delete_json;
    }
    if ((st = duet__tok_load_model(tok, root)) != DUET_OK ||
        (st = duet__tok_load_normalizer(tok, cJSON_GetObjectItemCaseSensitive(root, "normalizer"),
                                        0)) != DUET_OK ||
        (st = duet__tok_load_pretok(
             tok, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"))) != DUET_OK ||
        (st = duet__tok_load_postproc(tok, cJSON_GetObjectItemCaseSensitive(root, "post_processor"),
                                      0)) != DUET_OK ||
        (st = duet__tok_load_decoder(tok, cJSON_GetObjectItemCaseSensitive(root, "decoder"))) !=
            DUET_OK)
        goto err_delete_json;
    duet__tok_byte_tables(tok);
    if (config_path != NULL && (st = duet__tok_load_config(tok, config_path)) != DUET_OK)
        goto err_delete_json;
    duet__tok_default_specials(tok);
    cJSON_Delete(root);
    *tok_p = tok;
    return DUET_OK;

err_delete_json:
    cJSON_Delete(root);
err_destroy:
    duet_tokenizer_destroy(tok);
    return st;
}

duet_status_t duet_tokenizer_load(const char *dir, duet_tokenizer_t **tok_p)
{
    char *json_path = NULL, *cfg_path = NULL;
    size_t n;
    duet_status_t st;

    if (dir == NULL)
        return duet_error(DUET_ERR_INVALID, "tokenizer: no directory");
    n = strlen(dir) + sizeof("/tokenizer_config.json");
    json_path = duet_malloc(n);
    cfg_path = duet_malloc(n);
    if (json_path == NULL || cfg_path == NULL) {
        st = duet_error(DUET_ERR_NO_MEMORY, "%s: no memory", dir);
        goto out;
    }
    snprintf(json_path, n, "%s/tokenizer.json", dir);
    snprintf(cfg_path, n, "%s/tokenizer_config.json", dir);
    /* only whether it exists: opening a FIFO there would block (the loader
     * refuses anything but a regular file) */
    st = duet_tokenizer_load_files(json_path, access(cfg_path, F_OK) == 0 ? cfg_path : NULL, tok_p);
out:
    duet_free(json_path);
    duet_free(cfg_path);
    return st;
}

void duet_tokenizer_destroy(duet_tokenizer_t *tok)
{
    if (tok == NULL)
        return;
    for (int i = 0; i < tok->n_norm; i++) {
        duet_free(tok->norm[i].a);
        duet_free(tok->norm[i].b);
    }
    duet_free(tok->norm);
    duet__tok_buf_free(&tok->arena);
    duet_free(tok->piece_off);
    duet_free(tok->piece_len);
    duet_free(tok->vhash);
    duet_free(tok->mhash);
    duet_free(tok->added);
    duet_free(tok->special);
    duet_free(tok->prefix);
    duet_free(tok->suffix);
    duet_free(tok->chat_template);
    duet_free(tok->dec_off);
    duet_free(tok->dec_len);
    duet_free(tok->dec_arena);
    duet_free(tok->path);
    duet_free(tok);
}

int duet_tokenizer_vocab_size(const duet_tokenizer_t *tok)
{
    return tok->n_ids;
}

int duet_tokenizer_bos(const duet_tokenizer_t *tok)
{
    return tok->bos;
}

int duet_tokenizer_eos(const duet_tokenizer_t *tok)
{
    return tok->eos;
}

const char *duet_tokenizer_chat_template(const duet_tokenizer_t *tok)
{
    return tok->chat_template;
}

const char *duet_tokenizer_piece(const duet_tokenizer_t *tok, int32_t id)
{
    if (id < 0 || id >= tok->n_ids || tok->piece_len[id] == UINT32_MAX)
        return NULL;
    return tok->arena.data + tok->piece_off[id];
}
