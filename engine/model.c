/* duet_model_open: config.json + safetensors, every weight the config
 * implies bound by its Hugging Face name and checked for shape and dtype.
 *
 * Tensors the config does not imply (rotary_emb.inv_freq in old exports,
 * a saved lm_head.weight of a tied model) are ignored, except attention
 * biases (q/k/v, o_proj) in a model whose config says it has none: running
 * without them would be silently wrong, so that is an error (vLLM refuses
 * such a checkpoint too). */
#include "engine/model.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "model/rope.h"

/* Bytes sampled from each end of every tensor for the fingerprint: cheap
 * (a few pages per tensor of a memory-mapped file) and enough to tell two
 * random initialisations apart. */
#define DUET_MODEL_FP_SAMPLE 4096

typedef struct {
    uint64_t h;
} duet__fp_t;

static void duet__fp_bytes(duet__fp_t *fp, const void *data, size_t n)
{
    const unsigned char *p = data;
    uint64_t h = fp->h;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull; /* FNV-1a */
    }
    fp->h = h;
}

static void duet__fp_u64(duet__fp_t *fp, uint64_t v)
{
    unsigned char b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(v >> (8 * i));
    duet__fp_bytes(fp, b, sizeof(b));
}

static void duet__fp_double(duet__fp_t *fp, double v)
{
    uint64_t u;
    memcpy(&u, &v, sizeof(u));
    duet__fp_u64(fp, u);
}

static void duet__fp_tensor(duet__fp_t *fp, const duet_st_tensor_t *t)
{
    size_t head = t->nbytes < DUET_MODEL_FP_SAMPLE ? t->nbytes : DUET_MODEL_FP_SAMPLE;
    size_t tail = t->nbytes - head < DUET_MODEL_FP_SAMPLE ? t->nbytes - head : DUET_MODEL_FP_SAMPLE;

    duet__fp_bytes(fp, t->name, strlen(t->name) + 1);
    duet__fp_u64(fp, (uint64_t)t->dtype);
    duet__fp_u64(fp, (uint64_t)t->ndim);
    for (int d = 0; d < t->ndim; d++)
        duet__fp_u64(fp, (uint64_t)t->shape[d]);
    duet__fp_bytes(fp, t->data, head);
    duet__fp_bytes(fp, (const char *)t->data + t->nbytes - tail, tail);
}

