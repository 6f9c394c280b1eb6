/* model/safetensors, model/model_config, engine/model: the validation
 * matrix (bad files are written into a temp dir), sharded checkpoints, the
 * writer, stories260K, fingerprints and out-of-memory unwinding. */
#include <dirent.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/alloc.h"
#include "common/json.h"
#include "common/status.h"
#include "engine/model.h"
#include "model/model_config.h"
#include "model/rope.h"
#include "model/safetensors.h"

static char tmpdir[256];

static int setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/duet-test-loader-XXXXXX");
    return mkdtemp(tmpdir) == NULL ? -1 : 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static void path_of(char *buf, size_t n, const char *sub, const char *name)
{
    snprintf(buf, n, "%s/%s%s%s", tmpdir, sub, sub[0] ? "/" : "", name);
}

static void write_bytes(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

static void write_text(const char *path, const char *text)
{
    write_bytes(path, text, strlen(text));
}

/* u64 header length, the header, data_size bytes of pattern. */
static void write_st_raw(const char *path, uint64_t hlen, const char *header, size_t data_size)
{
    size_t len = strlen(header);
    unsigned char *buf = malloc(8 + len + data_size + 1);
    assert_non_null(buf);
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)(hlen >> (8 * i));
    memcpy(buf + 8, header, len);
    for (size_t i = 0; i < data_size; i++)
        buf[8 + len + i] = (unsigned char)i;
    write_bytes(path, buf, 8 + len + data_size);
    free(buf);
}

static void write_st(const char *path, const char *header, size_t data_size)
{
    write_st_raw(path, strlen(header), header, data_size);
}

/* Opening `header` + data must fail with st and a message holding each of
 * the NULL-terminated substrings. */
static void expect_st_error(const char *header, size_t data_size, duet_status_t want, ...)
{
    char path[512];
    duet_st_set_t *set = NULL;
    long live = duet_alloc_live();
    va_list ap;
    const char *sub;

    path_of(path, sizeof(path), "", "model.safetensors");
    write_st(path, header, data_size);
    duet_error_clear();
    duet_status_t st = duet_st_open_file(path, &set);
    if (st != want)
        fail_msg("header %s: got %s (%s), want %s", header, duet_status_name(st), duet_error_msg(),
                 duet_status_name(want));
    assert_null(set);
    assert_non_null(strstr(duet_error_msg(), path));
    va_start(ap, want);
    while ((sub = va_arg(ap, const char *)) != NULL) {
        if (strstr(duet_error_msg(), sub) == NULL)
            fail_msg("message '%s' lacks '%s'", duet_error_msg(), sub);
    }
    va_end(ap);
    assert_int_equal(duet_alloc_live(), live);
}

static void test_st_bad_files(void **state)
{
    (void)state;
    char path[512];
    duet_st_set_t *set = NULL;

    path_of(path, sizeof(path), "", "short.safetensors");
    write_bytes(path, "\x02\0\0\0\0", 5);
    assert_int_equal(duet_st_open_file(path, &set), DUET_ERR_FORMAT);
    assert_non_null(strstr(duet_error_msg(), "short.safetensors: file is 5 bytes"));

    path_of(path, sizeof(path), "", "long.safetensors");
    write_st_raw(path, 1000, "{}", 4);
    assert_int_equal(duet_st_open_file(path, &set), DUET_ERR_FORMAT);
    assert_non_null(strstr(duet_error_msg(), "long.safetensors: header length 1000 exceeds"));

    path_of(path, sizeof(path), "", "missing.safetensors");
    assert_int_equal(duet_st_open_file(path, &set), DUET_ERR_NOT_FOUND);
    assert_non_null(strstr(duet_error_msg(), "missing.safetensors"));
    assert_null(set);
}

static void test_st_bad_headers(void **state)
{
    (void)state;
    const char *T = "model.layers.0.self_attn.q_proj.weight";

    expect_st_error("{\"w\": {\"dtype\": \"F32\"", 0, DUET_ERR_FORMAT, "not valid JSON", NULL);
    expect_st_error("[1, 2]", 0, DUET_ERR_FORMAT, "not a JSON object", NULL);
    expect_st_error("{} x", 0, DUET_ERR_FORMAT, "after the JSON object", NULL);
    expect_st_error("{\"w\": 3}", 0, DUET_ERR_FORMAT, "tensor w: entry is not an object", NULL);
    expect_st_error("{\"w\": {\"shape\": [1], \"data_offsets\": [0, 4]}}", 4, DUET_ERR_FORMAT,
                    "tensor w: missing dtype", NULL);
    expect_st_error("{\"w\": {\"dtype\": \"F32\", \"data_offsets\": [0, 4]}}", 4, DUET_ERR_FORMAT,
                    "tensor w: missing shape", NULL);
    expect_st_error("{\"w\": {\"dtype\": \"F32\", \"shape\": [1]}}", 4, DUET_ERR_FORMAT,
                    "tensor w: missing data_offsets", NULL);
    expect_st_error("{\"w\": {\"dtype\": \"F33\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 4,
                    DUET_ERR_FORMAT, "tensor w: unknown dtype \"F33\"", NULL);
    expect_st_error("{\"w\": {\"dtype\": \"F64\", \"shape\": [1], \"data_offsets\": [0, 8]}}", 8,
                    DUET_ERR_UNSUPPORTED, "tensor w: dtype F64 is not supported", NULL);
    expect_st_error("{\"w\": {\"dtype\": \"F32\", \"shape\": [-1, 2], \"data_offsets\": [0, 4]}}",
                    4, DUET_ERR_FORMAT, "tensor w: shape[0] is not a non-negative integer", NULL);
    expect_st_error("{\"w\": {\"dtype\": \"F32\", \"shape\": [1.5], \"data_offsets\": [0, 4]}}", 4,
                    DUET_ERR_FORMAT, "shape[0]", NULL);
    expect_st_error(
        "{\"w\": {\"dtype\": \"F32\", \"shape\": [1,1,1,1,1], \"data_offsets\": [0, 4]}}", 4,
        DUET_ERR_FORMAT, "tensor w: shape has 5 dimensions, more than 4", NULL);
    expect_st_error("{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0]}}", 4,
                    DUET_ERR_FORMAT, "tensor w: data_offsets is not two", NULL);
    expect_st_error("{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [-4, 0]}}", 4,
                    DUET_ERR_FORMAT, "tensor w: data_offsets", NULL);
    expect_st_error("{\"w\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [8, 4]}}", 8,
                    DUET_ERR_FORMAT, "tensor w: data_offsets [8, 4] end before begin", NULL);

    char hdr[512];
    snprintf(hdr, sizeof(hdr),
             "{\"%s\": {\"dtype\": \"F32\", \"shape\": [4, 4], \"data_offsets\": [0, 64]}}", T);
    expect_st_error(hdr, 16, DUET_ERR_FORMAT, T, "data_offsets [0, 64] exceed data size 16", NULL);
    expect_st_error("{\"w\": {\"dtype\": \"F32\", \"shape\": [2, 2], \"data_offsets\": [0, 12]}}",
                    16, DUET_ERR_FORMAT, "tensor w: data_offsets [0, 12] hold 12 bytes", "needs 16",
                    NULL);
    expect_st_error("{\"w\": {\"dtype\": \"BF16\", \"shape\": [3], \"data_offsets\": [0, 4]}}", 8,
                    DUET_ERR_FORMAT, "needs 6", NULL);
    expect_st_error("{\"a\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]},"
                    " \"b\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [8, 24]}}",
                    24, DUET_ERR_FORMAT, "tensors a [0, 16] and b [8, 24] overlap", NULL);
    expect_st_error("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
                    " \"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}",
                    8, DUET_ERR_FORMAT, "tensor a: listed twice", NULL);
    expect_st_error("{\"__metadata__\": 7}", 0, DUET_ERR_FORMAT, "__metadata__", NULL);
}

