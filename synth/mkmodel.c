/* duet mkmodel: synthetic Llama-family checkpoints, streamed to disk. */
#include "synth/mkmodel.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"
#include "model/safetensors.h"
#include "synth/mkmodel_internal.h"
#include "tokenizer/tokenizer.h"

/* Linear layers get std GAIN / sqrt(fan_in), a bit above 1, and the
 * embeddings a small std, so that each block's output outweighs the token
 * embedding in the residual stream: otherwise (gain 1, embedding std 1)
 * random models, tied ones above all, repeat the last token forever.  The
 * constants were chosen with the reference forward pass of test_mkmodel
 * (distinct greedy tokens, top-1/top-2 gaps) over several shapes/seeds. */
#define DUET_MKMODEL_GAIN      1.5f
#define DUET_MKMODEL_EMBED_STD 0.2f
#define DUET_MKMODEL_NORM_STD  0.1f
#define DUET_MKMODEL_BIAS_STD  0.5f
/* embed_tokens and lm_head rows are scaled by (1 + a) / (1 - a), a uniform
 * in (-SPREAD, SPREAD): token norms vary by about e^(+-0.7) as in trained
 * models, which widens the gap between the two largest logits (fewer
 * near-ties for greedy decoding).  A rational function, not expf(), so
 * that every libm produces the same weights. */
#define DUET_MKMODEL_ROW_SPREAD 0.35f
#define DUET_MKMODEL_CHUNK      ((size_t)1 << 22) /* elements generated per write */
#define DUET_MKMODEL_MIN_SPLIT  ((size_t)1 << 16) /* below this, one thread */
#define DUET_MKMODEL_GOLDEN     0x9e3779b97f4a7c15ull

typedef struct {
    int kv_heads, head_dim;
} duet__mk_dims_t;

static uint64_t duet__mk_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t duet__mk_key(uint64_t seed, const char *name)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
        h ^= *p;
        h *= 0x100000001b3ull;
    }
    return duet__mk_mix(h ^ duet__mk_mix(seed + DUET_MKMODEL_GOLDEN));
}

/* 24 random bits -> odd multiples of 2^-24 in (-1, 1), symmetric. */
static float duet__mk_unit(uint32_t bits)
{
    return (float)(bits >> 8) * 0x1p-23f - 1.0f + 0x1p-24f;
}

/* The product of two floats is exact in double, so whether a compiler fuses
 * it with the following add (FMA contraction) cannot change the result: the
 * weights do not depend on the compiler or its flags. */
static float duet__mk_row_scale(const duet__mk_spec_t *s, uint64_t row)
{
    double a = (double)DUET_MKMODEL_ROW_SPREAD *
               duet__mk_unit((uint32_t)duet__mk_mix(s->row_key + row * DUET_MKMODEL_GOLDEN));
    return (float)((1.0 + a) / (1.0 - a));
}

/* Element i takes 32 bits of the splitmix64 output for counter i / 2. */
void duet__mk_gen(const duet__mk_spec_t *s, uint64_t first, size_t n, float *dst)
{
    const uint64_t cols = s->ndim == 2 ? (uint64_t)s->shape[1] : (uint64_t)s->shape[0];
    uint64_t row = first / cols, col = first % cols;
    float amp = s->row_key ? s->amp * duet__mk_row_scale(s, row) : s->amp;

    for (size_t j = 0; j < n; j++) {
        uint64_t i = first + j;
        uint64_t r = duet__mk_mix(s->key + (i >> 1) * DUET_MKMODEL_GOLDEN);
        float u = duet__mk_unit((i & 1) ? (uint32_t)(r >> 32) : (uint32_t)r);
        dst[j] = (float)((double)amp * u + s->offset);
        if (++col == cols && s->row_key) {
            col = 0;
            amp = s->amp * duet__mk_row_scale(s, ++row);
        } else if (col == cols) {
            col = 0;
        }
    }
}

/* duet_f32_to_f16 (round to nearest even), bit for bit, at a fraction of
 * its cost: f16 subnormals are rounded by the FPU itself (adding 0.5f
 * leaves 2^-24 as the ulp, the f16 subnormal step), normals by integer
 * rebias + round-half-even on the dropped 13 bits. */
static uint16_t duet__mk_to_f16(float f)
{
    uint32_t u, a, sign;
    memcpy(&u, &f, sizeof(u));
    sign = (u >> 16) & 0x8000u;
    a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) /* >= 65520: rounds to infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) { /* < 2^-14 */
        float t;
        uint32_t v;
        memcpy(&t, &a, sizeof(t));
        t += 0.5f;
        memcpy(&v, &t, sizeof(v));
        return (uint16_t)(sign | (v - 0x3f000000u));
    }
    a += 0xc8000fffu + ((a >> 13) & 1u); /* exponent 127 -> 15 bias, + rounding */
    return (uint16_t)(sign | (a >> 13));
}

