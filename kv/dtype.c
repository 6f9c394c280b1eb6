#include "kv/dtype.h"

#include <math.h>

size_t duet_dtype_size(duet_dtype_t dt)
{
    switch (dt) {
    case DUET_DTYPE_F32:
    case DUET_DTYPE_I32:
        return 4;
    case DUET_DTYPE_F16:
    case DUET_DTYPE_BF16:
        return 2;
    case DUET_DTYPE_I64:
        return 8;
    }
    return 0;
}

static const char *const duet__dtype_names[] = {"F32", "F16", "BF16", "I32", "I64"};

const char *duet_dtype_name(duet_dtype_t dt)
{
    if ((unsigned)dt < sizeof(duet__dtype_names) / sizeof(duet__dtype_names[0]))
        return duet__dtype_names[dt];
    return "?";
}

int duet_dtype_parse(const char *s)
{
    for (int i = 0; i < (int)(sizeof(duet__dtype_names) / sizeof(duet__dtype_names[0])); i++) {
        if (strcmp(s, duet__dtype_names[i]) == 0)
            return i;
    }
    return -1;
}

float duet_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    float f;

    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else {
            /* subnormal: value = man * 2^-24 */
            f = (float)man * 0x1p-24f;
            return sign ? -f : f;
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 112u) << 23) | (man << 13);
    }
    memcpy(&f, &u, sizeof(f));
    return f;
}

uint16_t duet_f32_to_f16(float f)
{
    uint32_t u;
    uint32_t sign, exp, man;

    memcpy(&u, &f, sizeof(u));
    sign = (u >> 16) & 0x8000u;
    exp = (u >> 23) & 0xffu;
    man = u & 0x7fffffu;
    if (exp == 0xff)
        return (uint16_t)(sign | 0x7c00u | (man ? 0x200u : 0));
    int e = (int)exp - 127 + 15;
    if (e >= 31)
        return (uint16_t)(sign | 0x7c00u);
    if (e <= 0) {
        if (e < -10)
            return (uint16_t)sign;
        man |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - e);
        uint32_t half = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1u)))
            half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = sign | ((uint32_t)e << 10) | (man >> 13);
    uint32_t rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (half & 1u)))
        half++; /* may carry into the exponent: still correct rounding */
    return (uint16_t)half;
}

void duet_dtype_to_f32(duet_dtype_t dt, const void *src, float *dst, size_t n)
{
    switch (dt) {
    case DUET_DTYPE_F32:
        memcpy(dst, src, n * sizeof(float));
        break;
    case DUET_DTYPE_F16: {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++)
            dst[i] = duet_f16_to_f32(s[i]);
        break;
    }
    case DUET_DTYPE_BF16: {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++)
            dst[i] = duet_bf16_to_f32(s[i]);
        break;
    }
    default:
        for (size_t i = 0; i < n; i++)
            dst[i] = NAN;
        break;
    }
}