static void test_st_valid_file(void **state)
{
    (void)state;
    char path[512];
    duet_st_set_t *set = NULL;
    long live = duet_alloc_live();

    path_of(path, sizeof(path), "", "ok.safetensors");
    /* gap between b and a; zero-sized tensor; metadata; names out of order */
    write_st(path,
             "{\"__metadata__\": {\"format\": \"pt\"},"
             " \"b\": {\"dtype\": \"F16\", \"shape\": [2, 3], \"data_offsets\": [0, 12]},"
             " \"a\": {\"dtype\": \"I64\", \"shape\": [1], \"data_offsets\": [16, 24]},"
             " \"z\": {\"dtype\": \"F32\", \"shape\": [0, 5], \"data_offsets\": [24, 24]},"
             " \"s\": {\"dtype\": \"BF16\", \"shape\": [], \"data_offsets\": [12, 14]}}   ",
             24);
    assert_int_equal(duet_st_open_file(path, &set), DUET_OK);
    assert_int_equal(duet_st_count(set), 4);
    assert_string_equal(duet_st_at(set, 0)->name, "a");
    assert_string_equal(duet_st_at(set, 3)->name, "z");
    assert_null(duet_st_at(set, 4));
    assert_null(duet_st_find(set, "c"));
    assert_null(duet_st_find(set, "__metadata__"));

    const duet_st_tensor_t *b = duet_st_find(set, "b");
    assert_non_null(b);
    assert_int_equal(b->dtype, DUET_DTYPE_F16);
    assert_int_equal(b->ndim, 2);
    assert_int_equal(b->shape[0], 2);
    assert_int_equal(b->shape[1], 3);
    assert_int_equal(b->nbytes, 12);
    assert_string_equal(b->file, path);
    const unsigned char *bd = b->data;
    assert_int_equal(bd[0], 0);
    assert_int_equal(bd[11], 11);
    const duet_st_tensor_t *a = duet_st_find(set, "a");
    assert_int_equal(((const unsigned char *)a->data)[0], 16);
    assert_int_equal(duet_st_find(set, "s")->ndim, 0);
    assert_int_equal(duet_st_find(set, "z")->nbytes, 0);
    duet_st_close(set);
    duet_st_close(NULL);
    assert_int_equal(duet_alloc_live(), live);
}

static void test_st_writer(void **state)
{
    (void)state;
    char path[512];
    float f[6] = {1, 2, 3, 4, 5, 6};
    uint16_t h[3] = {0x3c00, 0x4000, 0xc000};
    int64_t ids[2] = {7, -9};
    duet_st_write_tensor_t ts[] = {
        {"w \"quoted\\", DUET_DTYPE_F32, 2, {2, 3}, f},
        {"h", DUET_DTYPE_F16, 1, {3}, h},
        {"i", DUET_DTYPE_I64, 1, {2}, ids},
    };
    duet_st_set_t *set = NULL;
    long live = duet_alloc_live();

    path_of(path, sizeof(path), "", "written.safetensors");
    assert_int_equal(duet_st_write_file(path, ts, 3), DUET_OK);
    FILE *fp = fopen(path, "rb");
    unsigned char len[8];
    assert_int_equal(fread(len, 1, 8, fp), 8);
    fclose(fp);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | len[i];
    assert_int_equal((8 + hlen) % 8, 0);

    assert_int_equal(duet_st_open_file(path, &set), DUET_OK);
    const duet_st_tensor_t *t = duet_st_find(set, "w \"quoted\\");
    assert_non_null(t);
    assert_memory_equal(t->data, f, sizeof(f));
    assert_memory_equal(duet_st_find(set, "h")->data, h, sizeof(h));
    assert_memory_equal(duet_st_find(set, "i")->data, ids, sizeof(ids));
    duet_st_close(set);

    /* bad input leaves no file and no temp file behind */
    duet_st_write_tensor_t dup[] = {{"x", DUET_DTYPE_F32, 1, {1}, f},
                                    {"x", DUET_DTYPE_F32, 1, {1}, f}};
    path_of(path, sizeof(path), "", "dup.safetensors");
    assert_int_equal(duet_st_write_file(path, dup, 2), DUET_ERR_INVALID);
    assert_non_null(strstr(duet_error_msg(), "tensor x: given twice"));
    duet_st_write_tensor_t bad[] = {{"x", (duet_dtype_t)42, 1, {1}, f}};
    assert_int_equal(duet_st_write_file(path, bad, 1), DUET_ERR_INVALID);
    assert_int_equal(access(path, F_OK), -1);

    /* a streaming writer that is not given every byte does not publish */
    duet_st_writer_t *w = NULL;
    assert_int_equal(duet_st_writer_create(path, ts, 1, &w), DUET_OK);
    assert_int_equal(duet_st_writer_append(w, f, 8), DUET_OK);
    assert_int_equal(duet_st_writer_append(w, f, 24), DUET_ERR_INVALID);
    assert_int_equal(duet_st_writer_finish(w), DUET_ERR_INVALID);
    assert_int_equal(access(path, F_OK), -1);

    DIR *d = opendir(tmpdir);
    struct dirent *de;
    while ((de = readdir(d)) != NULL)
        assert_null(strstr(de->d_name, ".tmp."));
    closedir(d);
    assert_int_equal(duet_alloc_live(), live);
}

