/* An opened Hugging Face Llama-family checkpoint: its config and validated
 * views of every weight tensor (still in the file's dtype, memory-mapped).
 * Backends copy/convert their shard from these views. */
#ifndef DUET_ENGINE_MODEL_H
#define DUET_ENGINE_MODEL_H

#include <stdint.h>

#include "common/status.h"
#include "model/model_config.h"
#include "model/safetensors.h"

typedef struct {
    const duet_st_tensor_t *attn_norm; /* [hidden] input_layernorm */
    const duet_st_tensor_t *wq;        /* [n_heads*head_dim][hidden] */
    const duet_st_tensor_t *wk;        /* [n_kv_heads*head_dim][hidden] */
    const duet_st_tensor_t *wv;        /* [n_kv_heads*head_dim][hidden] */
    const duet_st_tensor_t *bq;        /* [n_heads*head_dim] or NULL */
    const duet_st_tensor_t *bk;        /* [n_kv_heads*head_dim] or NULL */
    const duet_st_tensor_t *bv;        /* [n_kv_heads*head_dim] or NULL */
    const duet_st_tensor_t *wo;        /* [hidden][n_heads*head_dim] */
    const duet_st_tensor_t *bo;        /* [hidden] or NULL (cfg.o_bias) */
    const duet_st_tensor_t *q_norm;    /* [head_dim] or NULL (cfg.qk_norm) */
    const duet_st_tensor_t *k_norm;    /* [head_dim] or NULL (cfg.qk_norm) */
    const duet_st_tensor_t *mlp_norm;  /* [hidden] post_attention_layernorm */
    const duet_st_tensor_t *w_gate;    /* [intermediate][hidden] */
    const duet_st_tensor_t *w_up;      /* [intermediate][hidden] */
    const duet_st_tensor_t *w_down;    /* [hidden][intermediate] */
    /* FP8 checkpoints (cfg.quant): the weight_scale of each linear weight
     * above whose dtype is F8_E4M3 ([] or [1] per tensor, [out][1] per
     * channel, a float dtype), NULL for a weight stored in a float dtype. */
    const duet_st_tensor_t *wq_scale, *wk_scale, *wv_scale, *wo_scale;
    const duet_st_tensor_t *w_gate_scale, *w_up_scale, *w_down_scale;
} duet_layer_weights_t;

typedef struct {
    char *dir;
    duet_model_config_t cfg;
    duet_st_set_t *st;
    const duet_st_tensor_t *embed;   /* [vocab][hidden] model.embed_tokens.weight */
    const duet_st_tensor_t *norm;    /* [hidden] model.norm.weight */
    const duet_st_tensor_t *lm_head; /* [vocab][hidden]; == embed when tied */
    duet_layer_weights_t *layers;    /* [n_layers] */
    float *rope_inv_freq;            /* [head_dim / 2], rope_scaling applied (model/rope.h) */
    /* Identity of the weights and shapes: equal fingerprints mean the same
     * model to both sides of a KV transfer.  A 64-bit hash of the config
     * fields that change the computation (arch, sizes, rope_theta, rms_eps,
     * tying, attention bias; not max_pos or token ids) and, for every weight
     * used, its name, dtype, shape and first and last 4 KiB of data: cheap
     * for any model size, independent of how the files are sharded. */
    uint64_t fingerprint;
} duet_model_t;

/* Open DIR: config.json + safetensors.  Every tensor the config implies must
 * exist with exactly the implied shape and a float dtype; a missing tensor or
 * a shape mismatch is DUET_ERR_FORMAT naming the file and tensor.  In an FP8
 * checkpoint (config.json quantization_config, model/quant.h) the q/k/v/o
 * and gate/up/down weights may be F8_E4M3, each with its weight_scale of the
 * shape the strategy implies; an F8_E4M3 weight without a valid scale, or
 * without a quantization_config, is DUET_ERR_FORMAT naming the tensor.  lm_head is
 * the embedding when tie_word_embeddings is true (a saved lm_head.weight is
 * then ignored) and required otherwise.  q/k/v or o_proj biases present in
 * a model whose config implies none are an error, other extra tensors are
 * ignored.  An
 * open model is immutable: share it between threads freely.  close accepts
 * NULL. */
duet_status_t duet_model_open(const char *dir, duet_model_t **model_p);
void duet_model_close(duet_model_t *model);

#endif
