/* FP8 weight quantization of a checkpoint: config.json's
 * quantization_config, and the e4m3 weight scales next to the weights.
 *
 * Accepted layouts (all e4m3 weights, symmetric, scale multiplies):
 *  - compressed-tensors (llm-compressor, Neural Magic / Red Hat FP8
 *    checkpoints): quant_method "compressed-tensors", format
 *    "float-quantized", every config_groups.*.weights {num_bits 8, type
 *    float, strategy tensor|channel}; <m>.weight F8_E4M3 and
 *    <m>.weight_scale F32/BF16/F16 of shape [] or [1] (tensor) or [out, 1]
 *    (channel).
 *  - fbgemm_fp8 (Meta's FP8 Llama releases): per channel, weight_scale
 *    [out, 1].
 *  - fp8 (vLLM Fp8Config / AutoFP8 serialized): per tensor, weight_scale
 *    [] or [1]; weight_block_size (block scales) is refused.
 * input_scale tensors (static activation scales) are ignored: activations
 * are bf16 between ops, and the CUDA FP8 GEMM quantizes them per tensor on
 * the device from their measured amax.  Which modules are FP8 follows the
 * tensors' dtypes: modules in ignore / modules_to_not_convert /
 * ignored_layers are stored in bf16 and used as such; embeddings, norms and
 * lm_head must not be FP8.  Refused, naming the key: another quant_method,
 * another format, num_bits / type other than 8 / float, strategies block,
 * group and token, asymmetric weights, an FP8 KV cache (kv_cache_scheme),
 * sparsity. */
#ifndef DUET_MODEL_QUANT_H
#define DUET_MODEL_QUANT_H

#include <stdbool.h>

#include <cjson/cJSON.h>

#include "common/status.h"

typedef enum {
    DUET_QUANT_NONE = 0,
    DUET_QUANT_COMPRESSED_TENSORS = 1,
    DUET_QUANT_FBGEMM_FP8 = 2,
    DUET_QUANT_FP8 = 3,
} duet_quant_method_t;

typedef struct {
    duet_quant_method_t method;
    bool per_channel;  /* weight_scale [out, 1]; else one scale per tensor */
    bool static_input; /* the checkpoint has input_scale tensors (ignored) */
} duet_quant_config_t;

/* quantization_config of config.json (absent or null: NONE). */
duet_status_t duet_quant_config_parse(const cJSON *json, const char *what, duet_quant_config_t *q);

/* "none", "compressed-tensors", "fbgemm_fp8", "fp8". */
const char *duet_quant_method_name(duet_quant_method_t m);

#endif
