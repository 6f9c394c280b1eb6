/* tokenizer/: encode/decode against reference ids from an independent
 * implementation (tests/data/tokenizers/README.md), streaming decode,
 * malformed files, the synthetic writer, leaks and allocation failures. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <cjson/cJSON.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/json.h"
#include "common/status.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_text.h" /* scanners and NFC, tested directly */

static const char *src_dir(void)
{
    const char *d = getenv("DUET_SOURCE_DIR");
    if (d == NULL)
        fail_msg("DUET_SOURCE_DIR is not set (run through ctest)");
    return d;
}

static char *src_path(const char *rel)
{
    static char buf[4][1024];
    static int k;
    char *p = buf[k++ & 3];
    snprintf(p, sizeof(buf[0]), "%s/%s", src_dir(), rel);
    return p;
}

static duet_tokenizer_t *load_rel(const char *json_rel, const char *cfg_rel)
{
    duet_tokenizer_t *tok = NULL;
    duet_status_t st =
        duet_tokenizer_load_files(src_path(json_rel), cfg_rel ? src_path(cfg_rel) : NULL, &tok);
    if (st != DUET_OK)
        fail_msg("load %s: %s", json_rel, duet_error_msg());
    return tok;
}

/* Complete, valid UTF-8 (no character cut at the end). */
static bool utf8_complete(const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t k = c < 0x80                   ? 1
                   : (c >= 0xC2 && c <= 0xDF) ? 2
                   : (c >= 0xE0 && c <= 0xEF) ? 3
                   : (c >= 0xF0 && c <= 0xF4) ? 4
                                              : 0;
        if (k == 0 || i + k > n)
            return false;
        for (size_t j = 1; j < k; j++) {
            if (((unsigned char)s[i + j] & 0xC0) != 0x80)
                return false;
        }
        i += k;
    }
    return true;
}

static void expect_ids(const cJSON *want, const int32_t *ids, size_t n, const char *what,
                       const char *text)
{
    size_t wn = (size_t)cJSON_GetArraySize(want);
    bool same = wn == n;
    for (size_t i = 0; same && i < n; i++)
        same = (int32_t)cJSON_GetArrayItem(want, (int)i)->valuedouble == ids[i];
    if (!same) {
        fprintf(stderr, "%s mismatch for text \"%s\": got %zu ids:", what, text, n);
        for (size_t i = 0; i < n; i++)
            fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, "\n");
        fail_msg("%s differs from the reference", what);
    }
}

/* Streaming decode gives the whole decode, never a cut character. */
static void check_stream(const duet_tokenizer_t *tok, const int32_t *ids, size_t n, bool skip,
                         const char *whole)
{
    duet_detok_t *dt;
    size_t cap = duet_detok_max_chunk(tok), len, total = 0;
    char *chunk = malloc(cap), *acc = malloc(strlen(whole) + cap * 2 + 1);
    assert_int_equal(duet_detok_create(tok, skip, &dt), DUET_OK);
    for (size_t i = 0; i <= n; i++) {
        duet_status_t st = i < n ? duet_detok_push(dt, ids[i], chunk, cap, &len)
                                 : duet_detok_flush(dt, chunk, cap, &len);
        assert_int_equal(st, DUET_OK);
        assert_int_equal(strlen(chunk), len);
        if (!utf8_complete(chunk, len))
            fail_msg("chunk %zu ends inside a UTF-8 character", i);
        if (total + len > strlen(whole))
            fail_msg("streamed text is longer than the whole decode \"%s\"", whole);
        memcpy(acc + total, chunk, len);
        total += len;
    }
    acc[total] = '\0';
    assert_string_equal(acc, whole);
    duet_detok_destroy(dt);
    free(chunk);
    free(acc);
}

static void run_fixture(const char *ref_rel)
{
    cJSON *ref;
    long live = duet_alloc_live();
    assert_int_equal(duet_json_load_file(src_path(ref_rel), &ref), DUET_OK);
    const cJSON *tj = cJSON_GetObjectItem(ref, "tokenizer"),
                *cj = cJSON_GetObjectItem(ref, "config");
    duet_tokenizer_t *tok = load_rel(tj->valuestring, cJSON_IsString(cj) ? cj->valuestring : NULL);
    const cJSON *c;
    int count = 0;

    cJSON_ArrayForEach(c, cJSON_GetObjectItem(ref, "cases"))
    {
        const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
        int32_t *ids, *plain;
        size_t n, np;
        char *dec, *dec_sp;
        assert_int_equal(duet_tokenizer_encode(tok, text, strlen(text), true, &ids, &n), DUET_OK);
        assert_int_equal(duet_tokenizer_encode(tok, text, strlen(text), false, &plain, &np),
                         DUET_OK);
        expect_ids(cJSON_GetObjectItem(c, "ids"), ids, n, "ids", text);
        expect_ids(cJSON_GetObjectItem(c, "plain"), plain, np, "plain ids", text);
        assert_int_equal(duet_tokenizer_decode(tok, ids, n, true, &dec), DUET_OK);
        assert_int_equal(duet_tokenizer_decode(tok, ids, n, false, &dec_sp), DUET_OK);
        assert_string_equal(dec, cJSON_GetObjectItem(c, "decoded")->valuestring);
        assert_string_equal(dec_sp, cJSON_GetObjectItem(c, "decoded_special")->valuestring);
        check_stream(tok, ids, n, true, dec);
        check_stream(tok, ids, n, false, dec_sp);
        duet_free(ids);
        duet_free(plain);
        duet_free(dec);
        duet_free(dec_sp);
        count++;
    }
    assert_true(count > 100);
    duet_tokenizer_destroy(tok);
    cJSON_Delete(ref);
    assert_int_equal(duet_alloc_live(), live);
}

static void test_ref_stories260k(void **state)
{
    (void)state;
    run_fixture("tests/data/tokenizers/ref_stories260K.json");
}

