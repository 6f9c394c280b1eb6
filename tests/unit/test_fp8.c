/* FP8 weights: e4m3 conversions, quantization_config (model/quant.h), the
 * loader's checks of F8_E4M3 weights and their scales (engine/model.c),
 * mkmodel --fp8 and the CPU backend's dequantization at load. */
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "common/alloc.h"
#include "common/json.h"
#include "common/status.h"
#include "engine/backend.h"
#include "engine/model.h"
#include "engine/weight_src.h"
#include "model/model_config.h"
#include "model/safetensors.h"
#include "synth/mkmodel.h"

static char tmpdir[256];

static int setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/duet-test-fp8-XXXXXX");
    return mkdtemp(tmpdir) == NULL ? -1 : 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

/* Every e4m3 value reads back exactly; rounding is to nearest even;
 * saturation at 448; NaN stays NaN. */
static void test_e4m3(void **state)
{
    (void)state;
    for (int b = 0; b < 256; b++) {
        float f = duet_e4m3_to_f32((uint8_t)b);
        if ((b & 0x7f) == 0x7f) {
            assert_true(isnan(f));
            continue;
        }
        assert_int_equal(duet_f32_to_e4m3(f), b);
    }
    assert_true(duet_e4m3_to_f32(0x7e) == 448.0f);
    assert_true(duet_e4m3_to_f32(0x01) == 0x1p-9f);
    assert_true(duet_e4m3_to_f32(0x08) == 0x1p-6f);
    assert_true(duet_e4m3_to_f32(0x38) == 1.0f);
    assert_true(duet_e4m3_to_f32(0xb8) == -1.0f);
    assert_int_equal(duet_f32_to_e4m3(1.0625f), 0x38); /* halfway 1 / 1.125: even (1) */
    assert_int_equal(duet_f32_to_e4m3(1.1875f), 0x3a); /* halfway 1.125 / 1.25: even (1.25) */
    assert_int_equal(duet_f32_to_e4m3(1.07f), 0x39);   /* above halfway */
    assert_int_equal(duet_f32_to_e4m3(500.0f), 0x7e);  /* saturates */
    assert_int_equal(duet_f32_to_e4m3(-INFINITY), 0xfe);
    assert_int_equal(duet_f32_to_e4m3(NAN) & 0x7f, 0x7f);
    assert_int_equal(duet_f32_to_e4m3(0x1p-10f), 0x00);  /* halfway 0 / 2^-9: even (0) */
    assert_int_equal(duet_f32_to_e4m3(0x3p-10f), 0x02);  /* halfway 2^-9 / 2^-8: even */
    assert_int_equal(duet_f32_to_e4m3(0x1.ep-7f), 0x08); /* rounds up into the normals */
    /* the midpoint of every pair of neighbours rounds to the even one */
    for (int b = 0; b < 0x7d; b++) {
        float lo = duet_e4m3_to_f32((uint8_t)b), hi = duet_e4m3_to_f32((uint8_t)(b + 1));
        assert_int_equal(duet_f32_to_e4m3((lo + hi) / 2), (b & 1) ? b + 1 : b);
        assert_int_equal(duet_f32_to_e4m3(nextafterf((lo + hi) / 2, 0)), b);
        assert_int_equal(duet_f32_to_e4m3(nextafterf((lo + hi) / 2, 1000)), b + 1);
    }
    assert_string_equal(duet_dtype_name(DUET_DTYPE_F8_E4M3), "F8_E4M3");
    assert_int_equal(duet_dtype_parse("F8_E4M3"), DUET_DTYPE_F8_E4M3);
    assert_int_equal(duet_dtype_size(DUET_DTYPE_F8_E4M3), 1);
}

#define BASE                                                                                       \
    "\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64, \"num_hidden_layers\": 2, "   \
    "\"num_attention_heads\": 8, \"intermediate_size\": 128, \"vocab_size\": 100"
#define CT_HEAD                                                                                    \
    "\"quantization_config\": {\"quant_method\": \"compressed-tensors\", \"format\": "             \
    "\"float-quantized\", "
