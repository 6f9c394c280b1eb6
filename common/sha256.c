/* SHA-256 and HMAC-SHA256, written from FIPS 180-4 §6.2 and RFC 2104
 * (common/sha256.h). */
#include "common/sha256.h"

#include "common/sha256_block.h"

#include <string.h>

/* FIPS 180-4 §4.2.2: the first 32 bits of the fractional parts of the cube
 * roots of the first 64 primes */
const uint32_t duet__sha256_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static inline uint32_t duet__ror(uint32_t x, int n)
{
    return (x >> n) | (x << (32 - n));
}

/* One round of §6.2.2 step 3 with the working variables renamed instead of
 * moved: the caller passes them rotated by one each round, so d and h are
 * the only ones written. */
#define DUET__ROUND(a, b, c, d, e, f, g, h, t)                                                    \
    do {                                                                                          \
        uint32_t t1 = h + (duet__ror(e, 6) ^ duet__ror(e, 11) ^ duet__ror(e, 25)) +                \
                      ((e & f) ^ (~e & g)) + duet__sha256_k[t] + w[t];                                   \
        uint32_t t2 = (duet__ror(a, 2) ^ duet__ror(a, 13) ^ duet__ror(a, 22)) +                   \
                      ((a & b) ^ (a & c) ^ (b & c));                                              \
        d += t1;                                                                                  \
        h = t1 + t2;                                                                              \
    } while (0)

void duet__sha256_block_portable(uint32_t hs[8], const uint8_t *p)
{
    uint32_t w[64];
    uint32_t a = hs[0], b = hs[1], c = hs[2], d = hs[3], e = hs[4], f = hs[5], g = hs[6],
             h = hs[7];

    for (int t = 0; t < 16; t++)
        w[t] = (uint32_t)p[4 * t] << 24 | (uint32_t)p[4 * t + 1] << 16 |
               (uint32_t)p[4 * t + 2] << 8 | (uint32_t)p[4 * t + 3];
    for (int t = 16; t < 64; t++) {
        uint32_t s0 = duet__ror(w[t - 15], 7) ^ duet__ror(w[t - 15], 18) ^ (w[t - 15] >> 3);
        uint32_t s1 = duet__ror(w[t - 2], 17) ^ duet__ror(w[t - 2], 19) ^ (w[t - 2] >> 10);
        w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    for (int t = 0; t < 64; t += 8) {
        DUET__ROUND(a, b, c, d, e, f, g, h, t);
        DUET__ROUND(h, a, b, c, d, e, f, g, t + 1);
        DUET__ROUND(g, h, a, b, c, d, e, f, t + 2);
        DUET__ROUND(f, g, h, a, b, c, d, e, t + 3);
        DUET__ROUND(e, f, g, h, a, b, c, d, t + 4);
        DUET__ROUND(d, e, f, g, h, a, b, c, t + 5);
        DUET__ROUND(c, d, e, f, g, h, a, b, t + 6);
        DUET__ROUND(b, c, d, e, f, g, h, a, t + 7);
    }
    hs[0] += a;
    hs[1] += b;
    hs[2] += c;
    hs[3] += d;
    hs[4] += e;
    hs[5] += f;
    hs[6] += g;
    hs[7] += h;
    /* the message schedule holds key material under HMAC (the working
     * variables live in registers, as in other implementations) */
    duet_wipe(w, sizeof(w));
}

static void duet__block(uint32_t h[8], const uint8_t *p)
{
    /* the CPU's answer is cached after the first call (sha256_x86.c) */
    if (duet__sha256_x86_ok())
        duet__sha256_block_x86(h, p);
    else
        duet__sha256_block_portable(h, p);
}

void duet_sha256_init(duet_sha256_t *s)
{
    /* §5.3.3: the first 32 bits of the fractional parts of the square
     * roots of the first 8 primes */
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, h0, sizeof(h0));
    s->n_bytes = 0;
    s->n_buf = 0;
}