void duet__mk_store(duet_dtype_t dt, const float *src, size_t n, void *dst)
{
    uint16_t *h = dst;
    switch (dt) {
    case DUET_DTYPE_F16:
        for (size_t i = 0; i < n; i++)
            h[i] = duet__mk_to_f16(src[i]);
        break;
    case DUET_DTYPE_BF16:
        for (size_t i = 0; i < n; i++)
            h[i] = duet_f32_to_bf16(src[i]);
        break;
    default:
        memcpy(dst, src, n * sizeof(float));
        break;
    }
}

duet_mkmodel_opts_t duet_mkmodel_opts_default(void)
{
    duet_mkmodel_opts_t o;
    memset(&o, 0, sizeof(o));
    o.arch = DUET_ARCH_LLAMA;
    o.layers = 2;
    o.hidden = 64;
    o.heads = 4;
    o.kv_heads = 2;
    o.head_dim = 16;
    o.intermediate = 128;
    o.vocab = 512;
    o.max_pos = 2048;
    o.rope_theta = 10000.0;
    o.rms_eps = 1e-5;
    o.tied = false;
    o.dtype = DUET_DTYPE_F32;
    o.seed = 1;
    o.shards = 1;
    o.threads = 0;
    return o;
}

duet_status_t duet_mkmodel_preset(const char *name, duet_mkmodel_opts_t *o)
{
    static const struct {
        const char *name;
        int layers, hidden, heads, kv_heads, head_dim, intermediate, vocab, max_pos;
        double theta;
        bool tied;
    } presets[] = {
        /* ../shared/BENCHMARKS.md; max_pos and theta are those of the
         * namesakes without RoPE scaling, which duet does not implement */
        {"bench-124m", 12, 768, 12, 4, 64, 2048, 32000, 2048, 10000.0, false},
        {"llama-3.2-1b-shape", 16, 2048, 32, 8, 64, 8192, 128256, 8192, 500000.0, true},
        {"llama-3-8b-shape", 32, 4096, 32, 8, 128, 14336, 128256, 8192, 500000.0, false},
    };
    for (size_t i = 0; i < sizeof(presets) / sizeof(presets[0]); i++) {
        if (strcmp(name, presets[i].name) != 0)
            continue;
        o->arch = DUET_ARCH_LLAMA;
        o->attention_bias = false;
        o->layers = presets[i].layers;
        o->hidden = presets[i].hidden;
        o->heads = presets[i].heads;
        o->kv_heads = presets[i].kv_heads;
        o->head_dim = presets[i].head_dim;
        o->intermediate = presets[i].intermediate;
        o->vocab = presets[i].vocab;
        o->max_pos = presets[i].max_pos;
        o->rope_theta = presets[i].theta;
        o->rms_eps = 1e-5;
        o->tied = presets[i].tied;
        return DUET_OK;
    }
    return duet_error(DUET_ERR_NOT_FOUND,
                      "mkmodel: unknown preset %s (bench-124m, llama-3.2-1b-shape, "
                      "llama-3-8b-shape)",
                      name);
}

static void duet__mk_dims(const duet_mkmodel_opts_t *o, duet__mk_dims_t *d)
{
    d->kv_heads = o->kv_heads > 0 ? o->kv_heads : o->heads;
    d->head_dim = o->head_dim > 0 ? o->head_dim : (o->heads > 0 ? o->hidden / o->heads : 0);
}

static size_t duet__mk_tensor_count(const duet_mkmodel_opts_t *o)
{
    size_t per_layer = o->arch == DUET_ARCH_QWEN2   ? 12
                       : o->arch == DUET_ARCH_QWEN3 ? 11
                       : o->attention_bias          ? 13
                                                    : 9;
    if (o->fp8 != 0)
        per_layer += 7; /* a weight_scale per linear weight */
    return 2 + (size_t)o->layers * per_layer + (o->tied ? 0 : 1);
}

#define DUET__MK_RANGE(field, lo, hi)                                                              \
    do {                                                                                           \
        if ((long long)(field) < (lo) || (long long)(field) > (hi))                                \
            return duet_error(DUET_ERR_INVALID,                                                    \
                              "mkmodel: " #field " %lld: must be in [%lld, %lld]",                 \
                              (long long)(field), (long long)(lo), (long long)(hi));               \
    } while (0)

