/* common/sha256, the wrapper of libcrypto's SHA-256 and HMAC (FIPS 180-2
 * and RFC 4231 vectors; one-shot, incremental and restarted hashes agree),
 * its constant-time compares, common/random and the page grants of
 * node/grant.h (every field is bound; expiry; length). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/random.h"
#include "common/sha256.h"
#include "node/grant.h"

static void duet__hex(const uint8_t *b, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", b[i]);
}

static void duet__check_sha(const void *data, size_t len, const char *want)
{
    uint8_t d[DUET_SHA256_LEN];
    char hex[2 * DUET_SHA256_LEN + 1];
    assert_int_equal(duet_sha256(data, len, d), DUET_OK);
    duet__hex(d, sizeof(d), hex);
    assert_string_equal(hex, want);
}

static void test_sha256_fips(void **state)
{
    (void)state;
    duet__check_sha("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    duet__check_sha("", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    duet__check_sha(two, strlen(two),
                    "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    /* one million 'a', fed in uneven pieces through the incremental API */
    char *a = malloc(1000000);
    assert_non_null(a);
    memset(a, 'a', 1000000);
    duet_sha256_t s;
    uint8_t d[DUET_SHA256_LEN];
    char hex[2 * DUET_SHA256_LEN + 1];
    assert_int_equal(duet_sha256_init(&s), DUET_OK);
    for (size_t off = 0, step = 1; off < 1000000; off += step, step = step % 97 + 13)
        duet_sha256_update(&s, a + off, off + step > 1000000 ? 1000000 - off : step);
    assert_int_equal(duet_sha256_final(&s, d), DUET_OK);
    duet__hex(d, sizeof(d), hex);
    assert_string_equal(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    free(a);
}

/* One context restarted between messages (the prefix cache's page ids)
 * gives what one-shot hashing and uneven incremental pieces give, on
 * random messages of every length around the 64-byte block and the
 * 56-byte padding boundary. */
static void test_sha256_restart(void **state)
{
    (void)state;
    uint32_t seed = 1;
    uint8_t msg[300], a[DUET_SHA256_LEN], b[DUET_SHA256_LEN], c[DUET_SHA256_LEN];
    duet_sha256_t r;
    assert_int_equal(duet_sha256_init(&r), DUET_OK);
    for (size_t len = 0; len < sizeof(msg); len++) {
        for (size_t i = 0; i < len; i++)
            msg[i] = (uint8_t)((seed = seed * 1664525u + 1013904223u) >> 24);
        assert_int_equal(duet_sha256(msg, len, a), DUET_OK);
        duet_sha256_t s;
        assert_int_equal(duet_sha256_init(&s), DUET_OK);
        for (size_t off = 0, step = 1; off < len; off += step, step = step * 3 % 71 + 1)
            duet_sha256_update(&s, msg + off, off + step > len ? len - off : step);
        assert_int_equal(duet_sha256_final(&s, b), DUET_OK);
        assert_null(s.ctx);
        duet_sha256_update(&r, msg, len);
        assert_int_equal(duet_sha256_restart(&r, c), DUET_OK);
        assert_memory_equal(a, b, sizeof(a));
        assert_memory_equal(a, c, sizeof(a));
    }
    duet_sha256_cleanup(&r);
    assert_null(r.ctx);
    duet_sha256_cleanup(&r); /* twice: a no-op */
}

