/* The tokenizer object shared by tokenizer.c (loading), tokenizer_encode.c,
 * tokenizer_decode.c and tokenizer_synth.c.  Internal. */
#ifndef DUET_TOKENIZER_TOKENIZER_INTERNAL_H
#define DUET_TOKENIZER_TOKENIZER_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_text.h"

typedef enum {
    DUET__TOK_NORM_PREPEND, /* a: text to prepend to a non-empty segment */
    DUET__TOK_NORM_REPLACE, /* a -> b, literal */
    DUET__TOK_NORM_NFC,
} duet__tok_norm_kind_t;

typedef struct {
    duet__tok_norm_kind_t kind;
    char *a, *b; /* duet_malloc'd, NUL-terminated */
} duet__tok_norm_t;

typedef enum {
    DUET__TOK_PREPEND_ALWAYS,
    DUET__TOK_PREPEND_FIRST,
    DUET__TOK_PREPEND_NEVER,
} duet__tok_prepend_t;

typedef struct {
    int32_t id;
    uint32_t off, len; /* content in the piece arena */
    bool special, normalized, lstrip, rstrip, single_word;
} duet__tok_added_t;

/* Decoder step applied to each token before the bytes are joined. */
typedef enum {
    DUET__TOK_DEC_NONE,      /* no decoder: tokens joined with " " */
    DUET__TOK_DEC_CHAIN,     /* Replace*, ByteFallback?, Fuse?, Strip? */
    DUET__TOK_DEC_BYTELEVEL, /* ByteLevel */
    DUET__TOK_DEC_METASPACE, /* Metaspace */
} duet__tok_dec_kind_t;

typedef struct {
    uint64_t key; /* left id << 32 | right id; UINT64_MAX: empty slot */
    int32_t rank;
    int32_t id;
} duet__tok_merge_t;

struct duet_tokenizer {
    char *path; /* tokenizer.json path, for messages */

    /* pieces: id -> text in one arena; piece_len[i] == UINT32_MAX: no piece */
    int32_t n_ids;
    duet__tok_buf_t arena;
    uint32_t *piece_off, *piece_len;

    /* model vocab: open addressing, slot holds id or -1 */
    int32_t *vhash;
    uint32_t vhash_mask;
    duet__tok_merge_t *mhash;
    uint64_t mhash_mask;
    int32_t n_merges;
    bool byte_fallback, fuse_unk, ignore_merges;
    int32_t unk_id;         /* -1: none */
    int32_t byte_tok[256];  /* <0xNN> ids, -1 when missing */
    int32_t byte_char[256]; /* byte-level: id of the mapped character, -1 when missing */
    char byte_utf8[256][3]; /* byte-level: UTF-8 of the mapped character */
    uint8_t byte_utf8_len[256];

    /* normalizer */
    duet__tok_norm_t *norm;
    int n_norm;

    /* pre-tokenizer */
    duet__tok_split_t split;
    bool byte_level;             /* map bytes to the GPT-2 alphabet */
    bool bl_prefix_before_split; /* ByteLevel(use_regex) add_prefix_space */
    bool bl_prefix_per_word;     /* Split, then ByteLevel(add_prefix_space) */
    bool metaspace;
    char ms_repl[8];
    duet__tok_prepend_t ms_prepend;
    bool ms_split;

    /* added tokens, longest first; added_first[b]..added_first[b+1] index the
     * ones whose content starts with byte b */
    duet__tok_added_t *added;
    int n_added;
    int32_t added_first[257];
    bool any_normalized_added;
    uint8_t *special; /* [n_ids] 1 for special added tokens */

    /* post-processing */
    int32_t *prefix, *suffix;
    int n_prefix, n_suffix;
    int32_t bos, eos;
    char *chat_template;

    /* decoder: per-id bytes after the per-token steps */
    duet__tok_dec_kind_t dec_kind;
    uint32_t *dec_off, *dec_len;
    char *dec_arena;
    int strip_start; /* leading strip_char to strip from the decoded text */
    char strip_char;
    char dec_repl[8];        /* Metaspace decoder replacement */
    bool dec_ms_strip_first; /* Metaspace: drop it from the first token */
    size_t max_dec_len;
};

/* FNV-1a over len bytes. */
uint64_t duet__tok_hash(const char *s, size_t len);
/* Model vocab lookup (not added tokens); -1 when absent. */
int32_t duet__tok_vocab_find(const duet_tokenizer_t *tok, const char *s, size_t len);
/* Merge of (left, right): 1 and sets rank / merged id, or 0. */
int duet__tok_merge_find(const duet_tokenizer_t *tok, int32_t left, int32_t right, int32_t *rank,
                         int32_t *id);
/* JSON helpers (tokenizer.c); messages name path and where.key. */
const char *duet__tok_type(const cJSON *obj);
duet_status_t duet__tok_opt_bool(const cJSON *obj, const char *key, const char *path,
                                 const char *where, bool *out);
duet_status_t duet__tok_req_string(const cJSON *obj, const char *key, const char *path,
                                   const char *where, const char **out);
duet_status_t duet__tok_int(const cJSON *v, const char *path, const char *where, int32_t max,
                            int32_t *out);
duet_status_t duet__tok_pattern_string(const cJSON *obj, const char *path, const char *where,
                                       const char **out);
duet_status_t duet__tok_ids_append(duet_tokenizer_t *tok, int32_t **ids, int *n, int32_t id);

/* Pipeline sections (tokenizer_pipeline.c); NULL / null means none. */
duet_status_t duet__tok_load_normalizer(duet_tokenizer_t *tok, const cJSON *n, int depth);
duet_status_t duet__tok_load_pretok(duet_tokenizer_t *tok, const cJSON *p);
duet_status_t duet__tok_load_postproc(duet_tokenizer_t *tok, const cJSON *p, int depth);
duet_status_t duet__tok_load_decoder(duet_tokenizer_t *tok, const cJSON *d);

/* Build the decoder's per-id byte table (called once at the end of load). */
duet_status_t duet__tok_decoder_prepare(duet_tokenizer_t *tok, const char *replace_from[],
                                        const char *replace_to[], int n_replace,
                                        bool byte_fallback);

#endif
