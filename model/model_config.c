/* config.json of a Hugging Face Llama-family checkpoint.
 *
 * Defaults for absent keys follow transformers' LlamaConfig:
 * num_key_value_heads = num_attention_heads, head_dim = hidden_size /
 * num_attention_heads, max_position_embeddings = 2048, rope_theta = 10000,
 * rms_norm_eps = 1e-6, tie_word_embeddings = false, attention_bias = false
 * (q/k/v biases always for Qwen2; attention_bias: true gives q/k/v and o
 * biases, as in LlamaAttention and Qwen3Attention), torch_dtype = float32;
 * Qwen3's head_dim defaults to 128 as in Qwen3Config.  rope_scaling linear,
 * llama3, yarn and dynamic are read as transformers' modeling_rope_utils reads them.
 * Anything that would change the computation and that duet does not
 * implement (longrope and other scaling types, sliding windows shorter than
 * the context, another activation, MLP bias) is refused rather than
 * ignored. */
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
    {"Qwen3ForCausalLM", "qwen3", DUET_ARCH_QWEN3},
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
                          "MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM)",
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
                      "%s: model_type: %s is not supported (llama, mistral, qwen2, qwen3)", what,
                      type);
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

/* A number of rope_scaling; def < 0 makes it required.  Positive unless
 * zero_ok. */
static duet_status_t duet__rs_num(const cJSON *rs, const char *what, const char *type,
                                  const char *key, double def, bool zero_ok, double *out)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(rs, key);
    if (it == NULL || cJSON_IsNull(it)) {
        if (def < 0)
            return duet_error(DUET_ERR_FORMAT,
                              "%s: rope_scaling.%s: missing (required by rope_scaling.type %s)",
                              what, key, type);
        *out = def;
        return DUET_OK;
    }
    if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble) ||
        !(it->valuedouble > 0 || (zero_ok && it->valuedouble == 0)))
        return duet_error(DUET_ERR_FORMAT, "%s: rope_scaling.%s: expected a %s number", what, key,
                          zero_ok ? "non-negative" : "positive");
    *out = it->valuedouble;
    return DUET_OK;
}

/* yarn's default attention factor: get_mscale of modeling_rope_utils */
static double duet__yarn_mscale(double scale, double mscale)
{
    return scale <= 1 ? 1.0 : 0.1 * mscale * log(scale) + 1.0;
}

static duet_status_t duet__cfg_yarn(const cJSON *rs, const char *what, int max_pos,
                                    duet_rope_scaling_t *r)
{
    const cJSON *tr = cJSON_GetObjectItemCaseSensitive(rs, "truncate");
    double orig = max_pos, mscale, mscale_all, attn;
    duet_status_t st;

    if ((st = duet__rs_num(rs, what, "yarn", "original_max_position_embeddings", max_pos, false,
                           &orig)) != DUET_OK ||
        (st = duet__rs_num(rs, what, "yarn", "factor", max_pos / orig, false, &r->factor)) !=
            DUET_OK ||
        (st = duet__rs_num(rs, what, "yarn", "beta_fast", 32, false, &r->beta_fast)) != DUET_OK ||
        (st = duet__rs_num(rs, what, "yarn", "beta_slow", 1, false, &r->beta_slow)) != DUET_OK ||
        (st = duet__rs_num(rs, what, "yarn", "mscale", 0, true, &mscale)) != DUET_OK ||
        (st = duet__rs_num(rs, what, "yarn", "mscale_all_dim", 0, true, &mscale_all)) != DUET_OK ||
        (st = duet__rs_num(rs, what, "yarn", "attention_factor", 0, true, &attn)) != DUET_OK)
        return st;
    if (orig != floor(orig) || orig > DUET_CFG_MAX_DIM)
        return duet_error(DUET_ERR_FORMAT,
                          "%s: rope_scaling.original_max_position_embeddings: expected a "
                          "positive integer",
                          what);
    if (tr != NULL && !cJSON_IsNull(tr) && !cJSON_IsBool(tr))
        return duet_error(DUET_ERR_FORMAT, "%s: rope_scaling.truncate: expected a boolean", what);
    r->truncate = tr == NULL || cJSON_IsNull(tr) || cJSON_IsTrue(tr);
    r->orig_max_pos = (int)orig;
    /* an explicit attention_factor wins; 0 counts as absent (as `or` does) */
    if (attn > 0)
        r->attention_factor = attn;
    else if (mscale > 0 && mscale_all > 0)
        r->attention_factor =
            duet__yarn_mscale(r->factor, mscale) / duet__yarn_mscale(r->factor, mscale_all);
    else
        r->attention_factor = duet__yarn_mscale(r->factor, 1.0);
    if (r->factor == 1.0 && r->attention_factor == 1.0)
        r->type = DUET_ROPE_NONE;
    return DUET_OK;
}