/* A two-shard checkpoint in tmpdir/sub: a, b in shard 1; c in shard 2. */
static void write_sharded(const char *sub, const char *index)
{
    char dir[512], path[512];
    float v[4] = {1, 2, 3, 4};
    duet_st_write_tensor_t s1[] = {{"a", DUET_DTYPE_F32, 1, {4}, v},
                                   {"b", DUET_DTYPE_F32, 1, {2}, v}};
    duet_st_write_tensor_t s2[] = {{"c", DUET_DTYPE_F32, 1, {3}, v}};

    path_of(dir, sizeof(dir), "", sub);
    mkdir(dir, 0755);
    path_of(path, sizeof(path), sub, "s1.safetensors");
    assert_int_equal(duet_st_write_file(path, s1, 2), DUET_OK);
    path_of(path, sizeof(path), sub, "s2.safetensors");
    assert_int_equal(duet_st_write_file(path, s2, 1), DUET_OK);
    path_of(path, sizeof(path), sub, "model.safetensors.index.json");
    write_text(path, index);
}

static void expect_dir_error(const char *sub, duet_status_t want, const char *a, const char *b)
{
    char dir[512];
    duet_st_set_t *set = NULL;
    long live = duet_alloc_live();

    path_of(dir, sizeof(dir), "", sub);
    duet_status_t st = duet_st_open_dir(dir, &set);
    if (st != want)
        fail_msg("%s: got %s (%s)", sub, duet_status_name(st), duet_error_msg());
    assert_null(set);
    if (strstr(duet_error_msg(), a) == NULL || (b && strstr(duet_error_msg(), b) == NULL))
        fail_msg("message '%s' lacks '%s' / '%s'", duet_error_msg(), a, b ? b : "");
    assert_int_equal(duet_alloc_live(), live);
}

static void test_st_sharded(void **state)
{
    (void)state;
    char dir[512];
    duet_st_set_t *set = NULL;
    long live = duet_alloc_live();

    write_sharded("good", "{\"metadata\": {\"total_size\": 36}, \"weight_map\": {"
                          "\"a\": \"s1.safetensors\", \"c\": \"s2.safetensors\","
                          " \"b\": \"s1.safetensors\"}}");
    path_of(dir, sizeof(dir), "", "good");
    assert_int_equal(duet_st_open_dir(dir, &set), DUET_OK);
    assert_int_equal(duet_st_count(set), 3);
    assert_non_null(strstr(duet_st_find(set, "a")->file, "good/s1.safetensors"));
    assert_non_null(strstr(duet_st_find(set, "c")->file, "good/s2.safetensors"));
    assert_int_equal(duet_st_find(set, "c")->shape[0], 3);
    assert_true(((const float *)duet_st_find(set, "c")->data)[2] == 3.0f);
    duet_st_close(set);
    assert_int_equal(duet_alloc_live(), live);

    write_sharded("noshard", "{\"weight_map\": {\"a\": \"s1.safetensors\","
                             " \"b\": \"s1.safetensors\", \"c\": \"s3.safetensors\"}}");
    expect_dir_error("noshard", DUET_ERR_NOT_FOUND, "shard s3.safetensors", "s3.safetensors");
    write_sharded("absent", "{\"weight_map\": {\"a\": \"s1.safetensors\","
                            " \"b\": \"s1.safetensors\", \"c\": \"s2.safetensors\","
                            " \"d\": \"s2.safetensors\"}}");
    expect_dir_error("absent", DUET_ERR_FORMAT, "absent/s2.safetensors: tensor d",
                     "absent from it");
    write_sharded("unlisted", "{\"weight_map\": {\"a\": \"s1.safetensors\","
                              " \"c\": \"s2.safetensors\"}}");
    expect_dir_error("unlisted", DUET_ERR_FORMAT, "s1.safetensors: tensor b", "not listed");
    write_sharded("moved", "{\"weight_map\": {\"a\": \"s1.safetensors\","
                           " \"b\": \"s2.safetensors\", \"c\": \"s2.safetensors\"}}");
    expect_dir_error("moved", DUET_ERR_FORMAT, "s1.safetensors: tensor b",
                     "maps it to s2.safetensors");
    write_sharded("escape", "{\"weight_map\": {\"a\": \"../good/s1.safetensors\"}}");
    expect_dir_error("escape", DUET_ERR_FORMAT, "weight_map.a", NULL);
    write_sharded("twice", "{\"weight_map\": {\"a\": \"s1.safetensors\","
                           " \"a\": \"s1.safetensors\"}}");
    expect_dir_error("twice", DUET_ERR_FORMAT, "tensor a listed twice", NULL);
    write_sharded("nomap", "{\"metadata\": {}}");
    expect_dir_error("nomap", DUET_ERR_FORMAT, "weight_map", NULL);

    /* the same tensor in two shards */
    char path[512];
    float v[4] = {0};
    duet_st_write_tensor_t s3[] = {{"c", DUET_DTYPE_F32, 1, {3}, v}};
    write_sharded("both", "{\"weight_map\": {\"a\": \"s1.safetensors\","
                          " \"b\": \"s1.safetensors\", \"c\": \"s2.safetensors\"}}");
    path_of(path, sizeof(path), "both", "s1.safetensors");
    duet_st_write_tensor_t s1[] = {
        {"a", DUET_DTYPE_F32, 1, {4}, v}, {"b", DUET_DTYPE_F32, 1, {2}, v}, s3[0]};
    assert_int_equal(duet_st_write_file(path, s1, 3), DUET_OK);
    expect_dir_error("both", DUET_ERR_FORMAT, "tensor c: present in both", "s2.safetensors");

    path_of(dir, sizeof(dir), "", "empty");
    mkdir(dir, 0755);
    expect_dir_error("empty", DUET_ERR_NOT_FOUND, "model.safetensors.index.json", NULL);
}