duet_status_t duet_mkmodel_check(const duet_mkmodel_opts_t *o)
{
    duet__mk_dims_t d;

    if (o->arch != DUET_ARCH_LLAMA && o->arch != DUET_ARCH_MISTRAL && o->arch != DUET_ARCH_QWEN2 &&
        o->arch != DUET_ARCH_QWEN3)
        return duet_error(DUET_ERR_INVALID, "mkmodel: arch %d: unknown", (int)o->arch);
    if (o->rope_scaling != NULL) {
        cJSON *rs = cJSON_Parse(o->rope_scaling);
        bool obj = cJSON_IsObject(rs);
        cJSON_Delete(rs);
        if (!obj)
            return duet_error(DUET_ERR_INVALID, "mkmodel: rope_scaling %s: not a JSON object",
                              o->rope_scaling);
    }
    if (o->attention_bias && o->arch != DUET_ARCH_LLAMA)
        return duet_error(DUET_ERR_INVALID,
                          "mkmodel: attention_bias: only for llama (qwen2 always has q/k/v "
                          "biases, mistral and qwen3 none)");
    DUET__MK_RANGE(o->layers, 1, 1024);
    DUET__MK_RANGE(o->hidden, 1, 1 << 20);
    DUET__MK_RANGE(o->heads, 1, 1 << 12);
    DUET__MK_RANGE(o->kv_heads, 0, 1 << 12);
    DUET__MK_RANGE(o->head_dim, 0, 1 << 12);
    DUET__MK_RANGE(o->intermediate, 1, 1 << 22);
    DUET__MK_RANGE(o->vocab, 260, 1 << 24);
    DUET__MK_RANGE(o->max_pos, 1, 1 << 24);
    DUET__MK_RANGE(o->threads, 0, 1024);
    duet__mk_dims(o, &d);
    if (o->heads % d.kv_heads != 0)
        return duet_error(DUET_ERR_INVALID, "mkmodel: heads %d is not a multiple of kv_heads %d",
                          o->heads, d.kv_heads);
    if (o->head_dim == 0 && o->hidden % o->heads != 0)
        return duet_error(DUET_ERR_INVALID,
                          "mkmodel: hidden %d is not a multiple of heads %d (give head_dim)",
                          o->hidden, o->heads);
    if (d.head_dim < 2 || d.head_dim % 2 != 0)
        return duet_error(DUET_ERR_INVALID, "mkmodel: head_dim %d: must be even (RoPE)",
                          d.head_dim);
    if (!(o->rope_theta > 0) || !isfinite(o->rope_theta))
        return duet_error(DUET_ERR_INVALID, "mkmodel: rope_theta %g: must be positive",
                          o->rope_theta);
    if (!(o->rms_eps > 0) || !isfinite(o->rms_eps))
        return duet_error(DUET_ERR_INVALID, "mkmodel: rms_eps %g: must be positive", o->rms_eps);
    if (o->dtype != DUET_DTYPE_F32 && o->dtype != DUET_DTYPE_F16 && o->dtype != DUET_DTYPE_BF16)
        return duet_error(DUET_ERR_INVALID, "mkmodel: dtype %s: must be F32, F16 or BF16",
                          duet_dtype_name(o->dtype));
    if (o->fp8 < 0 || o->fp8 > DUET_MKMODEL_FP8_CHANNEL || o->fp8_format < 0 ||
        o->fp8_format > DUET_MKMODEL_FP8_VLLM)
        return duet_error(DUET_ERR_INVALID, "mkmodel: fp8 %d / fp8_format %d: unknown", o->fp8,
                          o->fp8_format);
    if (o->fp8 == DUET_MKMODEL_FP8_TENSOR && o->fp8_format == DUET_MKMODEL_FP8_FBGEMM)
        return duet_error(DUET_ERR_INVALID, "mkmodel: fp8 tensor: fbgemm_fp8 is per channel only");
    if (o->fp8 == DUET_MKMODEL_FP8_CHANNEL && o->fp8_format == DUET_MKMODEL_FP8_VLLM)
        return duet_error(DUET_ERR_INVALID, "mkmodel: fp8 channel: the fp8 format is per tensor");
    if (o->shards < 1 || (size_t)o->shards > duet__mk_tensor_count(o) || o->shards > 99999)
        return duet_error(DUET_ERR_INVALID, "mkmodel: shards %d: must be in [1, %zu] (tensors)",
                          o->shards, duet__mk_tensor_count(o));
    return DUET_OK;
}

static void duet__mk_spec(duet__mk_spec_t *s, uint64_t seed, const char *name, int64_t d0,
                          int64_t d1, float offset, float std)
{
    snprintf(s->name, sizeof(s->name), "%s", name);
    s->ndim = d1 < 0 ? 1 : 2;
    s->shape[0] = d0;
    s->shape[1] = d1 < 0 ? 0 : d1;
    s->count = (uint64_t)d0 * (uint64_t)(d1 < 0 ? 1 : d1);
    s->offset = offset;
    s->amp = std * 1.7320508f; /* U(-a, a) has std a / sqrt(3) */
    s->key = duet__mk_key(seed, name);
    s->row_key = 0;
    s->fp8 = 0;
    s->scales = NULL;
}