#define CT_W(strategy)                                                                             \
    "\"config_groups\": {\"group_0\": {\"targets\": [\"Linear\"], \"weights\": {\"num_bits\": 8, " \
    "\"type\": \"float\", \"strategy\": \"" strategy                                               \
    "\", \"symmetric\": true, \"dynamic\": false}"

static duet_status_t parse_cfg(const char *text, duet_model_config_t *c)
{
    cJSON *j = NULL;
    duet_status_t st = duet_json_parse(text, strlen(text), "cfg.json", &j);
    assert_int_equal(st, DUET_OK);
    st = duet_model_config_parse(j, "cfg.json", c);
    cJSON_Delete(j);
    return st;
}

static void expect_cfg_error(const char *text, duet_status_t want, const char *sub)
{
    duet_model_config_t c;
    duet_status_t st = parse_cfg(text, &c);
    if (st != want)
        fail_msg("%s: got %s (%s)", text, duet_status_name(st), duet_error_msg());
    if (strstr(duet_error_msg(), sub) == NULL)
        fail_msg("message '%s' lacks '%s'", duet_error_msg(), sub);
}

static void test_quant_config(void **state)
{
    (void)state;
    duet_model_config_t c;

    assert_int_equal(parse_cfg("{" BASE "}", &c), DUET_OK);
    assert_int_equal(c.quant.method, DUET_QUANT_NONE);
    assert_int_equal(parse_cfg("{" BASE ", \"quantization_config\": null}", &c), DUET_OK);
    assert_int_equal(c.quant.method, DUET_QUANT_NONE);
    assert_int_equal(
        parse_cfg("{" BASE ", " CT_HEAD CT_W(
                      "channel") ", \"input_activations\": {\"num_bits\": 8, \"type\": \"float\", "
                                 "\"strategy\": \"token\", \"dynamic\": true}}}, \"ignore\": "
                                 "[\"lm_head\"], \"kv_cache_scheme\": null}}",
                  &c),
        DUET_OK);
    assert_int_equal(c.quant.method, DUET_QUANT_COMPRESSED_TENSORS);
    assert_true(c.quant.per_channel);
    assert_false(c.quant.static_input);
    assert_int_equal(
        parse_cfg("{" BASE ", " CT_HEAD CT_W(
                      "tensor") ", \"input_activations\": {\"num_bits\": 8, \"type\": \"float\", "
                                "\"strategy\": \"tensor\", \"dynamic\": false}}}}}",
                  &c),
        DUET_OK);
    assert_false(c.quant.per_channel);
    assert_true(c.quant.static_input);
    assert_int_equal(parse_cfg("{" BASE ", \"quantization_config\": {\"quant_method\": "
                               "\"fbgemm_fp8\", \"activation_scale_ub\": 1200.0, "
                               "\"modules_to_not_convert\": [\"lm_head\"]}}",
                               &c),
                     DUET_OK);
    assert_int_equal(c.quant.method, DUET_QUANT_FBGEMM_FP8);
    assert_true(c.quant.per_channel);
    assert_int_equal(parse_cfg("{" BASE ", \"quantization_config\": {\"quant_method\": \"fp8\", "
                               "\"activation_scheme\": \"static\"}}",
                               &c),
                     DUET_OK);
    assert_int_equal(c.quant.method, DUET_QUANT_FP8);
    assert_false(c.quant.per_channel);
    assert_true(c.quant.static_input);
    assert_string_equal(duet_quant_method_name(DUET_QUANT_FBGEMM_FP8), "fbgemm_fp8");

    expect_cfg_error("{" BASE ", \"quantization_config\": {\"quant_method\": \"awq\"}}",
                     DUET_ERR_UNSUPPORTED, "quantization_config.quant_method: awq");
    expect_cfg_error("{" BASE ", \"quantization_config\": {\"bits\": 4}}", DUET_ERR_FORMAT,
                     "quantization_config.quant_method");
    expect_cfg_error("{" BASE ", \"quantization_config\": 3}", DUET_ERR_FORMAT,
                     "quantization_config");
    expect_cfg_error("{" BASE ", " CT_HEAD CT_W("block") "}}}}", DUET_ERR_UNSUPPORTED,
                     "quantization_config.config_groups.group_0.weights.strategy: block");
    expect_cfg_error("{" BASE ", " CT_HEAD CT_W("group") "}}}}", DUET_ERR_UNSUPPORTED,
                     "weights.strategy: group");
    expect_cfg_error("{" BASE ", \"quantization_config\": {\"quant_method\": "
                     "\"compressed-tensors\", \"format\": \"pack-quantized\"}}",
                     DUET_ERR_UNSUPPORTED, "quantization_config.format: pack-quantized");
    expect_cfg_error("{" BASE ", \"quantization_config\": {\"quant_method\": "
                     "\"compressed-tensors\", \"config_groups\": {}}}",
                     DUET_ERR_FORMAT, "quantization_config.format");
    expect_cfg_error("{" BASE ", \"quantization_config\": {\"quant_method\": "
                     "\"compressed-tensors\", \"format\": \"float-quantized\"}}",
                     DUET_ERR_FORMAT, "quantization_config.config_groups");
    expect_cfg_error("{" BASE ", " CT_HEAD
                     "\"config_groups\": {\"g\": {\"weights\": {\"num_bits\": "
                     "4, \"type\": \"int\", \"strategy\": \"channel\"}}}}}",
                     DUET_ERR_UNSUPPORTED, "config_groups.g.weights.num_bits");
    expect_cfg_error("{" BASE ", " CT_HEAD
                     "\"config_groups\": {\"g\": {\"weights\": {\"num_bits\": "
                     "8, \"type\": \"int\", \"strategy\": \"channel\"}}}}}",
                     DUET_ERR_UNSUPPORTED, "config_groups.g.weights.type");
    expect_cfg_error("{" BASE ", " CT_HEAD
                     "\"config_groups\": {\"g\": {\"weights\": {\"num_bits\": "
                     "8, \"type\": \"float\", \"strategy\": \"channel\", \"symmetric\": false}}}}}",
                     DUET_ERR_UNSUPPORTED, "config_groups.g.weights.symmetric");
    expect_cfg_error("{" BASE ", " CT_HEAD
                     "\"config_groups\": {\"g\": {\"weights\": {\"num_bits\": "
                     "8, \"type\": \"float\"}}}}}",
                     DUET_ERR_FORMAT, "config_groups.g.weights.strategy: missing");
    expect_cfg_error("{" BASE ", " CT_HEAD "\"config_groups\": {\"g\": {\"targets\": []}}}}",
                     DUET_ERR_FORMAT, "config_groups.g.weights: missing");
    expect_cfg_error("{" BASE ", " CT_HEAD CT_W(
                         "channel") "}, \"h\": {\"weights\": {\"num_bits\": "
                                    "8, \"type\": \"float\", \"strategy\": \"tensor\"}}}}}",
                     DUET_ERR_UNSUPPORTED, "config_groups.h.weights.strategy");
    expect_cfg_error("{" BASE ", " CT_HEAD CT_W("tensor") "}}, \"kv_cache_scheme\": {\"num_bits\": "
                                                          "8}}}",
                     DUET_ERR_UNSUPPORTED, "quantization_config.kv_cache_scheme");
    expect_cfg_error("{" BASE ", " CT_HEAD CT_W("tensor") "}}, \"ignore\": \"lm_head\"}}",
                     DUET_ERR_FORMAT, "quantization_config.ignore");
    expect_cfg_error("{" BASE ", \"quantization_config\": {\"quant_method\": \"fp8\", "
                     "\"weight_block_size\": [128, 128]}}",
                     DUET_ERR_UNSUPPORTED, "quantization_config.weight_block_size");
    expect_cfg_error("{" BASE ", \"quantization_config\": {\"quant_method\": \"fbgemm_fp8\", "
                     "\"activation_scale_ub\": -1}}",
                     DUET_ERR_FORMAT, "quantization_config.activation_scale_ub");
}