static void test_ref_sp_metaspace(void **state)
{
    (void)state;
    run_fixture("tests/data/tokenizers/ref_sp_metaspace.json");
}

static void test_ref_bytelevel_gpt2(void **state)
{
    (void)state;
    run_fixture("tests/data/tokenizers/ref_bytelevel_gpt2.json");
}

static void test_ref_bytelevel_llama3(void **state)
{
    (void)state;
    run_fixture("tests/data/tokenizers/ref_bytelevel_llama3.json");
}

static void test_ref_bytelevel_qwen2(void **state)
{
    (void)state;
    run_fixture("tests/data/tokenizers/ref_bytelevel_qwen2.json");
}

static void test_stories260k_properties(void **state)
{
    (void)state;
    duet_tokenizer_t *tok = NULL;
    assert_int_equal(duet_tokenizer_load(src_path("models/stories260K"), &tok), DUET_OK);
    assert_int_equal(duet_tokenizer_vocab_size(tok), 512);
    assert_int_equal(duet_tokenizer_bos(tok), 1);
    assert_int_equal(duet_tokenizer_eos(tok), 2);
    assert_null(duet_tokenizer_chat_template(tok));
    assert_string_equal(duet_tokenizer_piece(tok, 1), "<s>");
    assert_string_equal(duet_tokenizer_piece(tok, 13), "<0x0A>");
    assert_null(duet_tokenizer_piece(tok, -1));
    assert_null(duet_tokenizer_piece(tok, 512));

    /* CJK goes through byte fallback: 3 <0xNN> ids per character */
    int32_t *ids;
    size_t n;
    assert_int_equal(duet_tokenizer_encode(tok, "\xe4\xbd\xa0", 3, false, &ids, &n), DUET_OK);
    assert_int_equal(n, 4); /* "▁" + 3 bytes */
    assert_int_equal(ids[1], 3 + 0xE4);
    assert_int_equal(ids[2], 3 + 0xBD);
    assert_int_equal(ids[3], 3 + 0xA0);
    duet_free(ids);
    duet_tokenizer_destroy(tok);
}

/* Byte-fallback tokens split a character: nothing comes out until it is
 * complete; bad sequences become U+FFFD; a small buffer rolls back. */
static void test_stream_partial_utf8(void **state)
{
    (void)state;
    duet_tokenizer_t *tok = load_rel("models/stories260K/tokenizer.json", NULL);
    duet_detok_t *dt;
    char out[64];
    size_t len;
    const int32_t b = 3; /* <0x00> */

    assert_int_equal(duet_detok_create(tok, true, &dt), DUET_OK);
    assert_int_equal(duet_detok_push(dt, 1, out, sizeof(out), &len), DUET_OK); /* <s> */
    assert_int_equal(len, 0);
    assert_int_equal(duet_detok_push(dt, b + 0xE4, out, sizeof(out), &len), DUET_OK);
    assert_int_equal(len, 0);
    assert_int_equal(duet_detok_push(dt, b + 0xBD, out, sizeof(out), &len), DUET_OK);
    assert_int_equal(len, 0);
    /* too small: error, and the state is as before */
    assert_int_equal(duet_detok_push(dt, b + 0xA0, out, 3, &len), DUET_ERR_TOO_LONG);
    assert_int_equal(duet_detok_push(dt, b + 0xA0, out, sizeof(out), &len), DUET_OK);
    assert_string_equal(out, "\xe4\xbd\xa0");
    /* truncated sequence followed by ASCII: one U+FFFD, then the text */
    assert_int_equal(duet_detok_push(dt, b + 0xE4, out, sizeof(out), &len), DUET_OK);
    assert_int_equal(len, 0);
    assert_int_equal(duet_detok_push(dt, b + 'A', out, sizeof(out), &len), DUET_OK);
    assert_string_equal(out, "\xef\xbf\xbd"
                             "A");
    /* a dangling lead byte is flushed as U+FFFD */
    assert_int_equal(duet_detok_push(dt, b + 0xF0, out, sizeof(out), &len), DUET_OK);
    assert_int_equal(len, 0);
    assert_int_equal(duet_detok_flush(dt, out, sizeof(out), &len), DUET_OK);
    assert_string_equal(out, "\xef\xbf\xbd");
    assert_int_equal(duet_detok_push(dt, 512, out, sizeof(out), &len), DUET_ERR_INVALID);
    assert_int_equal(duet_detok_push(dt, -1, out, sizeof(out), &len), DUET_ERR_INVALID);
    duet_detok_destroy(dt);

    /* the leading-space strip applies once, at the start of the stream */
    int32_t ids[] = {1, 261, 261};
    char *whole;
    assert_string_equal(duet_tokenizer_piece(tok, 261), "\xe2\x96\x81"
                                                        "a");
    assert_int_equal(duet_tokenizer_decode(tok, ids, 3, true, &whole), DUET_OK);
    assert_string_equal(whole, "a a");
    duet_free(whole);
    assert_int_equal(duet_tokenizer_decode(tok, ids, 3, false, &whole), DUET_OK);
    assert_string_equal(whole, "<s> a a");
    duet_free(whole);
    int32_t bad[] = {1, 600};
    assert_int_equal(duet_tokenizer_decode(tok, bad, 2, true, &whole), DUET_ERR_INVALID);
    duet_tokenizer_destroy(tok);
}

/* ---- malformed files ---- */

typedef struct {
    char dir[512];
} tmpdir_t;

static void tmp_make(tmpdir_t *t)
{
    const char *base = getenv("DUET_BINARY_DIR");
    snprintf(t->dir, sizeof(t->dir), "%s/tokenizer_test_XXXXXX", base ? base : "/tmp");
    assert_non_null(mkdtemp(t->dir));
}