static void test_hmac_rfc4231(void **state)
{
    (void)state;
    uint8_t k20b[20], k20a[20], k20c[20], k25[25], k131[131], d50d[50], d50c[50];
    memset(k20b, 0x0b, sizeof(k20b));
    memset(k20a, 0xaa, sizeof(k20a));
    memset(k20c, 0x0c, sizeof(k20c));
    for (int i = 0; i < 25; i++)
        k25[i] = (uint8_t)(i + 1);
    memset(k131, 0xaa, sizeof(k131));
    memset(d50d, 0xdd, sizeof(d50d));
    memset(d50c, 0xcd, sizeof(d50c));
    const char *t6 = "Test Using Larger Than Block-Size Key - Hash Key First";
    const char *t7 = "This is a test using a larger than block-size key and a larger than "
                     "block-size data. The key needs to be hashed before being used by the HMAC "
                     "algorithm.";
    struct {
        const void *key;
        size_t key_len;
        const void *data;
        size_t len;
        const char *want; /* case 5 is truncated to 128 bits */
    } cases[] = {
        {k20b, 20, "Hi There", 8,
         "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
        {"Jefe", 4, "what do ya want for nothing?", 28,
         "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
        {k20a, 20, d50d, 50, "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"},
        {k25, 25, d50c, 50, "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"},
        {k20c, 20, "Test With Truncation", 20, "a3b6167473100ee06e0c796c2955552b"},
        {k131, 131, t6, strlen(t6),
         "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"},
        {k131, 131, t7, strlen(t7),
         "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        uint8_t mac[DUET_SHA256_LEN];
        char hex[2 * DUET_SHA256_LEN + 1];
        assert_int_equal(
            duet_hmac_sha256(cases[i].key, cases[i].key_len, cases[i].data, cases[i].len, mac),
            DUET_OK);
        duet__hex(mac, sizeof(mac), hex);
        hex[strlen(cases[i].want)] = '\0';
        assert_string_equal(hex, cases[i].want);
    }
    /* incremental in pieces equals one-shot (case 7), and an empty key is
     * a valid key (RFC 2104: zero-padded to the block) */
    duet_hmac_sha256_t h;
    uint8_t one[DUET_SHA256_LEN], inc[DUET_SHA256_LEN], zero_key[DUET_SHA256_BLOCK] = {0};
    assert_int_equal(duet_hmac_sha256(k131, 131, t7, strlen(t7), one), DUET_OK);
    assert_int_equal(duet_hmac_sha256_init(&h, k131, 131), DUET_OK);
    for (size_t off = 0; off < strlen(t7); off += 7)
        duet_hmac_sha256_update(&h, t7 + off, strlen(t7) - off < 7 ? strlen(t7) - off : 7);
    assert_int_equal(duet_hmac_sha256_final(&h, inc), DUET_OK);
    assert_memory_equal(one, inc, sizeof(one));
    assert_int_equal(duet_hmac_sha256("", 0, "abc", 3, one), DUET_OK);
    assert_int_equal(duet_hmac_sha256(zero_key, sizeof(zero_key), "abc", 3, inc), DUET_OK);
    assert_memory_equal(one, inc, sizeof(one));
}

static void test_ct_equal(void **state)
{
    (void)state;
    assert_true(duet_ct_equal("abcdef", "abcdef", 6));
    assert_false(duet_ct_equal("abcdef", "abcdeg", 6));
    assert_false(duet_ct_equal("xbcdef", "abcdef", 6));
    assert_true(duet_ct_equal("", "", 0));
    /* the secret compare: contents and length must both match */
    assert_true(duet_ct_equal_secret("abcdef", 6, "abcdef", 6));
    assert_false(duet_ct_equal_secret("abcdef", 6, "abcdeg", 6));
    assert_false(duet_ct_equal_secret("abcdef", 6, "abcde", 5));
    assert_false(duet_ct_equal_secret("abcdef", 6, "abcdefg", 7));
    assert_false(duet_ct_equal_secret("abcdef", 6, NULL, 0));
    assert_false(duet_ct_equal_secret("abcdef", 6, "abcdef\0junk", 11));
    /* wipe zeroes */
    char w[9] = "secretky";
    duet_wipe(w, sizeof(w));
    for (size_t i = 0; i < sizeof(w); i++)
        assert_int_equal(w[i], 0);
}

static void test_random_ids(void **state)
{
    (void)state;
    enum { N = 2000 };
    static char ids[N][DUET_RANDOM_ID_LEN + 1];
    for (int i = 0; i < N; i++) {
        assert_int_equal(duet_random_id(ids[i]), DUET_OK);
        assert_int_equal(strlen(ids[i]), DUET_RANDOM_ID_LEN);
        assert_int_equal(strspn(ids[i], "0123456789abcdef"), DUET_RANDOM_ID_LEN);
        for (int j = 0; j < i; j++)
            assert_string_not_equal(ids[i], ids[j]);
    }
    /* every hex digit position varies (no counter or fixed prefix) */
    for (int p = 0; p < DUET_RANDOM_ID_LEN; p++) {
        bool varies = false;
        for (int i = 1; i < N && !varies; i++)
            varies = ids[i][p] != ids[0][p];
        assert_true(varies);
    }
    uint64_t a, b;
    assert_int_equal(duet_random_nonzero_u64(&a), DUET_OK);
    assert_int_equal(duet_random_nonzero_u64(&b), DUET_OK);
    assert_true(a != 0 && b != 0 && a != b);
}

static void test_grant(void **state)
{
    (void)state;
    uint8_t key[DUET_NODE_GRANT_KEY_LEN], other[DUET_NODE_GRANT_KEY_LEN], mac[DUET_NODE_GRANT_LEN];
    int32_t pages[] = {7, 8, 9, 30};
    uint64_t now = duet_node_grant_now_ms();
    assert_int_equal(duet_random_bytes(key, sizeof(key)), DUET_OK);
    memcpy(other, key, sizeof(key));
    other[5] ^= 1;
    duet_node_grant_t g = {.transfer_id = 0x1234567890abcdefull,
                           .decode_id = "decode-0-00112233",
                           .pages = pages,
                           .n_pages = 4,
                           .packed = true,
                           .stage0 = 100,
                           .expiry_ms = now + 5000};
    assert_int_equal(duet_node_grant_sign(key, &g, mac), DUET_OK);
    assert_int_equal(duet_node_grant_verify(key, &g, mac, sizeof(mac), now), DUET_OK);
    /* clock skew is tolerated, an old grant is not */
    assert_int_equal(duet_node_grant_verify(key, &g, mac, sizeof(mac), now + 5000 + 1000), DUET_OK);
    assert_int_equal(
        duet_node_grant_verify(key, &g, mac, sizeof(mac), now + 5000 + DUET_NODE_GRANT_SKEW_MS + 1),
        DUET_ERR_INVALID);
    assert_non_null(strstr(duet_error_msg(), "expired"));
    /* missing, short, wrong key */
    assert_int_equal(duet_node_grant_verify(key, &g, mac, 0, now), DUET_ERR_INVALID);
    assert_non_null(strstr(duet_error_msg(), "no page grant"));
    assert_int_equal(duet_node_grant_verify(key, &g, mac, 16, now), DUET_ERR_INVALID);
    assert_int_equal(duet_node_grant_verify(other, &g, mac, sizeof(mac), now), DUET_ERR_INVALID);
    assert_non_null(strstr(duet_error_msg(), "does not match"));
    /* every bound field: change it and the grant no longer holds */
    duet_node_grant_t t;
    int32_t moved[] = {7, 8, 9, 31};
    t = g, t.transfer_id++;
    assert_int_equal(duet_node_grant_verify(key, &t, mac, sizeof(mac), now), DUET_ERR_INVALID);
    t = g, t.decode_id = "decode-0-00112234";
    assert_int_equal(duet_node_grant_verify(key, &t, mac, sizeof(mac), now), DUET_ERR_INVALID);
    t = g, t.pages = moved;
    assert_int_equal(duet_node_grant_verify(key, &t, mac, sizeof(mac), now), DUET_ERR_INVALID);
    t = g, t.n_pages = 3;
    assert_int_equal(duet_node_grant_verify(key, &t, mac, sizeof(mac), now), DUET_ERR_INVALID);
    t = g, t.packed = false;
    assert_int_equal(duet_node_grant_verify(key, &t, mac, sizeof(mac), now), DUET_ERR_INVALID);
    t = g, t.stage0 = 101;
    assert_int_equal(duet_node_grant_verify(key, &t, mac, sizeof(mac), now), DUET_ERR_INVALID);
    t = g, t.expiry_ms += 60000;
    assert_int_equal(duet_node_grant_verify(key, &t, mac, sizeof(mac), now), DUET_ERR_INVALID);
    /* a flipped bit of the MAC */
    mac[31] ^= 0x80;
    assert_int_equal(duet_node_grant_verify(key, &g, mac, sizeof(mac), now), DUET_ERR_INVALID);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sha256_fips),  cmocka_unit_test(test_sha256_restart),
        cmocka_unit_test(test_hmac_rfc4231), cmocka_unit_test(test_ct_equal),
        cmocka_unit_test(test_random_ids),   cmocka_unit_test(test_grant),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
