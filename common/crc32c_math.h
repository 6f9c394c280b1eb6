/* CRC32C arithmetic shared by the host and the GPU (header only: C and
 * CUDA, static inline, pure).
 *
 * Convention (common/crc32c.h): the reflected Castagnoli polynomial
 * 0x82F63B78, register preset to ~0 and inverted at the end, so
 * crc32c("123456789") == 0xE3069283.  A 32-bit value v also stands for the
 * polynomial sum of bit (31 - i) * x^i (reflected): 0x80000000 is 1,
 * 0x40000000 is x.
 *
 * Shift and combine.  Appending n zero bytes multiplies the register by
 * x^(8n) modulo P (carry-less, in GF(2)), and the CRC is linear, so
 *   crc(A || B) = crc(A) * x^(8|B|) mod P  xor  crc(B)
 * (duet_crc32c_combine).  The *raw* CRC R(M) -- register preset to 0, no
 * final inversion -- is linear without the constant term:
 *   R(A || B) = R(A) * x^(8|B|) xor R(B),   R(0^k || M) = R(M),
 *   crc(M) = R(M) xor (~0 * x^(8|M|)) xor ~0        (duet_crc32c_from_raw).
 * Leading zero bytes do not change R, which the GPU uses to pad.
 *
 * Parallel CRC of a piece (engine/cuda/kv_crc.cu; emulated on the CPU by
 * tests/unit/test_crc32c.c).  A piece's bytes are read as B = 256 lanes of
 * 16-byte vectors, vector i by lane i mod B (a warp reads 512 contiguous
 * bytes per load).  The piece is widened to whole aligned vectors: bytes
 * before its start and after its end in its first and last vector read as
 * zero; in front it is padded with zero vectors to a multiple of B.  Lane t
 * keeps s = G(v xor s) over its vectors in order, where G maps a 16-byte
 * vector to the raw CRC of that vector followed by 16 (B - 1) zero bytes
 * (16 table lookups: duet_crc32c_par_step), so its final s is its share of
 * R(body) shifted 16 t bytes too far.  Multiplying by fwd[t] =
 * x^(8 * 16 (B - 1 - t)) aligns every lane 16 (B - 1) + pad bytes past the
 * piece's end (pad: the zeros after it in its last vector); the lanes'
 * xor is then one multiplication by x^(8 (after + 16 - pad)) away from
 *   T(piece) = R(piece) * x^(8 (after + 16 B)),
 * with `after` the bytes of the whole stream that follow the piece.  The
 * xor of T over all pieces is R(stream) * x^(8 * 16 B), which the host
 * turns into the CRC (duet_crc32c_par_finish: one multiplication by the
 * inverse power, then from_raw). */
#ifndef DUET_COMMON_CRC32C_MATH_H
#define DUET_COMMON_CRC32C_MATH_H

#include <stdint.h>

#ifdef __CUDACC__
#define DUET_CRC32C_HD __host__ __device__
#else
#define DUET_CRC32C_HD
#endif

#define DUET_CRC32C_POLY 0x82F63B78u
#define DUET_CRC32C_ONE  0x80000000u /* the polynomial 1 */
/* x^-1 mod P: (P + 1) / x, reflected */
#define DUET_CRC32C_XINV 0x05EC76F1u

/* Lanes and vector bytes of the parallel CRC; a round covers STRIDE bytes. */
#define DUET_CRC32C_PAR_LANES  256
#define DUET_CRC32C_PAR_VEC    16
#define DUET_CRC32C_PAR_STRIDE (DUET_CRC32C_PAR_LANES * DUET_CRC32C_PAR_VEC)
/* Digits (base 256) of the shift lengths duet_crc32c_par_xpow8 takes:
 * streams below 2^40 bytes. */
#define DUET_CRC32C_PAR_DIGITS 5

/* a * b mod P (reflected; either may be 0). */
static inline DUET_CRC32C_HD uint32_t duet_crc32c_mulmod(uint32_t a, uint32_t b)
{
    uint32_t p = 0;
    for (int i = 0; i < 32; i++) {
        p ^= b & (0u - ((a >> (31 - i)) & 1u));
        b = (b >> 1) ^ (DUET_CRC32C_POLY & (0u - (b & 1u)));
    }
    return p;
}

/* base^e mod P by squaring. */
static inline DUET_CRC32C_HD uint32_t duet_crc32c_powmod(uint32_t base, uint64_t e)
{
    uint32_t r = DUET_CRC32C_ONE;
    while (e != 0) {
        if (e & 1u)
            r = duet_crc32c_mulmod(r, base);
        base = duet_crc32c_mulmod(base, base);
        e >>= 1;
    }
    return r;
}

/* x^(8n) mod P: the operator of appending n zero bytes. */
static inline DUET_CRC32C_HD uint32_t duet_crc32c_xpow8(uint64_t n)
{
    return duet_crc32c_powmod(0x00800000u /* x^8 */, n);
}

/* The CRC of crc's message followed by n zero bytes, in raw terms:
 * R(M || 0^n) = R(M) * x^(8n). */
static inline DUET_CRC32C_HD uint32_t duet_crc32c_shift(uint32_t raw, uint64_t n)
{
    return duet_crc32c_mulmod(duet_crc32c_xpow8(n), raw);
}

/* crc(A || B) from crc1 = crc(A), crc2 = crc(B) and len2 = |B| (also for
 * raw CRCs). */
static inline DUET_CRC32C_HD uint32_t duet_crc32c_combine(uint32_t crc1, uint32_t crc2,
                                                          uint64_t len2)
{
    return duet_crc32c_shift(crc1, len2) ^ crc2;
}

