/* SHA-256's compression function on x86's SHA extensions (SHA-NI):
 * sha256rnds2 runs two rounds on the state held as ABEF and CDGH,
 * sha256msg1/msg2 extend the message schedule four words at a time.
 * Written from Intel's instruction descriptions (SDM vol. 2); checked
 * against the portable function in tests/unit/test_sha256.c.  About 8x the
 * portable speed where present (every x86 server CPU since Ice Lake and
 * Zen); the prefix cache hashes every prompt page with it. */
#include "common/sha256_block.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#include <stdatomic.h>

bool duet__sha256_x86_ok(void)
{
    /* CPUID (not __builtin_cpu_supports: clang's knows no "sha"): leaf 7
     * EBX bit 29 SHA, leaf 1 ECX bits 19 SSE4.1 and 9 SSSE3; asked once */
    static atomic_int ok = -1;
    int v = atomic_load_explicit(&ok, memory_order_relaxed);
    if (v < 0) {
        unsigned a, b, c, d;
        v = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b >> 29 & 1u) &&
            __get_cpuid(1, &a, &b, &c, &d) && (c >> 19 & 1u) && (c >> 9 & 1u);
        atomic_store_explicit(&ok, v, memory_order_relaxed);
    }
    return v != 0;
}

__attribute__((target("sha,sse4.1,ssse3"))) void duet__sha256_block_x86(uint32_t h[8],
                                                                        const uint8_t *p)
{
    /* big-endian words: reverse the bytes of each 32-bit lane */
    const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bLL, 0x0405060700010203LL);
    __m128i abcd = _mm_loadu_si128((const __m128i *)&h[0]); /* lanes A B C D */
    __m128i efgh = _mm_loadu_si128((const __m128i *)&h[4]); /* lanes E F G H */
    __m128i m[4], k, abef, cdgh, abef0, cdgh0;

    /* to the instruction's layout: abef = lanes F E B A, cdgh = H G D C */
    abcd = _mm_shuffle_epi32(abcd, 0xB1);     /* B A D C */
    efgh = _mm_shuffle_epi32(efgh, 0x1B);     /* H G F E */
    abef = _mm_alignr_epi8(abcd, efgh, 8);    /* F E B A */
    cdgh = _mm_blend_epi16(efgh, abcd, 0xF0); /* H G D C */
    abef0 = abef;
    cdgh0 = cdgh;

    for (int i = 0; i < 16; i++) { /* rounds 4i .. 4i+3 */
        __m128i *w = &m[i & 3];
        if (i < 4)
            *w = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 16 * i)), bswap);
        k = _mm_add_epi32(*w, _mm_loadu_si128((const __m128i *)&duet__sha256_k[4 * i]));
        cdgh = _mm_sha256rnds2_epu32(cdgh, abef, k);
        if (i >= 3 && i < 15) { /* words 4(i+1) .. 4(i+1)+3 */
            __m128i *next = &m[(i + 1) & 3];
            *next = _mm_add_epi32(*next, _mm_alignr_epi8(*w, m[(i - 1) & 3], 4));
            *next = _mm_sha256msg2_epu32(*next, *w);
        }
        k = _mm_shuffle_epi32(k, 0x0E);
        abef = _mm_sha256rnds2_epu32(abef, cdgh, k);
        if (i >= 1 && i < 13) /* the first half of words 4(i+3) .. 4(i+3)+3 */
            m[(i - 1) & 3] = _mm_sha256msg1_epu32(m[(i - 1) & 3], *w);
    }
    abef = _mm_add_epi32(abef, abef0);
    cdgh = _mm_add_epi32(cdgh, cdgh0);

    /* back: A B C D and E F G H */
    abef = _mm_shuffle_epi32(abef, 0x1B); /* A B E F */
    cdgh = _mm_shuffle_epi32(cdgh, 0xB1); /* G H C D */
    _mm_storeu_si128((__m128i *)&h[0], _mm_blend_epi16(abef, cdgh, 0xF0));
    _mm_storeu_si128((__m128i *)&h[4], _mm_alignr_epi8(cdgh, abef, 8));
}

#else

bool duet__sha256_x86_ok(void)
{
    return false;
}

void duet__sha256_block_x86(uint32_t h[8], const uint8_t *p)
{
    duet__sha256_block_portable(h, p);
}

#endif