/* A small FP8 model in tmpdir/name. */
static void make_fp8(const char *name, int fp8, int format, duet_dtype_t dtype, char *dir)
{
    duet_mkmodel_opts_t o = duet_mkmodel_opts_default();
    o.fp8 = fp8;
    o.fp8_format = format;
    o.dtype = dtype;
    o.threads = 1;
    snprintf(dir, PATH_MAX, "%s/%s", tmpdir, name);
    if (duet_mkmodel_write(dir, &o) != DUET_OK)
        fail_msg("mkmodel: %s", duet_error_msg());
}

/* Rewrite dir's model.safetensors: drop `drop`, or give `reshape` the
 * shape [d0] (d1 < 0) or [d0, d1], or give `retype` F8_E4M3 data. */
static void rewrite(const char *dir, const char *drop, const char *reshape, int64_t d0, int64_t d1,
                    const char *retype)
{
    char path[PATH_MAX];
    duet_st_set_t *set;
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    assert_int_equal(duet_st_open_file(path, &set), DUET_OK);
    size_t n = duet_st_count(set), k = 0;
    duet_st_write_tensor_t *t = calloc(n, sizeof(*t));
    void *bufs[2] = {NULL, NULL};
    assert_non_null(t);
    for (size_t i = 0; i < n; i++) {
        const duet_st_tensor_t *s = duet_st_at(set, i);
        if (drop != NULL && strcmp(s->name, drop) == 0)
            continue;
        t[k] = (duet_st_write_tensor_t){s->name, s->dtype, s->ndim, {0}, s->data};
        memcpy(t[k].shape, s->shape, sizeof(s->shape));
        if (reshape != NULL && strcmp(s->name, reshape) == 0) {
            t[k].ndim = d1 < 0 ? 1 : 2;
            t[k].shape[0] = d0;
            t[k].shape[1] = d1 < 0 ? 0 : d1;
            bufs[0] = calloc((size_t)d0 * (size_t)(d1 < 0 ? 1 : d1), 4);
            for (int64_t e = 0; e < d0 * (d1 < 0 ? 1 : d1); e++)
                ((float *)bufs[0])[e] = 0.01f;
            t[k].dtype = DUET_DTYPE_F32;
            t[k].data = bufs[0];
        }
        if (retype != NULL && strcmp(s->name, retype) == 0) { /* zeros, 1 byte each */
            size_t count = 1;
            for (int d = 0; d < s->ndim; d++)
                count *= (size_t)s->shape[d];
            bufs[1] = calloc(count, 1);
            t[k].dtype = DUET_DTYPE_F8_E4M3;
            t[k].data = bufs[1];
        }
        k++;
    }
    /* write next to it, then replace (the set maps the old file) */
    char tmp[PATH_MAX + 8];
    snprintf(tmp, sizeof(tmp), "%s.new", path);
    assert_int_equal(duet_st_write_file(tmp, t, k), DUET_OK);
    duet_st_close(set);
    assert_int_equal(rename(tmp, path), 0);
    free(bufs[0]);
    free(bufs[1]);
    free(t);
}