/* Every tensor of the model, in Hugging Face order. */
static duet_status_t duet__mk_specs(const duet_mkmodel_opts_t *o, duet__mk_spec_t **specs_p,
                                    size_t *n_p)
{
    duet__mk_dims_t d;
    size_t n = 0, cap = duet__mk_tensor_count(o);
    duet__mk_spec_t *s = DUET_NEW_ARRAY(duet__mk_spec_t, cap);
    const int64_t h = o->hidden, ff = o->intermediate;
    char name[96];

    if (s == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "mkmodel: no memory for %zu tensors", cap);
    duet__mk_dims(o, &d);
    const int64_t q = (int64_t)o->heads * d.head_dim, kv = (int64_t)d.kv_heads * d.head_dim;
    /* an FP8 linear weight is followed by its scale */
#define DUET__MK_FP8(pre)                                                                          \
    do {                                                                                           \
        if (o->fp8 == 0)                                                                           \
            break;                                                                                 \
        duet__mk_spec_t *w_ = &s[n - 1], *sc_ = &s[n++];                                           \
        *sc_ = *w_;                                                                                \
        snprintf(sc_->name, sizeof(sc_->name), "%.80s_scale", pre);                                \
        w_->fp8 = 1;                                                                               \
        w_->dtype = DUET_DTYPE_F8_E4M3;                                                            \
        w_->per_row = sc_->per_row = o->fp8 == DUET_MKMODEL_FP8_CHANNEL;                           \
        sc_->fp8 = 2;                                                                              \
        sc_->dtype = DUET_DTYPE_F32;                                                               \
        sc_->ndim = sc_->per_row ? 2 : o->fp8_format == DUET_MKMODEL_FP8_VLLM ? 0 : 1;             \
        sc_->shape[0] = sc_->per_row ? w_->shape[0] : 1;                                           \
        sc_->shape[1] = 1;                                                                         \
        sc_->count = (uint64_t)sc_->shape[0];                                                      \
    } while (0)
    const float lin_h = DUET_MKMODEL_GAIN / sqrtf((float)h);
    duet__mk_spec(&s[n++], o->seed, "model.embed_tokens.weight", o->vocab, h, 0.0f,
                  DUET_MKMODEL_EMBED_STD);
    s[n - 1].row_key = duet__mk_mix(s[n - 1].key ^ 0x726f772d7363616cull) | 1;
    for (int l = 0; l < o->layers; l++) {
#define DUET__MK_LAYER(suffix, d0, d1, off, std)                                                   \
    do {                                                                                           \
        snprintf(name, sizeof(name), "model.layers.%d.%s", l, suffix);                             \
        duet__mk_spec(&s[n++], o->seed, name, d0, d1, off, std);                                   \
    } while (0)
        DUET__MK_LAYER("input_layernorm.weight", h, -1, 1.0f, DUET_MKMODEL_NORM_STD);
        DUET__MK_LAYER("self_attn.q_proj.weight", q, h, 0.0f, lin_h);
        DUET__MK_FP8(name);
        DUET__MK_LAYER("self_attn.k_proj.weight", kv, h, 0.0f, lin_h);
        DUET__MK_FP8(name);
        DUET__MK_LAYER("self_attn.v_proj.weight", kv, h, 0.0f, lin_h);
        DUET__MK_FP8(name);
        if (o->arch == DUET_ARCH_QWEN2 || o->attention_bias) {
            DUET__MK_LAYER("self_attn.q_proj.bias", q, -1, 0.0f, DUET_MKMODEL_BIAS_STD);
            DUET__MK_LAYER("self_attn.k_proj.bias", kv, -1, 0.0f, DUET_MKMODEL_BIAS_STD);
            DUET__MK_LAYER("self_attn.v_proj.bias", kv, -1, 0.0f, DUET_MKMODEL_BIAS_STD);
        }
        DUET__MK_LAYER("self_attn.o_proj.weight", h, q, 0.0f, DUET_MKMODEL_GAIN / sqrtf((float)q));
        DUET__MK_FP8(name);
        if (o->attention_bias)
            DUET__MK_LAYER("self_attn.o_proj.bias", h, -1, 0.0f, DUET_MKMODEL_BIAS_STD);
        if (o->arch == DUET_ARCH_QWEN3) {
            DUET__MK_LAYER("self_attn.q_norm.weight", d.head_dim, -1, 1.0f, DUET_MKMODEL_NORM_STD);
            DUET__MK_LAYER("self_attn.k_norm.weight", d.head_dim, -1, 1.0f, DUET_MKMODEL_NORM_STD);
        }
        DUET__MK_LAYER("post_attention_layernorm.weight", h, -1, 1.0f, DUET_MKMODEL_NORM_STD);
        DUET__MK_LAYER("mlp.gate_proj.weight", ff, h, 0.0f, lin_h);
        DUET__MK_FP8(name);
        DUET__MK_LAYER("mlp.up_proj.weight", ff, h, 0.0f, lin_h);
        DUET__MK_FP8(name);
        DUET__MK_LAYER("mlp.down_proj.weight", h, ff, 0.0f, DUET_MKMODEL_GAIN / sqrtf((float)ff));
        DUET__MK_FP8(name);
#undef DUET__MK_LAYER
#undef DUET__MK_FP8
    }
    duet__mk_spec(&s[n++], o->seed, "model.norm.weight", h, -1, 1.0f, DUET_MKMODEL_NORM_STD);
    if (!o->tied) {
        duet__mk_spec(&s[n++], o->seed, "lm_head.weight", o->vocab, h, 0.0f, lin_h);
        s[n - 1].row_key = duet__mk_mix(s[n - 1].key ^ 0x726f772d7363616cull) | 1;
    }
    for (size_t i = 0; i < n; i++) {
        s[i].base = o->dtype;
        if (s[i].fp8 == 0)
            s[i].dtype = o->dtype;
    }
    *specs_p = s;
    *n_p = n;
    return DUET_OK;
}