static duet_status_t parse_cfg(const char *text, duet_model_config_t *c)
{
    cJSON *j = NULL;
    duet_status_t st = duet_json_parse(text, strlen(text), "cfg.json", &j);
    assert_int_equal(st, DUET_OK);
    st = duet_model_config_parse(j, "cfg.json", c);
    cJSON_Delete(j);
    return st;
}

#define BASE                                                                                       \
    "\"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 8,"                   \
    " \"intermediate_size\": 128, \"vocab_size\": 100"

static void expect_cfg_error(const char *text, duet_status_t want, const char *sub)
{
    duet_model_config_t c;
    duet_status_t st = parse_cfg(text, &c);
    if (st != want)
        fail_msg("%s: got %s (%s)", text, duet_status_name(st), duet_error_msg());
    if (strstr(duet_error_msg(), "cfg.json: ") != duet_error_msg() ||
        strstr(duet_error_msg(), sub) == NULL)
        fail_msg("message '%s' lacks 'cfg.json: ... %s'", duet_error_msg(), sub);
}

static void test_config(void **state)
{
    (void)state;
    duet_model_config_t c;

    assert_int_equal(parse_cfg("{\"architectures\": [\"LlamaForCausalLM\"], " BASE "}", &c),
                     DUET_OK);
    assert_int_equal(c.arch, DUET_ARCH_LLAMA);
    assert_int_equal(c.n_kv_heads, 8);
    assert_int_equal(c.head_dim, 8);
    assert_int_equal(c.max_pos, 2048);
    assert_true(c.rope_theta == 10000.0);
    assert_true(c.rms_eps == 1e-6);
    assert_false(c.tie_embeddings);
    assert_false(c.qkv_bias);
    assert_false(c.o_bias);
    assert_int_equal(c.bos_id, -1);
    assert_int_equal(c.n_eos, 0);
    assert_int_equal(c.torch_dtype, DUET_DTYPE_F32);

    assert_int_equal(parse_cfg("{\"model_type\": \"qwen2\", " BASE ", \"num_key_value_heads\": 2,"
                               " \"head_dim\": 16, \"rope_theta\": 1e6, \"bos_token_id\": 5,"
                               " \"eos_token_id\": [7, 9], \"tie_word_embeddings\": true,"
                               " \"torch_dtype\": \"bfloat16\", \"use_sliding_window\": false,"
                               " \"sliding_window\": 16, \"rope_scaling\": {\"type\": \"linear\","
                               " \"factor\": 1.0}}",
                               &c),
                     DUET_OK);
    assert_int_equal(c.arch, DUET_ARCH_QWEN2);
    assert_true(c.qkv_bias);
    assert_false(c.o_bias); /* Qwen2's o_proj has no bias */
    assert_int_equal(c.n_kv_heads, 2);
    assert_int_equal(c.head_dim, 16);
    assert_true(c.rope_theta == 1e6);
    assert_int_equal(c.bos_id, 5);
    assert_int_equal(c.n_eos, 2);
    assert_true(duet_model_config_is_eos(&c, 9));
    assert_false(duet_model_config_is_eos(&c, 5));
    assert_true(c.tie_embeddings);
    assert_int_equal(c.torch_dtype, DUET_DTYPE_BF16);

    assert_int_equal(parse_cfg("{\"architectures\": [\"MistralForCausalLM\"], " BASE
                               ", \"sliding_window\": null, \"attention_bias\": true,"
                               " \"eos_token_id\": 3, \"max_position_embeddings\": 512}",
                               &c),
                     DUET_OK);
    assert_int_equal(c.arch, DUET_ARCH_MISTRAL);
    assert_true(c.qkv_bias);
    assert_true(c.o_bias);
    assert_int_equal(c.eos_ids[0], 3);
    assert_int_equal(c.max_pos, 512);

    /* LlamaAttention with attention_bias: every projection has a bias */
    assert_int_equal(parse_cfg("{\"architectures\": [\"LlamaForCausalLM\"], " BASE
                               ", \"attention_bias\": true}",
                               &c),
                     DUET_OK);
    assert_true(c.qkv_bias);
    assert_true(c.o_bias);
    assert_false(c.qk_norm);

    /* Qwen3: q/k norms, head_dim from the config (128 when absent, as
     * Qwen3Config), attention_bias as Llama */
    assert_int_equal(parse_cfg("{\"architectures\": [\"Qwen3ForCausalLM\"], " BASE
                               ", \"head_dim\": 32, \"num_key_value_heads\": 4}",
                               &c),
                     DUET_OK);
    assert_int_equal(c.arch, DUET_ARCH_QWEN3);
    assert_true(c.qk_norm);
    assert_false(c.qkv_bias);
    assert_false(c.o_bias);
    assert_int_equal(c.head_dim, 32);
    assert_int_equal(parse_cfg("{\"model_type\": \"qwen3\", " BASE "}", &c), DUET_OK);
    assert_int_equal(c.head_dim, 128);
    assert_string_equal(duet_arch_name(DUET_ARCH_QWEN3), "qwen3");
    assert_string_equal(duet_arch_name(DUET_ARCH_QWEN2), "qwen2");
    assert_int_equal(duet_arch_parse("MistralForCausalLM"), DUET_ARCH_MISTRAL);
    assert_int_equal(duet_arch_parse("gpt2"), -1);

    expect_cfg_error("{\"architectures\": [\"GPT2LMHeadModel\"], " BASE "}", DUET_ERR_UNSUPPORTED,
                     "architectures[0]: GPT2LMHeadModel");
    expect_cfg_error("{\"architectures\": \"LlamaForCausalLM\", " BASE "}", DUET_ERR_FORMAT,
                     "architectures");
    expect_cfg_error("{" BASE "}", DUET_ERR_FORMAT, "architectures");
    expect_cfg_error("{\"model_type\": \"llama\", \"num_hidden_layers\": 2,"
                     " \"num_attention_heads\": 8, \"intermediate_size\": 128,"
                     " \"vocab_size\": 100}",
                     DUET_ERR_FORMAT, "missing required key hidden_size");
    expect_cfg_error(
        "{\"model_type\": \"llama\", \"hidden_size\": \"64\", \"num_hidden_layers\": 2,"
        " \"num_attention_heads\": 8, \"intermediate_size\": 128,"
        " \"vocab_size\": 100}",
        DUET_ERR_FORMAT, "hidden_size");
    expect_cfg_error("{\"model_type\": \"llama\", " BASE ", \"num_key_value_heads\": 0}",
                     DUET_ERR_FORMAT, "num_key_value_heads: 0 must be positive");
    expect_cfg_error("{\"model_type\": \"llama\", \"hidden_size\": 64, \"num_hidden_layers\": -2,"
                     " \"num_attention_heads\": 8, \"intermediate_size\": 128,"
                     " \"vocab_size\": 100}",
                     DUET_ERR_FORMAT, "num_hidden_layers: -2 must be positive");
    expect_cfg_error("{\"model_type\": \"llama\", " BASE ", \"num_key_value_heads\": 3}",
                     DUET_ERR_FORMAT, "num_key_value_heads 3");
    expect_cfg_error("{\"model_type\": \"llama\", " BASE ", \"head_dim\": 7}", DUET_ERR_FORMAT,
                     "head_dim: 7 must be even");
    expect_cfg_error("{\"model_type\": \"llama\", " BASE ", \"rope_theta\": 0}", DUET_ERR_FORMAT,
                     "rope_theta");
    expect_cfg_error("{\"model_type\": \"llama\", " BASE ", \"rms_norm_eps\": \"x\"}",
                     DUET_ERR_FORMAT, "rms_norm_eps");
    expect_cfg_error("{\"model_type\": \"llama\", " BASE ", \"tie_word_embeddings\": 1}",
                     DUET_ERR_FORMAT, "tie_word_embeddings");
    expect_cfg_error("{\"model_type\": \"llama\", " BASE ", \"eos_token_id\": 100}",
                     DUET_ERR_FORMAT, "eos_token_id: 100 is outside the vocabulary");
    expect_cfg_error("{\"model_type\": \"llama\", " BASE ", \"bos_token_id\": \"<s>\"}",
                     DUET_ERR_FORMAT, "bos_token_id");
    /* llama3 without all of its keys: the missing key is named */
    expect_cfg_error("{\"model_type\": \"llama\", " BASE ", \"rope_scaling\": {\"rope_type\":"
                     " \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0}}",
                     DUET_ERR_FORMAT, "rope_scaling.high_freq_factor: missing");
    expect_cfg_error("{\"model_type\": \"llama\", " BASE ", \"rope_scaling\": {\"rope_type\":"
                     " \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0,"
                     " \"high_freq_factor\": 4.0}}",
                     DUET_ERR_FORMAT, "rope_scaling.original_max_position_embeddings: missing");
    expect_cfg_error("{\"model_type\": \"llama\", " BASE ", \"rope_scaling\": {\"rope_type\":"
                     " \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 4.0,"
                     " \"high_freq_factor\": 1.0, \"original_max_position_embeddings\": 8192}}",
                     DUET_ERR_FORMAT, "rope_scaling.high_freq_factor 1 must be above");
    expect_cfg_error("{\"model_type\": \"llama\", " BASE ", \"rope_scaling\": {\"type\":"
                     " \"linear\"}}",
                     DUET_ERR_FORMAT, "rope_scaling.factor: missing");
    expect_cfg_error("{\"model_type\": \"llama\", " BASE ", \"rope_scaling\": {\"type\":"
                     " \"linear\", \"factor\": -2}}",
                     DUET_ERR_FORMAT, "rope_scaling.factor: expected a positive number");
    expect_cfg_error("{\"model_type\": \"llama\", " BASE ", \"rope_scaling\": {\"type\":"
                     " \"dynamic\"}}",
                     DUET_ERR_FORMAT,
                     "rope_scaling.factor: missing (required by rope_scaling.type "
                     "dynamic)");
    expect_cfg_error("{\"model_type\": \"llama\", " BASE ", \"rope_scaling\": {\"type\":"
                     " \"longrope\", \"factor\": 2.0}}",
                     DUET_ERR_UNSUPPORTED, "rope_scaling.type longrope is not supported");
    expect_cfg_error("{\"model_type\": \"qwen2\", " BASE ", \"rope_scaling\": {\"type\":"
                     " \"yarn\", \"factor\": 4.0, \"truncate\": 1}}",
                     DUET_ERR_FORMAT, "rope_scaling.truncate");
    assert_int_equal(parse_cfg("{\"model_type\": \"llama\", " BASE ", \"rope_scaling\": {"
                               "\"type\": \"linear\", \"factor\": 2.0}}",
                               &c),
                     DUET_OK);
    assert_int_equal(c.rope_scaling.type, DUET_ROPE_LINEAR);
    assert_true(c.rope_scaling.factor == 2.0);
    assert_true(c.rope_scaling.attention_factor == 1.0);
    assert_int_equal(parse_cfg("{\"model_type\": \"llama\", " BASE ", \"rope_scaling\": {"
                               "\"type\": \"dynamic\", \"factor\": 1.0}}",
                               &c),
                     DUET_OK);
    assert_int_equal(c.rope_scaling.type, DUET_ROPE_NONE);
    assert_int_equal(parse_cfg("{\"model_type\": \"llama\", " BASE ", \"rope_scaling\": {"
                               "\"type\": \"dynamic\", \"factor\": 2.0}}",
                               &c),
                     DUET_OK);
    assert_int_equal(c.rope_scaling.type, DUET_ROPE_DYNAMIC);
    expect_cfg_error("{\"model_type\": \"mistral\", " BASE ", \"sliding_window\": 1024}",
                     DUET_ERR_UNSUPPORTED, "sliding_window 1024");
    expect_cfg_error("{\"model_type\": \"qwen2\", " BASE ", \"use_sliding_window\": true,"
                     " \"sliding_window\": 16}",
                     DUET_ERR_UNSUPPORTED, "sliding_window 16");
    expect_cfg_error("{\"model_type\": \"llama\", " BASE ", \"hidden_act\": \"gelu\"}",
                     DUET_ERR_UNSUPPORTED, "hidden_act: gelu");
    expect_cfg_error("{\"model_type\": \"llama\", " BASE ", \"mlp_bias\": true}",
                     DUET_ERR_UNSUPPORTED, "mlp_bias");
    expect_cfg_error("{\"model_type\": \"llama\", " BASE ", \"torch_dtype\": \"float64\"}",
                     DUET_ERR_UNSUPPORTED, "torch_dtype: float64");
}

