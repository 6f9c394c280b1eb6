/* Element types of weights, activations and KV. */
#ifndef DUET_KV_DTYPE_H
#define DUET_KV_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum {
    DUET_DTYPE_F32 = 0,
    DUET_DTYPE_F16 = 1,
    DUET_DTYPE_BF16 = 2,
    DUET_DTYPE_I32 = 3,
    DUET_DTYPE_I64 = 4,
    /* FP8 e4m3 (OCP "e4m3fn": bias 7, no infinities, max 448, NaN
     * S.1111.111); weights of FP8 checkpoints only (model/quant.h) */
    DUET_DTYPE_F8_E4M3 = 5,
} duet_dtype_t;

/* Bytes per element; 0 for an unknown value. */
size_t duet_dtype_size(duet_dtype_t dt);
/* "F32", "F16", "BF16", "I32", "I64", "F8_E4M3" (safetensors spelling). */
const char *duet_dtype_name(duet_dtype_t dt);
/* Parse the safetensors spelling; returns -1 if unknown. */
int duet_dtype_parse(const char *s);

static inline float duet_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* Round to nearest even; NaN stays NaN. */
static inline uint16_t duet_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float duet_f16_to_f32(uint16_t h);
/* e4m3 -> float is exact (every e4m3 value is a float); NaN stays NaN. */
float duet_e4m3_to_f32(uint8_t b);
/* Round to nearest even, saturating to +-448 (as a quantizer clamps);
 * NaN gives the e4m3 NaN 0x7f (sign kept). */
uint8_t duet_f32_to_e4m3(float f);
uint16_t duet_f32_to_f16(float f);

/* Convert n elements of src (dtype dt) to float. */
void duet_dtype_to_f32(duet_dtype_t dt, const void *src, float *dst, size_t n);

#endif
