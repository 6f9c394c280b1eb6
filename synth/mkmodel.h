/* Synthetic Hugging Face Llama-family checkpoints ("duet mkmodel").
 *
 * Weights are a pure function of (seed, tensor name, element index): a
 * counter-based generator (splitmix64), so any tensor or slice of one can be
 * regenerated independently of the others and of the generation order, and
 * two runs with the same options write identical files.  Distributions
 * (U = uniform, std s):
 *   embed_tokens            U, std 0.2, times a per-row scale in [0.48, 2.08]
 *   q/k/v/o, gate/up/down   U, std 1.5 / sqrt(fan_in)
 *   lm_head (untied)        U, std 1.5 / sqrt(hidden), times a per-row scale
 *   norm weights            1 + U, std 0.1 (q_norm / k_norm of qwen3 too)
 *   q/k/v and o biases      U, std 0.5
 * so that a forward pass stays well-conditioned, greedy decoding is
 * decisive (median top-1/top-2 logit gap around 0.1 of the top logit's
 * distance to the mean) and not degenerate (no endless repetition, tied
 * models included): tested with a reference forward pass in test_mkmodel.
 * The values are the same on every machine and compiler (integer hashing,
 * exactly rounded float operations, no libm). */
#ifndef DUET_SYNTH_MKMODEL_H
#define DUET_SYNTH_MKMODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "kv/dtype.h"
#include "model/model_config.h"

typedef struct {
    duet_arch_t arch;    /* qwen2 gets q/k/v biases, qwen3 q_norm / k_norm */
    bool attention_bias; /* llama only: q/k/v and o_proj biases (attention_bias: true) */
    int layers;
    int hidden;
    int heads;
    int kv_heads; /* 0: = heads */
    int head_dim; /* 0: = hidden / heads */
    int intermediate;
    int vocab; /* >= 260 (the synthetic tokenizer's minimum) */
    int max_pos;
    double rope_theta;
    const char *rope_scaling; /* NULL: null; else a JSON object, config.json's rope_scaling */
    double rms_eps;
    bool tied;          /* tie_word_embeddings: no lm_head.weight */
    duet_dtype_t dtype; /* F32, F16 or BF16 */
    uint64_t seed;
    /* FP8 checkpoint (model/quant.h): 0 none, else the q/k/v/o and
     * gate/up/down weights, first rounded to dtype, are quantized to
     * F8_E4M3 with scale = amax / 448 (round to nearest even) per tensor
     * (DUET_MKMODEL_FP8_TENSOR) or per output row (CHANNEL), written with
     * F32 <m>.weight_scale tensors and config.json's quantization_config in
     * fp8_format; embeddings, norms, lm_head and biases stay in dtype. */
    int fp8;
    int fp8_format;
    int shards;  /* 1: model.safetensors; > 1: model-0000i-of-0000n + index */
    int threads; /* generation threads; 0: online CPUs (at most 16) */
} duet_mkmodel_opts_t;

#define DUET_MKMODEL_FP8_TENSOR  1
#define DUET_MKMODEL_FP8_CHANNEL 2
/* fp8_format: weight_scale [1] / [out, 1] / [] with these configs */
#define DUET_MKMODEL_FP8_COMPRESSED_TENSORS 0 /* compressed-tensors float-quantized */
#define DUET_MKMODEL_FP8_FBGEMM             1 /* fbgemm_fp8: channel only */
#define DUET_MKMODEL_FP8_VLLM               2 /* fp8 (vLLM Fp8Config): tensor only */

/* A small llama: 2 layers, hidden 64, 4 heads / 2 KV heads (head_dim 16),
 * intermediate 128, vocab 512, max_pos 2048, theta 10000, eps 1e-5,
 * untied, F32, seed 1, 1 shard. */
duet_mkmodel_opts_t duet_mkmodel_opts_default(void);

/* Overwrite the shape fields (arch, attention_bias, layers, hidden, heads,
 * kv_heads, head_dim, intermediate, vocab, max_pos, rope_theta, rms_eps,
 * tied) with a
 * preset of ../shared/BENCHMARKS.md: "bench-124m", "llama-3.2-1b-shape",
 * "llama-3-8b-shape".  dtype, seed, shards, threads are left alone.
 * DUET_ERR_NOT_FOUND for an unknown name. */
duet_status_t duet_mkmodel_preset(const char *name, duet_mkmodel_opts_t *opts);

/* DUET_ERR_INVALID naming the option when opts cannot make a model. */
duet_status_t duet_mkmodel_check(const duet_mkmodel_opts_t *opts);

/* Parameter count and bytes of weight data (headers excluded). */
duet_status_t duet_mkmodel_size(const duet_mkmodel_opts_t *opts, uint64_t *params_p,
                                uint64_t *bytes_p);

/* Write DIR/config.json, the safetensors file(s) and DIR/tokenizer.json
 * (duet_tokenizer_write_synthetic), creating DIR (and parents) if missing.
 * config.json has bos_token_id = vocab - 2 and eos_token_id = vocab - 1.
 * Tensors are generated and written in chunks (memory use is a few tens of
 * MiB whatever the model size); every file is written to a temp name and
 * renamed.  A stale model.safetensors / index from another shard count is
 * removed so that the directory describes one model. */
duet_status_t duet_mkmodel_write(const char *dir, const duet_mkmodel_opts_t *opts);

/* Elements [first, first + n) of tensor `name` (row-major) as the float
 * values before rounding to opts->dtype, i.e. what duet_mkmodel_write
 * stores up to that rounding (FP8 weights: before the rounding to dtype and
 * the quantization; their weight_scale tensors are DUET_ERR_INVALID).  DUET_ERR_NOT_FOUND for a name the model does
 * not have, DUET_ERR_INVALID for a range past the end. */
duet_status_t duet_mkmodel_values(const duet_mkmodel_opts_t *opts, const char *name, uint64_t first,
                                  size_t n, float *dst);

#endif
