/* The tokenizer (tokenizer/tokenizer.h) on arbitrary bytes, for each
 * fixture family: SentencePiece BPE (stories260K, a Metaspace one) and
 * byte-level BPE (GPT-2, Llama-3, Qwen2 with NFC).
 *
 * Input: byte 0 picks the tokenizer (low 3 bits), add_special (bit 3) and
 * skip_special (bit 4); the rest is both the text to encode and, read as
 * 16-bit little-endian numbers, ids to decode (some out of range).
 * Checks: encoded ids are in the vocabulary; byte-level tokenizers without
 * a normalizer give the text back exactly (decode_bytes); the streaming
 * decoder (push per id, then flush) gives the same text as a whole decode;
 * out-of-range ids are refused, never read. */
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "fuzz/fuzz.h"
#include "tokenizer/tokenizer.h"

static const struct {
    const char *dir;
    bool exact; /* decode_bytes(encode(x)) == x */
} duet__fuzz_toks[] = {
    {"models/stories260K", false},
    {"tests/data/tokenizers/sp_metaspace", false},
    {"tests/data/tokenizers/bytelevel_gpt2", true},
    {"tests/data/tokenizers/bytelevel_llama3", true},
    {"tests/data/tokenizers/bytelevel_qwen2", false},
};
#define DUET__FUZZ_NTOK (sizeof(duet__fuzz_toks) / sizeof(duet__fuzz_toks[0]))
static duet_tokenizer_t *duet__fuzz_tok[DUET__FUZZ_NTOK];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    duet_fuzz_quiet();
    for (size_t i = 0; i < DUET__FUZZ_NTOK; i++)
        duet__fuzz_tok[i] = duet_fuzz_tokenizer(duet__fuzz_toks[i].dir);
    return 0;
}

static void duet__fuzz_encode(const duet_tokenizer_t *tok, bool exact, const char *text, size_t len,
                              bool add_special)
{
    int32_t *ids = NULL;
    size_t n = 0;
    char *bytes = NULL;
    size_t blen = 0;
    int vocab = duet_tokenizer_vocab_size(tok);

    if (duet_tokenizer_encode(tok, text, len, add_special, &ids, &n) != DUET_OK)
        return; /* only allocation failures may refuse */
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab) {
            fprintf(stderr, "encode produced id %d outside 0..%d\n", ids[i], vocab - 1);
            abort();
        }
    if (exact && !add_special) {
        if (duet_tokenizer_decode_bytes(tok, ids, n, false, &bytes, &blen) != DUET_OK)
            abort();
        if (blen != len || memcmp(bytes, text, len) != 0) {
            fprintf(stderr, "byte-level round trip lost bytes (%zu in, %zu out)\n", len, blen);
            abort();
        }
        duet_free(bytes);
    }
    duet_free(ids);
}

static void duet__fuzz_decode(const duet_tokenizer_t *tok, const uint8_t *data, size_t size,
                              bool skip)
{
    int vocab = duet_tokenizer_vocab_size(tok);
    size_t n = size / 2, cap = duet_detok_max_chunk(tok), got = 0, len;
    int32_t *ids = malloc((n ? n : 1) * sizeof(*ids));
    char *chunk = malloc(cap), *whole = NULL, *streamed;
    duet_detok_t *dt = NULL;
    duet_status_t st;

    if (ids == NULL || chunk == NULL)
        abort();
    for (size_t i = 0; i < n; i++) {
        int v = data[2 * i] | data[2 * i + 1] << 8;
        /* mostly valid ids, some just outside and some far outside */
        ids[i] = v < 0xF000 ? v % (vocab + 2) - 1 : v;
    }
    streamed = malloc(n * cap + cap + 1);
    if (streamed == NULL || duet_detok_create(tok, skip, &dt) != DUET_OK)
        abort();
    bool valid = true;
    for (size_t i = 0; i < n; i++) {
        st = duet_detok_push(dt, ids[i], chunk, cap, &len);
        if (ids[i] < 0 || ids[i] >= vocab) {
            if (st != DUET_ERR_INVALID)
                abort();
            valid = false;
            continue;
        }
        if (st != DUET_OK || len >= cap || chunk[len] != '\0')
            abort();
        memcpy(streamed + got, chunk, len);
        got += len;
    }
    st = duet_detok_flush(dt, chunk, cap, &len);
    if (st != DUET_OK)
        abort();
    memcpy(streamed + got, chunk, len);
    got += len;
    streamed[got] = '\0';
    duet_detok_destroy(dt);

    st = duet_tokenizer_decode(tok, ids, n, skip, &whole);
    if (valid) {
        if (st != DUET_OK)
            abort();
        /* a <0x00> piece decodes to a NUL byte: compare as C strings */
        size_t slen = strnlen(streamed, got);
        if (strlen(whole) != slen || memcmp(whole, streamed, slen) != 0) {
            fprintf(stderr, "streamed decode (%zu bytes) differs from a whole decode (%zu)\n", slen,
                    strlen(whole));
            abort();
        }
        duet_free(whole);
    } else if (st == DUET_OK) {
        fprintf(stderr, "decode accepted an out-of-range id\n");
        abort();
    }
    free(streamed);
    free(chunk);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    size_t which = (data[0] & 7) % DUET__FUZZ_NTOK;
    bool add_special = (data[0] & 8) != 0, skip = (data[0] & 16) != 0;
    const duet_tokenizer_t *tok = duet__fuzz_tok[which];

    duet__fuzz_encode(tok, duet__fuzz_toks[which].exact, (const char *)data + 1, size - 1,
                      add_special);
    duet__fuzz_decode(tok, data + 1, size - 1, skip);
    return 0;
}