duet_status_t duet_mkmodel_size(const duet_mkmodel_opts_t *o, uint64_t *params_p, uint64_t *bytes_p)
{
    duet__mk_spec_t *specs;
    size_t n;
    uint64_t params = 0;
    duet_status_t st = duet_mkmodel_check(o);

    if (st != DUET_OK || (st = duet__mk_specs(o, &specs, &n)) != DUET_OK)
        return st;
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; i++) {
        params += specs[i].fp8 == 2 ? 0 : specs[i].count; /* scales are not parameters */
        bytes += specs[i].count * duet_dtype_size(specs[i].dtype);
    }
    duet_free(specs);
    *params_p = params;
    *bytes_p = bytes;
    return DUET_OK;
}

duet_status_t duet_mkmodel_values(const duet_mkmodel_opts_t *o, const char *name, uint64_t first,
                                  size_t n, float *dst)
{
    duet__mk_spec_t *specs;
    size_t count;
    duet_status_t st = duet_mkmodel_check(o);

    if (st != DUET_OK || (st = duet__mk_specs(o, &specs, &count)) != DUET_OK)
        return st;
    st = duet_error(DUET_ERR_NOT_FOUND, "mkmodel: no tensor %s", name);
    for (size_t i = 0; i < count; i++) {
        if (strcmp(specs[i].name, name) != 0)
            continue;
        if (specs[i].fp8 == 2) { /* amax / 448 of the weight: no generated values */
            st = duet_error(DUET_ERR_INVALID, "mkmodel: tensor %s: a scale, not generated", name);
        } else if (first > specs[i].count || n > specs[i].count - first) {
            st = duet_error(DUET_ERR_INVALID, "mkmodel: tensor %s: [%llu, +%zu) is past %llu", name,
                            (unsigned long long)first, n, (unsigned long long)specs[i].count);
        } else {
            duet__mk_gen(&specs[i], first, n, dst);
            st = DUET_OK;
        }
        break;
    }
    duet_free(specs);
    return st;
}

/* One thread's part of a chunk: generate and convert in small blocks. */
typedef struct {
    const duet__mk_spec_t *spec;
    duet_dtype_t dtype;
    uint64_t first;
    size_t n;
    unsigned char *out;
} duet__mk_job_t;

static void *duet__mk_job_run(void *arg)
{
    const duet__mk_job_t *job = arg;
    const size_t esz = duet_dtype_size(job->dtype);
    float block[1024];

    for (size_t done = 0; done < job->n; done += 1024) {
        size_t k = job->n - done < 1024 ? job->n - done : 1024;
        if (job->spec->fp8 != 0) {
            duet__mk_fp8_block(job->spec, job->first + done, k, block, job->out + done * esz);
            continue;
        }
        duet__mk_gen(job->spec, job->first + done, k, block);
        duet__mk_store(job->dtype, block, k, job->out + done * esz);
    }
    return NULL;
}

/* One chunk being generated by nt threads while the caller writes the
 * previous one.  A thread that cannot be started leaves its part to
 * duet__mk_batch_wait, on the calling thread. */
typedef struct {
    duet__mk_job_t jobs[DUET_MKMODEL_MAX_THREADS];
    pthread_t tids[DUET_MKMODEL_MAX_THREADS];
    bool started[DUET_MKMODEL_MAX_THREADS];
    int nt;
} duet__mk_batch_t;

static void duet__mk_batch_start(duet__mk_batch_t *b, const duet__mk_spec_t *spec, duet_dtype_t dt,
                                 uint64_t first, size_t n, unsigned char *out, int nt)
{
    const size_t esz = duet_dtype_size(dt);

    b->nt = n < DUET_MKMODEL_MIN_SPLIT ? 1 : nt;
    for (int t = 0; t < b->nt; t++) {
        size_t lo = n * (size_t)t / (size_t)b->nt, hi = n * (size_t)(t + 1) / (size_t)b->nt;
        b->jobs[t] = (duet__mk_job_t){spec, dt, first + lo, hi - lo, out + lo * esz};
        b->started[t] = pthread_create(&b->tids[t], NULL, duet__mk_job_run, &b->jobs[t]) == 0;
    }
}

static void duet__mk_batch_wait(duet__mk_batch_t *b)
{
    for (int t = 0; t < b->nt; t++) {
        if (b->started[t])
            pthread_join(b->tids[t], NULL);
        else
            duet__mk_job_run(&b->jobs[t]);
    }
}

