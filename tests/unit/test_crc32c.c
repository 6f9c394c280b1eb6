/* CRC32C arithmetic (common/crc32c_math.h) against the byte-serial CRC
 * (common/crc32c.c), on the CPU:
 *  - the constants: x * x^-1 = 1, x^(8n) by squaring = n zero bytes fed;
 *  - combine: crc(A || B) from crc(A), crc(B), |B| for random splits,
 *    lengths 0, 1, odd, and chains over segment lists; raw <-> standard;
 *  - the piece plan (merging, splitting, `after`);
 *  - the GPU's parallel CRC (engine/cuda/kv_crc.cu), emulated lane by lane
 *    with the same tables and steps, over aligned, unaligned, tiny and
 *    multi-piece segment lists: it must equal the byte-serial CRC. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/alloc.h"
#include "common/crc32c.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;

static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static unsigned char *random_buf(size_t n)
{
    unsigned char *b = duet_aligned_alloc(64, n + 64);
    assert_non_null(b);
    for (size_t i = 0; i < n + 64; i++)
        b[i] = (unsigned char)rnd();
    return b;
}

static void test_constants(void **state)
{
    unsigned char zeros[300];
    (void)state;
    memset(zeros, 0, sizeof(zeros));
    assert_int_equal(duet_crc32c(0, "123456789", 9), 0xE3069283u);
    assert_int_equal(duet_crc32c_mulmod(0x40000000u, DUET_CRC32C_XINV), DUET_CRC32C_ONE);
    assert_int_equal(duet_crc32c_mulmod(0, 0x12345678u), 0);
    assert_int_equal(duet_crc32c_mulmod(DUET_CRC32C_ONE, 0x12345678u), 0x12345678u);
    assert_int_equal(duet_crc32c_xpow8(0), DUET_CRC32C_ONE);
    /* the raw register fed n zero bytes == a multiplication by x^(8n) */
    for (size_t n = 0; n < sizeof(zeros); n += 7) {
        uint32_t reg = 0xdeadbeefu;
        /* duet_crc32c extends ~reg: feeding zeros to the raw register reg
         * is ~duet_crc32c(~reg, zeros) */
        uint32_t fed = ~duet_crc32c(~reg, zeros, n);
        assert_int_equal(duet_crc32c_shift(reg, n), fed);
    }
    /* a shift there and back */
    assert_int_equal(duet_crc32c_mulmod(duet_crc32c_powmod(DUET_CRC32C_XINV, 8u * 12345u),
                                        duet_crc32c_shift(0xabcdef01u, 12345u)),
                     0xabcdef01u);
}

static void test_combine(void **state)
{
    size_t cap = 1 << 16;
    unsigned char *b = random_buf(cap);
    (void)state;
    for (int it = 0; it < 400; it++) {
        size_t n = it < 20 ? (size_t)it : (size_t)(rnd() % cap);
        size_t cut = n ? (size_t)(rnd() % (n + 1)) : 0;
        size_t off = (size_t)(rnd() % 17);
        uint32_t whole = duet_crc32c(0, b + off, n);
        uint32_t a = duet_crc32c(0, b + off, cut), c = duet_crc32c(0, b + off + cut, n - cut);
        assert_int_equal(duet_crc32c_combine(a, c, n - cut), whole);
        /* raw CRC: register preset 0, no final inversion */
        uint32_t raw = ~duet_crc32c(~0u, b + off, n);
        assert_int_equal(duet_crc32c_from_raw(raw, n), whole);
    }
    /* a segment list folded with combine == the serial CRC over the list */
    for (int it = 0; it < 50; it++) {
        duet_crc32c_range_t r[40];
        uint32_t acc = 0;
        int nr = 1 + (int)(rnd() % 40);
        for (int i = 0; i < nr; i++) {
            r[i].len = rnd() % 5 == 0 ? rnd() % 3 : rnd() % 3000;
            r[i].off = rnd() % (cap - r[i].len);
            acc = duet_crc32c_combine(acc, duet_crc32c(0, b + r[i].off, r[i].len), r[i].len);
        }
        assert_int_equal(acc, duet_crc32c_ranges(b, r, nr));
    }
    duet_aligned_free(b);
}

static void test_plan(void **state)
{
    duet_crc32c_range_t r[] = {{100, 50}, {150, 30}, {0, 0}, {180, 1}, {7, 5000}, {9000, 0}};
    duet_crc32c_piece_t p[16];
    uint64_t total = 0;
    size_t m;
    (void)state;
    m = duet_crc32c_plan(r, 6, 2048, p, 16, &total);
    assert_int_equal(total, 50 + 30 + 1 + 5000);
    assert_int_equal(m, 4); /* [100, 181) merged, then 5000 bytes in 3 pieces */
    assert_int_equal(p[0].off, 100);
    assert_int_equal(p[0].len, 81);
    assert_int_equal(p[0].after, 5000);
    assert_int_equal(p[1].off, 7);
    assert_int_equal(p[1].len, 2048);
    assert_int_equal(p[2].off, 7 + 2048);
    assert_int_equal(p[3].len, 5000 - 4096);
    assert_int_equal(p[3].after, 0);
    /* too small an array: the count still comes back */
    assert_int_equal(duet_crc32c_plan(r, 6, 2048, p, 2, &total), 4);
    assert_int_equal(duet_crc32c_plan(r, 0, 2048, p, 16, &total), 0);
    assert_int_equal(total, 0);
}

