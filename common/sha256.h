/* SHA-256 (FIPS 180-4), HMAC-SHA256 (RFC 2104), a constant-time compare
 * and a wipe, all from OpenSSL 3's libcrypto (EVP digests, EVP_MAC,
 * CRYPTO_memcmp, OPENSSL_cleanse): the library everyone audits, with its
 * own SHA-extension and AVX code paths.  Used by the page grants
 * (node/grant.h), the prefix cache's page ids (kv/prefix_cache.h) and the
 * secret and token compares.  Checked against the FIPS 180-2 and RFC 4231
 * vectors (tests/unit/test_sha256.c).
 *
 * A context is owned by its caller and may live on the stack; it holds a
 * libcrypto context that init allocates and final frees.  Every function
 * is thread-safe; the only shared state is the SHA-256 and HMAC algorithm
 * handles, fetched once per process and never changed.  libcrypto fails
 * only without memory: init and final then return an error (the output is
 * zeroed), and a caller must not use the output. */
#ifndef DUET_COMMON_SHA256_H
#define DUET_COMMON_SHA256_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#define DUET_SHA256_LEN   32
#define DUET_SHA256_BLOCK 64

struct evp_md_ctx_st;  /* EVP_MD_CTX */
struct evp_mac_ctx_st; /* EVP_MAC_CTX */

typedef struct {
    struct evp_md_ctx_st *ctx;
    bool failed; /* an update failed: final reports it */
} duet_sha256_t;

/* DUET_ERR_NO_MEMORY when libcrypto cannot make a context (nothing to
 * clean up then). */
duet_status_t duet_sha256_init(duet_sha256_t *s);
void duet_sha256_update(duet_sha256_t *s, const void *data, size_t len);
/* Writes the digest and frees the context (also on error: out is then
 * zeros). */
duet_status_t duet_sha256_final(duet_sha256_t *s, uint8_t out[DUET_SHA256_LEN]);
duet_status_t duet_sha256(const void *data, size_t len, uint8_t out[DUET_SHA256_LEN]);
/* For many messages on one context: write the digest of what was hashed
 * and start a new hash (out is zeros on error; the context is kept either
 * way, for duet_sha256_final or duet_sha256_cleanup). */
duet_status_t duet_sha256_restart(duet_sha256_t *s, uint8_t out[DUET_SHA256_LEN]);
/* Free the context without a digest (after restart; NULL context ok). */
void duet_sha256_cleanup(duet_sha256_t *s);

/* HMAC-SHA256, incremental: init with the key, update with the message. */
typedef struct {
    struct evp_mac_ctx_st *ctx;
    bool failed;
} duet_hmac_sha256_t;

duet_status_t duet_hmac_sha256_init(duet_hmac_sha256_t *h, const void *key, size_t key_len);
void duet_hmac_sha256_update(duet_hmac_sha256_t *h, const void *data, size_t len);
/* Writes the MAC and frees the context (also on error: out is then
 * zeros). */
duet_status_t duet_hmac_sha256_final(duet_hmac_sha256_t *h, uint8_t out[DUET_SHA256_LEN]);
duet_status_t duet_hmac_sha256(const void *key, size_t key_len, const void *data, size_t len,
                               uint8_t out[DUET_SHA256_LEN]);

/* Compare two byte strings of length len in time independent of where they
 * differ (CRYPTO_memcmp; for MACs and tokens).  True when equal. */
bool duet_ct_equal(const void *a, const void *b, size_t len);

/* Compare a secret of expected_len bytes with got (got_len bytes, NULL
 * allowed) in time that depends only on expected_len: the contents and
 * where they differ stay hidden; whether the lengths match does not.
 * True when equal. */
bool duet_ct_equal_secret(const void *expected, size_t expected_len, const void *got,
                          size_t got_len);

/* Overwrite len bytes with zeros in a way the compiler keeps
 * (OPENSSL_cleanse). */
void duet_wipe(void *p, size_t len);

#endif