static const char *tmp_write(tmpdir_t *t, const char *name, const char *content)
{
    static char path[4][600];
    static int k;
    char *p = path[k++ & 3];
    snprintf(p, sizeof(path[0]), "%s/%s", t->dir, name);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    fputs(content, f);
    fclose(f);
    return p;
}

static void tmp_remove(tmpdir_t *t)
{
    static const char *const names[] = {"tokenizer.json", "tokenizer_config.json", "bad.json",
                                        "syn_a.json", "syn_b.json"};
    char p[600];
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        snprintf(p, sizeof(p), "%s/%s", t->dir, names[i]);
        unlink(p);
    }
    rmdir(t->dir);
}

#define BL_PRE "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"use_regex\": true}, "
#define MINI_MODEL                                                                                 \
    "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a " \
    "b\"]}"

static void expect_load_error(tmpdir_t *t, const char *json, const char *config, duet_status_t want,
                              const char *needle)
{
    long live = duet_alloc_live();
    duet_tokenizer_t *tok = NULL;
    const char *jp = tmp_write(t, "tokenizer.json", json);
    const char *cp = config ? tmp_write(t, "tokenizer_config.json", config) : NULL;
    duet_status_t st = duet_tokenizer_load_files(jp, cp, &tok);
    if (st != want || strstr(duet_error_msg(), needle) == NULL)
        fail_msg("got %s \"%s\", want %s mentioning \"%s\"", duet_status_name(st), duet_error_msg(),
                 duet_status_name(want), needle);
    assert_null(tok);
    assert_int_equal(duet_alloc_live(), live);
}

static void test_errors(void **state)
{
    (void)state;
    tmpdir_t t;
    duet_tokenizer_t *tok = NULL;
    tmp_make(&t);

    assert_int_equal(duet_tokenizer_load(t.dir, &tok), DUET_ERR_IO);
    assert_non_null(strstr(duet_error_msg(), "tokenizer.json"));
    expect_load_error(&t, "{\"model\": {\"type\": \"BPE\",", NULL, DUET_ERR_FORMAT, "invalid JSON");
    expect_load_error(&t, "[1, 2]", NULL, DUET_ERR_FORMAT, "not a JSON object");
    expect_load_error(&t, "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0}}}", NULL,
                      DUET_ERR_UNSUPPORTED, "model.type \"WordPiece\"");
    expect_load_error(&t, "{\"model\": {\"type\": \"Unigram\", \"vocab\": [[\"a\", 0.0]]}}", NULL,
                      DUET_ERR_UNSUPPORTED, "Unigram");
    expect_load_error(&t,
                      "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2},"
                      " \"merges\": [\"a b\", \"a c\"]}}",
                      NULL, DUET_ERR_FORMAT, "model.merges[1]: \"c\" is not in the vocab");
    expect_load_error(&t,
                      "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1},"
                      " \"merges\": [[\"a\", \"b\"]]}}",
                      NULL, DUET_ERR_FORMAT, "\"ab\" is not in the vocab");
    expect_load_error(&t,
                      "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2},"
                      " \"merges\": [\"a b c\"]}}",
                      NULL, DUET_ERR_FORMAT, "model.merges[0]");
    expect_load_error(&t,
                      "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -3}, \"merges\": []}}",
                      NULL, DUET_ERR_FORMAT, "model.vocab[\"a\"]");
    expect_load_error(&t, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}}", NULL,
                      DUET_ERR_FORMAT, "model.merges");
    expect_load_error(&t,
                      "{\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": "
                      "\"Split\", \"pattern\": {\"Regex\": \"\\\\w+|\\\\s+\"}, \"behavior\": "
                      "\"Isolated\", \"invert\": false}, {\"type\": \"ByteLevel\", \"use_regex\": "
                      "false}]}, " MINI_MODEL "}",
                      NULL, DUET_ERR_UNSUPPORTED, "split regex \"\\w+|\\s+\"");
    expect_load_error(&t, "{\"normalizer\": {\"type\": \"NFKC\"}, " MINI_MODEL "}", NULL,
                      DUET_ERR_UNSUPPORTED, "normalizer.type \"NFKC\"");
    expect_load_error(&t, "{\"pre_tokenizer\": {\"type\": \"Whitespace\"}, " MINI_MODEL "}", NULL,
                      DUET_ERR_UNSUPPORTED, "pre_tokenizer.type \"Whitespace\"");
    expect_load_error(&t, "{\"decoder\": {\"type\": \"WordPiece\"}, " MINI_MODEL "}", NULL,
                      DUET_ERR_UNSUPPORTED, "decoder.type \"WordPiece\"");
    expect_load_error(&t,
                      "{\"added_tokens\": [{\"id\": 5, \"special\": true}], " BL_PRE MINI_MODEL "}",
                      NULL, DUET_ERR_FORMAT, "added_tokens[0].content");
    expect_load_error(&t, "{" BL_PRE MINI_MODEL "}", "{\"bos_token\": \"<nope>\"}", DUET_ERR_FORMAT,
                      "bos_token: \"<nope>\" is not a token");
    expect_load_error(&t, "{" BL_PRE MINI_MODEL "}", "{\"add_bos_token\": 1}", DUET_ERR_FORMAT,
                      "add_bos_token");
    expect_load_error(&t, "{" BL_PRE MINI_MODEL "}", "{oops", DUET_ERR_FORMAT,
                      "tokenizer_config.json");
    tmp_remove(&t);
}

/* Merge order: lowest rank first, leftmost among equal ranks (as Hugging
 * Face tokenizers; checked against @huggingface/tokenizers 0.2.0). */
