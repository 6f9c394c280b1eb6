/* SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), small and dependency
 * free, for the page grants (node/grant.h), the prefix cache's page ids
 * (kv/prefix_cache.h) and anything else that needs a MAC or a hash.  The
 * block function runs on x86's SHA extensions where the CPU has them
 * (common/sha256_x86.c).  Checked against the FIPS 180-2 and RFC 4231
 * vectors (tests/unit/test_sha256.c).
 *
 * All functions are pure (no global state) and thread-safe; a context is
 * owned by its caller and may live on the stack. */
#ifndef DUET_COMMON_SHA256_H
#define DUET_COMMON_SHA256_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DUET_SHA256_LEN   32
#define DUET_SHA256_BLOCK 64

typedef struct {
    uint32_t h[8];
    uint64_t n_bytes;               /* hashed so far */
    uint8_t buf[DUET_SHA256_BLOCK]; /* the partial block */
    size_t n_buf;
} duet_sha256_t;

void duet_sha256_init(duet_sha256_t *s);
void duet_sha256_update(duet_sha256_t *s, const void *data, size_t len);
/* Writes the digest and wipes the context. */
void duet_sha256_final(duet_sha256_t *s, uint8_t out[DUET_SHA256_LEN]);
void duet_sha256(const void *data, size_t len, uint8_t out[DUET_SHA256_LEN]);

/* HMAC-SHA256, incremental: init with the key, update with the message. */
typedef struct {
    duet_sha256_t inner;
    uint8_t opad_key[DUET_SHA256_BLOCK];
} duet_hmac_sha256_t;

void duet_hmac_sha256_init(duet_hmac_sha256_t *h, const void *key, size_t key_len);
void duet_hmac_sha256_update(duet_hmac_sha256_t *h, const void *data, size_t len);
/* Writes the MAC and wipes the context. */
void duet_hmac_sha256_final(duet_hmac_sha256_t *h, uint8_t out[DUET_SHA256_LEN]);
void duet_hmac_sha256(const void *key, size_t key_len, const void *data, size_t len,
                      uint8_t out[DUET_SHA256_LEN]);

/* Compare two byte strings of length len in time independent of where they
 * differ (for MACs and tokens).  True when equal. */
bool duet_ct_equal(const void *a, const void *b, size_t len);

/* Overwrite len bytes with zeros in a way the compiler keeps. */
void duet_wipe(void *p, size_t len);

#endif
