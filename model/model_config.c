/* config.json of a Hugging Face Llama-family checkpoint.
 *
 * Defaults for absent keys follow transformers' LlamaConfig:
 * num_key_value_heads = num_attention_heads, head_dim = hidden_size /
 * num_attention_heads, max_position_embeddings = 2048, rope_theta = 10000,
 * rms_norm_eps = 1e-6, tie_word_embeddings = false, attention_bias = false
 * (q/k/v biases always for Qwen2; attention_bias: true gives q/k/v and o
 * biases, as in LlamaAttention), torch_dtype = float32.  Anything that would
 * change the computation and that duet does not implement (RoPE scaling,
 * sliding windows shorter than the context, another activation, MLP bias)
 * is refused rather than ignored. */
#include "model/model_config.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/json.h"

#define DUET_CFG_MAX_DIM (1 << 24)

static const struct {
    const char *hf;   /* architectures[0] */
    const char *type; /* model_type, and duet's short name */
    duet_arch_t arch;
} duet__archs[] = {
    {"LlamaForCausalLM", "llama", DUET_ARCH_LLAMA},
    {"MistralForCausalLM", "mistral", DUET_ARCH_MISTRAL},
    {"Qwen2ForCausalLM", "qwen2", DUET_ARCH_QWEN2},
};
#define DUET__N_ARCHS (sizeof(duet__archs) / sizeof(duet__archs[0]))

const char *duet_arch_name(duet_arch_t arch)
{
    for (size_t i = 0; i < DUET__N_ARCHS; i++) {
        if (duet__archs[i].arch == arch)
            return duet__archs[i].type;
    }
    return "?";
}

int duet_arch_parse(const char *s)
{
    for (size_t i = 0; i < DUET__N_ARCHS; i++) {
        if (strcmp(s, duet__archs[i].type) == 0 || strcmp(s, duet__archs[i].hf) == 0)
            return (int)duet__archs[i].arch;
    }
    return -1;
}

bool duet_model_config_is_eos(const duet_model_config_t *cfg, int id)
{
    for (int i = 0; i < cfg->n_eos; i++) {
        if (cfg->eos_ids[i] == id)
            return true;
    }
    return false;
}

static duet_status_t duet__cfg_arch(const cJSON *json, const char *what, duet_arch_t *arch_p)
{
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(json, "architectures");
    const char *type = NULL;
    duet_status_t st;

    if (archs != NULL && !cJSON_IsNull(archs)) {
        const cJSON *a0 = cJSON_GetArrayItem(archs, 0);
        if (!cJSON_IsArray(archs) || !cJSON_IsString(a0))
            return duet_error(DUET_ERR_FORMAT,
                              "%s: architectures: expected a non-empty list of strings", what);
        for (size_t i = 0; i < DUET__N_ARCHS; i++) {
            if (strcmp(a0->valuestring, duet__archs[i].hf) == 0) {
                *arch_p = duet__archs[i].arch;
                return DUET_OK;
            }
        }
        return duet_error(DUET_ERR_UNSUPPORTED,
                          "%s: architectures[0]: %s is not supported (LlamaForCausalLM, "
                          "MistralForCausalLM, Qwen2ForCausalLM)",
                          what, a0->valuestring);
    }
    st = duet_json_get_string(json, "model_type", what, &type);
    if (st == DUET_ERR_NOT_FOUND)
        return duet_error(DUET_ERR_FORMAT, "%s: missing required key architectures (or model_type)",
                          what);
    if (st != DUET_OK)
        return st;
    for (size_t i = 0; i < DUET__N_ARCHS; i++) {
        if (strcmp(type, duet__archs[i].type) == 0) {
            *arch_p = duet__archs[i].arch;
            return DUET_OK;
        }
    }
    return duet_error(DUET_ERR_UNSUPPORTED,
                      "%s: model_type: %s is not supported (llama, mistral, qwen2)", what, type);
}

