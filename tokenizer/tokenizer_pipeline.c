/* Parsing of the tokenizer.json pipeline sections: normalizer,
 * pre_tokenizer, post_processor and decoder. */
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/alloc.h"
#include "tokenizer/tokenizer_internal.h"

/* ---- normalizer / pre-tokenizer / post-processor / decoder ---- */

static duet_status_t duet__tok_norm_add(duet_tokenizer_t *tok, duet__tok_norm_kind_t kind,
                                        const char *a, const char *b)
{
    duet__tok_norm_t *n = duet_realloc(tok->norm, (size_t)(tok->n_norm + 1) * sizeof(*n));
    if (n == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "%s: no memory for the normalizer", tok->path);
    tok->norm = n;
    n = &tok->norm[tok->n_norm];
    n->kind = kind;
    n->a = a ? duet_strdup(a) : NULL;
    n->b = b ? duet_strdup(b) : NULL;
    tok->n_norm++;
    if ((a && n->a == NULL) || (b && n->b == NULL))
        return duet_error(DUET_ERR_NO_MEMORY, "%s: no memory for the normalizer", tok->path);
    return DUET_OK;
}

duet_status_t duet__tok_load_normalizer(duet_tokenizer_t *tok, const cJSON *n, int depth)
{
    const char *path = tok->path, *type = duet__tok_type(n), *a, *b;
    duet_status_t st;

    if (n == NULL || cJSON_IsNull(n))
        return DUET_OK;
    if (type == NULL || depth > 4)
        return duet_error(DUET_ERR_FORMAT, "%s: normalizer: missing type", path);
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *it, *list = cJSON_GetObjectItemCaseSensitive(n, "normalizers");
        if (!cJSON_IsArray(list))
            return duet_error(DUET_ERR_FORMAT, "%s: normalizer.normalizers: not an array", path);
        cJSON_ArrayForEach(it, list)
        {
            if ((st = duet__tok_load_normalizer(tok, it, depth + 1)) != DUET_OK)
                return st;
        }
        return DUET_OK;
    }
    if (strcmp(type, "Prepend") == 0) {
        if ((st = duet__tok_req_string(n, "prepend", path, "normalizer", &a)) != DUET_OK)
            return st;
        return duet__tok_norm_add(tok, DUET__TOK_NORM_PREPEND, a, NULL);
    }
    if (strcmp(type, "Replace") == 0) {
        if ((st = duet__tok_pattern_string(n, path, "normalizer", &a)) != DUET_OK ||
            (st = duet__tok_req_string(n, "content", path, "normalizer", &b)) != DUET_OK)
            return st;
        if (a[0] == '\0')
            return duet_error(DUET_ERR_FORMAT, "%s: normalizer.pattern: empty", path);
        return duet__tok_norm_add(tok, DUET__TOK_NORM_REPLACE, a, b);
    }
    if (strcmp(type, "NFC") == 0)
        return duet__tok_norm_add(tok, DUET__TOK_NORM_NFC, NULL, NULL);
    return duet_error(DUET_ERR_UNSUPPORTED, "%s: normalizer.type \"%s\" is not supported", path,
                      type);
}

static duet_status_t duet__tok_load_metaspace(duet_tokenizer_t *tok, const cJSON *m,
                                              const char *where, duet__tok_prepend_t *scheme,
                                              char repl[8])
{
    const char *path = tok->path, *r;
    const cJSON *ps = cJSON_GetObjectItemCaseSensitive(m, "prepend_scheme");
    bool aps = true;
    duet_status_t st;

    if ((st = duet__tok_req_string(m, "replacement", path, where, &r)) != DUET_OK ||
        (st = duet__tok_opt_bool(m, "add_prefix_space", path, where, &aps)) != DUET_OK)
        return st;
    if (strlen(r) == 0 || strlen(r) > 4)
        return duet_error(DUET_ERR_FORMAT, "%s: %s.replacement: expected one character", path,
                          where);
    strcpy(repl, r);
    *scheme = aps ? DUET__TOK_PREPEND_ALWAYS : DUET__TOK_PREPEND_NEVER;
    if (cJSON_IsString(ps)) {
        if (strcmp(ps->valuestring, "always") == 0)
            *scheme = DUET__TOK_PREPEND_ALWAYS;
        else if (strcmp(ps->valuestring, "first") == 0)
            *scheme = DUET__TOK_PREPEND_FIRST;
        else if (strcmp(ps->valuestring, "never") == 0)
            *scheme = DUET__TOK_PREPEND_NEVER;
        else
            return duet_error(DUET_ERR_FORMAT, "%s: %s.prepend_scheme: unknown value \"%s\"", path,
                              where, ps->valuestring);
    }
    return DUET_OK;
}