/* The frequency tables of model/rope.c against values computed
 * independently (numpy, float64, from transformers' formulas). */
static void expect_freqs(const char *text, const int *idx, const double *want, int n_idx,
                         double attn)
{
    duet_model_config_t c;
    float tab[512];
    if (parse_cfg(text, &c) != DUET_OK)
        fail_msg("%s: %s", text, duet_error_msg());
    duet_rope_inv_freq(&c, tab);
    for (int k = 0; k < n_idx; k++) {
        if (fabs((double)tab[idx[k]] - want[k]) > 1e-6 * want[k])
            fail_msg("%s: inv_freq[%d] %.9g, want %.9g", text, idx[k], (double)tab[idx[k]],
                     want[k]);
    }
    if (fabs(c.rope_scaling.attention_factor - attn) > 1e-12)
        fail_msg("%s: attention factor %.12g, want %.12g", text, c.rope_scaling.attention_factor,
                 attn);
}

static void test_rope_tables(void **state)
{
    (void)state;
    /* Llama-3.1-8B: wavelengths above 8192 divided by 8, below 2048 kept,
     * indices 29..34 interpolated */
    static const int l3_i[] = {0, 10, 20, 29, 30, 31, 32, 33, 40, 45, 50, 63};
    static const double l3_w[] = {1.0,
                                  0.12868737343265052,
                                  0.016560440080994446,
                                  0.002166570763503359,
                                  0.0013718935677611381,
                                  0.0008567514129196321,
                                  0.0005248461609929549,
                                  0.00031269375038406517,
                                  3.428102195952591e-05,
                                  1.2297638677963614e-05,
                                  4.411534674558404e-06,
                                  3.068925988914511e-07};
    expect_freqs("{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 4096,"
                 " \"num_hidden_layers\": 1, \"num_attention_heads\": 32,"
                 " \"num_key_value_heads\": 8, \"intermediate_size\": 14336,"
                 " \"vocab_size\": 128256, \"max_position_embeddings\": 131072,"
                 " \"rope_theta\": 500000.0, \"rope_scaling\": {\"factor\": 8.0,"
                 " \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0,"
                 " \"original_max_position_embeddings\": 8192, \"rope_type\": \"llama3\"}}",
                 l3_i, l3_w, 12, 1.0);
    /* Qwen2.5's YaRN (factor 4 over 32768 positions, theta 1e6, head_dim
     * 128): correction dims floor(23.x) = 23 and ceil(39.x) = 40 */
    static const int y_i[] = {0, 10, 20, 25, 30, 35, 40, 50, 63};
    static const double y_w[] = {1.0,
                                 0.11547819846894583,
                                 0.01333521432163324,
                                 0.004131738022518394,
                                 0.001064360981247002,
                                 0.0002462584069089387,
                                 4.4456985250973074e-05,
                                 5.133812566142866e-06,
                                 3.102344401879299e-07};
    expect_freqs("{\"model_type\": \"qwen2\", \"hidden_size\": 2048,"
                 " \"num_hidden_layers\": 1, \"num_attention_heads\": 16,"
                 " \"intermediate_size\": 64, \"vocab_size\": 100,"
                 " \"max_position_embeddings\": 131072, \"rope_theta\": 1000000.0,"
                 " \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4.0,"
                 " \"original_max_position_embeddings\": 32768}}",
                 y_i, y_w, 9, 0.1 * log(4.0) + 1.0);
    /* yarn's attention factor: explicit, or from mscale / mscale_all_dim */
    static const int z_i[] = {0};
    static const double z_w[] = {1.0};
    expect_freqs("{\"model_type\": \"llama\", " BASE ", \"rope_scaling\": {\"type\": \"yarn\","
                 " \"factor\": 4.0, \"attention_factor\": 0.5}}",
                 z_i, z_w, 1, 0.5);
    expect_freqs("{\"model_type\": \"llama\", " BASE ", \"rope_scaling\": {\"type\": \"yarn\","
                 " \"factor\": 40.0, \"mscale\": 1.0, \"mscale_all_dim\": 0.5}}",
                 z_i, z_w, 1, (0.1 * log(40.0) + 1.0) / (0.05 * log(40.0) + 1.0));
    /* linear: every frequency over the factor (head_dim 8, theta 1e4) */
    static const int li_i[] = {0, 1, 2, 3};
    static const double li_w[] = {0.25, 0.025, 0.0025, 0.00025};
    expect_freqs("{\"model_type\": \"llama\", " BASE ", \"rope_scaling\": {\"type\":"
                 " \"linear\", \"factor\": 4.0}}",
                 li_i, li_w, 4, 1.0);
    /* unscaled: theta^(-2i/d); dynamic NTK too (transformers rescales only
     * past max_position_embeddings, beyond what the engine accepts) */
    static const double d_w[] = {1.0, 0.1, 0.01, 0.001};
    expect_freqs("{\"model_type\": \"llama\", " BASE "}", li_i, d_w, 4, 1.0);
    expect_freqs("{\"model_type\": \"llama\", " BASE ", \"rope_scaling\": {\"type\":"
                 " \"dynamic\", \"factor\": 4.0}}",
                 li_i, d_w, 4, 1.0);
}

