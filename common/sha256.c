/* SHA-256, HMAC-SHA256 and the compares on libcrypto (common/sha256.h). */
#include "common/sha256.h"

#include <pthread.h>
#include <string.h>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>

/* Fetched once: an implicit fetch on every init (EVP_sha256()) costs a
 * lock and a lookup in OpenSSL 3, more than hashing one KV page. */
static pthread_once_t duet__crypto_once = PTHREAD_ONCE_INIT;
static EVP_MD *duet__sha256_md;
static EVP_MAC *duet__hmac;

static void duet__crypto_fetch(void)
{
    duet__sha256_md = EVP_MD_fetch(NULL, "SHA256", NULL);
    duet__hmac = EVP_MAC_fetch(NULL, "HMAC", NULL);
}

static const EVP_MD *duet__md(void)
{
    pthread_once(&duet__crypto_once, duet__crypto_fetch);
    return duet__sha256_md;
}

static EVP_MAC *duet__mac(void)
{
    pthread_once(&duet__crypto_once, duet__crypto_fetch);
    return duet__hmac;
}

duet_status_t duet_sha256_init(duet_sha256_t *s)
{
    const EVP_MD *md = duet__md();

    s->failed = false;
    s->ctx = md != NULL ? EVP_MD_CTX_new() : NULL;
    if (s->ctx == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "sha256: libcrypto has no %s",
                          md != NULL ? "memory" : "SHA-256");
    if (EVP_DigestInit_ex2(s->ctx, md, NULL) != 1) {
        EVP_MD_CTX_free(s->ctx);
        s->ctx = NULL;
        return duet_error(DUET_ERR_INTERNAL, "sha256: EVP_DigestInit_ex2 failed");
    }
    return DUET_OK;
}

void duet_sha256_update(duet_sha256_t *s, const void *data, size_t len)
{
    if (!s->failed && len > 0 && EVP_DigestUpdate(s->ctx, data, len) != 1)
        s->failed = true;
}

duet_status_t duet_sha256_final(duet_sha256_t *s, uint8_t out[DUET_SHA256_LEN])
{
    unsigned int n = 0;
    bool ok = !s->failed && EVP_DigestFinal_ex(s->ctx, out, &n) == 1 && n == DUET_SHA256_LEN;

    EVP_MD_CTX_free(s->ctx);
    s->ctx = NULL;
    if (!ok) {
        memset(out, 0, DUET_SHA256_LEN);
        return duet_error(DUET_ERR_INTERNAL, "sha256: libcrypto failed");
    }
    return DUET_OK;
}

duet_status_t duet_sha256_restart(duet_sha256_t *s, uint8_t out[DUET_SHA256_LEN])
{
    unsigned int n = 0;
    bool ok = !s->failed && EVP_DigestFinal_ex(s->ctx, out, &n) == 1 && n == DUET_SHA256_LEN;

    s->failed = EVP_DigestInit_ex2(s->ctx, duet__md(), NULL) != 1;
    if (!ok) {
        memset(out, 0, DUET_SHA256_LEN);
        return duet_error(DUET_ERR_INTERNAL, "sha256: libcrypto failed");
    }
    return DUET_OK;
}

void duet_sha256_cleanup(duet_sha256_t *s)
{
    EVP_MD_CTX_free(s->ctx);
    s->ctx = NULL;
}

duet_status_t duet_sha256(const void *data, size_t len, uint8_t out[DUET_SHA256_LEN])
{
    duet_sha256_t s;
    duet_status_t st = duet_sha256_init(&s);
    if (st != DUET_OK) {
        memset(out, 0, DUET_SHA256_LEN);
        return st;
    }
    duet_sha256_update(&s, data, len);
    return duet_sha256_final(&s, out);
}

duet_status_t duet_hmac_sha256_init(duet_hmac_sha256_t *h, const void *key, size_t key_len)
{
    EVP_MAC *mac = duet__mac();
    static const unsigned char empty[1] = {0};
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, (char *)"SHA256", 0),
        OSSL_PARAM_construct_end(),
    };

    h->failed = false;
    h->ctx = mac != NULL ? EVP_MAC_CTX_new(mac) : NULL;
    if (h->ctx == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "hmac-sha256: libcrypto has no %s",
                          mac != NULL ? "memory" : "HMAC");
    /* an empty key is a valid HMAC key (RFC 2104); OpenSSL wants a
     * non-NULL pointer for it */
    if (EVP_MAC_init(h->ctx, key_len > 0 ? key : empty, key_len, params) != 1) {
        EVP_MAC_CTX_free(h->ctx);
        h->ctx = NULL;
        return duet_error(DUET_ERR_INTERNAL, "hmac-sha256: EVP_MAC_init failed");
    }
    return DUET_OK;
}

void duet_hmac_sha256_update(duet_hmac_sha256_t *h, const void *data, size_t len)
{
    if (!h->failed && len > 0 && EVP_MAC_update(h->ctx, data, len) != 1)
        h->failed = true;
}

duet_status_t duet_hmac_sha256_final(duet_hmac_sha256_t *h, uint8_t out[DUET_SHA256_LEN])
{
    size_t n = 0;
    bool ok =
        !h->failed && EVP_MAC_final(h->ctx, out, &n, DUET_SHA256_LEN) == 1 && n == DUET_SHA256_LEN;

    EVP_MAC_CTX_free(h->ctx); /* cleanses the keyed state */
    h->ctx = NULL;
    if (!ok) {
        memset(out, 0, DUET_SHA256_LEN);
        return duet_error(DUET_ERR_INTERNAL, "hmac-sha256: libcrypto failed");
    }
    return DUET_OK;
}

duet_status_t duet_hmac_sha256(const void *key, size_t key_len, const void *data, size_t len,
                               uint8_t out[DUET_SHA256_LEN])
{
    duet_hmac_sha256_t h;
    duet_status_t st = duet_hmac_sha256_init(&h, key, key_len);
    if (st != DUET_OK) {
        memset(out, 0, DUET_SHA256_LEN);
        return st;
    }
    duet_hmac_sha256_update(&h, data, len);
    return duet_hmac_sha256_final(&h, out);
}

bool duet_ct_equal(const void *a, const void *b, size_t len)
{
    return len == 0 || CRYPTO_memcmp(a, b, len) == 0;
}

bool duet_ct_equal_secret(const void *expected, size_t expected_len, const void *got,
                          size_t got_len)
{
    bool same_len = got != NULL && got_len == expected_len;
    /* the same work whatever got holds: compare expected with itself when
     * the lengths differ */
    int diff =
        expected_len > 0 ? CRYPTO_memcmp(expected, same_len ? got : expected, expected_len) : 0;
    return same_len && diff == 0;
}

void duet_wipe(void *p, size_t len)
{
    OPENSSL_cleanse(p, len);
}
