/* RoPE inverse frequencies of a config, scaling included: computed once
 * when a model is opened and handed to the backends' rope_kv_store. */
#ifndef DUET_MODEL_ROPE_H
#define DUET_MODEL_ROPE_H

#include "model/model_config.h"

/* inv_freq[i] for i < head_dim / 2, as transformers' modeling_rope_utils
 * computes them (in double, rounded to float):
 *   default  theta^(-2i/d)
 *   dynamic  default: transformers' NTK rescaling starts past
 *            max_position_embeddings, where the engine refuses to go
 *   linear   default / factor
 *   llama3   default where the wavelength 2 pi / f < orig / high_freq_factor,
 *            default / factor where it is > orig / low_freq_factor, and in
 *            between (1 - s) f / factor + s f with
 *            s = (orig / wavelength - low) / (high - low)
 *   yarn     f / factor (1 - e_i) + f e_i, with e_i = 1 - ramp(i) and ramp
 *            the clamped line from the correction dims of beta_fast and
 *            beta_slow (floored / ceiled when truncate) at orig positions.
 * The attention factor (cos and sin are multiplied by it) is
 * cfg->rope_scaling.attention_factor. */
void duet_rope_inv_freq(const duet_model_config_t *cfg, float *inv_freq);

#endif