static void stories_dir(char *buf, size_t n)
{
    const char *src = getenv("DUET_SOURCE_DIR");
    snprintf(buf, n, "%s/models/stories260K", src ? src : ".");
}

static void test_stories260k(void **state)
{
    (void)state;
    char dir[512];
    duet_model_t *m = NULL, *m2 = NULL;
    long live = duet_alloc_live();

    stories_dir(dir, sizeof(dir));
    if (duet_model_open(dir, &m) != DUET_OK)
        fail_msg("%s", duet_error_msg());
    assert_int_equal(m->cfg.arch, DUET_ARCH_LLAMA);
    assert_int_equal(m->cfg.hidden, 64);
    assert_int_equal(m->cfg.n_layers, 5);
    assert_int_equal(m->cfg.n_heads, 8);
    assert_int_equal(m->cfg.n_kv_heads, 4);
    assert_int_equal(m->cfg.head_dim, 8);
    assert_int_equal(m->cfg.intermediate, 172);
    assert_int_equal(m->cfg.vocab, 512);
    assert_int_equal(m->cfg.max_pos, 512);
    assert_true(m->cfg.rms_eps == 1e-5);
    assert_true(m->cfg.tie_embeddings);
    assert_false(m->cfg.qkv_bias);
    assert_int_equal(m->cfg.bos_id, 1);
    assert_true(duet_model_config_is_eos(&m->cfg, 2));
    assert_ptr_equal(m->lm_head, m->embed);
    assert_int_equal(m->embed->shape[0], 512);
    assert_int_equal(m->layers[4].wk->shape[0], 32);
    assert_int_equal(m->layers[4].w_down->shape[1], 172);
    assert_null(m->layers[0].bq);
    assert_string_equal(m->layers[3].wo->name, "model.layers.3.self_attn.o_proj.weight");
    assert_int_equal(m->layers[3].wo->dtype, DUET_DTYPE_F32);
    assert_int_equal(duet_st_count(m->st), 2 + 5 * 9);
    assert_true(m->fingerprint != 0);
    assert_int_equal(duet_model_open(dir, &m2), DUET_OK);
    assert_true(m->fingerprint == m2->fingerprint);
    duet_model_close(m2);
    duet_model_close(m);
    duet_model_close(NULL);
    assert_int_equal(duet_alloc_live(), live);
}