/* rope_scaling: linear, llama3, yarn and dynamic (NTK); others refused. */
static duet_status_t duet__cfg_rope_scaling(const cJSON *json, const char *what, int max_pos,
                                            duet_rope_scaling_t *r)
{
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(json, "rope_scaling");
    const cJSON *type;
    const char *name;
    double orig = 0;
    duet_status_t st;

    memset(r, 0, sizeof(*r));
    r->type = DUET_ROPE_NONE;
    r->factor = 1.0;
    r->attention_factor = 1.0;
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
    if (strcmp(name, "yarn") == 0) {
        r->type = DUET_ROPE_YARN;
        return duet__cfg_yarn(rs, what, max_pos, r);
    }
    if (strcmp(name, "linear") != 0 && strcmp(name, "llama3") != 0 && strcmp(name, "dynamic") != 0)
        return duet_error(DUET_ERR_UNSUPPORTED,
                          "%s: rope_scaling.type %s is not supported (default, linear, llama3, "
                          "yarn, dynamic)",
                          what, name);
    if ((st = duet__rs_num(rs, what, name, "factor", -1, false, &r->factor)) != DUET_OK)
        return st;
    if (r->factor == 1.0) /* linear, llama3 and dynamic are plain RoPE at factor 1 */
        return DUET_OK;
    if (strcmp(name, "dynamic") == 0) { /* see DUET_ROPE_DYNAMIC */
        r->type = DUET_ROPE_DYNAMIC;
        return DUET_OK;
    }
    if (strcmp(name, "linear") == 0) {
        r->type = DUET_ROPE_LINEAR;
        return DUET_OK;
    }
    r->type = DUET_ROPE_LLAMA3;
    if ((st = duet__rs_num(rs, what, name, "low_freq_factor", -1, false, &r->low_freq_factor)) !=
            DUET_OK ||
        (st = duet__rs_num(rs, what, name, "high_freq_factor", -1, false, &r->high_freq_factor)) !=
            DUET_OK ||
        (st = duet__rs_num(rs, what, name, "original_max_position_embeddings", -1, false, &orig)) !=
            DUET_OK)
        return st;
    if (orig != floor(orig) || orig > DUET_CFG_MAX_DIM)
        return duet_error(DUET_ERR_FORMAT,
                          "%s: rope_scaling.original_max_position_embeddings: expected a "
                          "positive integer",
                          what);
    if (!(r->high_freq_factor > r->low_freq_factor))
        return duet_error(DUET_ERR_FORMAT,
                          "%s: rope_scaling.high_freq_factor %g must be above low_freq_factor %g",
                          what, r->high_freq_factor, r->low_freq_factor);
    r->orig_max_pos = (int)orig;
    return DUET_OK;
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
        c.arch != DUET_ARCH_QWEN3 && c.hidden % c.n_heads != 0)
        return duet_error(DUET_ERR_FORMAT,
                          "%s: hidden_size %d is not a multiple of num_attention_heads %d and "
                          "head_dim is not given",
                          what, c.hidden, c.n_heads);
    /* Qwen3Config's head_dim defaults to 128, not hidden / heads */
    if ((st = duet__cfg_int(json, what, "head_dim", 1,
                            c.arch == DUET_ARCH_QWEN3 ? 128 : c.hidden / c.n_heads, &c.head_dim)) !=
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
        (st = duet__cfg_rope_scaling(json, what, c.max_pos, &c.rope_scaling)) != DUET_OK ||
        (st = duet__cfg_sliding_window(json, what, c.max_pos)) != DUET_OK ||
        (st = duet__cfg_mlp(json, what)) != DUET_OK ||
        (st = duet_quant_config_parse(json, what, &c.quant)) != DUET_OK)
        return st;
    c.qkv_bias = c.arch == DUET_ARCH_QWEN2 || attention_bias;
    c.o_bias = c.arch != DUET_ARCH_QWEN2 && attention_bias;
    c.qk_norm = c.arch == DUET_ARCH_QWEN3;
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