int duet__mk_threads(const duet_mkmodel_opts_t *o)
{
    long n = o->threads > 0 ? o->threads : sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1)
        n = 1;
    return n > DUET_MKMODEL_MAX_THREADS ? DUET_MKMODEL_MAX_THREADS : (int)n;
}

/* Position in a shard's tensors, advanced one chunk at a time. */
typedef struct {
    size_t tensor;
    uint64_t first;
    size_t n;
} duet__mk_chunk_t;

static bool duet__mk_chunk_next(const duet__mk_spec_t *specs, size_t n_specs, duet__mk_chunk_t *c)
{
    c->first += c->n;
    while (c->tensor < n_specs && c->first >= specs[c->tensor].count) {
        c->tensor++;
        c->first = 0;
    }
    if (c->tensor == n_specs)
        return false;
    uint64_t left = specs[c->tensor].count - c->first;
    c->n = left < DUET_MKMODEL_CHUNK ? (size_t)left : DUET_MKMODEL_CHUNK;
    return true;
}

/* Stream specs into one file: chunk k + 1 is generated into one buffer
 * while chunk k is written from the other. */
static duet_status_t duet__mk_write_shard(const char *path, const duet_mkmodel_opts_t *o,
                                          const duet__mk_spec_t *specs, size_t n,
                                          unsigned char *bufs[2])
{
    duet_st_write_tensor_t *desc = DUET_NEW_ARRAY(duet_st_write_tensor_t, n);
    const int nt = duet__mk_threads(o);
    duet__mk_chunk_t cur = {0, 0, 0}, next;
    duet__mk_batch_t batch;
    duet_st_writer_t *w;
    duet_status_t st;
    int b = 0;

    if (desc == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "%s: no memory", path);
    for (size_t i = 0; i < n; i++) {
        desc[i].name = specs[i].name;
        desc[i].dtype = specs[i].dtype;
        desc[i].ndim = specs[i].ndim;
        desc[i].shape[0] = specs[i].shape[0];
        desc[i].shape[1] = specs[i].shape[1];
    }
    st = duet_st_writer_create(path, desc, n, &w);
    duet_free(desc);
    if (st != DUET_OK)
        return st;
    if (!duet__mk_chunk_next(specs, n, &cur))
        return duet_st_writer_finish(w);
    duet__mk_batch_start(&batch, &specs[cur.tensor], specs[cur.tensor].dtype, cur.first, cur.n,
                         bufs[b], nt);
    duet__mk_batch_wait(&batch);
    for (;;) {
        bool more;
        next = cur;
        more = duet__mk_chunk_next(specs, n, &next);
        if (more)
            duet__mk_batch_start(&batch, &specs[next.tensor], specs[next.tensor].dtype, next.first,
                                 next.n, bufs[1 - b], nt);
        st = duet_st_writer_append(w, bufs[b], cur.n * duet_dtype_size(specs[cur.tensor].dtype));
        if (more)
            duet__mk_batch_wait(&batch); /* even on error: the threads use bufs */
        if (st != DUET_OK) {
            duet_st_writer_abort(w);
            return st;
        }
        if (!more)
            break;
        cur = next;
        b = 1 - b;
    }
    return duet_st_writer_finish(w);
}

static duet_status_t duet__mk_path(char *buf, const char *dir, const char *name)
{
    int n = snprintf(buf, PATH_MAX, "%s/%s", dir, name);
    if (n < 0 || n >= PATH_MAX)
        return duet_error(DUET_ERR_INVALID, "%s/%s: path too long", dir, name);
    return DUET_OK;
}

/* Text file through a temp name; body writes with fprintf. */
typedef void (*duet__mk_body_cb)(FILE *f, const void *arg);

static duet_status_t duet__mk_write_text(const char *path, duet__mk_body_cb body, const void *arg)
{
    char tmp[PATH_MAX + 16];
    FILE *f;
    int fd;

    snprintf(tmp, sizeof(tmp), "%s.tmp.XXXXXX", path);
    if ((fd = mkstemp(tmp)) < 0)
        return duet_error(DUET_ERR_IO, "%s: %s", tmp, strerror(errno));
    if (fchmod(fd, 0644) != 0 || (f = fdopen(fd, "w")) == NULL) {
        duet_status_t st = duet_error(DUET_ERR_IO, "%s: %s", tmp, strerror(errno));
        close(fd);
        unlink(tmp);
        return st;
    }
    body(f, arg);
    if (ferror(f) != 0) {
        fclose(f);
        unlink(tmp);
        return duet_error(DUET_ERR_IO, "%s: write failed", tmp);
    }
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        duet_status_t st = duet_error(DUET_ERR_IO, "%s: %s", path, strerror(errno));
        unlink(tmp);
        return st;
    }
    return DUET_OK;
}

/* Shortest text that reads back as v, with a ".0" on integral values so
 * that Python sees a float. */
static void duet__mk_fmt_double(char *buf, size_t size, double v)
{
    if (v == floor(v) && fabs(v) < 1e15) {
        snprintf(buf, size, "%.1f", v);
        return;
    }
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, size, "%.*g", p, v);
        if (strtod(buf, NULL) == v)
            return;
    }
}