/* An integer in [lo, DUET_CFG_MAX_DIM]; def < 0 makes the key required. */
static duet_status_t duet__cfg_int(const cJSON *json, const char *what, const char *key, int lo,
                                   int def, int *out)
{
    int64_t v;
    duet_status_t st = duet_json_get_int(json, key, what, &v);

    if (st == DUET_ERR_NOT_FOUND) {
        if (def < 0)
            return duet_error(DUET_ERR_FORMAT, "%s: missing required key %s", what, key);
        *out = def;
        return DUET_OK;
    }
    if (st != DUET_OK)
        return st;
    if (v < lo)
        return duet_error(DUET_ERR_FORMAT, "%s: %s: %lld must be %s", what, key, (long long)v,
                          lo > 0 ? "positive" : "non-negative");
    if (v > DUET_CFG_MAX_DIM)
        return duet_error(DUET_ERR_FORMAT, "%s: %s: %lld is above the limit %d", what, key,
                          (long long)v, DUET_CFG_MAX_DIM);
    *out = (int)v;
    return DUET_OK;
}

static duet_status_t duet__cfg_pos_double(const cJSON *json, const char *what, const char *key,
                                          double def, double *out)
{
    double v;
    duet_status_t st = duet_json_get_double(json, key, what, &v);

    if (st == DUET_ERR_NOT_FOUND) {
        *out = def;
        return DUET_OK;
    }
    if (st != DUET_OK)
        return st;
    if (!(v > 0) || !isfinite(v))
        return duet_error(DUET_ERR_FORMAT, "%s: %s: %g must be positive", what, key, v);
    *out = v;
    return DUET_OK;
}

static duet_status_t duet__cfg_bool(const cJSON *json, const char *what, const char *key, bool def,
                                    bool *out)
{
    duet_status_t st = duet_json_get_bool(json, key, what, out);
    if (st == DUET_ERR_NOT_FOUND) {
        *out = def;
        return DUET_OK;
    }
    return st;
}

static duet_status_t duet__cfg_token(const cJSON *item, const char *what, const char *key,
                                     int vocab, int *out)
{
    double v = cJSON_IsNumber(item) ? item->valuedouble : -1;
    if (!cJSON_IsNumber(item) || v != floor(v))
        return duet_error(DUET_ERR_FORMAT, "%s: %s: expected a token id", what, key);
    if (v < 0 || v >= vocab)
        return duet_error(DUET_ERR_FORMAT, "%s: %s: %g is outside the vocabulary [0, %d)", what,
                          key, v, vocab);
    *out = (int)v;
    return DUET_OK;
}

static duet_status_t duet__cfg_tokens(const cJSON *json, const char *what, duet_model_config_t *c)
{
    const cJSON *bos = cJSON_GetObjectItemCaseSensitive(json, "bos_token_id");
    const cJSON *eos = cJSON_GetObjectItemCaseSensitive(json, "eos_token_id");
    const cJSON *it;
    duet_status_t st;

    c->bos_id = -1;
    c->n_eos = 0;
    if (bos != NULL && !cJSON_IsNull(bos) &&
        (st = duet__cfg_token(bos, what, "bos_token_id", c->vocab, &c->bos_id)) != DUET_OK)
        return st;
    if (eos == NULL || cJSON_IsNull(eos))
        return DUET_OK;
    if (!cJSON_IsArray(eos))
        return duet__cfg_token(eos, what, "eos_token_id", c->vocab, &c->eos_ids[c->n_eos++]);
    if (cJSON_GetArraySize(eos) > DUET_MAX_EOS_IDS)
        return duet_error(DUET_ERR_UNSUPPORTED, "%s: eos_token_id: %d ids, at most %d", what,
                          cJSON_GetArraySize(eos), DUET_MAX_EOS_IDS);
    cJSON_ArrayForEach(it, eos)
    {
        if ((st = duet__cfg_token(it, what, "eos_token_id", c->vocab, &c->eos_ids[c->n_eos++])) !=
            DUET_OK)
            return st;
    }
    return DUET_OK;
}

