/* RoPE inverse frequencies with transformers' rope_scaling types. */
#include "model/rope.h"

#include <math.h>

/* find_correction_dim of modeling_rope_utils: the dimension whose
 * frequency makes n_rot rotations over max_pos positions */
static double duet__yarn_dim(double n_rot, int dim, double base, int max_pos)
{
    return (double)dim * log((double)max_pos / (n_rot * 2.0 * M_PI)) / (2.0 * log(base));
}

void duet_rope_inv_freq(const duet_model_config_t *cfg, float *inv_freq)
{
    const duet_rope_scaling_t *rs = &cfg->rope_scaling;
    int dim = cfg->head_dim, half = dim / 2;
    double base = cfg->rope_theta, lo = 0, hi = 0;

    if (rs->type == DUET_ROPE_YARN) {
        lo = duet__yarn_dim(rs->beta_fast, dim, base, rs->orig_max_pos);
        hi = duet__yarn_dim(rs->beta_slow, dim, base, rs->orig_max_pos);
        if (rs->truncate) {
            lo = floor(lo);
            hi = ceil(hi);
        }
        lo = lo > 0 ? lo : 0;
        hi = hi < dim - 1 ? hi : dim - 1;
        if (lo == hi)
            hi += 0.001; /* as transformers: no division by zero */
    }
    for (int i = 0; i < half; i++) {
        double f = 1.0 / pow(base, (double)(2 * i) / (double)dim);
        switch (rs->type) {
        case DUET_ROPE_NONE:
        case DUET_ROPE_DYNAMIC: /* unscaled up to max_pos, the engine's limit */
            break;
        case DUET_ROPE_LINEAR:
            f /= rs->factor;
            break;
        case DUET_ROPE_LLAMA3: {
            double wavelen = 2.0 * M_PI / f;
            double orig = (double)rs->orig_max_pos;
            if (wavelen > orig / rs->low_freq_factor) {
                f /= rs->factor;
            } else if (!(wavelen < orig / rs->high_freq_factor)) {
                double s = (orig / wavelen - rs->low_freq_factor) /
                           (rs->high_freq_factor - rs->low_freq_factor);
                f = (1.0 - s) * f / rs->factor + s * f;
            }
            break;
        }
        case DUET_ROPE_YARN: {
            double ramp = ((double)i - lo) / (hi - lo);
            double extra = 1.0 - (ramp < 0 ? 0 : ramp > 1 ? 1 : ramp);
            f = f / rs->factor * (1.0 - extra) + f * extra;
            break;
        }
        }
        inv_freq[i] = (float)f;
    }
}