void duet_sha256_update(duet_sha256_t *s, const void *data, size_t len)
{
    const uint8_t *p = data;

    s->n_bytes += len;
    if (s->n_buf > 0) {
        size_t take = DUET_SHA256_BLOCK - s->n_buf;
        if (take > len)
            take = len;
        memcpy(s->buf + s->n_buf, p, take);
        s->n_buf += take;
        p += take;
        len -= take;
        if (s->n_buf < DUET_SHA256_BLOCK)
            return;
        duet__block(s->h, s->buf);
        s->n_buf = 0;
    }
    for (; len >= DUET_SHA256_BLOCK; p += DUET_SHA256_BLOCK, len -= DUET_SHA256_BLOCK)
        duet__block(s->h, p);
    memcpy(s->buf, p, len);
    s->n_buf = len;
}

void duet_sha256_final(duet_sha256_t *s, uint8_t out[DUET_SHA256_LEN])
{
    uint64_t bits = s->n_bytes * 8;
    uint8_t pad[DUET_SHA256_BLOCK + 8] = {0x80};
    /* §5.1.1: a one bit, zeros to 56 mod 64 bytes, the length in bits */
    size_t n_pad = (s->n_buf < 56 ? 56 : 120) - s->n_buf;

    for (int i = 0; i < 8; i++)
        pad[n_pad + (size_t)i] = (uint8_t)(bits >> (56 - 8 * i));
    duet_sha256_update(s, pad, n_pad + 8);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (uint8_t)(s->h[i] >> 24);
        out[4 * i + 1] = (uint8_t)(s->h[i] >> 16);
        out[4 * i + 2] = (uint8_t)(s->h[i] >> 8);
        out[4 * i + 3] = (uint8_t)s->h[i];
    }
    duet_wipe(s, sizeof(*s));
}

void duet_sha256(const void *data, size_t len, uint8_t out[DUET_SHA256_LEN])
{
    duet_sha256_t s;
    duet_sha256_init(&s);
    duet_sha256_update(&s, data, len);
    duet_sha256_final(&s, out);
}

void duet_hmac_sha256_init(duet_hmac_sha256_t *h, const void *key, size_t key_len)
{
    uint8_t k[DUET_SHA256_BLOCK] = {0}, ipad[DUET_SHA256_BLOCK];

    /* a key longer than a block is hashed first */
    if (key_len > DUET_SHA256_BLOCK)
        duet_sha256(key, key_len, k);
    else if (key_len > 0)
        memcpy(k, key, key_len);
    for (int i = 0; i < DUET_SHA256_BLOCK; i++) {
        ipad[i] = k[i] ^ 0x36;
        h->opad_key[i] = k[i] ^ 0x5c;
    }
    duet_sha256_init(&h->inner);
    duet_sha256_update(&h->inner, ipad, sizeof(ipad));
    duet_wipe(k, sizeof(k));
    duet_wipe(ipad, sizeof(ipad));
}

void duet_hmac_sha256_update(duet_hmac_sha256_t *h, const void *data, size_t len)
{
    duet_sha256_update(&h->inner, data, len);
}

void duet_hmac_sha256_final(duet_hmac_sha256_t *h, uint8_t out[DUET_SHA256_LEN])
{
    uint8_t inner[DUET_SHA256_LEN];
    duet_sha256_t outer;

    duet_sha256_final(&h->inner, inner);
    duet_sha256_init(&outer);
    duet_sha256_update(&outer, h->opad_key, sizeof(h->opad_key));
    duet_sha256_update(&outer, inner, sizeof(inner));
    duet_sha256_final(&outer, out);
    duet_wipe(inner, sizeof(inner));
    duet_wipe(h, sizeof(*h));
}

void duet_hmac_sha256(const void *key, size_t key_len, const void *data, size_t len,
                      uint8_t out[DUET_SHA256_LEN])
{
    duet_hmac_sha256_t h;
    duet_hmac_sha256_init(&h, key, key_len);
    duet_hmac_sha256_update(&h, data, len);
    duet_hmac_sha256_final(&h, out);
}

bool duet_ct_equal(const void *a, const void *b, size_t len)
{
    const volatile uint8_t *x = a, *y = b;
    uint8_t diff = 0;
    for (size_t i = 0; i < len; i++)
        diff |= (uint8_t)(x[i] ^ y[i]);
    return diff == 0;
}

void duet_wipe(void *p, size_t len)
{
    memset(p, 0, len);
    /* the compiler must assume the asm reads the zeros: the memset stays
     * (a volatile byte loop did the same at a byte per store, which was
     * half of hashing a page) */
    __asm__ __volatile__("" : : "r"(p) : "memory");
}