/* Every n-th allocation failing makes open fail with DUET_ERR_NO_MEMORY
 * and free everything, until n is large enough to succeed. */
static void test_open_alloc_failures(void **state)
{
    (void)state;
    char dir[512];
    long live = duet_alloc_live();
    long n;

    stories_dir(dir, sizeof(dir));
    for (n = 0; n < 1000; n++) {
        duet_model_t *m = NULL;
        duet_alloc_fail_after(n);
        duet_status_t st = duet_model_open(dir, &m);
        duet_alloc_fail_after(-1);
        if (st == DUET_OK) {
            duet_model_close(m);
            assert_int_equal(duet_alloc_live(), live);
            break;
        }
        if (st != DUET_ERR_NO_MEMORY)
            fail_msg("fail after %ld: %s (%s)", n, duet_status_name(st), duet_error_msg());
        assert_null(m);
        assert_int_equal(duet_alloc_live(), live);
    }
    assert_true(n > 3 && n < 1000);
}

/* A tiny llama written tensor by tensor, with one thing wrong. */
typedef enum {
    BROKEN_NONE,
    BROKEN_MISSING,
    BROKEN_SHAPE,
    BROKEN_DTYPE,
    BROKEN_BIAS,
    BROKEN_O_BIAS,
    BROKEN_NO_LM_HEAD
} broken_t;

