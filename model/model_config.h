/* The model hyper-parameters read from a Hugging Face config.json. */
#ifndef DUET_MODEL_MODEL_CONFIG_H
#define DUET_MODEL_MODEL_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "common/status.h"
#include "kv/dtype.h"

#define DUET_MAX_EOS_IDS 8

typedef enum {
    DUET_ARCH_LLAMA = 0,   /* LlamaForCausalLM */
    DUET_ARCH_MISTRAL = 1, /* MistralForCausalLM */
    DUET_ARCH_QWEN2 = 2,   /* Qwen2ForCausalLM: q/k/v carry a bias */
} duet_arch_t;

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
    double rms_eps;
    bool tie_embeddings; /* tie_word_embeddings */
    bool qkv_bias;       /* Qwen2, or attention_bias: true */
    bool o_bias;         /* attention_bias: true outside Qwen2 (Llama's o_proj.bias) */
    int bos_id;          /* -1 when none */
    int eos_ids[DUET_MAX_EOS_IDS];
    int n_eos;
    duet_dtype_t torch_dtype; /* informational; tensors carry their own dtype */
} duet_model_config_t;

/* Parse a config.json object.  `what` names the file in messages.  Missing
 * required keys, wrong types, non-positive sizes, head counts that do not
 * divide, an unsupported architecture or rope_scaling are DUET_ERR_FORMAT /
 * DUET_ERR_UNSUPPORTED naming the key. */
duet_status_t duet_model_config_parse(const cJSON *json, const char *what,
                                      duet_model_config_t *cfg_p);

/* Read DIR/config.json. */
duet_status_t duet_model_config_load(const char *dir, duet_model_config_t *cfg_p);

/* Short name: "llama", "mistral", "qwen2" (the model_type spelling). */
const char *duet_arch_name(duet_arch_t arch);
/* Parse a short name or an architectures[] name ("Qwen2ForCausalLM");
 * -1 when unknown. */
int duet_arch_parse(const char *s);

/* True when id is one of the model's EOS ids. */
bool duet_model_config_is_eos(const duet_model_config_t *cfg, int id);

#endif
