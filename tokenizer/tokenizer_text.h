/* Text primitives of the tokenizer (internal): UTF-8 stepping, the coarse
 * Unicode classes used by the split patterns, NFC, the GPT-2 byte <-> code
 * point table, the hand-written scanners for the known split regexes, and a
 * growable byte buffer.  All functions are pure or work on caller state, so
 * they are thread-safe. */
#ifndef DUET_TOKENIZER_TOKENIZER_TEXT_H
#define DUET_TOKENIZER_TOKENIZER_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* ---- generated tables (tokenizer/tokenizer_unicode_tables.c) ---- */

typedef struct {
    uint32_t first, last, value;
} duet__tok_range_t;

typedef struct {
    uint32_t a, b, c;
} duet__tok_decomp_t;

typedef enum {
    DUET__TOK_CLS_OTHER = 0,
    DUET__TOK_CLS_LETTER = 1,
    DUET__TOK_CLS_NUMBER = 2,
    DUET__TOK_CLS_MARK = 3,
    DUET__TOK_CLS_CONNECTOR = 4,
} duet__tok_cls_t;

extern const char duet__tok_unicode_version[];
extern const duet__tok_range_t duet__tok_cls_ranges[];
extern const size_t duet__tok_cls_ranges_n;
extern const duet__tok_range_t duet__tok_ccc_ranges[];
extern const size_t duet__tok_ccc_ranges_n;
extern const duet__tok_decomp_t duet__tok_decomp[]; /* {cp, first, second|0} by cp */
extern const size_t duet__tok_decomp_n;
extern const duet__tok_decomp_t duet__tok_comp[]; /* {first, second, composite} */
extern const size_t duet__tok_comp_n;

/* ---- UTF-8 ---- */

/* Code points above this stand for one invalid byte b as (INVALID_BASE + b):
 * they are classified as "other" and written back as the raw byte. */
#define DUET__TOK_INVALID_BASE 0x110000u

/* Decode the character at s[pos] (pos < len).  Returns its byte length (>= 1)
 * and sets *cp; an invalid or truncated sequence is one byte long and gives
 * DUET__TOK_INVALID_BASE + that byte. */
size_t duet__tok_utf8_next(const char *s, size_t len, size_t pos, uint32_t *cp);
/* Encode cp (or an invalid-byte stand-in) into out[4]; returns the length. */
size_t duet__tok_utf8_put(uint32_t cp, char *out);

/* Coarse general category of cp. */
duet__tok_cls_t duet__tok_cls(uint32_t cp);
/* White_Space (what Oniguruma's \s matches). */
bool duet__tok_is_space(uint32_t cp);

/* ---- growable byte buffer (duet_malloc) ---- */

typedef struct {
    char *data;
    size_t len, cap;
} duet__tok_buf_t;

duet_status_t duet__tok_buf_reserve(duet__tok_buf_t *b, size_t extra);
duet_status_t duet__tok_buf_put(duet__tok_buf_t *b, const void *data, size_t n);
void duet__tok_buf_free(duet__tok_buf_t *b);

/* Append the NFC form of s[0..len) to out (invalid bytes pass through). */
duet_status_t duet__tok_nfc(const char *s, size_t len, duet__tok_buf_t *out);

/* ---- GPT-2 byte-level alphabet ---- */

/* The code point that byte b is written as (bytes_to_unicode). */
uint32_t duet__tok_byte_to_cp(uint8_t b);
/* Inverse: the byte for cp, or -1 when cp is not in the alphabet. */
int duet__tok_cp_to_byte(uint32_t cp);

/* ---- split patterns ---- */

typedef enum {
    DUET__TOK_SPLIT_NONE = 0,
    DUET__TOK_SPLIT_GPT2,   /* GPT-2 ByteLevel regex */
    DUET__TOK_SPLIT_LLAMA3, /* Llama-3: \p{N}{1,3} */
    DUET__TOK_SPLIT_QWEN2,  /* Qwen2: \p{N} */
} duet__tok_split_t;

/* The scanner for a regex string from a tokenizer.json Split, or
 * DUET__TOK_SPLIT_NONE when the pattern is not one of the known ones. */
duet__tok_split_t duet__tok_split_lookup(const char *pattern);
/* The regex string of a split kind (for messages and the synthetic writer). */
const char *duet__tok_split_pattern(duet__tok_split_t kind);
/* End of the match that starts at pos (pos < len); matches tile the text. */
size_t duet__tok_split_next(duet__tok_split_t kind, const char *s, size_t len, size_t pos);

#endif
