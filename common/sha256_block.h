/* SHA-256's compression function (FIPS 180-4 §6.2.2), one 64-byte block
 * into the state h: the portable one and the one on x86's SHA extensions
 * (common/sha256_x86.c).  Internal to common/sha256.c and its test, which
 * checks the two against each other. */
#ifndef DUET_COMMON_SHA256_BLOCK_H
#define DUET_COMMON_SHA256_BLOCK_H

#include <stdbool.h>
#include <stdint.h>

extern const uint32_t duet__sha256_k[64];

void duet__sha256_block_portable(uint32_t h[8], const uint8_t *p);

/* Whether this CPU has the SHA extensions (and SSE4.1); false on other
 * architectures and compilers. */
bool duet__sha256_x86_ok(void);
/* Only where duet__sha256_x86_ok(). */
void duet__sha256_block_x86(uint32_t h[8], const uint8_t *p);

#endif