static uint64_t duet__fp_final(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The config fields that change what the model computes (max_pos and the
 * special token ids do not), then every bound tensor in a fixed order. */
static uint64_t duet__model_fingerprint(const duet_model_t *m)
{
    const duet_model_config_t *c = &m->cfg;
    duet__fp_t fp = {0xcbf29ce484222325ull};

    duet__fp_bytes(&fp, "duet-model-v1", 14);
    duet__fp_u64(&fp, (uint64_t)c->arch);
    duet__fp_u64(&fp, (uint64_t)c->hidden);
    duet__fp_u64(&fp, (uint64_t)c->n_layers);
    duet__fp_u64(&fp, (uint64_t)c->n_heads);
    duet__fp_u64(&fp, (uint64_t)c->n_kv_heads);
    duet__fp_u64(&fp, (uint64_t)c->head_dim);
    duet__fp_u64(&fp, (uint64_t)c->intermediate);
    duet__fp_u64(&fp, (uint64_t)c->vocab);
    duet__fp_double(&fp, c->rope_theta);
    duet__fp_double(&fp, c->rms_eps);
    duet__fp_u64(&fp, (uint64_t)c->tie_embeddings);
    duet__fp_u64(&fp, (uint64_t)c->qkv_bias);
    if (c->rope_scaling.type != DUET_ROPE_NONE) { /* unscaled models keep their fingerprint */
        duet__fp_u64(&fp, (uint64_t)c->rope_scaling.type);
        duet__fp_double(&fp, (double)c->rope_scaling.attention_factor);
        for (int i = 0; i < c->head_dim / 2; i++)
            duet__fp_double(&fp, (double)m->rope_inv_freq[i]);
    }
    duet__fp_tensor(&fp, m->embed);
    for (int l = 0; l < c->n_layers; l++) {
        const duet_layer_weights_t *w = &m->layers[l];
        /* o_bias follows from arch and qkv_bias; absent tensors add nothing */
        const duet_st_tensor_t *ts[] = {w->attn_norm, w->wq, w->wk, w->wv, w->bq, w->bk, w->bv,
                                        w->wo, w->bo, w->mlp_norm, w->w_gate, w->w_up, w->w_down,
                                        w->q_norm, w->k_norm,
                                        /* FP8 scales: NULL in float checkpoints */
                                        w->wq_scale, w->wk_scale, w->wv_scale, w->wo_scale,
                                        w->w_gate_scale, w->w_up_scale, w->w_down_scale};
        for (size_t i = 0; i < sizeof(ts) / sizeof(ts[0]); i++) {
            if (ts[i] != NULL)
                duet__fp_tensor(&fp, ts[i]);
        }
    }
    duet__fp_tensor(&fp, m->norm);
    if (!c->tie_embeddings)
        duet__fp_tensor(&fp, m->lm_head);
    return duet__fp_final(fp.h);
}

static duet_status_t duet__model_bind_any(const duet_model_t *m, const char *name, int64_t d0,
                                          int64_t d1, bool fp8_ok, const duet_st_tensor_t **t_p);

static duet_status_t duet__model_bind(const duet_model_t *m, const char *name, int64_t d0,
                                      int64_t d1, const duet_st_tensor_t **t_p)
{
    return duet__model_bind_any(m, name, d0, d1, false, t_p);
}

static void duet__shape_str(char *buf, size_t size, int ndim, const int64_t *shape)
{
    if (ndim == 1)
        snprintf(buf, size, "[%lld]", (long long)shape[0]);
    else if (ndim == 2)
        snprintf(buf, size, "[%lld, %lld]", (long long)shape[0], (long long)shape[1]);
    else
        snprintf(buf, size, "(%d dimensions)", ndim);
}

/* Find name; d1 < 0 means a 1-D tensor [d0].  F8_E4M3 is accepted for the
 * linear weights of a layer (duet__model_bind_scale checks their scales). */
static duet_status_t duet__model_bind_any(const duet_model_t *m, const char *name, int64_t d0,
                                          int64_t d1, bool fp8_ok, const duet_st_tensor_t **t_p)
{
    const duet_st_tensor_t *t = duet_st_find(m->st, name);
    int64_t want[2] = {d0, d1};
    int ndim = d1 < 0 ? 1 : 2;
    char got_s[48], want_s[48];

    duet__shape_str(want_s, sizeof(want_s), ndim, want);
    if (t == NULL)
        return duet_error(DUET_ERR_FORMAT, "%s: tensor %s: missing (config.json implies %s)",
                          m->dir, name, want_s);
    if (t->dtype == DUET_DTYPE_F8_E4M3 && !fp8_ok)
        return duet_error(DUET_ERR_FORMAT,
                          "%s: tensor %s: dtype F8_E4M3: only the q/k/v/o and gate/up/down "
                          "projections may be FP8 (embeddings, norms, lm_head and biases stay "
                          "F32, F16 or BF16)",
                          t->file, name);
    if (t->dtype != DUET_DTYPE_F32 && t->dtype != DUET_DTYPE_F16 && t->dtype != DUET_DTYPE_BF16 &&
        t->dtype != DUET_DTYPE_F8_E4M3)
        return duet_error(DUET_ERR_FORMAT, "%s: tensor %s: dtype %s is not F32, F16 or BF16",
                          t->file, name, duet_dtype_name(t->dtype));
    if (t->ndim != ndim || t->shape[0] != d0 || (ndim == 2 && t->shape[1] != d1)) {
        duet__shape_str(got_s, sizeof(got_s), t->ndim, t->shape);
        return duet_error(DUET_ERR_FORMAT,
                          "%s: tensor %s: shape %s does not match config.json (expected %s)",
                          t->file, name, got_s, want_s);
    }
    *t_p = t;
    return DUET_OK;
}

/* The weight_scale of an F8_E4M3 linear weight t (rows d0): a float dtype,
 * shape [] or [1] (per tensor) or [d0, 1] (per channel, as the config's
 * strategy says), finite and non-negative values. */
static duet_status_t duet__model_bind_scale(const duet_model_t *m, const duet_st_tensor_t *t,
                                            int64_t d0, const duet_st_tensor_t **s_p)
{
    const duet_quant_config_t *q = &m->cfg.quant;
    char name[160], got_s[48];
    const duet_st_tensor_t *s;
    size_t len = strlen(t->name);
    float v;

    if (q->method == DUET_QUANT_NONE)
        return duet_error(DUET_ERR_FORMAT,
                          "%s: tensor %s: dtype F8_E4M3, but config.json has no "
                          "quantization_config",
                          t->file, t->name);
    snprintf(name, sizeof(name), "%.*s_scale", (int)len, t->name); /* <m>.weight_scale */
    if ((s = duet_st_find(m->st, name)) == NULL)
        return duet_error(DUET_ERR_FORMAT,
                          "%s: tensor %s: missing (the F8_E4M3 weight %s needs it)", t->file, name,
                          t->name);
    if (s->dtype != DUET_DTYPE_F32 && s->dtype != DUET_DTYPE_F16 && s->dtype != DUET_DTYPE_BF16)
        return duet_error(DUET_ERR_FORMAT, "%s: tensor %s: dtype %s is not F32, F16 or BF16",
                          s->file, name, duet_dtype_name(s->dtype));
    bool per_tensor = s->ndim == 0 || (s->ndim == 1 && s->shape[0] == 1);
    bool per_channel = s->ndim == 2 && s->shape[0] == d0 && s->shape[1] == 1;
    if (q->per_channel ? !per_channel : !per_tensor) {
        duet__shape_str(got_s, sizeof(got_s), s->ndim, s->shape);
        if (s->ndim == 0)
            snprintf(got_s, sizeof(got_s), "[]");
        return duet_error(DUET_ERR_FORMAT,
                          "%s: tensor %s: shape %s does not match the %s strategy of "
                          "quantization_config (expected %s%lld%s)",
                          s->file, name, got_s, q->per_channel ? "per-channel" : "per-tensor",
                          q->per_channel ? "[" : "[] or [", q->per_channel ? (long long)d0 : 1LL,
                          q->per_channel ? ", 1]" : "]");
    }
    for (int64_t i = 0; i < (q->per_channel ? d0 : 1); i++) {
        duet_dtype_to_f32(s->dtype, (const char *)s->data + (size_t)i * duet_dtype_size(s->dtype),
                          &v, 1);
        if (!(v >= 0) || isinf(v))
            return duet_error(DUET_ERR_FORMAT,
                              "%s: tensor %s: element %lld is %g, not a finite "
                              "non-negative scale",
                              s->file, name, (long long)i, (double)v);
    }
    *s_p = s;
    return DUET_OK;
}

static duet_status_t duet__model_bind_layer(duet_model_t *m, int l)
{
    const duet_model_config_t *c = &m->cfg;
    duet_layer_weights_t *w = &m->layers[l];
    const int64_t q = (int64_t)c->n_heads * c->head_dim;
    const int64_t kv = (int64_t)c->n_kv_heads * c->head_dim;
    char name[128];
    duet_status_t st;
    const struct {
        const char *suffix;
        int64_t d0, d1;
        const duet_st_tensor_t **dst;
    } specs[] = {
        {"input_layernorm.weight", c->hidden, -1, &w->attn_norm},
        {"self_attn.q_proj.weight", q, c->hidden, &w->wq},
        {"self_attn.k_proj.weight", kv, c->hidden, &w->wk},
        {"self_attn.v_proj.weight", kv, c->hidden, &w->wv},
        {"self_attn.o_proj.weight", c->hidden, q, &w->wo},
        {"post_attention_layernorm.weight", c->hidden, -1, &w->mlp_norm},
        {"mlp.gate_proj.weight", c->intermediate, c->hidden, &w->w_gate},
        {"mlp.up_proj.weight", c->intermediate, c->hidden, &w->w_up},
        {"mlp.down_proj.weight", c->hidden, c->intermediate, &w->w_down},
        {"self_attn.q_proj.bias", q, -1, &w->bq},
        {"self_attn.k_proj.bias", kv, -1, &w->bk},
        {"self_attn.v_proj.bias", kv, -1, &w->bv},
        {"self_attn.o_proj.bias", c->hidden, -1, &w->bo},
        {"self_attn.q_norm.weight", c->head_dim, -1, &w->q_norm},
        {"self_attn.k_norm.weight", c->head_dim, -1, &w->k_norm},
    };

    for (size_t i = 0; i < sizeof(specs) / sizeof(specs[0]); i++) {
        bool is_bias = strstr(specs[i].suffix, ".bias") != NULL;
        bool is_o = strstr(specs[i].suffix, "o_proj") != NULL;
        bool is_qk_norm = strstr(specs[i].suffix, "_norm.weight") != NULL &&
                          strstr(specs[i].suffix, "self_attn.") != NULL;
        snprintf(name, sizeof(name), "model.layers.%d.%s", l, specs[i].suffix);
        if (is_qk_norm && !c->qk_norm) {
            const duet_st_tensor_t *t = duet_st_find(m->st, name);
            if (t != NULL)
                return duet_error(DUET_ERR_FORMAT, "%s: tensor %s: present, but %s has no q/k norm",
                                  t->file, name, duet_arch_name(c->arch));
            continue;
        }
        if (is_bias && !(is_o ? c->o_bias : c->qkv_bias)) {
            const duet_st_tensor_t *t = duet_st_find(m->st, name);
            if (t != NULL)
                return duet_error(DUET_ERR_FORMAT,
                                  "%s: tensor %s: present, but config.json implies none (%s)",
                                  t->file, name,
                                  is_o && c->arch == DUET_ARCH_QWEN2 ? "Qwen2 has no o_proj bias"
                                                                     : "attention_bias is false");
            continue;
        }
        if ((st = duet__model_bind_any(m, name, specs[i].d0, specs[i].d1,
                                       specs[i].d1 >= 0 && !is_qk_norm, specs[i].dst)) != DUET_OK)
            return st;
    }
    const duet_st_tensor_t *lin[] = {w->wq, w->wk, w->wv, w->wo, w->w_gate, w->w_up, w->w_down};
    const duet_st_tensor_t **scl[] = {&w->wq_scale,    &w->wk_scale,     &w->wv_scale,
                                      &w->wo_scale,    &w->w_gate_scale, &w->w_up_scale,
                                      &w->w_down_scale};
    for (size_t i = 0; i < sizeof(lin) / sizeof(lin[0]); i++) {
        if (lin[i]->dtype == DUET_DTYPE_F8_E4M3 &&
            (st = duet__model_bind_scale(m, lin[i], lin[i]->shape[0], scl[i])) != DUET_OK)
            return st;
    }
    return DUET_OK;
}

duet_status_t duet_model_open(const char *dir, duet_model_t **model_p)
{
    duet_model_t *m = DUET_NEW(duet_model_t);
    duet_status_t st;

    if (m == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "%s: no memory", dir);
    if ((m->dir = duet_strdup(dir)) == NULL) {
        st = duet_error(DUET_ERR_NO_MEMORY, "%s: no memory", dir);
        goto err_free_model;
    }
    if ((st = duet_model_config_load(dir, &m->cfg)) != DUET_OK)
        goto err_free_dir;
    if ((st = duet_st_open_dir(dir, &m->st)) != DUET_OK)
        goto err_free_dir;
    m->layers = DUET_NEW_ARRAY(duet_layer_weights_t, (size_t)m->cfg.n_layers);
    if (m->layers == NULL) {
        st = duet_error(DUET_ERR_NO_MEMORY, "%s: no memory for %d layers", dir, m->cfg.n_layers);
        goto err_close_st;
    }
    if ((st = duet__model_bind(m, "model.embed_tokens.weight", m->cfg.vocab, m->cfg.hidden,
                               &m->embed)) != DUET_OK ||
        (st = duet__model_bind(m, "model.norm.weight", m->cfg.hidden, -1, &m->norm)) != DUET_OK)
        goto err_free_layers;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        if ((st = duet__model_bind_layer(m, l)) != DUET_OK)
            goto err_free_layers;
    }
    if (m->cfg.tie_embeddings) {
        m->lm_head = m->embed;
    } else if (duet_st_find(m->st, "lm_head.weight") == NULL) {
        st = duet_error(DUET_ERR_FORMAT,
                        "%s: tensor lm_head.weight: missing and tie_word_embeddings is false", dir);
        goto err_free_layers;
    } else if ((st = duet__model_bind(m, "lm_head.weight", m->cfg.vocab, m->cfg.hidden,
                                      &m->lm_head)) != DUET_OK) {
        goto err_free_layers;
    }
    m->rope_inv_freq = DUET_NEW_ARRAY(float, (size_t)(m->cfg.head_dim / 2));
    if (m->rope_inv_freq == NULL) {
        st = duet_error(DUET_ERR_NO_MEMORY, "%s: no memory", dir);
        goto err_free_layers;
    }
    duet_rope_inv_freq(&m->cfg, m->rope_inv_freq);
    m->fingerprint = duet__model_fingerprint(m);
    *model_p = m;
    return DUET_OK;

err_free_layers:
    duet_free(m->layers);
err_close_st:
    duet_st_close(m->st);
err_free_dir:
    duet_free(m->dir);
err_free_model:
    duet_free(m);
    return st;
}

void duet_model_close(duet_model_t *model)
{
    if (model == NULL)
        return;
    duet_free(model->rope_inv_freq);
    duet_free(model->layers);
    duet_st_close(model->st);
    duet_free(model->dir);
    duet_free(model);
}