static duet_status_t duet__tok_load_pretok_one(duet_tokenizer_t *tok, const cJSON *p, bool last)
{
    const char *path = tok->path, *type = duet__tok_type(p);
    duet_status_t st;

    if (type == NULL)
        return duet_error(DUET_ERR_FORMAT, "%s: pre_tokenizer: missing type", path);
    if (tok->byte_level || tok->metaspace)
        return duet_error(DUET_ERR_UNSUPPORTED,
                          "%s: pre_tokenizer: \"%s\" after ByteLevel/Metaspace is not supported",
                          path, type);
    if (strcmp(type, "ByteLevel") == 0) {
        bool aps = true, use_regex = true;
        if ((st = duet__tok_opt_bool(p, "add_prefix_space", path, "pre_tokenizer", &aps)) !=
                DUET_OK ||
            (st = duet__tok_opt_bool(p, "use_regex", path, "pre_tokenizer", &use_regex)) != DUET_OK)
            return st;
        if (use_regex && tok->split != DUET__TOK_SPLIT_NONE)
            return duet_error(
                DUET_ERR_UNSUPPORTED,
                "%s: pre_tokenizer: ByteLevel(use_regex) after Split is not supported", path);
        tok->byte_level = true;
        if (use_regex) {
            tok->split = DUET__TOK_SPLIT_GPT2;
            tok->bl_prefix_before_split = aps;
        } else if (tok->split != DUET__TOK_SPLIT_NONE) {
            tok->bl_prefix_per_word = aps;
        } else {
            tok->bl_prefix_before_split = aps;
        }
        return DUET_OK;
    }
    if (strcmp(type, "Split") == 0) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
        const cJSON *re = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
        const cJSON *beh = cJSON_GetObjectItemCaseSensitive(p, "behavior");
        bool invert = false;
        if ((st = duet__tok_opt_bool(p, "invert", path, "pre_tokenizer", &invert)) != DUET_OK)
            return st;
        if (!cJSON_IsString(re))
            return duet_error(
                DUET_ERR_UNSUPPORTED,
                "%s: pre_tokenizer.pattern: only {\"Regex\": ...} splits are supported", path);
        if (tok->split != DUET__TOK_SPLIT_NONE)
            return duet_error(DUET_ERR_UNSUPPORTED, "%s: pre_tokenizer: more than one Split", path);
        tok->split = duet__tok_split_lookup(re->valuestring);
        if (tok->split == DUET__TOK_SPLIT_NONE)
            return duet_error(DUET_ERR_UNSUPPORTED,
                              "%s: pre_tokenizer.pattern: split regex \"%s\" is not supported "
                              "(known: GPT-2, Llama-3, Qwen2)",
                              path, re->valuestring);
        if (!cJSON_IsString(beh) || strcmp(beh->valuestring, "Isolated") != 0 || invert)
            return duet_error(DUET_ERR_UNSUPPORTED,
                              "%s: pre_tokenizer.behavior: only Isolated, non-inverted splits are "
                              "supported",
                              path);
        return DUET_OK;
    }
    if (strcmp(type, "Metaspace") == 0) {
        bool split = true;
        if (!last || tok->split != DUET__TOK_SPLIT_NONE)
            return duet_error(DUET_ERR_UNSUPPORTED,
                              "%s: pre_tokenizer: Metaspace combined with others", path);
        if ((st = duet__tok_load_metaspace(tok, p, "pre_tokenizer", &tok->ms_prepend,
                                           tok->ms_repl)) != DUET_OK ||
            (st = duet__tok_opt_bool(p, "split", path, "pre_tokenizer", &split)) != DUET_OK)
            return st;
        tok->metaspace = true;
        tok->ms_split = split;
        return DUET_OK;
    }
    return duet_error(DUET_ERR_UNSUPPORTED, "%s: pre_tokenizer.type \"%s\" is not supported", path,
                      type);
}

duet_status_t duet__tok_load_pretok(duet_tokenizer_t *tok, const cJSON *p)
{
    duet_status_t st;
    if (p == NULL || cJSON_IsNull(p))
        return DUET_OK;
    const char *type = duet__tok_type(p);
    if (type != NULL && strcmp(type, "Sequence") == 0) {
        const cJSON *it, *list = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
        if (!cJSON_IsArray(list))
            return duet_error(DUET_ERR_FORMAT, "%s: pre_tokenizer.pretokenizers: not an array",
                              tok->path);
        cJSON_ArrayForEach(it, list)
        {
            if ((st = duet__tok_load_pretok_one(tok, it, it->next == NULL)) != DUET_OK)
                return st;
        }
        return DUET_OK;
    }
    return duet__tok_load_pretok_one(tok, p, true);
}

