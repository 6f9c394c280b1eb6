/* mkmodel's internals shared by mkmodel.c and mkmodel_fp8.c. */
#ifndef DUET_SYNTH_MKMODEL_INTERNAL_H
#define DUET_SYNTH_MKMODEL_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "synth/mkmodel.h"

#define DUET_MKMODEL_MAX_THREADS 16

typedef struct {
    char name[96];
    int ndim;
    int64_t shape[2];
    uint64_t count;
    float offset, amp; /* value = offset + amp * row scale * U(-1, 1) */
    uint64_t key;
    uint64_t row_key;   /* 0: no per-row scale */
    duet_dtype_t dtype; /* stored dtype */
    /* FP8: 1 a quantized weight (values rounded to `base`, divided by the
     * scale, rounded to e4m3), 2 a weight_scale tensor (the values are
     * scales[]); scales: per row or one, computed by duet__mk_fp8_scales,
     * owned by the weight's spec */
    int fp8;
    bool per_row;
    duet_dtype_t base;
    float *scales;
} duet__mk_spec_t;

/* Elements [first, first + n) of s's values before any rounding. */
void duet__mk_gen(const duet__mk_spec_t *s, uint64_t first, size_t n, float *dst);
/* Round n floats to dt (F16, BF16; F32 copies) into dst. */
void duet__mk_store(duet_dtype_t dt, const float *src, size_t n, void *dst);
int duet__mk_threads(const duet_mkmodel_opts_t *o);

/* mkmodel_fp8.c: n bytes (fp8 1) or floats (fp8 2) of an FP8 spec from
 * `first` into out, tmp a scratch of n floats. */
void duet__mk_fp8_block(const duet__mk_spec_t *s, uint64_t first, size_t n, float *tmp,
                        unsigned char *out);
/* The scales of every FP8 weight spec (and the scale spec after it). */
duet_status_t duet__mk_fp8_scales(const duet_mkmodel_opts_t *o, duet__mk_spec_t *specs, size_t n);
/* config.json's quantization_config line ("" without fp8). */
const char *duet__mk_quant_config(const duet_mkmodel_opts_t *o);

#endif
