/* The model hyper-parameters read from a Hugging Face config.json. */
#ifndef DUET_MODEL_MODEL_CONFIG_H
#define DUET_MODEL_MODEL_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "common/status.h"
#include "kv/dtype.h"
#include "model/quant.h"

#define DUET_MAX_EOS_IDS 8

typedef enum {
    DUET_ARCH_LLAMA = 0,   /* LlamaForCausalLM */
    DUET_ARCH_MISTRAL = 1, /* MistralForCausalLM */
    DUET_ARCH_QWEN2 = 2,   /* Qwen2ForCausalLM: q/k/v carry a bias */
    DUET_ARCH_QWEN3 = 3,   /* Qwen3ForCausalLM: per-head RMSNorm of q and k */
} duet_arch_t;

/* rope_scaling of config.json, as transformers' modeling_rope_utils reads it
 * (see model/rope.h for the frequencies).  Scaling that changes nothing
 * (type default, or factor 1 without an attention factor) is NONE. */
typedef enum {
    DUET_ROPE_NONE = 0,
    DUET_ROPE_LINEAR = 1, /* factor */
    DUET_ROPE_LLAMA3 = 2, /* factor, low/high_freq_factor, original_max_position_embeddings */
    DUET_ROPE_YARN = 3,   /* factor, beta_fast/slow, attention_factor or mscale(_all_dim) */
    /* dynamic NTK: transformers rescales theta only for sequences longer
     * than max_position_embeddings, which the engine refuses (a context
     * is at most max_pos tokens): for every position duet runs, the
     * frequencies are the default ones */
    DUET_ROPE_DYNAMIC = 4,
} duet_rope_type_t;

typedef struct {
    duet_rope_type_t type;
    double factor;
    double low_freq_factor, high_freq_factor; /* llama3 */
    int orig_max_pos;                         /* original_max_position_embeddings */
    double beta_fast, beta_slow;              /* yarn, defaults 32 and 1 */
    double attention_factor;                  /* yarn: cos and sin times this; else 1 */
    bool truncate;                            /* yarn: floor/ceil the ramp ends (default) */
} duet_rope_scaling_t;

typedef struct {
    duet_arch_t arch;
    int hidden;       /* hidden_size */
    int n_layers;     /* num_hidden_layers */
    int n_heads;      /* num_attention_heads */
    int n_kv_heads;   /* num_key_value_heads (defaults to n_heads) */
    int head_dim;     /* head_dim (defaults to hidden / n_heads) */
    int intermediate; /* intermediate_size */
    int vocab;        /* vocab_size */
    int max_pos;      /* max_position_embeddings */
    double rope_theta;
    duet_rope_scaling_t rope_scaling;
    double rms_eps;
    bool tie_embeddings; /* tie_word_embeddings */
    bool qkv_bias;       /* Qwen2, or attention_bias: true */
    bool o_bias;         /* attention_bias: true outside Qwen2 (Llama's o_proj.bias) */
    bool qk_norm;        /* Qwen3: q_norm / k_norm over head_dim before RoPE */
    int bos_id;          /* -1 when none */
    int eos_ids[DUET_MAX_EOS_IDS];
    int n_eos;
    duet_dtype_t torch_dtype;  /* informational; tensors carry their own dtype */
    duet_quant_config_t quant; /* quantization_config: FP8 weights (model/quant.h) */
} duet_model_config_t;

/* Parse a config.json object.  `what` names the file in messages.  Missing
 * required keys, wrong types, non-positive sizes, head counts that do not
 * divide, an unsupported architecture or rope_scaling are DUET_ERR_FORMAT /
 * DUET_ERR_UNSUPPORTED naming the key. */
duet_status_t duet_model_config_parse(const cJSON *json, const char *what,
                                      duet_model_config_t *cfg_p);

/* Read DIR/config.json. */
duet_status_t duet_model_config_load(const char *dir, duet_model_config_t *cfg_p);

/* Short name: "llama", "mistral", "qwen2", "qwen3" (the model_type spelling). */
const char *duet_arch_name(duet_arch_t arch);
/* Parse a short name or an architectures[] name ("Qwen2ForCausalLM");
 * -1 when unknown. */
int duet_arch_parse(const char *s);

/* True when id is one of the model's EOS ids. */
bool duet_model_config_is_eos(const duet_model_config_t *cfg, int id);

#endif