/* ---- the GPU's parallel CRC, one lane at a time (engine/cuda/kv_crc.cu) ---- */

static uint32_t load_word(const unsigned char *p)
{
    uint32_t w;
    memcpy(&w, p, 4);
    return w; /* little-endian, as the GPU's loads */
}

/* T(piece): see common/crc32c_math.h.  base is 16-byte aligned. */
static uint32_t emulate_piece(const duet_crc32c_par_tables_t *t, const unsigned char *base,
                              duet_crc32c_piece_t pc)
{
    const int B = DUET_CRC32C_PAR_LANES;
    uint64_t a0 = pc.off & ~(uint64_t)15, end = pc.off + pc.len, a1 = (end + 15) & ~(uint64_t)15;
    int64_t nv = (int64_t)((a1 - a0) / 16), rounds = (nv + B - 1) / B, z = rounds * B - nv;
    uint32_t lo = (uint32_t)(pc.off - a0), pad = (uint32_t)(a1 - end), acc = 0;
    for (int lane = 0; lane < B; lane++) {
        uint32_t s = 0;
        int64_t i = lane - z;
        if (i < 0)
            i += B; /* leading zero vectors leave s at 0 */
        for (; i < nv; i += B) {
            const unsigned char *v = base + a0 + 16u * (uint64_t)i;
            uint32_t w[4];
            for (int k = 0; k < 4; k++) {
                w[k] = load_word(v + 4 * k);
                if (i == 0 || i == nv - 1)
                    w[k] = duet_crc32c_par_mask(w[k], k, i == 0 ? lo : 0,
                                                i == nv - 1 ? 16u - pad : 16u);
            }
            s = duet_crc32c_par_step(t->g, s, w[0], w[1], w[2], w[3]);
        }
        acc ^= duet_crc32c_mulmod(t->fwd[lane], s);
    }
    return duet_crc32c_mulmod(duet_crc32c_par_xpow8(t->dig, pc.after + 16u - pad), acc);
}

static uint32_t emulate(const duet_crc32c_par_tables_t *t, const unsigned char *base,
                        const duet_crc32c_range_t *r, int n, uint64_t piece_max)
{
    uint64_t total;
    size_t m = duet_crc32c_plan(r, n, piece_max, NULL, 0, &total);
    duet_crc32c_piece_t *p = DUET_NEW_ARRAY(duet_crc32c_piece_t, m + 1);
    uint32_t acc = 0;
    assert_non_null(p);
    assert_int_equal(duet_crc32c_plan(r, n, piece_max, p, m, &total), m);
    for (size_t i = 0; i < m; i++)
        acc ^= emulate_piece(t, base, p[i]);
    duet_free(p);
    return duet_crc32c_par_finish(acc, total);
}

static void test_parallel_emulated(void **state)
{
    size_t cap = 3u << 20;
    unsigned char *b = random_buf(cap);
    duet_crc32c_par_tables_t *t = DUET_NEW(duet_crc32c_par_tables_t);
    duet_crc32c_range_t r[64];
    (void)state;
    assert_non_null(t);
    duet_crc32c_par_tables_init(t);
    /* single ranges: every head/tail alignment, tiny, exactly one round,
     * several rounds, several pieces */
    static const uint64_t lens[] = {1,   2,    3,    15,   16,    17,    31,    33,
                                    255, 4095, 4096, 4097, 65536, 70001, 300000};
    for (size_t k = 0; k < sizeof(lens) / sizeof(lens[0]); k++)
        for (uint64_t off = 0; off < 18; off += (lens[k] > 5000 ? 5 : 1)) {
            r[0] = (duet_crc32c_range_t){off + 4096, lens[k]};
            assert_int_equal(emulate(t, b, r, 1, 64u << 10), duet_crc32c_ranges(b, r, 1));
        }
    /* random segment lists, some touching (merged), some empty */
    for (int it = 0; it < 40; it++) {
        int n = 1 + (int)(rnd() % 64);
        for (int i = 0; i < n; i++) {
            uint64_t len = rnd() % 4 == 0 ? rnd() % 20 : rnd() % 40000;
            r[i].off =
                i > 0 && rnd() % 4 == 0 ? r[i - 1].off + r[i - 1].len : rnd() % (cap - 100000);
            r[i].len = len;
        }
        assert_int_equal(emulate(t, b, r, n, it % 2 ? 4096 : 64u << 10),
                         duet_crc32c_ranges(b, r, n));
    }
    /* nothing at all */
    assert_int_equal(emulate(t, b, r, 0, 4096), 0);
    duet_free(t);
    duet_aligned_free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_constants),
        cmocka_unit_test(test_combine),
        cmocka_unit_test(test_plan),
        cmocka_unit_test(test_parallel_emulated),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
