/* Unpredictable values from OpenSSL 3's CSPRNG (RAND_bytes: a DRBG seeded
 * from the kernel's getrandom(2), reseeded after fork): secrets, request
 * ids, transfer ids.  No fallback to clocks or counters: when libcrypto
 * cannot give randomness the caller gets an error, never a guessable
 * value.  Thread-safe. */
#ifndef DUET_COMMON_RANDOM_H
#define DUET_COMMON_RANDOM_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* Fill buf with len random bytes; DUET_ERR_IO (naming libcrypto's error)
 * on failure. */
duet_status_t duet_random_bytes(void *buf, size_t len);

/* 128 random bits as 32 lowercase hex digits: out must hold 33 bytes. */
#define DUET_RANDOM_ID_LEN 32
duet_status_t duet_random_id(char out[DUET_RANDOM_ID_LEN + 1]);

/* A random non-zero 64-bit value (transfer ids: 0 means "unset"). */
duet_status_t duet_random_nonzero_u64(uint64_t *out_p);

#endif
