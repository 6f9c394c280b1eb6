/* Reading a duet_weight_src_t block as float, FP8 dequantization included:
 * the CPU backend's load path and the CUDA tests' reference. */
#ifndef DUET_ENGINE_WEIGHT_SRC_H
#define DUET_ENGINE_WEIGHT_SRC_H

#include <stddef.h>

#include "engine/backend.h"

/* The scale of source row `row` (absolute) of an F8_E4M3 source; 1 for a
 * float source. */
static inline float duet_weight_src_scale(const duet_weight_src_t *s, int row)
{
    float v = 1.0f;
    if (s->dtype == DUET_DTYPE_F8_E4M3 && s->scale != NULL)
        duet_dtype_to_f32(
            s->scale_dtype,
            (const char *)s->scale +
                (s->scale_per_row ? (size_t)row * duet_dtype_size(s->scale_dtype) : 0),
            &v, 1);
    return v;
}

/* dst[rows][cols] = the block as float: float dtypes converted exactly,
 * F8_E4M3 as e4m3 -> f32 (exact) times the row's scale (one f32 multiply,
 * rounded to nearest even). */
static inline void duet_weight_src_to_f32(const duet_weight_src_t *s, float *dst)
{
    size_t es = duet_dtype_size(s->dtype);
    for (int r = 0; r < s->rows; r++) {
        const char *row = (const char *)s->data +
                          ((size_t)(s->row0 + r) * (size_t)s->src_cols + (size_t)s->col0) * es;
        float *d = dst + (size_t)r * (size_t)s->cols;
        duet_dtype_to_f32(s->dtype, row, d, (size_t)s->cols);
        if (s->dtype == DUET_DTYPE_F8_E4M3) {
            float sc = duet_weight_src_scale(s, s->row0 + r);
            for (int c = 0; c < s->cols; c++)
                d[c] *= sc;
        }
    }
}

#endif