static void write_tiny(const char *sub, broken_t what, bool tied)
{
    static float zeros[16 * 8];
    char dir[512], path[512];
    char cfg[512];
    duet_st_write_tensor_t ts[16];
    size_t n = 0;

    path_of(dir, sizeof(dir), "", sub);
    mkdir(dir, 0755);
    snprintf(cfg, sizeof(cfg),
             "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 8,"
             " \"num_hidden_layers\": 1, \"num_attention_heads\": 2, \"num_key_value_heads\": 1,"
             " \"intermediate_size\": 16, \"vocab_size\": 16, \"tie_word_embeddings\": %s}",
             tied ? "true" : "false");
    path_of(path, sizeof(path), sub, "config.json");
    write_text(path, cfg);
#define T(nm, dt, a, b) ts[n++] = (duet_st_write_tensor_t){nm, dt, (b) ? 2 : 1, {a, b}, zeros}
    T("model.embed_tokens.weight", DUET_DTYPE_F32, 16, 8);
    T("model.norm.weight", DUET_DTYPE_F16, 8, 0);
    T("model.layers.0.input_layernorm.weight", DUET_DTYPE_BF16, 8, 0);
    T("model.layers.0.post_attention_layernorm.weight", DUET_DTYPE_F32, 8, 0);
    T("model.layers.0.self_attn.q_proj.weight", DUET_DTYPE_F32, 8, 8);
    T("model.layers.0.self_attn.k_proj.weight", DUET_DTYPE_F32, 4, 8);
    if (what != BROKEN_MISSING)
        T("model.layers.0.self_attn.v_proj.weight", DUET_DTYPE_F32, 4, 8);
    T("model.layers.0.self_attn.o_proj.weight", DUET_DTYPE_F32, 8, 8);
    if (what == BROKEN_SHAPE)
        T("model.layers.0.mlp.gate_proj.weight", DUET_DTYPE_F32, 8, 16);
    else
        T("model.layers.0.mlp.gate_proj.weight", DUET_DTYPE_F32, 16, 8);
    T("model.layers.0.mlp.up_proj.weight", what == BROKEN_DTYPE ? DUET_DTYPE_I32 : DUET_DTYPE_F32,
      16, 8);
    T("model.layers.0.mlp.down_proj.weight", DUET_DTYPE_F32, 8, 16);
    if (what == BROKEN_BIAS)
        T("model.layers.0.self_attn.q_proj.bias", DUET_DTYPE_F32, 8, 0);
    if (what == BROKEN_O_BIAS)
        T("model.layers.0.self_attn.o_proj.bias", DUET_DTYPE_F32, 8, 0);
    if (what != BROKEN_NO_LM_HEAD)
        T("lm_head.weight", DUET_DTYPE_F32, 16, 8);
#undef T
    path_of(path, sizeof(path), sub, "model.safetensors");
    assert_int_equal(duet_st_write_file(path, ts, n), DUET_OK);
}

static void expect_model_error(const char *sub, const char *a, const char *b)
{
    char dir[512];
    duet_model_t *m = NULL;
    long live = duet_alloc_live();

    path_of(dir, sizeof(dir), "", sub);
    duet_status_t st = duet_model_open(dir, &m);
    if (st != DUET_ERR_FORMAT)
        fail_msg("%s: got %s (%s)", sub, duet_status_name(st), duet_error_msg());
    assert_null(m);
    if (strstr(duet_error_msg(), a) == NULL || strstr(duet_error_msg(), b) == NULL)
        fail_msg("message '%s' lacks '%s' / '%s'", duet_error_msg(), a, b);
    assert_int_equal(duet_alloc_live(), live);
}

static void test_model_errors(void **state)
{
    (void)state;
    char dir[512];
    duet_model_t *m = NULL;

    write_tiny("tiny", BROKEN_NONE, false);
    path_of(dir, sizeof(dir), "", "tiny");
    assert_int_equal(duet_model_open(dir, &m), DUET_OK);
    assert_int_equal(m->layers[0].attn_norm->dtype, DUET_DTYPE_BF16);
    assert_ptr_not_equal(m->lm_head, m->embed);
    assert_string_equal(m->lm_head->name, "lm_head.weight");
    uint64_t fp_untied = m->fingerprint;
    duet_model_close(m);

    /* tied: lm_head.weight, although present, is not used */
    write_tiny("tied", BROKEN_NONE, true);
    path_of(dir, sizeof(dir), "", "tied");
    assert_int_equal(duet_model_open(dir, &m), DUET_OK);
    assert_ptr_equal(m->lm_head, m->embed);
    assert_true(m->fingerprint != fp_untied);
    duet_model_close(m);

    write_tiny("missing", BROKEN_MISSING, false);
    expect_model_error("missing", "missing: tensor model.layers.0.self_attn.v_proj.weight: missing",
                       "[4, 8]");
    write_tiny("shape", BROKEN_SHAPE, false);
    expect_model_error("shape",
                       "shape/model.safetensors: tensor model.layers.0.mlp.gate_proj.weight",
                       "shape [8, 16] does not match config.json (expected [16, 8])");
    write_tiny("dtype", BROKEN_DTYPE, false);
    expect_model_error("dtype", "tensor model.layers.0.mlp.up_proj.weight", "dtype I32");
    write_tiny("bias", BROKEN_BIAS, false);
    expect_model_error("bias", "tensor model.layers.0.self_attn.q_proj.bias", "attention_bias");
    /* an o_proj bias the config does not announce would be dropped */
    write_tiny("obias", BROKEN_O_BIAS, false);
    expect_model_error("obias", "tensor model.layers.0.self_attn.o_proj.bias", "attention_bias");
    write_tiny("nohead", BROKEN_NO_LM_HEAD, false);
    expect_model_error("nohead", "tensor lm_head.weight", "tie_word_embeddings is false");
    write_tiny("nohead_tied", BROKEN_NO_LM_HEAD, true);
    path_of(dir, sizeof(dir), "", "nohead_tied");
    assert_int_equal(duet_model_open(dir, &m), DUET_OK);
    duet_model_close(m);

    /* config errors name config.json */
    path_of(dir, sizeof(dir), "tiny", "config.json");
    write_text(dir, "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 8}");
    path_of(dir, sizeof(dir), "", "tiny");
    assert_int_equal(duet_model_open(dir, &m), DUET_ERR_FORMAT);
    assert_non_null(strstr(duet_error_msg(), "tiny/config.json: missing required key"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_st_bad_files),        cmocka_unit_test(test_st_bad_headers),
        cmocka_unit_test(test_st_valid_file),       cmocka_unit_test(test_st_writer),
        cmocka_unit_test(test_st_sharded),          cmocka_unit_test(test_config),
        cmocka_unit_test(test_rope_tables),         cmocka_unit_test(test_stories260k),
        cmocka_unit_test(test_open_alloc_failures), cmocka_unit_test(test_model_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