/* crc(M) from R(M) and |M|. */
static inline DUET_CRC32C_HD uint32_t duet_crc32c_from_raw(uint32_t raw, uint64_t n)
{
    return raw ^ duet_crc32c_shift(0xFFFFFFFFu, n) ^ 0xFFFFFFFFu;
}

/* R of one byte (the byte-serial table's entry). */
static inline DUET_CRC32C_HD uint32_t duet_crc32c_raw_byte(uint32_t b)
{
    uint32_t c = b & 0xffu;
    for (int k = 0; k < 8; k++)
        c = (c >> 1) ^ (DUET_CRC32C_POLY & (0u - (c & 1u)));
    return c;
}

/* ---- the parallel CRC's tables and steps ---------------------------------------- */

typedef struct {
    /* g[j][b]: R of a 16-byte vector holding b at byte j (zeros elsewhere)
     * followed by 16 (B - 1) zero bytes */
    uint32_t g[DUET_CRC32C_PAR_VEC][256];
    /* fwd[t] = x^(8 * 16 (B - 1 - t)) */
    uint32_t fwd[DUET_CRC32C_PAR_LANES];
    /* dig[k][d] = x^(8 d 256^k) */
    uint32_t dig[DUET_CRC32C_PAR_DIGITS][256];
} duet_crc32c_par_tables_t;

/* Fill the tables (host: some 20k multiplications). */
static inline void duet_crc32c_par_tables_init(duet_crc32c_par_tables_t *t)
{
    for (int j = 0; j < DUET_CRC32C_PAR_VEC; j++) {
        uint32_t op = duet_crc32c_xpow8((uint64_t)(DUET_CRC32C_PAR_STRIDE - 1 - j));
        for (uint32_t b = 0; b < 256; b++)
            t->g[j][b] = duet_crc32c_mulmod(op, duet_crc32c_raw_byte(b));
    }
    for (int l = 0; l < DUET_CRC32C_PAR_LANES; l++)
        t->fwd[l] = duet_crc32c_xpow8((uint64_t)DUET_CRC32C_PAR_VEC *
                                      (uint64_t)(DUET_CRC32C_PAR_LANES - 1 - l));
    for (int k = 0; k < DUET_CRC32C_PAR_DIGITS; k++) {
        uint32_t unit = duet_crc32c_xpow8((uint64_t)1 << (8 * k));
        t->dig[k][0] = DUET_CRC32C_ONE;
        for (int d = 1; d < 256; d++)
            t->dig[k][d] = duet_crc32c_mulmod(t->dig[k][d - 1], unit);
    }
}

/* One lane step: s' = G(v xor s), v the vector's four little-endian
 * words.  g may be in any memory space (shared memory on the GPU). */
static inline DUET_CRC32C_HD uint32_t duet_crc32c_par_step(const uint32_t (*g)[256], uint32_t s,
                                                           uint32_t w0, uint32_t w1, uint32_t w2,
                                                           uint32_t w3)
{
    w0 ^= s;
    return g[0][w0 & 0xff] ^ g[1][(w0 >> 8) & 0xff] ^ g[2][(w0 >> 16) & 0xff] ^ g[3][w0 >> 24] ^
           g[4][w1 & 0xff] ^ g[5][(w1 >> 8) & 0xff] ^ g[6][(w1 >> 16) & 0xff] ^ g[7][w1 >> 24] ^
           g[8][w2 & 0xff] ^ g[9][(w2 >> 8) & 0xff] ^ g[10][(w2 >> 16) & 0xff] ^ g[11][w2 >> 24] ^
           g[12][w3 & 0xff] ^ g[13][(w3 >> 8) & 0xff] ^ g[14][(w3 >> 16) & 0xff] ^ g[15][w3 >> 24];
}

/* x^(8n) from the digit tables (n < 2^40): at most 4 multiplications. */
static inline DUET_CRC32C_HD uint32_t duet_crc32c_par_xpow8(const uint32_t (*dig)[256], uint64_t n)
{
    uint32_t r = DUET_CRC32C_ONE;
    for (int k = 0; k < DUET_CRC32C_PAR_DIGITS; k++, n >>= 8)
        if ((n & 0xff) != 0)
            r = r == DUET_CRC32C_ONE ? dig[k][n & 0xff] : duet_crc32c_mulmod(r, dig[k][n & 0xff]);
    return r;
}

/* Keep bytes [lo, hi) of a 16-byte vector's word k (bytes 4k..4k+3), zero
 * the rest: the widening of a piece to whole vectors. */
static inline DUET_CRC32C_HD uint32_t duet_crc32c_par_mask(uint32_t w, int k, uint32_t lo,
                                                           uint32_t hi)
{
    for (uint32_t b = 0; b < 4; b++) {
        uint32_t at = 4u * (uint32_t)k + b;
        if (at < lo || at >= hi)
            w &= ~(0xffu << (8 * b));
    }
    return w;
}

/* The CRC of a stream of `total` bytes from the xor of its pieces' T
 * values (see above). */
static inline DUET_CRC32C_HD uint32_t duet_crc32c_par_finish(uint32_t acc, uint64_t total)
{
    uint32_t unshift = duet_crc32c_powmod(DUET_CRC32C_XINV, 8u * (uint64_t)DUET_CRC32C_PAR_STRIDE);
    return duet_crc32c_from_raw(duet_crc32c_mulmod(unshift, acc), total);
}

#endif