static void duet__mk_config_body(FILE *f, const void *arg)
{
    static const char *const hf[] = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                                     "Qwen3ForCausalLM"};
    static const char *const torch[] = {"float32", "float16", "bfloat16"};
    const duet_mkmodel_opts_t *o = arg;
    duet__mk_dims_t d;
    char theta[40], eps[40];

    duet__mk_dims(o, &d);
    duet__mk_fmt_double(theta, sizeof(theta), o->rope_theta);
    duet__mk_fmt_double(eps, sizeof(eps), o->rms_eps);
    fprintf(f, "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"%s\",\n", hf[o->arch],
            duet_arch_name(o->arch));
    fprintf(f,
            "  \"hidden_size\": %d,\n  \"intermediate_size\": %d,\n"
            "  \"num_hidden_layers\": %d,\n  \"num_attention_heads\": %d,\n"
            "  \"num_key_value_heads\": %d,\n  \"head_dim\": %d,\n  \"vocab_size\": %d,\n"
            "  \"max_position_embeddings\": %d,\n  \"rope_theta\": %s,\n"
            "  \"rms_norm_eps\": %s,\n"
            "  \"tie_word_embeddings\": %s,\n  \"hidden_act\": \"silu\",\n",
            o->hidden, o->intermediate, o->layers, o->heads, d.kv_heads, d.head_dim, o->vocab,
            o->max_pos, theta, eps, o->tied ? "true" : "false");
    if (o->rope_scaling == NULL) {
        fprintf(f, "  \"rope_scaling\": null,\n");
    } else { /* checked to be an object by duet_mkmodel_check */
        cJSON *rs = cJSON_Parse(o->rope_scaling);
        char *text = rs != NULL ? cJSON_PrintUnformatted(rs) : NULL;
        fprintf(f, "  \"rope_scaling\": %s,\n", text != NULL ? text : "null");
        cJSON_free(text);
        cJSON_Delete(rs);
    }
    if (o->arch == DUET_ARCH_LLAMA)
        fprintf(f, "  \"attention_bias\": %s,\n  \"mlp_bias\": false,\n",
                o->attention_bias ? "true" : "false");
    else if (o->arch == DUET_ARCH_MISTRAL)
        fprintf(f, "  \"sliding_window\": null,\n");
    else if (o->arch == DUET_ARCH_QWEN3)
        fprintf(f,
                "  \"attention_bias\": false,\n  \"use_sliding_window\": false,\n"
                "  \"sliding_window\": null,\n  \"max_window_layers\": %d,\n",
                o->layers);
    else
        fprintf(f,
                "  \"use_sliding_window\": false,\n  \"sliding_window\": %d,\n"
                "  \"max_window_layers\": %d,\n",
                o->max_pos, o->layers);
    fprintf(f,
            "  \"bos_token_id\": %d,\n  \"eos_token_id\": %d,\n  \"torch_dtype\": \"%s\",\n"
            "  \"initializer_range\": 0.02,\n  \"attention_dropout\": 0.0,\n"
            "  \"use_cache\": true,\n%s"
            "  \"duet_mkmodel\": {\"seed\": %llu}\n}\n",
            o->vocab - 2, o->vocab - 1, torch[o->dtype], duet__mk_quant_config(o),
            (unsigned long long)o->seed);
}

typedef struct {
    const duet__mk_spec_t *specs;
    const size_t *shard_of; /* per tensor */
    size_t n;
    int shards;
    uint64_t total;
} duet__mk_index_t;

static void duet__mk_shard_name(char *buf, size_t size, size_t i, int shards)
{
    snprintf(buf, size, "model-%05zu-of-%05d.safetensors", i + 1, shards);
}

static void duet__mk_index_body(FILE *f, const void *arg)
{
    const duet__mk_index_t *x = arg;
    char shard[64];

    fprintf(f, "{\n  \"metadata\": {\"total_size\": %llu},\n  \"weight_map\": {\n",
            (unsigned long long)x->total);
    for (size_t i = 0; i < x->n; i++) {
        duet__mk_shard_name(shard, sizeof(shard), x->shard_of[i], x->shards);
        fprintf(f, "    \"%s\": \"%s\"%s\n", x->specs[i].name, shard, i + 1 < x->n ? "," : "");
    }
    fprintf(f, "  }\n}\n");
}

/* Contiguous runs of tensors with about total/shards bytes each, none
 * empty. */
static void duet__mk_partition(const duet__mk_spec_t *specs, size_t n, int shards, size_t *shard_of)
{
    uint64_t total = 0, cum = 0;
    size_t i = 0;

    for (size_t k = 0; k < n; k++)
        total += specs[k].count;
    for (int s = 0; s < shards; s++) {
        uint64_t target = total / (uint64_t)shards * (uint64_t)(s + 1);
        do {
            cum += specs[i].count;
            shard_of[i++] = (size_t)s;
        } while (i < n && (s == shards - 1 ||
                           (n - i > (size_t)(shards - s - 1) && cum + specs[i].count <= target)));
    }
}