static duet_status_t duet__tok_load_template(duet_tokenizer_t *tok, const cJSON *p)
{
    const char *path = tok->path;
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(p, "single");
    const cJSON *specials = cJSON_GetObjectItemCaseSensitive(p, "special_tokens");
    const cJSON *it;
    bool seen_a = false;
    duet_status_t st;

    if (!cJSON_IsArray(single))
        return duet_error(DUET_ERR_FORMAT, "%s: post_processor.single: not an array", path);
    tok->n_prefix = tok->n_suffix = 0;
    cJSON_ArrayForEach(it, single)
    {
        const cJSON *seq = cJSON_GetObjectItemCaseSensitive(it, "Sequence");
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(it, "SpecialToken");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(sp, "id");
        if (seq != NULL) {
            seen_a = true;
            continue;
        }
        if (!cJSON_IsString(name))
            return duet_error(
                DUET_ERR_FORMAT,
                "%s: post_processor.single: item is neither Sequence nor SpecialToken", path);
        const cJSON *def = cJSON_GetObjectItemCaseSensitive(specials, name->valuestring);
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(def, "ids"), *idv;
        if (!cJSON_IsArray(ids))
            return duet_error(DUET_ERR_FORMAT,
                              "%s: post_processor.special_tokens: \"%s\" missing or without ids",
                              path, name->valuestring);
        cJSON_ArrayForEach(idv, ids)
        {
            int32_t id;
            if ((st = duet__tok_int(idv, path, "post_processor.special_tokens[].ids", tok->n_ids,
                                    &id)) != DUET_OK)
                return st;
            st = seen_a ? duet__tok_ids_append(tok, &tok->suffix, &tok->n_suffix, id)
                        : duet__tok_ids_append(tok, &tok->prefix, &tok->n_prefix, id);
            if (st != DUET_OK)
                return st;
        }
    }
    if (!seen_a)
        return duet_error(DUET_ERR_FORMAT, "%s: post_processor.single: no Sequence item", path);
    return DUET_OK;
}

duet_status_t duet__tok_load_postproc(duet_tokenizer_t *tok, const cJSON *p, int depth)
{
    const char *path = tok->path, *type = duet__tok_type(p);
    duet_status_t st;

    if (p == NULL || cJSON_IsNull(p))
        return DUET_OK;
    if (type == NULL || depth > 4)
        return duet_error(DUET_ERR_FORMAT, "%s: post_processor: missing type", path);
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *it, *list = cJSON_GetObjectItemCaseSensitive(p, "processors");
        if (!cJSON_IsArray(list))
            return duet_error(DUET_ERR_FORMAT, "%s: post_processor.processors: not an array", path);
        cJSON_ArrayForEach(it, list)
        {
            if ((st = duet__tok_load_postproc(tok, it, depth + 1)) != DUET_OK)
                return st;
        }
        return DUET_OK;
    }
    if (strcmp(type, "ByteLevel") == 0)
        return DUET_OK; /* offsets only */
    if (strcmp(type, "TemplateProcessing") == 0)
        return duet__tok_load_template(tok, p);
    if (strcmp(type, "BertProcessing") == 0 || strcmp(type, "RobertaProcessing") == 0) {
        const cJSON *cls = cJSON_GetObjectItemCaseSensitive(p, "cls");
        const cJSON *sep = cJSON_GetObjectItemCaseSensitive(p, "sep");
        int32_t c, s;
        if ((st = duet__tok_int(cJSON_GetArrayItem(cls, 1), path, "post_processor.cls", tok->n_ids,
                                &c)) != DUET_OK ||
            (st = duet__tok_int(cJSON_GetArrayItem(sep, 1), path, "post_processor.sep", tok->n_ids,
                                &s)) != DUET_OK)
            return st;
        tok->n_prefix = tok->n_suffix = 0;
        if ((st = duet__tok_ids_append(tok, &tok->prefix, &tok->n_prefix, c)) != DUET_OK)
            return st;
        return duet__tok_ids_append(tok, &tok->suffix, &tok->n_suffix, s);
    }
    return duet_error(DUET_ERR_UNSUPPORTED, "%s: post_processor.type \"%s\" is not supported", path,
                      type);
}

#define DUET__TOK_MAX_REPLACE 8

typedef struct {
    const char *from[DUET__TOK_MAX_REPLACE], *to[DUET__TOK_MAX_REPLACE];
    int n_replace;
    bool byte_fallback, fuse;
} duet__tok_chain_t;