static void expect_open_error(const char *dir, const char *sub)
{
    duet_model_t *m = NULL;
    duet_status_t st = duet_model_open(dir, &m);
    if (st == DUET_OK) {
        duet_model_close(m);
        fail_msg("%s: opened, expected an error with '%s'", dir, sub);
    }
    if (strstr(duet_error_msg(), sub) == NULL)
        fail_msg("message '%s' lacks '%s'", duet_error_msg(), sub);
}

static void set_config(const char *dir, const char *from, const char *to)
{
    char path[PATH_MAX];
    cJSON *j;
    snprintf(path, sizeof(path), "%s/config.json", dir);
    assert_int_equal(duet_json_load_file(path, &j), DUET_OK);
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    char *at = strstr(text, from);
    assert_non_null(at);
    size_t n = strlen(text) + strlen(to) + 1;
    char *out = malloc(n);
    snprintf(out, n, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
    FILE *f = fopen(path, "w");
    fputs(out, f);
    fclose(f);
    free(out);
    cJSON_free(text);
}

static void test_loader(void **state)
{
    (void)state;
    char dir[PATH_MAX];
    duet_model_t *m;
    const char *q0s = "model.layers.0.self_attn.q_proj.weight_scale";

    /* every format opens, scales bound with the strategy's shape */
    const int cases[][2] = {{DUET_MKMODEL_FP8_CHANNEL, DUET_MKMODEL_FP8_COMPRESSED_TENSORS},
                            {DUET_MKMODEL_FP8_TENSOR, DUET_MKMODEL_FP8_COMPRESSED_TENSORS},
                            {DUET_MKMODEL_FP8_CHANNEL, DUET_MKMODEL_FP8_FBGEMM},
                            {DUET_MKMODEL_FP8_TENSOR, DUET_MKMODEL_FP8_VLLM}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char name[32];
        snprintf(name, sizeof(name), "ok%zu", i);
        make_fp8(name, cases[i][0], cases[i][1], DUET_DTYPE_BF16, dir);
        if (duet_model_open(dir, &m) != DUET_OK)
            fail_msg("%s: %s", dir, duet_error_msg());
        const duet_layer_weights_t *w = &m->layers[1];
        assert_int_equal(w->w_down->dtype, DUET_DTYPE_F8_E4M3);
        assert_non_null(w->w_down_scale);
        assert_non_null(w->wq_scale);
        assert_int_equal(w->wq_scale->ndim, cases[i][0] == DUET_MKMODEL_FP8_CHANNEL ? 2
                                            : cases[i][1] == DUET_MKMODEL_FP8_VLLM  ? 0
                                                                                    : 1);
        assert_int_equal(m->embed->dtype, DUET_DTYPE_BF16);
        assert_int_equal(m->lm_head->dtype, DUET_DTYPE_BF16);
        duet_model_close(m);
    }

    make_fp8("noscale", DUET_MKMODEL_FP8_CHANNEL, 0, DUET_DTYPE_BF16, dir);
    rewrite(dir, q0s, NULL, 0, 0, NULL);
    expect_open_error(dir, "tensor model.layers.0.self_attn.q_proj.weight_scale: missing");

    make_fp8("shape1", DUET_MKMODEL_FP8_CHANNEL, 0, DUET_DTYPE_BF16, dir);
    rewrite(dir, NULL, q0s, 64, -1, NULL); /* [out], not [out, 1] */
    expect_open_error(dir, "q_proj.weight_scale: shape [64] does not match the per-channel");

    make_fp8("shape2", DUET_MKMODEL_FP8_TENSOR, 0, DUET_DTYPE_BF16, dir);
    rewrite(dir, NULL, q0s, 64, 1, NULL); /* per channel in a per-tensor model */
    expect_open_error(dir, "q_proj.weight_scale: shape [64, 1] does not match the per-tensor");

    make_fp8("shape3", DUET_MKMODEL_FP8_CHANNEL, 0, DUET_DTYPE_BF16, dir);
    rewrite(dir, NULL, q0s, 32, 1, NULL); /* wrong row count */
    expect_open_error(dir, "expected [64, 1]");

    make_fp8("noqc", DUET_MKMODEL_FP8_CHANNEL, 0, DUET_DTYPE_BF16, dir);
    set_config(dir, "\"quantization_config\"", "\"no_quantization_config\"");
    expect_open_error(dir, "q_proj.weight: dtype F8_E4M3, but config.json has no "
                           "quantization_config");

    make_fp8("embed8", DUET_MKMODEL_FP8_CHANNEL, 0, DUET_DTYPE_BF16, dir);
    rewrite(dir, NULL, NULL, 0, 0, "model.embed_tokens.weight");
    expect_open_error(dir, "model.embed_tokens.weight: dtype F8_E4M3: only the q/k/v/o");

    make_fp8("norm8", DUET_MKMODEL_FP8_CHANNEL, 0, DUET_DTYPE_BF16, dir);
    rewrite(dir, NULL, NULL, 0, 0, "model.layers.1.input_layernorm.weight");
    expect_open_error(dir, "input_layernorm.weight: dtype F8_E4M3");

    make_fp8("unknown", DUET_MKMODEL_FP8_CHANNEL, 0, DUET_DTYPE_BF16, dir);
    set_config(dir, "\"compressed-tensors\"", "\"gptq\"");
    expect_open_error(dir, "quantization_config.quant_method: gptq is not supported");
}

/* The CPU backend's load path reads e4m3 * scale exactly as the reference
 * dequantization does, for row and column blocks (TP shards). */
static void test_weight_src(void **state)
{
    (void)state;
    uint8_t w[6 * 4];
    float scale[6] = {0.5f, 2.0f, 0.01f, 3.0f, 1.0f, 0.125f};
    uint16_t scale_bf16[1] = {duet_f32_to_bf16(0.0625f)};
    float out[6 * 4];

    for (int i = 0; i < 24; i++)
        w[i] = (uint8_t)((i * 11 + 3) % 0x7e | (i & 1 ? 0x80 : 0)); /* no NaN */
    duet_weight_src_t s = {w, DUET_DTYPE_F8_E4M3, 4, 2, 3, 1, 2, scale, DUET_DTYPE_F32, true};
    duet_weight_src_to_f32(&s, out);
    for (int r = 0; r < 3; r++) {
        for (int c = 0; c < 2; c++)
            assert_true(out[r * 2 + c] == duet_e4m3_to_f32(w[(2 + r) * 4 + 1 + c]) * scale[2 + r]);
    }
    s = (duet_weight_src_t){w,          DUET_DTYPE_F8_E4M3, 4,    0, 6, 0, 4,
                            scale_bf16, DUET_DTYPE_BF16,    false};
    duet_weight_src_to_f32(&s, out);
    for (int i = 0; i < 24; i++)
        assert_true(out[i] == duet_e4m3_to_f32(w[i]) * 0.0625f);
}

/* mkmodel --fp8: the stored e4m3 bytes are the bf16 values divided by
 * amax / 448, rounded; the row (or tensor) amax maps to 448. */
static void test_mkmodel_fp8(void **state)
{
    (void)state;
    char dir[PATH_MAX];
    duet_model_t *m;
    duet_mkmodel_opts_t o = duet_mkmodel_opts_default();
    o.dtype = DUET_DTYPE_BF16;

    make_fp8("mk", DUET_MKMODEL_FP8_CHANNEL, 0, DUET_DTYPE_BF16, dir);
    assert_int_equal(duet_model_open(dir, &m), DUET_OK);
    const duet_st_tensor_t *t = m->layers[0].w_gate, *sc = m->layers[0].w_gate_scale;
    int64_t rows = t->shape[0], cols = t->shape[1];
    float *v = malloc((size_t)(rows * cols) * sizeof(float));
    assert_int_equal(
        duet_mkmodel_values(&o, "model.layers.0.mlp.gate_proj.weight", 0, (size_t)(rows * cols), v),
        DUET_OK);
    for (int64_t r = 0; r < rows; r++) {
        float amax = 0, s = ((const float *)sc->data)[r];
        bool hit = false;
        for (int64_t c = 0; c < cols; c++) {
            float b = duet_bf16_to_f32(duet_f32_to_bf16(v[r * cols + c]));
            amax = fabsf(b) > amax ? fabsf(b) : amax;
        }
        assert_true(s == amax / 448.0f);
        for (int64_t c = 0; c < cols; c++) {
            float b = duet_bf16_to_f32(duet_f32_to_bf16(v[r * cols + c]));
            uint8_t q = ((const uint8_t *)t->data)[r * cols + c];
            assert_int_equal(q, duet_f32_to_e4m3(b / s));
            hit = hit || (q & 0x7f) == 0x7e;
        }
        assert_true(hit); /* the amax element is +-448 */
    }
    free(v);
    o.fp8 = DUET_MKMODEL_FP8_CHANNEL;
    float one;
    assert_int_equal(
        duet_mkmodel_values(&o, "model.layers.0.mlp.gate_proj.weight_scale", 0, 1, &one),
        DUET_ERR_INVALID);
    o.fp8 = 0;
    duet_model_close(m);
    /* sizes: 1 byte a linear weight plus the scales */
    uint64_t params, bytes, params8, bytes8;
    o.fp8 = 0;
    assert_int_equal(duet_mkmodel_size(&o, &params, &bytes), DUET_OK);
    o.fp8 = DUET_MKMODEL_FP8_TENSOR;
    assert_int_equal(duet_mkmodel_size(&o, &params8, &bytes8), DUET_OK);
    assert_true(params8 == params);
    assert_true(bytes8 < bytes);
    o.fp8_format = DUET_MKMODEL_FP8_FBGEMM;
    assert_int_equal(duet_mkmodel_check(&o), DUET_ERR_INVALID);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_e4m3),
        cmocka_unit_test(test_quant_config),
        cmocka_unit_test(test_weight_src),
        cmocka_unit_test_setup_teardown(test_loader, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mkmodel_fp8, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