static void test_bpe_order(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        int32_t ids[4];
        size_t n;
    } cases[] = {
        {"aaa", {2, 0}, 2},  {"aba", {0, 4}, 2},      {"abab", {0, 4, 1}, 3},
        {"aaaa", {2, 2}, 2}, {"aaaaa", {2, 2, 0}, 3}, {"", {0}, 0},
    };
    tmpdir_t t;
    duet_tokenizer_t *tok = NULL;
    tmp_make(&t);
    const char *p =
        tmp_write(&t, "tokenizer.json",
                  "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"aa\": "
                  "2, \"ab\": 3, \"ba\": 4}, \"merges\": [\"a a\", \"b a\", \"a b\"]}}");
    assert_int_equal(duet_tokenizer_load_files(p, NULL, &tok), DUET_OK);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int32_t *ids;
        size_t n;
        assert_int_equal(
            duet_tokenizer_encode(tok, cases[i].text, strlen(cases[i].text), true, &ids, &n),
            DUET_OK);
        assert_int_equal(n, cases[i].n);
        for (size_t k = 0; k < n; k++)
            assert_int_equal(ids[k], cases[i].ids[k]);
        duet_free(ids);
    }
    /* no decoder: pieces joined with a space; an unknown char is dropped */
    int32_t ids[] = {2, 0, 4};
    char *dec;
    assert_int_equal(duet_tokenizer_decode(tok, ids, 3, false, &dec), DUET_OK);
    assert_string_equal(dec, "aa a ba");
    duet_free(dec);
    check_stream(tok, ids, 3, false, "aa a ba");
    int32_t *enc;
    size_t n;
    assert_int_equal(duet_tokenizer_encode(tok, "axa", 3, false, &enc, &n), DUET_OK);
    assert_int_equal(n, 1); /* x has no symbol, so the two a's merge */
    assert_int_equal(enc[0], 2);
    duet_free(enc);
    duet_tokenizer_destroy(tok);
    tmp_remove(&t);
}

/* Model options and added-token flags on a tiny char-level model.  Ids were
 * checked with @huggingface/tokenizers 0.2.0, except single_word, which
 * that library ignores: here it follows the Rust crate (no match next to a
 * word character). */
static void test_model_options(void **state)
{
    (void)state;
    static const char *const texts[] = {"abc",  "axxa",  "<x>>",   "<x>", "a \xe3\x80\x80<r>  b",
                                        "a<w>", " <w> ", "ab<x>>c"};
    static const int32_t want[2][8][5] = {
        {{1, 5}, {1, 0, 1}, {9}, {8}, {1, 10, 2}, {1, 0}, {7, 11, 7}, {4, 9, 3}},
        {{6}, {1, 0, 0, 1}, {9}, {8}, {1, 10, 2}, {1, 0, 0, 0}, {7, 11, 7}, {4, 9, 3}},
    };
    static const size_t want_n[2][8] = {{2, 3, 1, 1, 3, 2, 3, 3}, {1, 4, 1, 1, 3, 4, 3, 3}};
    tmpdir_t t;
    tmp_make(&t);
    for (int v = 0; v < 2; v++) {
        char json[1400];
        snprintf(json, sizeof(json),
                 "{\"added_tokens\": ["
                 "{\"id\": 8, \"content\": \"<x>\", \"special\": true},"
                 "{\"id\": 9, \"content\": \"<x>>\", \"special\": false},"
                 "{\"id\": 10, \"content\": \"<r>\", \"lstrip\": true, \"rstrip\": true},"
                 "{\"id\": 11, \"content\": \"<w>\", \"single_word\": true}],"
                 " \"decoder\": {\"type\": \"Fuse\"},"
                 " \"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"fuse_unk\": %s,"
                 " \"ignore_merges\": %s, \"vocab\": {\"<unk>\": 0, \"a\": 1, \"b\": 2, \"c\": 3,"
                 " \"ab\": 4, \"bc\": 5, \"abc\": 6, \" \": 7}, \"merges\": [\"b c\", \"a b\"]}}",
                 v == 0 ? "true" : "false", v == 0 ? "false" : "true");
        duet_tokenizer_t *tok = NULL;
        assert_int_equal(
            duet_tokenizer_load_files(tmp_write(&t, "tokenizer.json", json), NULL, &tok), DUET_OK);
        for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
            int32_t *ids;
            size_t n;
            assert_int_equal(
                duet_tokenizer_encode(tok, texts[i], strlen(texts[i]), false, &ids, &n), DUET_OK);
            if (n != want_n[v][i])
                fail_msg("variant %d text \"%s\": %zu ids, want %zu", v, texts[i], n, want_n[v][i]);
            for (size_t k = 0; k < n; k++)
                assert_int_equal(ids[k], want[v][i][k]);
            duet_free(ids);
        }
        duet_tokenizer_destroy(tok);
    }
    tmp_remove(&t);
}

/* The Metaspace decoder (older Llama-2 files): the replacement becomes a
 * space, and is dropped from the first token unless prepend_scheme is never
 * (the Rust crate's rule; the JS library drops it always). */