static duet_status_t duet__cfg_dtype(const cJSON *json, const char *what, duet_dtype_t *out)
{
    static const struct {
        const char *name;
        duet_dtype_t dt;
    } names[] = {
        {"float32", DUET_DTYPE_F32}, {"float16", DUET_DTYPE_F16}, {"bfloat16", DUET_DTYPE_BF16}};
    const char *key = "torch_dtype", *s = NULL;
    duet_status_t st = duet_json_get_string(json, key, what, &s);

    if (st == DUET_ERR_NOT_FOUND) { /* newer transformers write "dtype" */
        key = "dtype";
        st = duet_json_get_string(json, key, what, &s);
    }
    if (st == DUET_ERR_NOT_FOUND) {
        *out = DUET_DTYPE_F32;
        return DUET_OK;
    }
    if (st != DUET_OK)
        return st;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (strcmp(s, names[i].name) == 0) {
            *out = names[i].dt;
            return DUET_OK;
        }
    }
    return duet_error(DUET_ERR_UNSUPPORTED,
                      "%s: %s: %s is not supported (float32, float16, "
                      "bfloat16)",
                      what, key, s);
}

/* Accept only RoPE scaling that changes nothing. */
static duet_status_t duet__cfg_rope_scaling(const cJSON *json, const char *what)
{
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(json, "rope_scaling");
    const cJSON *type, *factor;
    const char *name;

    if (rs == NULL || cJSON_IsNull(rs))
        return DUET_OK;
    if (!cJSON_IsObject(rs))
        return duet_error(DUET_ERR_FORMAT, "%s: rope_scaling: expected an object or null", what);
    type = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
    if (!cJSON_IsString(type))
        type = cJSON_GetObjectItemCaseSensitive(rs, "type");
    if (!cJSON_IsString(type))
        return duet_error(DUET_ERR_FORMAT, "%s: rope_scaling: missing type / rope_type", what);
    name = type->valuestring;
    if (strcmp(name, "default") == 0)
        return DUET_OK;
    factor = cJSON_GetObjectItemCaseSensitive(rs, "factor");
    /* linear, dynamic, llama3 and yarn all reduce to plain RoPE at factor 1 */
    if ((strcmp(name, "linear") == 0 || strcmp(name, "dynamic") == 0 ||
         strcmp(name, "llama3") == 0 || strcmp(name, "yarn") == 0) &&
        cJSON_IsNumber(factor) && factor->valuedouble == 1.0)
        return DUET_OK;
    if (strcmp(name, "llama3") == 0)
        return duet_error(DUET_ERR_UNSUPPORTED,
                          "%s: rope_scaling.type llama3 (Llama-3.1-style frequency scaling) is "
                          "not supported yet; only unscaled RoPE is implemented",
                          what);
    return duet_error(DUET_ERR_UNSUPPORTED,
                      "%s: rope_scaling.type %s is not supported; only unscaled RoPE is "
                      "implemented",
                      what, name);
}

/* Sliding-window attention equals full attention only when the window
 * covers the whole context. */
static duet_status_t duet__cfg_sliding_window(const cJSON *json, const char *what, int max_pos)
{
    int64_t window;
    bool use = true;
    duet_status_t st = duet_json_get_bool(json, "use_sliding_window", what, &use);

    if (st != DUET_OK && st != DUET_ERR_NOT_FOUND)
        return st;
    if (!use)
        return DUET_OK;
    st = duet_json_get_int(json, "sliding_window", what, &window);
    if (st == DUET_ERR_NOT_FOUND)
        return DUET_OK;
    if (st != DUET_OK)
        return st;
    if (window < max_pos)
        return duet_error(DUET_ERR_UNSUPPORTED,
                          "%s: sliding_window %lld is smaller than max_position_embeddings %d: "
                          "sliding-window attention is not supported",
                          what, (long long)window, max_pos);
    return DUET_OK;
}

static duet_status_t duet__cfg_mlp(const cJSON *json, const char *what)
{
    const char *act = NULL;
    bool mlp_bias = false;
    duet_status_t st = duet_json_get_string(json, "hidden_act", what, &act);

    if (st != DUET_OK && st != DUET_ERR_NOT_FOUND)
        return st;
    if (st == DUET_OK && strcmp(act, "silu") != 0)
        return duet_error(DUET_ERR_UNSUPPORTED, "%s: hidden_act: %s is not supported (silu)", what,
                          act);
    if ((st = duet__cfg_bool(json, what, "mlp_bias", false, &mlp_bias)) != DUET_OK)
        return st;
    if (mlp_bias)
        return duet_error(DUET_ERR_UNSUPPORTED, "%s: mlp_bias: true is not supported", what);
    return DUET_OK;
}