static duet_status_t duet__tok_load_dec_step(duet_tokenizer_t *tok, const cJSON *d,
                                             duet__tok_chain_t *ch)
{
    const char *path = tok->path, *type = duet__tok_type(d), *a, *b;
    duet_status_t st;

    if (type == NULL)
        return duet_error(DUET_ERR_FORMAT, "%s: decoder: missing type", path);
    if (tok->dec_kind == DUET__TOK_DEC_BYTELEVEL || tok->dec_kind == DUET__TOK_DEC_METASPACE ||
        tok->strip_start > 0)
        return duet_error(DUET_ERR_UNSUPPORTED, "%s: decoder: \"%s\" after %s is not supported",
                          path, type, tok->strip_start > 0 ? "Strip" : "ByteLevel/Metaspace");
    if (strcmp(type, "ByteLevel") == 0 || strcmp(type, "Metaspace") == 0) {
        if (tok->dec_kind != DUET__TOK_DEC_NONE)
            return duet_error(DUET_ERR_UNSUPPORTED, "%s: decoder: \"%s\" inside a chain", path,
                              type);
        if (strcmp(type, "ByteLevel") == 0) {
            tok->dec_kind = DUET__TOK_DEC_BYTELEVEL;
            return DUET_OK;
        }
        tok->dec_kind = DUET__TOK_DEC_METASPACE;
        duet__tok_prepend_t scheme;
        char repl[8];
        if ((st = duet__tok_load_metaspace(tok, d, "decoder", &scheme, repl)) != DUET_OK)
            return st;
        tok->dec_ms_strip_first = scheme != DUET__TOK_PREPEND_NEVER;
        strcpy(tok->dec_repl, repl);
        return DUET_OK;
    }
    tok->dec_kind = DUET__TOK_DEC_CHAIN;
    if (strcmp(type, "Replace") == 0) {
        if (ch->byte_fallback || ch->fuse || ch->n_replace == DUET__TOK_MAX_REPLACE)
            return duet_error(DUET_ERR_UNSUPPORTED,
                              "%s: decoder: Replace after ByteFallback/Fuse is not supported",
                              path);
        if ((st = duet__tok_pattern_string(d, path, "decoder", &a)) != DUET_OK ||
            (st = duet__tok_req_string(d, "content", path, "decoder", &b)) != DUET_OK)
            return st;
        if (a[0] == '\0')
            return duet_error(DUET_ERR_FORMAT, "%s: decoder.pattern: empty", path);
        ch->from[ch->n_replace] = a;
        ch->to[ch->n_replace++] = b;
        return DUET_OK;
    }
    if (strcmp(type, "ByteFallback") == 0) {
        if (ch->fuse)
            return duet_error(DUET_ERR_UNSUPPORTED, "%s: decoder: ByteFallback after Fuse", path);
        ch->byte_fallback = true;
        return DUET_OK;
    }
    if (strcmp(type, "Fuse") == 0) {
        ch->fuse = true;
        return DUET_OK;
    }
    if (strcmp(type, "Strip") == 0) {
        const cJSON *start = cJSON_GetObjectItemCaseSensitive(d, "start");
        const cJSON *stop = cJSON_GetObjectItemCaseSensitive(d, "stop");
        int32_t nstart = 0, nstop = 0;
        if ((st = duet__tok_req_string(d, "content", path, "decoder", &a)) != DUET_OK ||
            (st = duet__tok_int(start, path, "decoder.start", 1 << 16, &nstart)) != DUET_OK ||
            (st = duet__tok_int(stop, path, "decoder.stop", 1 << 16, &nstop)) != DUET_OK)
            return st;
        if (!ch->fuse || nstop != 0 || strlen(a) != 1 || (unsigned char)a[0] >= 0x80)
            return duet_error(DUET_ERR_UNSUPPORTED,
                              "%s: decoder: only Strip(one ASCII character, start, stop 0) after "
                              "Fuse is supported",
                              path);
        tok->strip_start = nstart;
        tok->strip_char = a[0];
        return DUET_OK;
    }
    return duet_error(DUET_ERR_UNSUPPORTED, "%s: decoder.type \"%s\" is not supported", path, type);
}

duet_status_t duet__tok_load_decoder(duet_tokenizer_t *tok, const cJSON *d)
{
    duet__tok_chain_t ch = {{NULL}, {NULL}, 0, false, false};
    duet_status_t st;

    if (d != NULL && !cJSON_IsNull(d)) {
        const char *type = duet__tok_type(d);
        if (type != NULL && strcmp(type, "Sequence") == 0) {
            const cJSON *it, *list = cJSON_GetObjectItemCaseSensitive(d, "decoders");
            if (!cJSON_IsArray(list))
                return duet_error(DUET_ERR_FORMAT, "%s: decoder.decoders: not an array", tok->path);
            cJSON_ArrayForEach(it, list)
            {
                if ((st = duet__tok_load_dec_step(tok, it, &ch)) != DUET_OK)
                    return st;
            }
        } else if ((st = duet__tok_load_dec_step(tok, d, &ch)) != DUET_OK) {
            return st;
        }
    }
    return duet__tok_decoder_prepare(tok, ch.from, ch.to, ch.n_replace, ch.byte_fallback);
}