static void test_metaspace_decoder(void **state)
{
    (void)state;
    static const char *const schemes[] = {"always", "never"};
    static const char *const want[] = {"a b a", " a b a"};
    int32_t ids[] = {0, 1, 2, 0};
    tmpdir_t t;
    tmp_make(&t);
    for (int v = 0; v < 2; v++) {
        char json[600];
        snprintf(
            json, sizeof(json),
            "{\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"\xe2\x96\x81\","
            " \"prepend_scheme\": \"%s\", \"split\": true},"
            " \"decoder\": {\"type\": \"Metaspace\", \"replacement\": \"\xe2\x96\x81\","
            " \"prepend_scheme\": \"%s\"},"
            " \"model\": {\"type\": \"BPE\", \"vocab\": {\"\xe2\x96\x81"
            "a\": 0,"
            " \"\xe2\x96\x81\": 1, \"b\": 2, \"a\": 3}, \"merges\": [[\"\xe2\x96\x81\", \"a\"]]}}",
            schemes[v], schemes[v]);
        duet_tokenizer_t *tok = NULL;
        char *dec;
        int32_t *enc;
        size_t n;
        assert_int_equal(
            duet_tokenizer_load_files(tmp_write(&t, "tokenizer.json", json), NULL, &tok), DUET_OK);
        assert_int_equal(duet_tokenizer_decode(tok, ids, 4, false, &dec), DUET_OK);
        assert_string_equal(dec, want[v]);
        check_stream(tok, ids, 4, false, dec);
        duet_free(dec);
        /* "a b a": spaces replaced, split before each replacement, prefix
         * unless never (ids checked with @huggingface/tokenizers 0.2.0) */
        assert_int_equal(duet_tokenizer_encode(tok, "a b a", 5, false, &enc, &n), DUET_OK);
        assert_int_equal(n, 4);
        assert_int_equal(enc[0], v == 0 ? 0 : 3);
        assert_int_equal(enc[1], 1);
        assert_int_equal(enc[2], 2);
        assert_int_equal(enc[3], 0);
        duet_free(enc);
        duet_tokenizer_destroy(tok);
    }
    tmp_remove(&t);
}

/* Pre-token boundaries of the hand-written scanners, per the regexes'
 * Oniguruma semantics (\s includes U+0085, excludes U+FEFF). */
static void test_split_scanners(void **state)
{
    (void)state;
    static const struct {
        duet__tok_split_t kind;
        const char *text, *want; /* pieces joined with '|' */
    } cases[] = {
        {DUET__TOK_SPLIT_GPT2, "Hello world", "Hello| world"},
        {DUET__TOK_SPLIT_GPT2, "it's IT'S", "it|'s| IT|'|S"},
        {DUET__TOK_SPLIT_GPT2, "1234567 x", "1234567| x"},
        {DUET__TOK_SPLIT_GPT2, "  hi  ", " | hi|  "},
        {DUET__TOK_SPLIT_GPT2, "hello!!!\n\nworld", "hello|!!!|\n|\n|world"},
        {DUET__TOK_SPLIT_GPT2, "a\xc2\x85!", "a|\xc2\x85|!"},
        {DUET__TOK_SPLIT_GPT2, "a\xef\xbb\xbf!", "a|\xef\xbb\xbf!"},
        {DUET__TOK_SPLIT_GPT2, "caf\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd",
         "caf\xc3\xa9| \xe4\xbd\xa0\xe5\xa5\xbd"},
        {DUET__TOK_SPLIT_LLAMA3, "1234567", "123|456|7"},
        {DUET__TOK_SPLIT_LLAMA3, "it's IT'S it'\xc5\xbf", "it|'s| IT|'S| it|'\xc5\xbf"},
        {DUET__TOK_SPLIT_LLAMA3, "x  \n\n  y", "x|  \n\n| | y"},
        {DUET__TOK_SPLIT_LLAMA3, "hello!!!\n\nworld", "hello|!!!\n\n|world"},
        {DUET__TOK_SPLIT_LLAMA3, "(hello) 'quoted'", "(hello|)| '|quoted|'"},
        {DUET__TOK_SPLIT_LLAMA3, "!\xc2\x85!", "!|\xc2\x85|!"},
        {DUET__TOK_SPLIT_LLAMA3, "a\tb\r\n", "a|\tb|\r\n"},
        {DUET__TOK_SPLIT_LLAMA3, "end   ", "end|   "},
        {DUET__TOK_SPLIT_QWEN2, "1234 ab", "1|2|3|4| ab"},
        {DUET__TOK_SPLIT_QWEN2, "\xe2\x80\x9cHi\xe2\x80\x9d", "\xe2\x80\x9cHi|\xe2\x80\x9d"},
        {DUET__TOK_SPLIT_QWEN2, "x\xff\xfey \xffz", "x|\xff\xfe|y| \xff|z"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *s = cases[i].text;
        size_t n = strlen(s);
        char got[128];
        size_t g = 0;
        for (size_t pos = 0; pos < n;) {
            size_t end = duet__tok_split_next(cases[i].kind, s, n, pos);
            assert_true(end > pos && end <= n);
            if (pos > 0)
                got[g++] = '|';
            memcpy(got + g, s + pos, end - pos);
            g += end - pos;
            pos = end;
        }
        got[g] = '\0';
        if (strcmp(got, cases[i].want) != 0)
            fail_msg("case %zu: split \"%s\" gave \"%s\"", i, cases[i].want, got);
    }
    assert_int_equal(duet__tok_split_lookup("\\w+"), DUET__TOK_SPLIT_NONE);
    for (int k = DUET__TOK_SPLIT_GPT2; k <= DUET__TOK_SPLIT_QWEN2; k++)
        assert_int_equal(duet__tok_split_lookup(duet__tok_split_pattern((duet__tok_split_t)k)), k);
}

static void test_nfc(void **state)
{
    (void)state;
    static const char *const cases[][2] = {
        {"plain ascii", "plain ascii"},
        {"e\xcc\x81", "\xc3\xa9"},                                /* e + acute */
        {"\xe2\x84\xab", "\xc3\x85"},                             /* angstrom sign */
        {"\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8", "\xea\xb0\x81"}, /* Hangul L V T */
        {"a\xcc\x81\xcc\x96", "\xc3\xa1\xcc\x96"},                /* reorder, then compose */
        {"a\xcc\x88\xcc\x81", "\xc3\xa4\xcc\x81"},                /* second mark blocked */
        {"\xcc\x81"
         "a\xff",
         "\xcc\x81"
         "a\xff"}, /* leading mark, bad byte */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        duet__tok_buf_t out = {0};
        assert_int_equal(duet__tok_nfc(cases[i][0], strlen(cases[i][0]), &out), DUET_OK);
        assert_string_equal(out.data, cases[i][1]);
        duet__tok_buf_free(&out);
    }
}

/* tokenizer_config.json variants: {"content"} objects, add_eos_token. */
static void test_config(void **state)
{
    (void)state;
    tmpdir_t t;
    duet_tokenizer_t *tok = NULL;
    int32_t *ids;
    size_t n;
    tmp_make(&t);
    const char *json =
        "{\"added_tokens\": [{\"id\": 3, \"content\": \"<B>\", \"special\": true},"
        " {\"id\": 4, \"content\": \"<E>\", \"special\": true}], " BL_PRE MINI_MODEL "}";
    tmp_write(&t, "tokenizer.json", json);
    tmp_write(&t, "tokenizer_config.json",
              "{\"bos_token\": {\"content\": \"<B>\"}, \"eos_token\": \"<E>\","
              " \"add_bos_token\": true, \"add_eos_token\": true,"
              " \"chat_template\": [{\"name\": \"tool\", \"template\": \"T\"},"
              " {\"name\": \"default\", \"template\": \"D\"}]}");
    assert_int_equal(duet_tokenizer_load(t.dir, &tok), DUET_OK);
    assert_int_equal(duet_tokenizer_bos(tok), 3);
    assert_int_equal(duet_tokenizer_eos(tok), 4);
    assert_string_equal(duet_tokenizer_chat_template(tok), "D");
    assert_int_equal(duet_tokenizer_encode(tok, "ab<E>a", 6, true, &ids, &n), DUET_OK);
    assert_int_equal(n, 5);
    assert_int_equal(ids[0], 3);
    assert_int_equal(ids[1], 2); /* merged "ab" */
    assert_int_equal(ids[2], 4); /* special matched in the text */
    assert_int_equal(ids[3], 0);
    assert_int_equal(ids[4], 4);
    duet_free(ids);
    duet_tokenizer_destroy(tok);
    tmp_remove(&t);

    /* Qwen2-style config: no bos, eos named, chat template */
    tok = load_rel("tests/data/tokenizers/bytelevel_qwen2/tokenizer.json",
                   "tests/data/tokenizers/bytelevel_qwen2/tokenizer_config.json");
    assert_int_equal(duet_tokenizer_bos(tok), -1);
    assert_string_equal(duet_tokenizer_piece(tok, duet_tokenizer_eos(tok)), "<|im_end|>");
    assert_non_null(strstr(duet_tokenizer_chat_template(tok), "<|im_start|>"));
    duet_tokenizer_destroy(tok);
}

/* decode_bytes(encode(x)) == x for any bytes, invalid UTF-8 included. */
static void check_byte_round_trip(const duet_tokenizer_t *tok, const char *x, size_t n)
{
    int32_t *ids;
    size_t k, len;
    char *bytes;
    assert_int_equal(duet_tokenizer_encode(tok, x, n, false, &ids, &k), DUET_OK);
    for (size_t i = 0; i < k; i++)
        assert_true(ids[i] >= 0 && ids[i] < duet_tokenizer_vocab_size(tok));
    assert_int_equal(duet_tokenizer_decode_bytes(tok, ids, k, false, &bytes, &len), DUET_OK);
    assert_int_equal(len, n);
    assert_memory_equal(bytes, x, n);
    duet_free(bytes);
    duet_free(ids);
}

static void random_bytes(uint32_t *seed, char *buf, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        *seed = *seed * 1103515245u + 12345u;
        buf[i] = (char)(*seed >> 16);
        if (buf[i] == '<')
            buf[i] = '>'; /* keep special-token spellings out */
    }
}

