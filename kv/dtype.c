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
    case DUET_DTYPE_F8_E4M3:
        return 1;
    }
    return 0;
}

static const char *const duet__dtype_names[] = {"F32", "F16", "BF16", "I32", "I64", "F8_E4M3"};

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

float duet_e4m3_to_f32(uint8_t b)
{
    uint32_t sign = b & 0x80u, exp = (b >> 3) & 0xfu, man = b & 0x7u;
    float f;

    if (exp == 0xfu && man == 0x7u)
        return sign ? -NAN : NAN;
    if (exp == 0)
        f = (float)man * 0x1p-9f; /* subnormal: man * 2^-6 / 8 */
    else
        f = ldexpf((float)(8u + man), (int)exp - 10); /* 1.man * 2^(exp - 7) */
    return sign ? -f : f;
}

uint8_t duet_f32_to_e4m3(float f)
{
    uint32_t u;
    uint8_t sign;
    float a;
    int e;

    memcpy(&u, &f, sizeof(u));
    sign = (uint8_t)((u >> 24) & 0x80u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint8_t)(sign | 0x7fu);
    a = fabsf(f);
    if (a >= 464.0f) /* 448 + half an ulp (32 / 2): saturate, infinities too */
        return (uint8_t)(sign | 0x7eu);
    if (a < 0x1p-6f) { /* subnormal range: steps of 2^-9, nearbyint rounds half to even */
        float q = nearbyintf(a * 0x1p9f);
        return (uint8_t)(sign | (uint8_t)q); /* q == 8 is the smallest normal 0x08 */
    }
    frexpf(a, &e); /* a = m * 2^e, m in [0.5, 1) */
    /* 4 significant bits: steps of 2^(e - 4) */
    float q = nearbyintf(ldexpf(a, 4 - e)); /* in [8, 16] */
    int exp = e - 1 + 7;
    if (q >= 16.0f) {
        q = 8.0f;
        exp++;
    }
    if (exp > 15 || (exp == 15 && q > 14.0f))
        return (uint8_t)(sign | 0x7eu);
    return (uint8_t)(sign | (uint8_t)(exp << 3) | (uint8_t)((int)q - 8));
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
    case DUET_DTYPE_F8_E4M3: {
        const uint8_t *s = src;
        for (size_t i = 0; i < n; i++)
            dst[i] = duet_e4m3_to_f32(s[i]);
        break;
    }
    default:
        for (size_t i = 0; i < n; i++)
            dst[i] = NAN;
        break;
    }
}