static duet_status_t duet__mk_mkdirs(const char *dir)
{
    char path[PATH_MAX];
    struct stat sb;
    size_t len = strlen(dir);

    if (len == 0 || len >= sizeof(path))
        return duet_error(DUET_ERR_INVALID, "mkmodel: bad output directory '%s'", dir);
    memcpy(path, dir, len + 1);
    for (size_t i = 1; i <= len; i++) {
        if (path[i] != '/' && path[i] != '\0')
            continue;
        char c = path[i];
        path[i] = '\0';
        if (mkdir(path, 0755) != 0 && errno != EEXIST)
            return duet_error(DUET_ERR_IO, "%s: mkdir: %s", path, strerror(errno));
        path[i] = c;
    }
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return duet_error(DUET_ERR_IO, "%s: not a directory", dir);
    return DUET_OK;
}

static duet_status_t duet__mk_write_sharded(const char *dir, const duet_mkmodel_opts_t *o,
                                            const duet__mk_spec_t *specs, size_t n,
                                            unsigned char *bufs[2])
{
    char path[PATH_MAX], name[64];
    size_t *shard_of = DUET_NEW_ARRAY(size_t, n);
    duet__mk_index_t index = {specs, shard_of, n, o->shards, 0};
    duet_status_t st = DUET_OK;

    if (shard_of == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "mkmodel: no memory");
    duet__mk_partition(specs, n, o->shards, shard_of);
    for (size_t b = 0, e; b < n; b = e) {
        for (e = b; e < n && shard_of[e] == shard_of[b]; e++)
            index.total += specs[e].count * duet_dtype_size(specs[e].dtype);
        duet__mk_shard_name(name, sizeof(name), shard_of[b], o->shards);
        if ((st = duet__mk_path(path, dir, name)) != DUET_OK ||
            (st = duet__mk_write_shard(path, o, specs + b, e - b, bufs)) != DUET_OK)
            goto out_free;
    }
    if ((st = duet__mk_path(path, dir, "model.safetensors.index.json")) != DUET_OK ||
        (st = duet__mk_write_text(path, duet__mk_index_body, &index)) != DUET_OK ||
        (st = duet__mk_path(path, dir, "model.safetensors")) != DUET_OK)
        goto out_free;
    unlink(path); /* it would take precedence over the index */
out_free:
    duet_free(shard_of);
    return st;
}

static duet_status_t duet__mk_write_weights(const char *dir, const duet_mkmodel_opts_t *o,
                                            const duet__mk_spec_t *specs, size_t n)
{
    const size_t size = DUET_MKMODEL_CHUNK * sizeof(float); /* any tensor's dtype */
    unsigned char *bufs[2] = {duet_malloc(size), duet_malloc(size)};
    char path[PATH_MAX];
    duet_status_t st;

    if (bufs[0] == NULL || bufs[1] == NULL) {
        st = duet_error(DUET_ERR_NO_MEMORY, "mkmodel: no memory for 2 x %zu bytes", size);
        goto out_free;
    }
    if (o->shards > 1) {
        st = duet__mk_write_sharded(dir, o, specs, n, bufs);
        goto out_free;
    }
    if ((st = duet__mk_path(path, dir, "model.safetensors")) != DUET_OK ||
        (st = duet__mk_write_shard(path, o, specs, n, bufs)) != DUET_OK ||
        (st = duet__mk_path(path, dir, "model.safetensors.index.json")) != DUET_OK)
        goto out_free;
    unlink(path); /* a stale index of an earlier sharded model */
out_free:
    duet_free(bufs[1]);
    duet_free(bufs[0]);
    return st;
}

duet_status_t duet_mkmodel_write(const char *dir, const duet_mkmodel_opts_t *o)
{
    char path[PATH_MAX];
    duet__mk_spec_t *specs;
    size_t n;
    duet_status_t st;

    if ((st = duet_mkmodel_check(o)) != DUET_OK || (st = duet__mk_mkdirs(dir)) != DUET_OK ||
        (st = duet__mk_specs(o, &specs, &n)) != DUET_OK)
        return st;
    if ((st = duet__mk_fp8_scales(o, specs, n)) != DUET_OK ||
        (st = duet__mk_write_weights(dir, o, specs, n)) != DUET_OK ||
        (st = duet__mk_path(path, dir, "config.json")) != DUET_OK ||
        (st = duet__mk_write_text(path, duet__mk_config_body, o)) != DUET_OK ||
        (st = duet__mk_path(path, dir, "tokenizer.json")) != DUET_OK ||
        (st = duet_tokenizer_write_synthetic(path, o->vocab)) != DUET_OK)
        goto out_free_specs;
out_free_specs:
    for (size_t i = 0; i < n; i++) {
        if (specs[i].fp8 == 1)
            duet_free(specs[i].scales);
    }
    duet_free(specs);
    return st;
}