static void test_round_trip_bytes(void **state)
{
    (void)state;
    static const char *const fixtures[] = {
        "models/stories260K/tokenizer.json",
        "tests/data/tokenizers/bytelevel_gpt2/tokenizer.json",
        "tests/data/tokenizers/bytelevel_llama3/tokenizer.json",
    };
    uint32_t seed = 42;
    char buf[300];
    for (size_t f = 0; f < sizeof(fixtures) / sizeof(fixtures[0]); f++) {
        duet_tokenizer_t *tok = load_rel(fixtures[f], NULL);
        static const char mixed[] = "plain text, \xff\xfe invalid \xe4\xbd and \xc3";
        check_byte_round_trip(tok, mixed, sizeof(mixed) - 1);
        for (int r = 0; r < 50; r++) {
            size_t n = (size_t)(r * 7 % 300);
            random_bytes(&seed, buf, n);
            check_byte_round_trip(tok, buf, n);
        }
        duet_tokenizer_destroy(tok);
    }
}

/* ---- priming with a context ---- */

/* The text a continuation streams after the context: primed, or with
 * every context id pushed. */
static void continue_text(const duet_tokenizer_t *tok, const int32_t *ctx, size_t n_ctx,
                          const int32_t *more, size_t n_more, bool prime, char *acc, size_t cap)
{
    duet_detok_t *dt;
    size_t chunk_cap = duet_detok_max_chunk(tok), len, total = 0;
    char *chunk = malloc(chunk_cap);
    assert_non_null(chunk);
    assert_int_equal(duet_detok_create(tok, true, &dt), DUET_OK);
    if (prime)
        assert_int_equal(duet_detok_prime(dt, ctx, n_ctx), DUET_OK);
    else
        for (size_t i = 0; i < n_ctx; i++)
            assert_int_equal(duet_detok_push(dt, ctx[i], chunk, chunk_cap, &len), DUET_OK);
    for (size_t i = 0; i <= n_more; i++) {
        assert_int_equal(i < n_more ? duet_detok_push(dt, more[i], chunk, chunk_cap, &len)
                                    : duet_detok_flush(dt, chunk, chunk_cap, &len),
                         DUET_OK);
        assert_true(total + len < cap);
        memcpy(acc + total, chunk, len);
        total += len;
    }
    acc[total] = '\0';
    duet_detok_destroy(dt);
    free(chunk);
}