duet_status_t duet_model_config_parse(const cJSON *json, const char *what,
                                      duet_model_config_t *cfg_p)
{
    duet_model_config_t c;
    bool attention_bias = false;
    duet_status_t st;

    memset(&c, 0, sizeof(c));
    if (!cJSON_IsObject(json))
        return duet_error(DUET_ERR_FORMAT, "%s: not a JSON object", what);
    if ((st = duet__cfg_arch(json, what, &c.arch)) != DUET_OK ||
        (st = duet__cfg_int(json, what, "hidden_size", 1, -1, &c.hidden)) != DUET_OK ||
        (st = duet__cfg_int(json, what, "num_hidden_layers", 1, -1, &c.n_layers)) != DUET_OK ||
        (st = duet__cfg_int(json, what, "num_attention_heads", 1, -1, &c.n_heads)) != DUET_OK ||
        (st = duet__cfg_int(json, what, "num_key_value_heads", 1, c.n_heads, &c.n_kv_heads)) !=
            DUET_OK ||
        (st = duet__cfg_int(json, what, "intermediate_size", 1, -1, &c.intermediate)) != DUET_OK ||
        (st = duet__cfg_int(json, what, "vocab_size", 1, -1, &c.vocab)) != DUET_OK ||
        (st = duet__cfg_int(json, what, "max_position_embeddings", 1, 2048, &c.max_pos)) != DUET_OK)
        return st;
    if (c.n_heads % c.n_kv_heads != 0)
        return duet_error(DUET_ERR_FORMAT,
                          "%s: num_attention_heads %d is not a multiple of num_key_value_heads "
                          "%d",
                          what, c.n_heads, c.n_kv_heads);
    if (duet_json_get_int(json, "head_dim", what, &(int64_t){0}) == DUET_ERR_NOT_FOUND &&
        c.hidden % c.n_heads != 0)
        return duet_error(DUET_ERR_FORMAT,
                          "%s: hidden_size %d is not a multiple of num_attention_heads %d and "
                          "head_dim is not given",
                          what, c.hidden, c.n_heads);
    if ((st = duet__cfg_int(json, what, "head_dim", 1, c.hidden / c.n_heads, &c.head_dim)) !=
        DUET_OK)
        return st;
    if (c.head_dim % 2 != 0)
        return duet_error(DUET_ERR_FORMAT, "%s: head_dim: %d must be even for RoPE", what,
                          c.head_dim);
    if ((st = duet__cfg_pos_double(json, what, "rope_theta", 10000.0, &c.rope_theta)) != DUET_OK ||
        (st = duet__cfg_pos_double(json, what, "rms_norm_eps", 1e-6, &c.rms_eps)) != DUET_OK ||
        (st = duet__cfg_bool(json, what, "tie_word_embeddings", false, &c.tie_embeddings)) !=
            DUET_OK ||
        (st = duet__cfg_bool(json, what, "attention_bias", false, &attention_bias)) != DUET_OK ||
        (st = duet__cfg_tokens(json, what, &c)) != DUET_OK ||
        (st = duet__cfg_dtype(json, what, &c.torch_dtype)) != DUET_OK ||
        (st = duet__cfg_rope_scaling(json, what)) != DUET_OK ||
        (st = duet__cfg_sliding_window(json, what, c.max_pos)) != DUET_OK ||
        (st = duet__cfg_mlp(json, what)) != DUET_OK)
        return st;
    c.qkv_bias = c.arch == DUET_ARCH_QWEN2 || attention_bias;
    c.o_bias = c.arch != DUET_ARCH_QWEN2 && attention_bias;
    *cfg_p = c;
    return DUET_OK;
}

duet_status_t duet_model_config_load(const char *dir, duet_model_config_t *cfg_p)
{
    char path[PATH_MAX];
    cJSON *root;
    duet_status_t st;
    int n = snprintf(path, sizeof(path), "%s/config.json", dir);

    if (n < 0 || (size_t)n >= sizeof(path))
        return duet_error(DUET_ERR_INVALID, "%s/config.json: path too long", dir);
    if ((st = duet_json_load_file(path, &root)) != DUET_OK)
        return st;
    st = duet_model_config_parse(root, path, cfg_p);
    cJSON_Delete(root);
    return st;
}
