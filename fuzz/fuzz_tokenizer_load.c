/* tokenizer.json (+ tokenizer_config.json) loading (tokenizer/tokenizer.h).
 *
 * Input: tokenizer.json, optionally followed by a NUL byte and
 * tokenizer_config.json.  A tokenizer that loads is then used: a short
 * text is encoded, and the ids decoded, so that tables built from a hostile
 * file are exercised too.
 *
 * Inputs naming a number >= 10^6 are skipped: token ids go up to the
 * loader's cap (2^24) and tables are sized by the largest id, a cost linear
 * in it and bounded (a 258-token file with id 2^24 - 1 loads in 0.16 s and
 * 200 MB without sanitizers, measured when the fuzzer first reported it as
 * a 10 s timeout under ASan); below 10^6 the harness stays fast. */
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "fuzz/fuzz.h"
#include "tokenizer/tokenizer.h"

static char *duet__fuzz_json, *duet__fuzz_cfg;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    duet_fuzz_quiet();
    duet__fuzz_json = duet_fuzz_path("tok/tokenizer.json");
    duet__fuzz_cfg = duet_fuzz_path("tok/tokenizer_config.json");
    return 0;
}

static bool duet__fuzz_big_number(const uint8_t *data, size_t size)
{
    char buf[32];
    for (size_t i = 0; i < size; i++) {
        if (data[i] < '0' || data[i] > '9' ||
            (i > 0 && (data[i - 1] == '.' || data[i - 1] == '-' ||
                       (data[i - 1] >= '0' && data[i - 1] <= '9'))))
            continue;
        size_t n = 0;
        while (i + n < size && n < sizeof(buf) - 1 && strchr("0123456789.eE+-", data[i + n]) &&
               data[i + n] != '\0')
            n++;
        memcpy(buf, data + i, n);
        buf[n] = '\0';
        if (strtod(buf, NULL) >= 1e6 || n == sizeof(buf) - 1)
            return true;
    }
    return false;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char text[] = "Hello, world! <s> \xe2\x96\x81x \xff\xfe 123  \n\tend</s>";
    const uint8_t *nul = memchr(data, 0, size);
    size_t jlen = nul ? (size_t)(nul - data) : size;
    duet_tokenizer_t *tok = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    char *out = NULL;

    if (duet__fuzz_big_number(data, size))
        return 0;
    duet_fuzz_write(duet__fuzz_json, data, jlen);
    if (nul != NULL)
        duet_fuzz_write(duet__fuzz_cfg, nul + 1, size - jlen - 1);
    if (duet_tokenizer_load_files(duet__fuzz_json, nul ? duet__fuzz_cfg : NULL, &tok) != DUET_OK)
        return 0;
    int vocab = duet_tokenizer_vocab_size(tok);
    if (duet_tokenizer_bos(tok) >= vocab || duet_tokenizer_eos(tok) >= vocab)
        abort();
    if (duet_tokenizer_encode(tok, text, sizeof(text) - 1, true, &ids, &n) == DUET_OK) {
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= vocab)
                abort();
        if (duet_tokenizer_decode(tok, ids, n, false, &out) == DUET_OK)
            duet_free(out);
        duet_free(ids);
    }
    for (int32_t id = -1; id <= vocab && id < 300; id++)
        (void)duet_tokenizer_piece(tok, id);
    (void)duet_tokenizer_chat_template(tok);
    duet_tokenizer_destroy(tok);
    return 0;
}