/* duet_detok_prime leaves the state pushing the whole context leaves:
 * random contexts heavy in byte tokens (UTF-8 cut across them), special
 * ids, short contexts (the start-of-text strip) and long ones (the tail
 * path), each continued by random ids, on every fixture; and an
 * out-of-range id is refused with the state kept. */
static void test_detok_prime(void **state)
{
    (void)state;
    static const char *const fixtures[] = {
        "models/stories260K/tokenizer.json",
        "tests/data/tokenizers/bytelevel_gpt2/tokenizer.json",
        "tests/data/tokenizers/bytelevel_llama3/tokenizer.json",
        "tests/data/tokenizers/bytelevel_qwen2/tokenizer.json",
    };
    static char want[1 << 16], got[1 << 16];
    int32_t ctx[400], more[12];
    uint32_t seed = 7;
    for (size_t f = 0; f < sizeof(fixtures) / sizeof(fixtures[0]); f++) {
        duet_tokenizer_t *tok = load_rel(fixtures[f], NULL);
        int vocab = duet_tokenizer_vocab_size(tok);
        for (int r = 0; r < 300; r++) {
            size_t n_ctx = (size_t)(r % 3 == 0 ? r % 7 : r % 400);
            for (size_t i = 0; i < n_ctx + 12; i++) {
                seed = seed * 1103515245u + 12345u;
                uint32_t x = seed >> 8;
                /* stories260K's byte tokens are ids 3..258, its specials
                 * 0..2; elsewhere any id */
                int32_t id = x % 4 == 0 ? (int32_t)(x / 4 % 3)
                             : x % 4 == 1 ? (int32_t)(3 + x / 4 % 256)
                                          : (int32_t)(x / 4 % (uint32_t)vocab);
                if (i < n_ctx)
                    ctx[i] = id;
                else
                    more[i - n_ctx] = id;
            }
            continue_text(tok, ctx, n_ctx, more, 12, false, want, sizeof(want));
            continue_text(tok, ctx, n_ctx, more, 12, true, got, sizeof(got));
            if (strcmp(want, got) != 0)
                fail_msg("%s, context of %zu ids (case %d): primed \"%s\", pushed \"%s\"",
                         fixtures[f], n_ctx, r, got, want);
        }
        duet_detok_t *dt;
        char out[64];
        size_t len;
        int32_t bad[] = {5, vocab, 6};
        assert_int_equal(duet_detok_create(tok, true, &dt), DUET_OK);
        assert_int_equal(duet_detok_prime(dt, bad, 3), DUET_ERR_INVALID);
        assert_non_null(strstr(duet_error_msg(), "position 1"));
        /* nothing was fed: the stream starts as a fresh one */
        int32_t one = 3 + 'A';
        continue_text(tok, NULL, 0, &one, 1, false, want, sizeof(want));
        assert_int_equal(duet_detok_push(dt, one, out, sizeof(out), &len), DUET_OK);
        assert_string_equal(out, want);
        duet_detok_destroy(dt);
        duet_tokenizer_destroy(tok);
    }
}

/* ---- synthetic writer ---- */

static void test_synthetic(void **state)
{
    (void)state;
    static const int sizes[] = {260, 512, 1000};
    static const char *const texts[] = {
        "Hello world! The quick brown fox.", "  spaces\tand\nnewlines  ",
        "caf\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x98\x80", "digits 0123456789", ""};
    tmpdir_t t;
    long live = duet_alloc_live();
    tmp_make(&t);
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        int v = sizes[s];
        char *a, *b;
        size_t alen, blen;
        const char *pa = tmp_write(&t, "syn_a.json", "");
        const char *pb = tmp_write(&t, "syn_b.json", "");
        assert_int_equal(duet_tokenizer_write_synthetic(pa, v), DUET_OK);
        assert_int_equal(duet_tokenizer_write_synthetic(pb, v), DUET_OK);
        assert_int_equal(duet_file_read(pa, &a, &alen), DUET_OK);
        assert_int_equal(duet_file_read(pb, &b, &blen), DUET_OK);
        assert_int_equal(alen, blen);
        assert_memory_equal(a, b, alen);
        duet_free(a);
        duet_free(b);

        duet_tokenizer_t *tok = NULL;
        assert_int_equal(duet_tokenizer_load_files(pa, NULL, &tok), DUET_OK);
        assert_int_equal(duet_tokenizer_vocab_size(tok), v);
        assert_int_equal(duet_tokenizer_bos(tok), v - 2);
        assert_int_equal(duet_tokenizer_eos(tok), v - 1);
        assert_string_equal(duet_tokenizer_piece(tok, v - 2), "<|bos|>");
        assert_string_equal(duet_tokenizer_piece(tok, v - 1), "<|eos|>");
        for (int id = 0; id < v; id++)
            assert_non_null(duet_tokenizer_piece(tok, id));
        for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
            int32_t *ids;
            size_t n;
            char *dec;
            assert_int_equal(duet_tokenizer_encode(tok, texts[i], strlen(texts[i]), true, &ids, &n),
                             DUET_OK);
            assert_true(n >= 1);
            assert_int_equal(ids[0], v - 2);
            assert_int_equal(duet_tokenizer_decode(tok, ids, n, true, &dec), DUET_OK);
            assert_string_equal(dec, texts[i]);
            check_stream(tok, ids, n, true, dec);
            duet_free(dec);
            duet_free(ids);
            check_byte_round_trip(tok, texts[i], strlen(texts[i]));
        }
        check_byte_round_trip(tok, "\x80\xff\xc3(\xe4\xbd", 6);
        /* merges were learned: common words are few tokens */
        int32_t *ids;
        size_t n, n_the;
        assert_int_equal(duet_tokenizer_encode(tok, " the", 4, false, &ids, &n_the), DUET_OK);
        duet_free(ids);
        assert_true(v > 300 ? n_the == 1 : n_the <= 3);
        assert_int_equal(duet_tokenizer_encode(tok, "<|eos|>", 7, false, &ids, &n), DUET_OK);
        assert_int_equal(n, 1);
        assert_int_equal(ids[0], v - 1);
        duet_free(ids);
        duet_tokenizer_destroy(tok);
    }
    assert_int_equal(duet_tokenizer_write_synthetic(src_path("x.json"), 259), DUET_ERR_INVALID);
    assert_int_equal(duet_tokenizer_write_synthetic("/nonexistent-dir/tok.json", 300), DUET_ERR_IO);
    tmp_remove(&t);
    assert_int_equal(duet_alloc_live(), live);
}

/* ---- allocation failures ---- */

static void test_alloc_failures(void **state)
{
    (void)state;
    tmpdir_t t;
    tmp_make(&t);
    const char *syn = tmp_write(&t, "syn_a.json", "");
    const char *json = src_path("tests/data/tokenizers/bytelevel_qwen2/tokenizer.json");
    const char *cfg = src_path("tests/data/tokenizers/bytelevel_qwen2/tokenizer_config.json");
    const char *sp = src_path("models/stories260K/tokenizer.json");
    const char *text = "Caf\xc3\xa9 e\xcc\x81 <|im_start|>hello 123, world!";
    int loads = 0, steps = 0;

    for (long n = 0; n < 100000 && steps < 4; n++) {
        long live = duet_alloc_live();
        duet_tokenizer_t *tok = NULL;
        duet_detok_t *dt = NULL;
        int32_t *ids = NULL;
        size_t k;
        char *dec = NULL;
        duet_status_t st;

        duet_alloc_fail_after(n);
        switch (steps) {
        case 0:
            st = duet_tokenizer_load_files(json, cfg, &tok);
            break;
        case 1:
            st = duet_tokenizer_load_files(sp, NULL, &tok);
            break;
        case 2:
            st = duet_tokenizer_write_synthetic(syn, 300);
            break;
        default: /* encode + decode + detok on a loaded tokenizer */
            duet_alloc_fail_after(-1);
            assert_int_equal(duet_tokenizer_load_files(json, cfg, &tok), DUET_OK);
            duet_alloc_fail_after(n);
            st = duet_tokenizer_encode(tok, text, strlen(text), true, &ids, &k);
            if (st == DUET_OK)
                st = duet_tokenizer_decode(tok, ids, k, false, &dec);
            if (st == DUET_OK)
                st = duet_detok_create(tok, false, &dt);
            break;
        }
        duet_alloc_fail_after(-1);
        if (st != DUET_OK) {
            assert_true(st == DUET_ERR_NO_MEMORY);
            if (steps < 3)
                assert_null(tok);
        } else {
            loads++;
            steps++;
            n = -1;
        }
        duet_detok_destroy(dt);
        duet_free(dec);
        duet_free(ids);
        duet_tokenizer_destroy(tok);
        assert_int_equal(duet_alloc_live(), live);
    }
    assert_int_equal(loads, 4);
    tmp_remove(&t);
}

/* ---- speed: an 8k-token prompt ---- */

static void test_long_prompt(void **state)
{
    (void)state;
    static const char *const fixtures[] = {
        "models/stories260K/tokenizer.json",
        "tests/data/tokenizers/bytelevel_llama3/tokenizer.json",
        "tests/data/tokenizers/bytelevel_qwen2/tokenizer.json",
    };
    const char *para = "Once upon a time, there was a little girl named Lily. She loved to play "
                       "outside in the sunshine with her dog, Max. \"Let's go!\" she said.\n";
    size_t plen = strlen(para), reps = 8192 * 4 / plen + 1, n = plen * reps;
    char *text = malloc(n + 1);
    for (size_t i = 0; i < reps; i++)
        memcpy(text + i * plen, para, plen);
    text[n] = '\0';
    for (size_t f = 0; f < sizeof(fixtures) / sizeof(fixtures[0]); f++) {
        duet_tokenizer_t *tok = load_rel(fixtures[f], NULL);
        int32_t *ids;
        size_t k;
        char *dec;
        int64_t t0 = duet_now_ns();
        assert_int_equal(duet_tokenizer_encode(tok, text, n, false, &ids, &k), DUET_OK);
        double ms = (double)(duet_now_ns() - t0) / 1e6;
        printf("# %s: %zu bytes -> %zu tokens in %.2f ms\n", fixtures[f], n, k, ms);
        assert_true(k >= 8000);
        /* generous bound (sanitizers, shared CPU); a quadratic merge loop
         * takes seconds here */
        assert_true(ms < 500.0);
        assert_int_equal(duet_tokenizer_decode(tok, ids, k, true, &dec), DUET_OK);
        assert_string_equal(dec, text);
        duet_free(dec);
        duet_free(ids);
        duet_tokenizer_destroy(tok);
    }
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ref_stories260k),
        cmocka_unit_test(test_ref_sp_metaspace),
        cmocka_unit_test(test_ref_bytelevel_gpt2),
        cmocka_unit_test(test_ref_bytelevel_llama3),
        cmocka_unit_test(test_ref_bytelevel_qwen2),
        cmocka_unit_test(test_stories260k_properties),
        cmocka_unit_test(test_stream_partial_utf8),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_bpe_order),
        cmocka_unit_test(test_model_options),
        cmocka_unit_test(test_metaspace_decoder),
        cmocka_unit_test(test_split_scanners),
        cmocka_unit_test(test_nfc),
        cmocka_unit_test(test_config),
        cmocka_unit_test(test_round_trip_bytes),
        cmocka_unit_test(test_detok_prime),
        cmocka_unit_test(test_synthetic),
        cmocka_unit_test(test_alloc_failures),
        cmocka_unit_test(test_long_prompt),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
